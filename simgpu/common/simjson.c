/*
 * simjson.c - the growable string builder the fakes write their JSON
 * reports with. Shared by the fake driver and the libraries built on it
 * (each links its own hidden copy).
 */
#include "simjson.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sim_sb_printf(sim_sb_t *sb, const char *fmt, ...)
{
    if (sb->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(sb->p ? sb->p + sb->n : NULL, sb->p ? sb->cap - sb->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            sb->oom = 1;
            return;
        }
        if (sb->p && sb->n + (size_t)k < sb->cap) {
            sb->n += (size_t)k;
            return;
        }
        size_t cap = sb->cap ? sb->cap : 4096;
        while (cap <= sb->n + (size_t)k)
            cap *= 2;
        char *p = realloc(sb->p, cap);
        if (!p) {
            sb->oom = 1;
            return;
        }
        sb->p = p;
        sb->cap = cap;
    }
}

void sim_sb_json_str(sim_sb_t *sb, const char *s)
{
    sim_sb_printf(sb, "\"");
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            sim_sb_printf(sb, "\\%c", ch);
        else if (ch < 0x20)
            sim_sb_printf(sb, "\\u%04x", ch);
        else
            sim_sb_printf(sb, "%c", ch);
    }
    sim_sb_printf(sb, "\"");
}

int sim_sb_finish(sim_sb_t *sb, char *buf, size_t len)
{
    int ret = -1;
    if (!sb->oom && sb->p) {
        if (buf && len > 0) {
            size_t k = sb->n < len - 1 ? sb->n : len - 1;
            memcpy(buf, sb->p, k);
            buf[k] = '\0';
        }
        ret = (int)sb->n;
    }
    free(sb->p);
    sb->p = NULL;
    sb->n = sb->cap = 0;
    return ret;
}
