/*
 * cfi.c - the unwind rule of one x86-64 code address, read from the
 * .eh_frame of the object that holds it (cunwind.h).
 *
 * The object is found with dl_iterate_phdr, its FDE by a binary search of
 * the table in .eh_frame_hdr (PT_GNU_EH_FRAME), and the rule by running the
 * CIE's and the FDE's call-frame instructions up to the address, as the
 * DWARF standard (section 6.4) and the x86-64 psABI define them. Only what
 * a walk of return addresses needs is kept: how to find the CFA, where the
 * return address and the caller's rbp are saved.
 * Invariants: reads only the loaded objects' unwind sections; writes only
 * *out. Anything outside the subset kept (an expression other than the
 * stack-realignment one, a CFA in another register, a table encoding other
 * than the usual one) yields GM_CFI_SLOW, never a guess.
 * Must not: allocate, take locks other than the loader's (dl_iterate_phdr),
 * or touch Python.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dl_iterate_phdr */
#endif
#include <link.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cunwind.h"

#if GM_CUNWIND_SUPPORTED

enum { REG_RBP = 6, REG_RSP = 7, REG_RA = 16 };
enum { HOW_SAME, HOW_OFFSET, HOW_UNDEF, HOW_OTHER };

typedef struct {
    uint8_t cfa_kind; /* GM_CFA_REG, GM_CFA_DEREF, or 0: unsupported */
    uint8_t cfa_reg;
    int64_t cfa_off;
    uint8_t rbp_how, ra_how;
    int64_t rbp_off, ra_off;
} state_t;

typedef struct {
    const uint8_t *p, *end;
    int bad;
} cursor_t;

static uint64_t rd_fixed(cursor_t *c, int n) {
    if (c->bad || c->end - c->p < n) {
        c->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    memcpy(&v, c->p, (size_t)n); /* little-endian */
    c->p += n;
    return v;
}

static uint64_t rd_uleb(cursor_t *c) {
    uint64_t v = 0;
    for (int shift = 0; !c->bad; shift += 7) {
        if (c->p >= c->end || shift > 63) {
            c->bad = 1;
            break;
        }
        uint8_t b = *c->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            break;
    }
    return v;
}

static int64_t rd_sleb(cursor_t *c) {
    int64_t v = 0;
    int shift = 0;
    uint8_t b = 0x80;
    while (!c->bad && (b & 0x80)) {
        if (c->p >= c->end || shift > 63) {
            c->bad = 1;
            return 0;
        }
        b = *c->p++;
        v |= (int64_t)(b & 0x7f) << shift;
        shift += 7;
    }
    if (shift < 64 && (b & 0x40))
        v |= -((int64_t)1 << shift);
    return v;
}

/* A DW_EH_PE-encoded pointer; absolute, pc-relative and data-relative
 * (base `data`) only; indirect ones are not followed. */
static uintptr_t rd_enc(cursor_t *c, uint8_t enc, uintptr_t data) {
    const uint8_t *at = c->p;
    uint64_t v;
    switch (enc & 0x0f) {
    case 0x00: v = rd_fixed(c, 8); break;
    case 0x01: v = rd_uleb(c); break;
    case 0x02: v = rd_fixed(c, 2); break;
    case 0x03: v = rd_fixed(c, 4); break;
    case 0x04: v = rd_fixed(c, 8); break;
    case 0x09: v = (uint64_t)rd_sleb(c); break;
    case 0x0a: v = (uint64_t)(int64_t)(int16_t)rd_fixed(c, 2); break;
    case 0x0b: v = (uint64_t)(int64_t)(int32_t)rd_fixed(c, 4); break;
    case 0x0c: v = rd_fixed(c, 8); break;
    default: c->bad = 1; return 0;
    }
    switch (enc & 0x70) {
    case 0x00: break;
    case 0x10: v += (uintptr_t)at; break;
    case 0x30: v += data; break;
    default: c->bad = 1; return 0;
    }
    return (uintptr_t)v;
}

/* ---------------------------------------------------- finding the FDE */

typedef struct {
    uintptr_t pc;
    const uint8_t *hdr; /* the object's .eh_frame_hdr, NULL if none */
    int found;          /* pc lies in a loaded object */
} find_t;

static int find_object(struct dl_phdr_info *info, size_t size, void *arg) {
    find_t *f = arg;
    const ElfW(Phdr) *eh = NULL;
    int inside = 0;
    for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && f->pc >= lo && f->pc < lo + ph->p_memsz)
            inside = 1;
        else if (ph->p_type == PT_GNU_EH_FRAME)
            eh = ph;
    }
    if (!inside)
        return 0;
    f->found = 1;
    f->hdr = eh ? (const uint8_t *)(info->dlpi_addr + eh->p_vaddr) : NULL;
    return 1;
}

