/*
 * gmtest.h - a tiny test framework for gpumem's C tests.
 *
 * TEST(name) { ... } defines a test and registers it (a constructor runs
 * before main). CHECK(cond) and CHECK_EQ(a, b) count a failure, print
 * file:line and carry on; REQUIRE(cond) also ends the current test (use it
 * when later lines would dereference something that does not exist).
 * gmtest_main() runs every test, or those whose names contain one of the
 * command-line arguments (and not matching a --skip=SUBSTR argument), and
 * ends with the line "N passed, M failed"
 * (N and M count tests). It returns non-zero when any test failed.
 * SKIP_IF(cond, reason...) ends a test that cannot apply to this run (the
 * backend or mode); it is reported as "skip NAME: reason", counted in a
 * "# K skipped" line and neither passed nor failed.
 *
 * Must not: allocate in CHECK (tests run under ASan/UBSan and leak checks),
 * or abort on the first failure.
 */
#ifndef GMTEST_H
#define GMTEST_H

#include <stdint.h>

typedef void (*gmtest_fn)(void);

void gmtest_register(const char *name, gmtest_fn fn, const char *file);
void gmtest_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Total failed checks so far in the current test (and in the process). */
long gmtest_failures(void);
int gmtest_main(int argc, char **argv);
/* Marks the current test skipped (printf-style reason); see SKIP_IF. */
void gmtest_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* For programs with their own main (the stress test): names the current
 * phase in failure reports and resets the per-phase report limit. */
void gmtest_begin(const char *name);

#define TEST(name)                                                       \
    static void name(void);                                              \
    __attribute__((constructor)) static void gmtest_reg_##name(void) {   \
        gmtest_register(#name, name, __FILE__);                          \
    }                                                                    \
    static void name(void)

#define CHECK(cond)                                                      \
    do {                                                                 \
        if (!(cond))                                                     \
            gmtest_fail(__FILE__, __LINE__, "CHECK(%s)", #cond);         \
    } while (0)

#define CHECK_MSG(cond, ...)                                             \
    do {                                                                 \
        if (!(cond))                                                     \
            gmtest_fail(__FILE__, __LINE__, __VA_ARGS__);                \
    } while (0)

/* Compares as unsigned 64-bit integers (sizes, addresses, counters, and
 * negative error codes all compare exactly); prints both as signed too. */
#define CHECK_EQ(a, b)                                                   \
    do {                                                                 \
        unsigned long long gmt_a_ = (unsigned long long)(a);             \
        unsigned long long gmt_b_ = (unsigned long long)(b);             \
        if (gmt_a_ != gmt_b_)                                            \
            gmtest_fail(__FILE__, __LINE__,                              \
                        "CHECK_EQ(%s, %s): %lld (0x%llx) != %lld (0x%llx)", \
                        #a, #b, (long long)gmt_a_, gmt_a_, (long long)gmt_b_, \
                        gmt_b_);                                         \
    } while (0)

#define CHECK_NE(a, b)                                                   \
    do {                                                                 \
        unsigned long long gmt_a_ = (unsigned long long)(a);             \
        unsigned long long gmt_b_ = (unsigned long long)(b);             \
        if (gmt_a_ == gmt_b_)                                            \
            gmtest_fail(__FILE__, __LINE__, "CHECK_NE(%s, %s): both %lld", \
                        #a, #b, (long long)gmt_a_);                      \
    } while (0)

/* Signed comparisons: a OP b. */
#define GMT_CMP_(a, op, b)                                               \
    do {                                                                 \
        long long gmt_a_ = (long long)(a);                               \
        long long gmt_b_ = (long long)(b);                               \
        if (!(gmt_a_ op gmt_b_))                                         \
            gmtest_fail(__FILE__, __LINE__, "CHECK(%s %s %s): %lld vs %lld", \
                        #a, #op, #b, gmt_a_, gmt_b_);                    \
    } while (0)
#define CHECK_LE(a, b) GMT_CMP_(a, <=, b)
#define CHECK_LT(a, b) GMT_CMP_(a, <, b)
#define CHECK_GE(a, b) GMT_CMP_(a, >=, b)
#define CHECK_GT(a, b) GMT_CMP_(a, >, b)

#define CHECK_STR(a, b)                                                  \
    do {                                                                 \
        const char *gmt_a_ = (a), *gmt_b_ = (b);                         \
        if (!gmtest_streq_(gmt_a_, gmt_b_))                              \
            gmtest_fail(__FILE__, __LINE__, "CHECK_STR(%s, %s): \"%s\" != \"%s\"", \
                        #a, #b, gmt_a_ ? gmt_a_ : "(null)",              \
                        gmt_b_ ? gmt_b_ : "(null)");                     \
    } while (0)

/* Ends the current test, reported as skipped, when cond is true. */
#define SKIP_IF(cond, ...)                                               \
    do {                                                                 \
        if (cond) {                                                      \
            gmtest_skip(__VA_ARGS__);                                    \
            return;                                                      \
        }                                                                \
    } while (0)

/* Ends the current test when cond is false. */
#define REQUIRE(cond)                                                    \
    do {                                                                 \
        if (!(cond)) {                                                   \
            gmtest_fail(__FILE__, __LINE__, "REQUIRE(%s)", #cond);       \
            return;                                                      \
        }                                                                \
    } while (0)

int gmtest_streq_(const char *a, const char *b);

#endif /* GMTEST_H */
