/*
 * tree.h - intrusive AVL tree with parent links (ordered sets of blocks).
 *
 * The allocator keeps free blocks ordered by (stream, size, address) and
 * unmapped expandable ranges by (stream, address), and needs lower_bound,
 * successor and predecessor, which a hash or a TLSF bitmap cannot give.
 * Nodes are embedded in the owner; the tree never allocates. A node is in at
 * most one tree at a time. Not thread-safe: callers hold the allocator lock.
 * Invariant (checked by gm_tree_check): |height(left) - height(right)| <= 1
 * at every node, parent links agree, and in-order traversal is sorted.
 */
#ifndef GM_CORE_TREE_H
#define GM_CORE_TREE_H

#include <stddef.h>

typedef struct gm_tree_node {
    struct gm_tree_node *left, *right, *parent;
    int height;
} gm_tree_node_t;

/* <0, 0, >0 like strcmp. */
typedef int (*gm_tree_cmp_fn)(const gm_tree_node_t *a, const gm_tree_node_t *b);

typedef struct gm_tree {
    gm_tree_node_t *root;
    size_t count;
    gm_tree_cmp_fn cmp;
} gm_tree_t;

void gm_tree_init(gm_tree_t *t, gm_tree_cmp_fn cmp);
/* Returns 0, or -1 if an equal node is already present (nothing inserted). */
int gm_tree_insert(gm_tree_t *t, gm_tree_node_t *n);
void gm_tree_erase(gm_tree_t *t, gm_tree_node_t *n);
/* First node that is not less than key, or NULL. */
gm_tree_node_t *gm_tree_lower_bound(const gm_tree_t *t, const gm_tree_node_t *key);
gm_tree_node_t *gm_tree_first(const gm_tree_t *t);
gm_tree_node_t *gm_tree_last(const gm_tree_t *t);
gm_tree_node_t *gm_tree_next(const gm_tree_node_t *n);
gm_tree_node_t *gm_tree_prev(const gm_tree_node_t *n);
/* Number of structural violations (0 when sound). */
int gm_tree_check(const gm_tree_t *t);

#endif /* GM_CORE_TREE_H */
