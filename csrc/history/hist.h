/*
 * hist.h - memory history: what is recorded (configuration), where events
 * go (one bounded ring per device, fed by the core's trace hook), which
 * allocators are recorded (the registry), and the locked half of a snapshot
 * (a plain-C copy of segments, blocks and rings).
 *
 * Pure C: no <Python.h>. Frame capture and the Python dicts live in
 * csrc/python/hist_*.c; interned tracebacks live in intern.h. Events and
 * blocks carry only interned ids (uint32_t), never object pointers, so
 * nothing is ever released under an allocator lock.
 *
 * Lock order (Note [History locks] in recorder.c):
 *   GIL -> registry lock -> allocator lock -> ring lock.
 * The intern lock is a leaf and is never held across any other lock.
 */
#ifndef GM_HISTORY_HIST_H
#define GM_HISTORY_HIST_H

#include <stddef.h>
#include <stdint.h>

#include "../core/gm_alloc.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GM_HIST_MAX_DEVICES 64

/* enabled= */
enum { GM_HIST_OFF = 0, GM_HIST_STATE = 1, GM_HIST_ALL = 2 };
/* context= ; the levels are torch's RecordContext (NEVER, STATE, ALLOC, ALL) */
enum { GM_HIST_CTX_NEVER = 0, GM_HIST_CTX_STATE = 1, GM_HIST_CTX_ALLOC = 2, GM_HIST_CTX_ALL = 3 };

/* One recorded event. `addr` holds device_free for GM_ACT_OOM; `size`
 * has torch's meaning per action (the core emits torch's values). */
typedef struct gm_hist_event {
    uint64_t addr;
    uint64_t size;
    uint64_t stream;
    uint64_t time_us; /* microseconds since the Unix epoch; in the ring, ticks (clock.h) */
    uint32_t tb;      /* interned traceback id; 0 = no frames attached */
    uint32_t meta;    /* interned user_metadata string id; 0 = "" */
    uint32_t compile; /* interned compile context (torch.compile region); 0 = "N/A" */
    uint8_t action;   /* gm_action_t */
    /* Ring-internal, 0 outside the ring: a free_requested whose
     * free_completed followed at once holds it here (ring.c, Note [Folded
     * frees]). In the struct's padding: the event stays 48 bytes. */
    uint8_t folded[3];
} gm_hist_event_t;

typedef struct gm_hist_config {
    int enabled;          /* GM_HIST_OFF / _STATE / _ALL */
    int context;          /* GM_HIST_CTX_* */
    int stacks_all;       /* 1: also capture C return addresses */
    uint64_t max_entries; /* ring bound; forced to 1 by GM_HIST_STATE; 0 reads as 1 */
    int clear_history;    /* clear the rings when enabling */
    uint32_t skip_mask;   /* bit (1 << action) set: that action is not recorded */
    /* appended: the sampled mode (sample.h; Note [Sampled recording]).
     * sample_mean 0: every allocation's stack is captured. While sampling,
     * frees capture no stack (context 'all' acts as 'alloc'). */
    uint64_t sample_mean;
    uint64_t sample_threshold;
    uint64_t sample_seed;
} gm_hist_config_t;

/* Apply a configuration to every device. Turning recording off clears the
 * rings and removes the hook from every registered allocator (recording
 * costs nothing while off). Call with no allocator lock held. */
int gm_hist_configure(const gm_hist_config_t *cfg);
void gm_hist_get_config(gm_hist_config_t *out);

/* The context level stack capture should honour right now: the configured
 * level while recording, GM_HIST_CTX_NEVER while off. Lock-free. */
int gm_hist_context_level(void);
int gm_hist_stacks_all(void);

/* Register allocator `a` for its device (gm_alloc_device). A later
 * allocator on the same device takes the slot over: the earlier one stops
 * being recorded and that device's ring is cleared; when the later one is
 * detached, the earlier one (if still registered) is recorded again, from an
 * empty ring. `chain`, if not NULL, is
 * a trace hook that keeps receiving every event of `a` (history owns the
 * core's single hook slot from now on). Returns GM_EINVAL for a device
 * outside [0, GM_HIST_MAX_DEVICES) (the chain hook is installed anyway). */
int gm_hist_attach(gm_alloc_t *a, gm_trace_fn chain, void *chain_arg);
/* Unregister `a` (no-op if it is not registered); call before
 * gm_alloc_destroy. The device's history goes with its recorded allocator:
 * its ring is cleared, so traces never outlive the segments they describe,
 * and the allocator registered before it on the device is recorded again. */
void gm_hist_detach(gm_alloc_t *a);

/* Per-thread user_metadata string id (see intern.h for the strings). */
void gm_hist_set_thread_metadata(uint32_t id);
uint32_t gm_hist_thread_metadata(void);
/* Per-thread compile context string id (the innermost torch.compile region
 * the thread runs, torch's pushCompileContext; 0: none), carried by the
 * events the thread causes. */
void gm_hist_set_thread_compile_context(uint32_t id);

/* ---- the locked half of a snapshot ---- */
typedef struct gm_hist_block {
    uint64_t address, size, requested_size;
    uint32_t ctx; /* traceback of the live allocation, 0 = none */
    uint8_t state; /* GM_BLOCK_* */
} gm_hist_block_t;

