/*
 * tree.c - intrusive AVL tree (see tree.h).
 *
 * Insert and erase rebalance on the way up from the changed node with at
 * most O(log n) rotations; lookups never modify the tree. Must not allocate.
 */
#include "tree.h"

static int height(const gm_tree_node_t *n) { return n ? n->height : 0; }

static void update(gm_tree_node_t *n) {
    int hl = height(n->left), hr = height(n->right);
    n->height = (hl > hr ? hl : hr) + 1;
}

static void replace_child(gm_tree_t *t, gm_tree_node_t *parent, gm_tree_node_t *old,
                          gm_tree_node_t *new_) {
    if (!parent)
        t->root = new_;
    else if (parent->left == old)
        parent->left = new_;
    else
        parent->right = new_;
    if (new_)
        new_->parent = parent;
}

/* Rotations return the new subtree root. */
static gm_tree_node_t *rotate_left(gm_tree_t *t, gm_tree_node_t *x) {
    gm_tree_node_t *y = x->right;
    replace_child(t, x->parent, x, y);
    x->right = y->left;
    if (y->left)
        y->left->parent = x;
    y->left = x;
    x->parent = y;
    update(x);
    update(y);
    return y;
}

static gm_tree_node_t *rotate_right(gm_tree_t *t, gm_tree_node_t *x) {
    gm_tree_node_t *y = x->left;
    replace_child(t, x->parent, x, y);
    x->left = y->right;
    if (y->right)
        y->right->parent = x;
    y->right = x;
    x->parent = y;
    update(x);
    update(y);
    return y;
}

static void rebalance_up(gm_tree_t *t, gm_tree_node_t *n) {
    while (n) {
        int old = n->height;
        update(n);
        int bal = height(n->left) - height(n->right);
        if (bal > 1) {
            if (height(n->left->left) < height(n->left->right))
                rotate_left(t, n->left);
            n = rotate_right(t, n);
        } else if (bal < -1) {
            if (height(n->right->right) < height(n->right->left))
                rotate_right(t, n->right);
            n = rotate_left(t, n);
        } else if (n->height == old) {
            /* Heights above cannot change any more. */
            return;
        }
        n = n->parent;
    }
}

void gm_tree_init(gm_tree_t *t, gm_tree_cmp_fn cmp) {
    t->root = NULL;
    t->count = 0;
    t->cmp = cmp;
}

int gm_tree_insert(gm_tree_t *t, gm_tree_node_t *n) {
    gm_tree_node_t *parent = NULL, **link = &t->root;
    while (*link) {
        parent = *link;
        int c = t->cmp(n, parent);
        if (c < 0)
            link = &parent->left;
        else if (c > 0)
            link = &parent->right;
        else
            return -1;
    }
    n->left = n->right = NULL;
    n->parent = parent;
    n->height = 1;
    *link = n;
    t->count++;
    rebalance_up(t, parent);
    return 0;
}

void gm_tree_erase(gm_tree_t *t, gm_tree_node_t *n) {
    gm_tree_node_t *fix;
    if (n->left && n->right) {
        /* Swap n with its successor s (leftmost of right subtree). */
        gm_tree_node_t *s = n->right;
        while (s->left)
            s = s->left;
        gm_tree_node_t *s_parent = s->parent, *s_right = s->right;
        replace_child(t, n->parent, n, s);
        s->left = n->left;
        s->left->parent = s;
        if (s_parent == n) {
            fix = s;
        } else {
            s_parent->left = s_right;
            if (s_right)
                s_right->parent = s_parent;
            s->right = n->right;
            s->right->parent = s;
            fix = s_parent;
        }
        s->height = n->height;
    } else {
        gm_tree_node_t *child = n->left ? n->left : n->right;
        fix = n->parent;
        replace_child(t, n->parent, n, child);
    }
    n->left = n->right = n->parent = NULL;
    n->height = 0;
    t->count--;
    /* Erase may need rotations all the way up; walk without early exit. */
    while (fix) {
        update(fix);
        int bal = height(fix->left) - height(fix->right);
        if (bal > 1) {
            if (height(fix->left->left) < height(fix->left->right))
                rotate_left(t, fix->left);
            fix = rotate_right(t, fix);
        } else if (bal < -1) {
            if (height(fix->right->right) < height(fix->right->left))
                rotate_right(t, fix->right);
            fix = rotate_left(t, fix);
        }
        fix = fix->parent;
    }
}

gm_tree_node_t *gm_tree_lower_bound(const gm_tree_t *t, const gm_tree_node_t *key) {
    gm_tree_node_t *n = t->root, *best = NULL;
    while (n) {
        if (t->cmp(n, key) < 0) {
            n = n->right;
        } else {
            best = n;
            n = n->left;
        }
    }
    return best;
}

gm_tree_node_t *gm_tree_first(const gm_tree_t *t) {
    gm_tree_node_t *n = t->root;
    if (!n)
        return NULL;
    while (n->left)
        n = n->left;
    return n;
}

gm_tree_node_t *gm_tree_last(const gm_tree_t *t) {
    gm_tree_node_t *n = t->root;
    if (!n)
        return NULL;
    while (n->right)
        n = n->right;
    return n;
}

gm_tree_node_t *gm_tree_next(const gm_tree_node_t *n) {
    if (n->right) {
        n = n->right;
        while (n->left)
            n = n->left;
        return (gm_tree_node_t *)n;
    }
    while (n->parent && n->parent->right == n)
        n = n->parent;
    return n->parent;
}

gm_tree_node_t *gm_tree_prev(const gm_tree_node_t *n) {
    if (n->left) {
        n = n->left;
        while (n->right)
            n = n->right;
        return (gm_tree_node_t *)n;
    }
    while (n->parent && n->parent->left == n)
        n = n->parent;
    return n->parent;
}

static int check_node(const gm_tree_t *t, const gm_tree_node_t *n, size_t *count) {
    if (!n)
        return 0;
    int bad = 0;
    (*count)++;
    if (n->left && (n->left->parent != n || t->cmp(n->left, n) >= 0))
        bad++;
    if (n->right && (n->right->parent != n || t->cmp(n->right, n) <= 0))
        bad++;
    int hl = height(n->left), hr = height(n->right);
    if (n->height != (hl > hr ? hl : hr) + 1 || hl - hr > 1 || hr - hl > 1)
        bad++;
    return bad + check_node(t, n->left, count) + check_node(t, n->right, count);
}

int gm_tree_check(const gm_tree_t *t) {
    size_t count = 0;
    int bad = check_node(t, t->root, &count);
    if (t->root && t->root->parent)
        bad++;
    if (count != t->count)
        bad++;
    /* In-order must be strictly increasing. */
    const gm_tree_node_t *prev = NULL;
    for (const gm_tree_node_t *n = gm_tree_first(t); n; n = gm_tree_next(n)) {
        if (prev && t->cmp(prev, n) >= 0)
            bad++;
        prev = n;
    }
    return bad;
}
