/*
 * fakecuda_image.c - reads the kernels and their attributes out of a module
 * image: a cubin (an ELF file, as ptxas writes it), a fatbin holding cubins
 * and PTX, or PTX text (fakecuda_ptx.c). Used by cuModuleLoad* (Note
 * [Module images]).
 *
 * Invariants: nothing is read outside the extent the ELF or fatbin headers
 * declare (an image whose tables point outside it is rejected); on error
 * nothing is left allocated.
 *
 * Must not: take the driver lock or touch driver state (pure parsing).
 */
#include "fakecuda_internal.h"
#include "fakecuda_image.h"

#include <stdlib.h>
#include <string.h>

/*
 * Note [Module images]
 * Rationale: Triton, Inductor's static launcher and torch's NVRTC path hand
 *   the driver a cubin (or PTX) and then ask for the kernel's registers,
 *   spills, shared memory and maximum block size, and launch it within
 *   those limits. Those numbers are in the image; reading them makes the
 *   attributes and the launch checks those of the real kernel.
 * Approach: a cubin is a 64-bit little-endian ELF with e_machine EM_CUDA
 *   (190). Observed in the cubins of ptxas 13.0 for sm_80/89/90/90a (ELF ABI
 *   version 7), checked against NVIDIA's cuobjdump -elf / -res-usage:
 *   e_flags bits 0-7 are the SM (0x5a = sm_90) and bit 11 (0x800) marks an
 *   arch-specific target (sm_90a). Kernels are the FUNC symbols with
 *   st_other bit 0x10 (entry). Attributes come from the ".nv.info" section
 *   (records: u8 format, u8 attribute; format 4 = u16 size + that many
 *   bytes, 3 = a u16 value, 1 and 2 = 2 bytes): EIATTR_REGCOUNT (0x2f,
 *   {u32 symbol, u32 registers}), EIATTR_FRAME_SIZE (0x11, {symbol, bytes}:
 *   the local memory per thread); and from ".nv.info.<kernel>":
 *   EIATTR_MAX_THREADS (0x05, .maxntid x,y,z), EIATTR_REQNTID (0x10,
 *   .reqntid), EIATTR_CBANK_PARAM_SIZE (0x19, parameter bytes). Static
 *   shared memory is the size of ".nv.shared.<kernel>" (what cuobjdump
 *   -res-usage prints as SHARED), less 1 KiB when the cubin has a
 *   ".nv.shared.reserved.0" section (ptxas 13.0 for sm_90: the section
 *   then starts with the system-reserved 1 KiB, so it is 1 KiB more than
 *   the "bytes smem" ptxas -v reports; a public report of a real driver
 *   shows CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES 0 for a kernel whose section
 *   is exactly that 1 KiB); user constant memory is the size of
 *   ".nv.constant3".
 *   A fatbin starts with magic 0xba55ed50, u16 version, u16 header size, u64
 *   payload size; each entry: u16 kind (1 PTX, 2 ELF), u16, u32 header
 *   size, u64 payload size, ..., at 28 u32 SM, at 56 u64 uncompressed size
 *   (non-zero: compressed). Observed in files NVIDIA's fatbinary 13.0
 *   wrote. A __fatBinC_Wrapper_t (magic 0x466243b1, fatbinary_section.h) is
 *   followed to its data.
 * Limitations: compressed fatbin entries are skipped (no decompressor);
 *   cluster dimensions recorded in a cubin are not read (PTX's are);
 *   relocatable cubins (ET_REL) are treated like executable ones; without
 *   a length (cuModuleLoadData) the extent the headers declare is trusted,
 *   as the real driver must.
 */

#define EM_CUDA 190
#define STO_CUDA_ENTRY 0x10
#define EF_CUDA_ARCH_SPECIFIC 0x800
#define FATBIN_MAGIC 0xba55ed50u
#define FATBINC_WRAPPER_MAGIC 0x466243b1u

enum { EIATTR_MAX_THREADS = 0x05, EIATTR_REQNTID = 0x10, EIATTR_FRAME_SIZE = 0x11,
       EIATTR_CBANK_PARAM_SIZE = 0x19, EIATTR_REGCOUNT = 0x2f };