typedef struct gm_hist_segment {
    int device;
    uint64_t address, total_size, allocated_size, active_size, requested_size, stream;
    uint32_t ctx; /* traceback of the malloc that created the segment */
    uint8_t is_small, is_expandable;
    gm_mempool_id_t pool_id;     /* {0, 0}: the default pools */
    size_t first_block, nblocks; /* range in gm_hist_copy_t.blocks */
} gm_hist_segment_t;

typedef struct gm_hist_copy {
    size_t nseg;
    gm_hist_segment_t *segs; /* by device, then address */
    size_t nblocks;
    gm_hist_block_t *blocks;
    int ndev;                /* device_traces has this many lists */
    size_t nev[GM_HIST_MAX_DEVICES];
    gm_hist_event_t *ev[GM_HIST_MAX_DEVICES]; /* oldest first */
    /* events ever pushed to the device's ring when it was copied: the oldest
     * copied event is number seq_end - nev (gm_hist_seq's numbering) */
    uint64_t seq_end[GM_HIST_MAX_DEVICES];
    int has_settings;
    gm_settings_t settings;  /* of the registered allocator on the lowest device */
} gm_hist_copy_t;

/* Copy every registered allocator's segments and its device's ring, each
 * device consistently (the ring is copied under the same allocator lock as
 * the segment walk), then record a `snapshot` marker per recorded device
 * (after the copy, as torch does). Call with no lock held; the GIL may be
 * released. 0 or GM_ENOMEM. */
int gm_hist_copy(gm_hist_copy_t *out);
void gm_hist_copy_free(gm_hist_copy_t *c);

/* Events pushed so far to device d's ring (never reset, also not by a clear
 * or a takeover): the next event recorded there gets this number. Lets a
 * caller name the point in the history where something happened (gpumem's
 * categories tag allocations so). 0 for a device outside the range. */
uint64_t gm_hist_seq(int device);

/* Bytes held by the rings (allocated chunks and their index). */
size_t gm_hist_ring_bytes(void);

/* ---- C return addresses (cframes.c) ---- */
/* Fill out[] with up to max return addresses of the caller's stack,
 * innermost first, after skipping `skip` innermost frames. */
int gm_cframes_capture(uintptr_t *out, int max, int skip);
/* Load the unwinder now (its first use may dlopen libgcc_s). */
void gm_cframes_warmup(void);
/* Symbolize one return address with dladdr, demangling C++ names when the
 * process has __cxa_demangle. Returns 1 if the function is CPython's eval
 * loop (where a Python frame is spliced in), else 0. */
int gm_cframes_symbolize(uintptr_t addr, char *name, size_t nlen, char *file, size_t flen);

/* ---- local function names from an object's .symtab (elfsyms.c) ---- */
/* The function of the ELF object at path containing offset (relative to its
 * load base): 1 and its name (and its source file, or NULL) in strings that
 * stay valid for the process's life; 0 if none is known. */
int gm_elfsyms_lookup(const char *path, uint64_t offset, const char **name, const char **file);

/* ---- entry points for the torch shim (also reachable through the
 * capsule gpumem._C._hist_api, for code outside this extension) ---- */
#define GM_HIST_API_VERSION 3
/* A TorchScript frame as the torch shim finds it (strings borrowed). */
typedef struct gm_script_frame {
    const char *name;
    const char *filename;
    int32_t line;
} gm_script_frame_t;

typedef struct gm_hist_api {
    int version;
    /* Capture the calling thread's stack for an operation at `level`
     * (GM_HIST_CTX_STATE for malloc, _ALL for free and empty_cache) and
     * return its traceback id, 0 when nothing is captured. Call BEFORE
     * taking any allocator lock, with or without the GIL: it takes the GIL
     * only if the thread has a Python thread state and the interpreter is
     * not finalizing, and never blocks otherwise. */
    uint32_t (*capture)(int level);
    int (*attach)(gm_alloc_t *a, gm_trace_fn chain, void *chain_arg);
    void (*detach)(gm_alloc_t *a);
    int (*context_level)(void);
    void (*set_thread_metadata)(uint32_t id);
    /* appended: capture with `nscript` TorchScript frames (innermost first),
     * which go before the thread's Python frames, as torch records frames
     * for stacks='python' and 'all'. Same rules as capture. */
    uint32_t (*capture_script)(int level, const gm_script_frame_t *script, uint32_t nscript);
    /* appended: torch's C++ history entry points (recordHistory, the user
     * metadata of the calling thread) reach gpumem's history through these */
    int (*configure)(const gm_hist_config_t *cfg);
    void (*get_config)(gm_hist_config_t *out);
    uint32_t (*intern_string)(const char *s, size_t len);
    uint32_t (*thread_metadata)(void);
    int (*string_view)(uint32_t id, const char **s, size_t *len);
    /* appended (version 3): whether an allocation of `size` bytes has its
     * stack captured (1 unless the sampled mode leaves it out); call once
     * per allocation, before capture, with no lock held. Lock-free. */
    int (*sample)(size_t size);
    /* appended (version 3): the locked half of a snapshot, for torch's C++
     * snapshot() (gm_hist_copy, gm_hist_copy_free above) */
    int (*copy)(gm_hist_copy_t *out);
    void (*copy_free)(gm_hist_copy_t *c);
    void (*set_thread_compile_context)(uint32_t id);
} gm_hist_api_t;

#ifdef __cplusplus
}
#endif
#endif /* GM_HISTORY_HIST_H */