/* The FDE covering pc in the sorted table of .eh_frame_hdr, or NULL. */
static const uint8_t *search_table(const uint8_t *hdr, uintptr_t pc, int *slow) {
    if (hdr[0] != 1 || hdr[3] != 0x3b) { /* version 1, datarel sdata4 entries */
        *slow = 1;
        return NULL;
    }
    cursor_t c = {hdr + 4, hdr + 4 + 16, 0};
    rd_enc(&c, hdr[1], (uintptr_t)hdr); /* eh_frame_ptr */
    uint64_t count = rd_enc(&c, hdr[2], (uintptr_t)hdr);
    if (c.bad) {
        *slow = 1;
        return NULL;
    }
    const int32_t *table = (const int32_t *)c.p;
    uint64_t lo = 0, hi = count;
    while (lo < hi) { /* the last entry with initial location <= pc */
        uint64_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)hdr + table[2 * mid] <= pc)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo ? hdr + table[2 * (lo - 1) + 1] : NULL;
}

/* ----------------------------------------------------- the instructions */

/* Run call-frame instructions [c) on st, for a pc at `target`, from
 * location *loc; `init` is the state DW_CFA_restore goes back to. Returns
 * 0, or -1 on anything unsupported. */
static int run(cursor_t *c, state_t *st, const state_t *init, uintptr_t *loc, uintptr_t target,
               uint64_t code_align, int64_t data_align) {
    state_t saved[8];
    int nsaved = 0;
    while (c->p < c->end && !c->bad) {
        uint8_t op = *c->p++;
        uint64_t reg = 0;
        int64_t off = 0;
        uint64_t delta = 0;
        switch (op >> 6) {
        case 1: delta = (op & 0x3f) * code_align; goto advance;
        case 2: reg = op & 0x3f; off = (int64_t)rd_uleb(c) * data_align; goto offset;
        case 3: reg = op & 0x3f; goto restore;
        default: break;
        }
        switch (op) {
        case 0x00: break; /* nop */
        case 0x01: return -1; /* set_loc: not emitted by GCC or Clang for x86-64 */
        case 0x02: delta = rd_fixed(c, 1) * code_align; goto advance;
        case 0x03: delta = rd_fixed(c, 2) * code_align; goto advance;
        case 0x04: delta = rd_fixed(c, 4) * code_align; goto advance;
        case 0x05: reg = rd_uleb(c); off = (int64_t)rd_uleb(c) * data_align; goto offset;
        case 0x06: reg = rd_uleb(c); goto restore;
        case 0x07: /* undefined */
        case 0x08: /* same value */
            reg = rd_uleb(c);
            if (reg == REG_RBP)
                st->rbp_how = op == 0x07 ? HOW_UNDEF : HOW_SAME;
            else if (reg == REG_RA)
                st->ra_how = op == 0x07 ? HOW_UNDEF : HOW_SAME;
            break;
        case 0x09: /* register */
            reg = rd_uleb(c);
            rd_uleb(c);
            goto other;
        case 0x0a:
            if (nsaved == 8)
                return -1;
            saved[nsaved++] = *st;
            break;
        case 0x0b:
            if (!nsaved)
                return -1;
            *st = saved[--nsaved]; /* the CFA rule too, as libgcc and GCC's output take it */
            break;
        case 0x0c: st->cfa_reg = (uint8_t)rd_uleb(c); st->cfa_off = (int64_t)rd_uleb(c); goto cfa;
        case 0x0d: st->cfa_reg = (uint8_t)rd_uleb(c); goto cfa;
        case 0x0e: st->cfa_off = (int64_t)rd_uleb(c); break;
        case 0x0f: { /* def_cfa_expression: DW_OP_breg6 <off>; DW_OP_deref only */
            uint64_t len = rd_uleb(c);
            if (c->bad || (uint64_t)(c->end - c->p) < len)
                return -1;
            cursor_t e = {c->p, c->p + len, 0};
            c->p += len;
            st->cfa_kind = 0;
            if (!e.bad && e.p < e.end && *e.p++ == 0x76) {
                int64_t o = rd_sleb(&e);
                if (!e.bad && e.p + 1 == e.end && *e.p == 0x06) {
                    st->cfa_kind = GM_CFA_DEREF;
                    st->cfa_reg = REG_RBP;
                    st->cfa_off = o;
                }
            }
            break;
        }
        case 0x10: /* expression */
        case 0x16: /* val_expression */
            reg = rd_uleb(c);
            {
                uint64_t len = rd_uleb(c);
                if (c->bad || (uint64_t)(c->end - c->p) < len)
                    return -1;
                c->p += len;
            }
            goto other;
        case 0x11: reg = rd_uleb(c); off = rd_sleb(c) * data_align; goto offset;
        case 0x12: st->cfa_reg = (uint8_t)rd_uleb(c); st->cfa_off = rd_sleb(c) * data_align; goto cfa;
        case 0x13: st->cfa_off = rd_sleb(c) * data_align; break;
        case 0x14: /* val_offset */
        case 0x15:
            reg = rd_uleb(c);
            if (op == 0x14) rd_uleb(c); else rd_sleb(c);
            goto other;
        case 0x2e: rd_uleb(c); break; /* GNU_args_size */
        case 0x2f: reg = rd_uleb(c); off = -(int64_t)rd_uleb(c) * data_align; goto offset;
        default: return -1;
        }
        continue;
    advance:
        if (*loc + delta > target)
            return 0;
        *loc += delta;
        continue;
    offset:
        if (reg == REG_RBP)
            st->rbp_how = HOW_OFFSET, st->rbp_off = off;
        else if (reg == REG_RA)
            st->ra_how = HOW_OFFSET, st->ra_off = off;
        continue;
    restore:
        if (!init)
            return -1;
        if (reg == REG_RBP)
            st->rbp_how = init->rbp_how, st->rbp_off = init->rbp_off;
        else if (reg == REG_RA)
            st->ra_how = init->ra_how, st->ra_off = init->ra_off;
        continue;
    other:
        if (reg == REG_RBP)
            st->rbp_how = HOW_OTHER;
        else if (reg == REG_RA)
            st->ra_how = HOW_OTHER;
        continue;
    cfa:
        st->cfa_kind = st->cfa_reg == REG_RSP || st->cfa_reg == REG_RBP ? GM_CFA_REG : 0;
        continue;
    }
    return c->bad ? -1 : 0;
}

