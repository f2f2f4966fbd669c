/*
 * simjson.h - a growable string builder for the fakes' JSON reports.
 * Start from a zeroed sim_sb_t; an allocation failure sets oom and makes
 * every later append a no-op.
 */
#ifndef GPUMEM_SIM_JSON_H
#define GPUMEM_SIM_JSON_H

#include <stddef.h>

typedef struct sim_sb {
    char *p;
    size_t n, cap;
    int oom;
} sim_sb_t;

void sim_sb_printf(sim_sb_t *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as a JSON string literal (quoted, escaped). */
void sim_sb_json_str(sim_sb_t *sb, const char *s);
/* snprintf semantics: copies at most len-1 bytes and a NUL into buf,
 * returns the full length, or -1 if building ran out of memory; frees sb. */
int sim_sb_finish(sim_sb_t *sb, char *buf, size_t len);

#endif