static uint16_t rd16(const unsigned char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t rd32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t rd64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

void fc_image_free(fc_image_t *im)
{
    for (int i = 0; i < im->nkernels; i++)
        free(im->k[i].name);
    free(im->k);
    memset(im, 0, sizeof *im);
}

fc_kinfo_t *fc_image_add_kernel(fc_image_t *im, const char *name, size_t len)
{
    fc_kinfo_t *nk = realloc(im->k, (size_t)(im->nkernels + 1) * sizeof *nk);
    if (!nk)
        return NULL;
    im->k = nk;
    fc_kinfo_t *k = &nk[im->nkernels];
    memset(k, 0, sizeof *k);
    if (!(k->name = strndup(name, len)))
        return NULL;
    im->nkernels++;
    return k;
}

/* ---- ELF ---- */
typedef struct {
    const unsigned char *b;
    uint64_t size;              /* the extent the headers declare */
    uint64_t shoff;
    unsigned shnum, shentsize;
    const unsigned char *shstr;
    uint64_t shstr_size;
} elf_t;

static const unsigned char *sh(const elf_t *e, unsigned i) { return e->b + e->shoff + (uint64_t)i * e->shentsize; }
static uint64_t sh_off(const elf_t *e, unsigned i) { return rd64(sh(e, i) + 24); }
static uint64_t sh_size(const elf_t *e, unsigned i) { return rd64(sh(e, i) + 32); }
static uint32_t sh_type(const elf_t *e, unsigned i) { return rd32(sh(e, i) + 4); }

static const char *sh_name(const elf_t *e, unsigned i)
{
    uint32_t n = rd32(sh(e, i));
    if (n >= e->shstr_size)
        return "";
    return (const char *)e->shstr + n;
}

static int find_section(const elf_t *e, const char *prefix, const char *name)
{
    size_t pl = strlen(prefix);
    for (unsigned i = 1; i < e->shnum; i++) {
        const char *n = sh_name(e, i);
        if (!strncmp(n, prefix, pl) && !strcmp(n + pl, name))
            return (int)i;
    }
    return -1;
}

/* Header and section table checked; e->size the extent they declare. */
static int elf_open(const unsigned char *b, size_t len, elf_t *e)
{
    if (b[4] != 2 || b[5] != 1 || rd16(b + 18) != EM_CUDA)
        return CUDA_ERROR_INVALID_IMAGE; /* not ELF64 LE for CUDA */
    uint64_t phoff = rd64(b + 32);
    e->b = b;
    e->shoff = rd64(b + 40);
    e->shentsize = rd16(b + 58);
    e->shnum = rd16(b + 60);
    unsigned phnum = rd16(b + 56), phentsize = rd16(b + 54), shstrndx = rd16(b + 62);
    if (e->shentsize < 64 || e->shnum == 0 || shstrndx >= e->shnum || e->shoff < 64 ||
        e->shoff > (1ull << 32))
        return CUDA_ERROR_INVALID_IMAGE;
    e->size = e->shoff + (uint64_t)e->shnum * e->shentsize;
    if (phnum && phoff + (uint64_t)phnum * phentsize > e->size)
        e->size = phoff + (uint64_t)phnum * phentsize;
    if (len && e->size > len)
        return CUDA_ERROR_INVALID_IMAGE;
    for (unsigned i = 1; i < e->shnum; i++) { /* every section within the extent */
        uint64_t off = sh_off(e, i), size = sh_size(e, i);
        if (off > (1ull << 32) || size > (1ull << 32))
            return CUDA_ERROR_INVALID_IMAGE;
        if (sh_type(e, i) != 8 /* SHT_NOBITS */ && off + size > e->size)
            e->size = off + size;
    }
    if (len && e->size > len)
        return CUDA_ERROR_INVALID_IMAGE;
    e->shstr = b + sh_off(e, shstrndx);
    e->shstr_size = sh_size(e, shstrndx);
    if (e->shstr_size == 0 || e->shstr[e->shstr_size - 1] != 0)
        return CUDA_ERROR_INVALID_IMAGE;
    return 0;
}

/* Walk the records of an .nv.info section; for each, fn(attr, value, size). */
typedef void (*rec_fn)(void *ctx, int attr, const unsigned char *val, unsigned size);

static int walk_info(const elf_t *e, int sec, rec_fn fn, void *ctx)
{
    const unsigned char *p = e->b + sh_off(e, (unsigned)sec);
    uint64_t n = sh_size(e, (unsigned)sec), i = 0;
    while (i + 4 <= n) {
        int fmt = p[i], attr = p[i + 1];
        if (fmt == 4) {
            unsigned sz = rd16(p + i + 2);
            if (i + 4 + sz > n)
                return CUDA_ERROR_INVALID_IMAGE;
            fn(ctx, attr, p + i + 4, sz);
            i += 4 + sz;
        } else if (fmt >= 1 && fmt <= 3) {
            fn(ctx, attr, p + i + 2, 2);
            i += 4;
        } else {
            return CUDA_ERROR_INVALID_IMAGE;
        }
    }
    return 0;
}

typedef struct {
    fc_kinfo_t *k;
    uint32_t sym;
} info_ctx_t;

static void global_rec(void *c, int attr, const unsigned char *v, unsigned size)
{
    info_ctx_t *x = c;
    if (size != 8 || rd32(v) != x->sym)
        return;
    if (attr == EIATTR_REGCOUNT)
        x->k->regs = (int)rd32(v + 4);
    else if (attr == EIATTR_FRAME_SIZE)
        x->k->local_bytes = (int)rd32(v + 4);
}

static int product3(const unsigned char *v, unsigned size)
{
    if (size != 12)
        return 0;
    uint64_t p = (uint64_t)rd32(v) * rd32(v + 4) * rd32(v + 8);
    return p > 1u << 30 ? 1 << 30 : (int)p;
}

static void kernel_rec(void *c, int attr, const unsigned char *v, unsigned size)
{
    info_ctx_t *x = c;
    if (attr == EIATTR_MAX_THREADS)
        x->k->max_threads = product3(v, size);
    else if (attr == EIATTR_REQNTID)
        x->k->req_threads = product3(v, size);
    else if (attr == EIATTR_CBANK_PARAM_SIZE && size == 2)
        x->k->param_bytes = rd16(v);
}

static int sec_size(const elf_t *e, const char *prefix, const char *name)
{
    int s = find_section(e, prefix, name);
    return s < 0 ? 0 : (int)sh_size(e, (unsigned)s);
}

static int cubin_parse(const unsigned char *b, size_t len, int cc_major, int cc_minor,
                       fc_image_t *out)
{
    elf_t e;
    int rc = elf_open(b, len, &e);
    if (rc)
        return rc;
    uint32_t flags = rd32(b + 48);
    out->kind = FC_IMG_CUBIN;
    out->sm = (int)(flags & 0xff);
    out->arch_specific = !!(flags & EF_CUDA_ARCH_SPECIFIC);
    out->ptx_version = (int)((flags >> 16) & 0xff);
    /* binary compatibility: same major, minor not above the device's;
     * arch-specific code only on exactly its compute capability */
    if (out->sm / 10 != cc_major || out->sm % 10 > cc_minor ||
        (out->arch_specific && out->sm % 10 != cc_minor))
        return CUDA_ERROR_NO_BINARY_FOR_GPU;
    int symtab = -1, info = find_section(&e, ".nv.info", "");
    for (unsigned i = 1; i < e.shnum; i++)
        if (sh_type(&e, i) == 2 /* SHT_SYMTAB */)
            symtab = (int)i;
    if (symtab < 0)
        return 0; /* no symbols: a module without kernels */
    unsigned strsec = rd32(sh(&e, (unsigned)symtab) + 40);
    if (strsec >= e.shnum)
        return CUDA_ERROR_INVALID_IMAGE;
    const char *str = (const char *)b + sh_off(&e, strsec);
    uint64_t strsize = sh_size(&e, strsec), nsym = sh_size(&e, (unsigned)symtab) / 24;
    if (strsize == 0 || str[strsize - 1] != 0)
        return CUDA_ERROR_INVALID_IMAGE;
    const unsigned char *syms = b + sh_off(&e, (unsigned)symtab);
    int user_const = sec_size(&e, ".nv.constant3", "");
    /* sm_90 cubins put the system-reserved shared memory (1 KiB) at the
     * start of each kernel's shared section; the driver's static size
     * leaves it out (Note [Module images]) */
    int reserved = find_section(&e, ".nv.shared.reserved.", "0") >= 0 ? 1024 : 0;
    for (uint64_t s = 1; s < nsym; s++) {
        const unsigned char *sym = syms + s * 24;
        uint32_t name = rd32(sym);
        if ((sym[4] & 0xf) != 2 /* STT_FUNC */ || !(sym[5] & STO_CUDA_ENTRY) || name >= strsize)
            continue;
        const char *kname = str + name;
        fc_kinfo_t *k = fc_image_add_kernel(out, kname, strlen(kname));
        if (!k)
            return CUDA_ERROR_OUT_OF_MEMORY;
        info_ctx_t x = {k, (uint32_t)s};
        if (info >= 0 && (rc = walk_info(&e, info, global_rec, &x)))
            return rc;
        int kinfo = find_section(&e, ".nv.info.", k->name);
        if (kinfo >= 0 && (rc = walk_info(&e, kinfo, kernel_rec, &x)))
            return rc;
        int sh = sec_size(&e, ".nv.shared.", k->name);
        k->shared_bytes = sh > reserved ? sh - reserved : 0;
        k->const_bytes = user_const;
    }
    return 0;
}

/* ---- fatbin: the best entry this device can run ---- */
static int fatbin_parse(const unsigned char *b, size_t len, int cc_major, int cc_minor,
                        fc_image_t *out)
{
    uint64_t hsize = rd16(b + 6), total = hsize + rd64(b + 8);
    if (hsize < 16 || (len && total > len))
        return CUDA_ERROR_INVALID_IMAGE;
    const unsigned char *best = NULL;
    int best_kind = 0, best_sm = -1, compressed = 0;
    uint64_t best_size = 0;
    for (uint64_t off = hsize; off + 64 <= total;) {
        const unsigned char *h = b + off;
        uint32_t ehs = rd32(h + 4);
        uint64_t esize = rd64(h + 8);
        if (ehs < 64 || off + ehs + esize > total)
            return CUDA_ERROR_INVALID_IMAGE;
        int kind = rd16(h), sm = (int)rd32(h + 28);
        if (rd64(h + 56) != 0) {
            compressed = 1; /* Note [Module images]: Limitations */
        } else if ((kind == 2 && sm / 10 == cc_major && sm % 10 <= cc_minor) ||
                   (kind == 1 && sm <= cc_major * 10 + cc_minor)) {
            /* prefer a cubin, then the highest SM */
            if (!best || (kind == 2 && best_kind == 1) || (kind == best_kind && sm > best_sm)) {
                best = h + ehs, best_kind = kind, best_sm = sm, best_size = esize;
            }
        }
        off += ehs + esize;
    }
    if (!best)
        return compressed ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_NO_BINARY_FOR_GPU;
    if (best_kind == 2)
        return cubin_parse(best, best_size, cc_major, cc_minor, out);
    char *text = malloc(best_size + 1);
    if (!text)
        return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(text, best, best_size);
    text[best_size] = 0;
    int rc = fc_ptx_parse(text, cc_major, cc_minor, out);
    free(text);
    return rc;
}

int fc_image_parse(const void *image, size_t len, int cc_major, int cc_minor, fc_image_t *out)
{
    const unsigned char *b = image;
    memset(out, 0, sizeof *out);
    if (len && len < 16)
        return CUDA_ERROR_INVALID_IMAGE;
    int rc;
    if (rd32(b) == FATBINC_WRAPPER_MAGIC) {
        const unsigned char *data;
        memcpy(&data, b + 8, sizeof data);
        if (!data)
            return CUDA_ERROR_INVALID_IMAGE;
        b = data, len = 0;
    }
    if (!memcmp(b, "\177ELF", 4))
        rc = (len && len < 64) ? CUDA_ERROR_INVALID_IMAGE : cubin_parse(b, len, cc_major, cc_minor, out);
    else if (rd32(b) == FATBIN_MAGIC)
        rc = fatbin_parse(b, len, cc_major, cc_minor, out);
    else if (len && memchr(b, 0, len) == NULL)
        rc = CUDA_ERROR_INVALID_IMAGE; /* text must be NUL-terminated */
    else
        rc = fc_ptx_parse((const char *)b, cc_major, cc_minor, out);
    if (rc)
        fc_image_free(out);
    return rc;
}