/* The rule at pc from the FDE at fde. */
static int rule_from_fde(const uint8_t *fde, uintptr_t pc, gm_cfi_rule_t *out) {
    cursor_t c = {fde, fde + 12, 0};
    uint64_t len = rd_fixed(&c, 4);
    if (len == 0 || len == 0xffffffffu)
        return GM_CFI_SLOW;
    const uint8_t *fde_end = c.p + len;
    const uint8_t *cie_field = c.p;
    uint32_t cie_off = (uint32_t)rd_fixed(&c, 4);
    if (!cie_off)
        return GM_CFI_SLOW; /* a CIE, not an FDE */
    const uint8_t *cie = cie_field - cie_off;

    /* The CIE. */
    cursor_t k = {cie, cie + 4, 0};
    uint64_t clen = rd_fixed(&k, 4);
    if (clen == 0 || clen == 0xffffffffu)
        return GM_CFI_SLOW;
    k.end = k.p + clen;
    if (rd_fixed(&k, 4) != 0)
        return GM_CFI_SLOW;
    uint8_t version = (uint8_t)rd_fixed(&k, 1);
    const char *aug = (const char *)k.p;
    size_t auglen = strnlen(aug, (size_t)(k.end - k.p));
    k.p += auglen + 1;
    if (aug[0] && aug[0] != 'z')
        return GM_CFI_SLOW;
    uint64_t code_align = rd_uleb(&k);
    int64_t data_align = rd_sleb(&k);
    uint64_t ra_reg = version == 1 ? rd_fixed(&k, 1) : rd_uleb(&k);
    uint8_t fde_enc = 0x00;
    if (aug[0] == 'z') {
        uint64_t alen = rd_uleb(&k);
        if (k.bad || (uint64_t)(k.end - k.p) < alen)
            return GM_CFI_SLOW;
        cursor_t a = {k.p, k.p + alen, 0};
        k.p += alen;
        for (size_t i = 1; i < auglen && !a.bad; i++) {
            if (aug[i] == 'R')
                fde_enc = (uint8_t)rd_fixed(&a, 1);
            else if (aug[i] == 'P') {
                uint8_t penc = (uint8_t)rd_fixed(&a, 1);
                rd_enc(&a, penc & 0x7f, 0);
            } else if (aug[i] == 'L')
                rd_fixed(&a, 1);
            else if (aug[i] == 'S')
                return GM_CFI_SLOW; /* a signal frame */
            else
                return GM_CFI_SLOW;
        }
        if (a.bad)
            return GM_CFI_SLOW;
    }
    if (k.bad || ra_reg != REG_RA)
        return GM_CFI_SLOW;

    /* The FDE's range. */
    c.end = fde_end;
    uintptr_t begin = rd_enc(&c, fde_enc, 0);
    uintptr_t range = rd_enc(&c, fde_enc & 0x0f, 0);
    if (c.bad)
        return GM_CFI_SLOW;
    if (pc < begin || pc - begin >= range)
        return GM_CFI_NONE;
    if (aug[0] == 'z') {
        uint64_t alen = rd_uleb(&c);
        if (c.bad || (uint64_t)(c.end - c.p) < alen)
            return GM_CFI_SLOW;
        c.p += alen;
    }

    state_t st = {0, 0, 0, HOW_SAME, HOW_SAME, 0, 0};
    uintptr_t loc = begin;
    if (run(&k, &st, NULL, &loc, UINTPTR_MAX, code_align, data_align) < 0)
        return GM_CFI_SLOW;
    state_t init = st;
    loc = begin;
    if (run(&c, &st, &init, &loc, pc, code_align, data_align) < 0)
        return GM_CFI_SLOW;

    if (st.ra_how == HOW_UNDEF)
        return GM_CFI_END;
    if (!st.cfa_kind || st.ra_how != HOW_OFFSET || st.rbp_how == HOW_OTHER ||
        st.cfa_off != (int32_t)st.cfa_off || st.ra_off != (int32_t)st.ra_off ||
        st.rbp_off != (int32_t)st.rbp_off)
        return GM_CFI_SLOW;
    out->cfa_kind = st.cfa_kind;
    out->cfa_reg = st.cfa_reg;
    out->cfa_off = (int32_t)st.cfa_off;
    out->ra_off = (int32_t)st.ra_off;
    out->rbp_saved = st.rbp_how == HOW_OFFSET;
    out->rbp_off = (int32_t)st.rbp_off;
    return GM_CFI_OK;
}

int gm_cfi_rule(uintptr_t pc, gm_cfi_rule_t *out) {
    memset(out, 0, sizeof *out);
    find_t f = {pc, NULL, 0};
    dl_iterate_phdr(find_object, &f);
    if (!f.found)
        return GM_CFI_SLOW; /* not in a loaded object: code registered at run time */
    if (!f.hdr)
        return GM_CFI_NONE;
    int slow = 0;
    const uint8_t *fde = search_table(f.hdr, pc, &slow);
    if (slow)
        return GM_CFI_SLOW;
    return fde ? rule_from_fde(fde, pc, out) : GM_CFI_NONE;
}

#endif /* GM_CUNWIND_SUPPORTED */
