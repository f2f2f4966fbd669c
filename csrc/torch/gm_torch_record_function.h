/*
 * gm_torch_record_function.h - the record_function callbacks of memory
 * history (gm_torch_record_function.cpp), which the module
 * gpumem_torch_record_function (gm_torch_rf_module.cpp) serves to Python.
 * Declares no torch type: includes only gm_torch_compat.h.
 */
#ifndef GM_TORCH_RECORD_FUNCTION_H
#define GM_TORCH_RECORD_FUNCTION_H

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "gm_torch_compat.h"

namespace gpumem {

/* Record record_function ranges (Note [Annotations]) while recording: of
 * the calling thread, or of every thread with `global`; off clears them.
 * GIL held. */
void set_annotations(bool enabled, bool global);
/* Note [Compile contexts]: follow torch.compile regions while recording
 * with compile_context=True. GIL held. */
void set_compile_contexts(bool enabled);
/* (name, start?, device, time_us) of each range event so far. */
std::vector<std::tuple<std::string, bool, int, int64_t>> annotations();

}  // namespace gpumem

#endif /* GM_TORCH_RECORD_FUNCTION_H */
