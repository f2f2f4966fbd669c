/*
 * gmtest.c - registry and runner for the tests declared with TEST().
 *
 * Tests run in registration order, which is link order and then source
 * order. A test passes when it records no failed check. The runner prints
 * "ok name" or "FAIL name" per test and the closing line "N passed, M
 * failed" (a test that called gmtest_skip prints "skip name: reason" and
 * counts in neither; a "# K skipped" line precedes the closing line).
 * Usage: prog [-l] [substring...] [--skip=substring...]
 * (-l lists the tests; plain substrings select, --skip= ones exclude).
 */
#include "gmtest.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define GMTEST_MAX 512
#define GMTEST_MAX_REPORTS 50 /* per test; the count stays exact */

typedef struct {
    const char *name;
    const char *file;
    gmtest_fn fn;
} gmtest_entry;

static gmtest_entry tests[GMTEST_MAX];
static int ntests;
static long failures_total;
static long failures_in_test;
static const char *current_test = "(none)";
static int skipped_in_test;
static char skip_reason[256];

void gmtest_register(const char *name, gmtest_fn fn, const char *file) {
    if (ntests >= GMTEST_MAX) {
        fprintf(stderr, "gmtest: too many tests (max %d)\n", GMTEST_MAX);
        return;
    }
    tests[ntests].name = name;
    tests[ntests].file = file;
    tests[ntests].fn = fn;
    ntests++;
}

void gmtest_fail(const char *file, int line, const char *fmt, ...) {
    failures_total++;
    failures_in_test++;
    if (failures_in_test > GMTEST_MAX_REPORTS) {
        if (failures_in_test == GMTEST_MAX_REPORTS + 1)
            printf("%s:%d: [%s] more failures not shown\n", file, line, current_test);
        return;
    }
    printf("%s:%d: [%s] failed: ", file, line, current_test);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

long gmtest_failures(void) { return failures_total; }

void gmtest_skip(const char *fmt, ...) {
    skipped_in_test = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(skip_reason, sizeof skip_reason, fmt, ap);
    va_end(ap);
}

void gmtest_begin(const char *name) {
    current_test = name;
    failures_in_test = 0;
}

int gmtest_streq_(const char *a, const char *b) {
    if (!a || !b)
        return a == b;
    return strcmp(a, b) == 0;
}

/* Arguments are name substrings: plain ones select tests (all when there
 * are none), "--skip=SUBSTR" ones exclude tests. */
static int selected(const char *name, int argc, char **argv, int first) {
    int any_include = 0, included = 0;
    for (int i = first; i < argc; i++) {
        if (strncmp(argv[i], "--skip=", 7) == 0) {
            if (strstr(name, argv[i] + 7))
                return 0;
            continue;
        }
        any_include = 1;
        if (strstr(name, argv[i]))
            included = 1;
    }
    return !any_include || included;
}

int gmtest_main(int argc, char **argv) {
    int first = 1;
    if (argc > 1 && strcmp(argv[1], "-l") == 0) {
        for (int i = 0; i < ntests; i++)
            printf("%s (%s)\n", tests[i].name, tests[i].file);
        return 0;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    int passed = 0, failed = 0, skipped = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < ntests; i++) {
        if (!selected(tests[i].name, argc, argv, first))
            continue;
        current_test = tests[i].name;
        failures_in_test = 0;
        skipped_in_test = 0;
        tests[i].fn();
        if (failures_in_test == 0 && skipped_in_test) {
            skipped++;
            printf("skip %s: %s\n", tests[i].name, skip_reason);
        } else if (failures_in_test == 0) {
            passed++;
            printf("ok   %s\n", tests[i].name);
        } else {
            failed++;
            printf("FAIL %s (%ld failed checks)\n", tests[i].name, failures_in_test);
        }
        current_test = "(none)";
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("# %d tests in %.2f s\n", passed + failed + skipped, secs);
    printf("# %d skipped\n", skipped);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
