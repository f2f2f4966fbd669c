/*
 * format.h - byte counts as text, the way c10's format_size writes them in
 * torch's out-of-memory message ("512 bytes", "1.50 KiB", "20.00 MiB",
 * "2.00 GiB"). Base: includes nothing of gpumem's.
 */
#ifndef GM_BASE_FORMAT_H
#define GM_BASE_FORMAT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

void gm_format_size(size_t bytes, char *buf, size_t buflen);

#ifdef __cplusplus
}
#endif
#endif /* GM_BASE_FORMAT_H */
