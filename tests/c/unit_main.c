/*
 * unit_main.c - entry point of the unit-test binary: runs every TEST()
 * linked in (see gmtest.h).
 *
 * Usage: unit [--backend=virtual|cuda] [--expandable] [-l] [name-substring...]
 *             [--skip=substring...]
 *   --backend=cuda  run on the CUDA driver backend over the fake libcuda at
 *                   $GPUMEM_LIBCUDA (also GM_TEST_BACKEND=cuda); default virtual.
 *   --expandable    fixtures opened with default settings use expandable
 *                   segments (tests that pin a mode keep it).
 */
#include <stdio.h>
#include <string.h>

#include "helpers.h"

int main(int argc, char **argv) {
    if (tdev_parse_args(&argc, argv) != 0)
        return 2;
    int j = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--expandable")) {
            fx_expandable_default = 1;
            continue;
        }
        argv[j++] = argv[i];
    }
    argc = j;
    argv[argc] = NULL;
    if (!(argc > 1 && !strcmp(argv[1], "-l")))
        printf("# backend=%s expandable=%d\n", tdev_kind_name(), fx_expandable_default);
    int rc = gmtest_main(argc, argv);
    tdev_shutdown();
    return rc;
}
