/*
 * format.c - byte counts as text (format.h).
 */
#include "format.h"

#include <stdio.h>

void gm_format_size(size_t bytes, char *buf, size_t buflen) {
    if (bytes <= 1024)
        snprintf(buf, buflen, "%zu bytes", bytes);
    else if (bytes <= ((size_t)1 << 20))
        snprintf(buf, buflen, "%.2f KiB", (double)bytes / 1024.0);
    else if (bytes <= ((size_t)1 << 30))
        snprintf(buf, buflen, "%.2f MiB", (double)bytes / 1048576.0);
    else
        snprintf(buf, buflen, "%.2f GiB", (double)bytes / 1073741824.0);
}
