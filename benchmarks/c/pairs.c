/*
 * pairs.c - the core's cost of one malloc+free pair that hits the cache,
 * timed in C on the virtual device (benchmarks/core_alloc.py builds and
 * runs it).
 *
 * Uses only the public API (core/gm_alloc.h, device/vdev.h). With
 * --baseline, core_alloc.py builds each tree's own copy of this file
 * against that tree (before issue 28 the virtual device was device/sim.h,
 * gm_sim_*), so both builds can be compared in one run.
 *
 *   pairs SIZE BATCHES PER_BATCH
 * prints one line per batch: nanoseconds per pair.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/gm_alloc.h"
#include "device/vdev.h"

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int pairs(gm_alloc_t *a, size_t size, long n) {
    for (long i = 0; i < n; i++) {
        uintptr_t p;
        int rc = gm_alloc_malloc(a, size, 0, 0, &p, NULL);
        if (rc == 0)
            rc = gm_alloc_free(a, p, 0);
        if (rc)
            return rc;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s SIZE BATCHES PER_BATCH\n", argv[0]);
        return 2;
    }
    size_t size = (size_t)strtoull(argv[1], NULL, 10);
    long batches = strtol(argv[2], NULL, 10), per_batch = strtol(argv[3], NULL, 10);
    gm_vdev_config_t cfg;
    gm_vdev_config_default(&cfg);
    cfg.capacity = (size_t)8 << 30;
    gm_vdev_t *vdev = NULL;
    gm_alloc_t *a = NULL;
    if (gm_vdev_create(&cfg, &vdev) || gm_alloc_create(gm_vdev_backend(vdev), 0, NULL, &a)) {
        fprintf(stderr, "pairs: could not create the virtual device or the allocator\n");
        return 1;
    }
    int rc = pairs(a, size, 10000); /* warm: the segment is cached */
    for (long b = 0; b < batches && rc == 0; b++) {
        double t0 = now_ns();
        rc = pairs(a, size, per_batch);
        printf("%.3f\n", (now_ns() - t0) / (double)per_batch);
    }
    gm_alloc_destroy(a);
    gm_vdev_destroy(vdev);
    if (rc)
        fprintf(stderr, "pairs: allocator error %d\n", rc);
    return rc ? 1 : 0;
}
