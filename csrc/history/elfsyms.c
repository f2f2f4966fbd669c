/*
 * elfsyms.c - names for addresses in a shared object's local functions, read
 * from its ELF symbol table (.symtab), for C frames dladdr cannot name.
 *
 * gpumem._C and the torch shim are built with -fvisibility=hidden, so their
 * functions are not in .dynsym and dladdr names none of them (their frames
 * read "?? (+0x15a7f)"), while torch names its allocator's own frames.  The
 * file's .symtab (kept unless the object is stripped) has them all, each
 * after an STT_FILE entry naming its source file.
 * Invariants: each file is read at most once per process (a table, possibly
 * empty, is cached for it); cached tables are never freed or changed, so the
 * strings handed out stay valid.  Only 64-bit little-endian ELF is read.
 * Must not: allocate Python objects, take locks other than its own mutex
 * (libc's), or read more than the section headers and one symbol table.
 */
#include <elf.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hist.h"

enum { MAX_FILES = 16, MAX_TABLE_BYTES = 64 << 20 };

typedef struct {
    uint64_t lo, hi;       /* [lo, hi): the function's bytes, file-relative */
    uint32_t name, file;   /* offsets into strtab; file 0: none */
} sym_t;

typedef struct {
    char *path;
    char *strtab;
    size_t strsz;
    sym_t *syms;
    size_t n;
} table_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static table_t files[MAX_FILES]; /* protected by: mu; entries immutable once filled */
static int nfiles;               /* protected by: mu */

static void *read_at(int fd, uint64_t off, uint64_t len) {
    if (len == 0 || len > MAX_TABLE_BYTES)
        return NULL;
    char *buf = malloc(len);
    uint64_t got = 0;
    while (buf && got < len) {
        ssize_t r = pread(fd, buf + got, len - got, (off_t)(off + got));
        if (r <= 0) {
            free(buf);
            return NULL;
        }
        got += (uint64_t)r;
    }
    return buf;
}

static int by_lo(const void *a, const void *b) {
    uint64_t x = ((const sym_t *)a)->lo, y = ((const sym_t *)b)->lo;
    return x < y ? -1 : x > y;
}

/* Fill t with the FUNC symbols of path's .symtab; t stays empty on any failure. */
static void load(table_t *t, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    Elf64_Ehdr eh;
    Elf64_Shdr *sh = NULL;
    Elf64_Sym *st = NULL;
    if (pread(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh || memcmp(eh.e_ident, ELFMAG, SELFMAG) ||
        eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB ||
        eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0)
        goto done;
    sh = read_at(fd, eh.e_shoff, (uint64_t)eh.e_shnum * sizeof *sh);
    if (!sh)
        goto done;
    for (unsigned i = 0; i < eh.e_shnum; i++) {
        if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh.e_shnum)
            continue;
        const Elf64_Shdr *ss = &sh[sh[i].sh_link];
        size_t count = sh[i].sh_size / sizeof *st;
        st = read_at(fd, sh[i].sh_offset, count * sizeof *st);
        t->strtab = read_at(fd, ss->sh_offset, ss->sh_size);
        t->syms = st && t->strtab ? malloc((count ? count : 1) * sizeof *t->syms) : NULL;
        if (!t->syms || t->strtab[ss->sh_size - 1] != 0) {
            free(t->strtab);
            free(t->syms);
            t->strtab = NULL;
            t->syms = NULL;
            goto done;
        }
        t->strsz = ss->sh_size;
        uint32_t file = 0;
        for (size_t k = 0; k < count; k++) {
            int type = ELF64_ST_TYPE(st[k].st_info);
            if (st[k].st_name >= t->strsz)
                continue;
            if (type == STT_FILE)
                file = st[k].st_name;
            else if (type == STT_FUNC && st[k].st_size && st[k].st_shndx != SHN_UNDEF)
                t->syms[t->n++] = (sym_t){st[k].st_value, st[k].st_value + st[k].st_size,
                                          st[k].st_name,
                                          ELF64_ST_BIND(st[k].st_info) == STB_LOCAL ? file : 0};
        }
        qsort(t->syms, t->n, sizeof *t->syms, by_lo);
        break;
    }
done:
    free(st);
    free(sh);
    close(fd);
}

static const table_t *table_for_unlocked(const char *path) {
    for (int i = 0; i < nfiles; i++)
        if (strcmp(files[i].path, path) == 0)
            return &files[i];
    if (nfiles == MAX_FILES)
        return NULL;
    table_t *t = &files[nfiles];
    memset(t, 0, sizeof *t);
    t->path = strdup(path);
    if (!t->path)
        return NULL;
    load(t, path);
    nfiles++;
    return t;
}

int gm_elfsyms_lookup(const char *path, uint64_t offset, const char **name, const char **file) {
    pthread_mutex_lock(&mu);
    const table_t *t = table_for_unlocked(path);
    pthread_mutex_unlock(&mu);
    if (!t || !t->n)
        return 0;
    size_t lo = 0, hi = t->n; /* the last symbol starting at or before offset */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (t->syms[mid].lo <= offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0 || offset >= t->syms[lo - 1].hi)
        return 0;
    const sym_t *s = &t->syms[lo - 1];
    *name = t->strtab + s->name;
    *file = s->file ? t->strtab + s->file : NULL;
    return 1;
}
