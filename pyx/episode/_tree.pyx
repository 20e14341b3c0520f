"""Dict/Tuple items as a tree of Columns, one Column per leaf.

A buffer whose first item is a dict or tuple of leaves (numbers, arrays, or
anything else dm-tree does not descend into) keeps each leaf in its own
Column, so numeric leaves are typed from the first append and finalize()
costs nothing, as for flat items. The tree's shape is the first item's: its
dict keys in their order, its tuple lengths. A Node walks items along that
shape in C:

* matches(): the item has exactly this shape (exact dict/tuple types, the
  same keys in the same order, the same lengths, leaves that do not nest).
  The buffer sends anything else to the object path, so a list-mode item
  always comes back as it went in.
* push() / set(): each leaf value into its Column, which promotes itself
  when a value stops fitting it (as a flat Column does).
* gather(): one thing per leaf (an item, rows, a sub-Column) put back into
  the item's shape.
"""
import numpy as np

cimport numpy as cnp
from cpython.dict cimport PyDict_Next, PyDict_Size
from cpython.object cimport PyObject

from episode._column cimport Column, KIND_OBJECT
from episode.spaces import flatten_struct, is_nesting

# The Columns' inline push (inlined here) calls numpy's C-API.
cnp.import_array()

# Deeper items take the object path: the walks below recurse in C.
cdef int MAX_DEPTH = 32

cdef object ndarray_type = np.ndarray
cdef object generic_type = np.generic


cdef inline bint is_leaf(object value) except -1:
    # Not a container dm-tree descends into (which RLlib's batching would).
    cdef object t = type(value)
    if t is ndarray_type or t is float or t is int or t is bool or isinstance(value, generic_type):
        return True
    return not is_nesting(value)


cdef class Node:
    """One level of a tree's shape: a leaf (its Column), a dict or a tuple."""

    cdef bint matches(self, object item) except -1:
        cdef Py_ssize_t pos = 0, i = 0, n
        cdef PyObject* key_ptr
        cdef PyObject* value_ptr
        if self.kind == NODE_LEAF:
            return is_leaf(item)
        if self.kind == NODE_DICT:
            n = len(self.keys)
            if type(item) is not dict or PyDict_Size(item) != n:
                return False
            while PyDict_Next(item, &pos, &key_ptr, &value_ptr):
                # Owned references: `==` and matches() may run Python code.
                key, value = <object>key_ptr, <object>value_ptr
                if i >= n:
                    return False
                expected = self.keys[i]
                if key is not expected and not key == expected:
                    return False
                if not (<Node>self.children[i]).matches(value):
                    return False
                i += 1
            return i == n
        n = len(self.children)
        if type(item) is not tuple or len(<tuple>item) != n:
            return False
        for i in range(n):
            if not (<Node>self.children[i]).matches((<tuple>item)[i]):
                return False
        return True

    cdef int push(self, object item) except -1:
        """Appends the leaves of `item`, which matches()."""
        cdef Py_ssize_t i
        if self.kind == NODE_LEAF:
            return self.col.push(item)
        if self.kind == NODE_DICT:
            for i in range(len(self.keys)):
                (<Node>self.children[i]).push((<dict>item)[self.keys[i]])
            return 0
        for i in range(len(self.children)):
            (<Node>self.children[i]).push((<tuple>item)[i])
        return 0

    cdef int set(self, Py_ssize_t pos, object item) except -1:
        """Overwrites row `pos` of each leaf with the leaves of `item`, which matches()."""
        cdef Py_ssize_t i
        if self.kind == NODE_LEAF:
            self.col.set(pos, item)
        elif self.kind == NODE_DICT:
            for i in range(len(self.keys)):
                (<Node>self.children[i]).set(pos, (<dict>item)[self.keys[i]])
        else:
            for i in range(len(self.children)):
                (<Node>self.children[i]).set(pos, (<tuple>item)[i])
        return 0

    cdef int check_rows(self, object item) except -1:
        """Raises ValueError unless each leaf of `item` (which matches()) is a
        row of its finalized Column's shape."""
        cdef Py_ssize_t i
        if self.kind == NODE_LEAF:
            self.col.check_row(item)
        elif self.kind == NODE_DICT:
            for i in range(len(self.keys)):
                (<Node>self.children[i]).check_rows((<dict>item)[self.keys[i]])
        else:
            for i in range(len(self.children)):
                (<Node>self.children[i]).check_rows((<tuple>item)[i])
        return 0

    cdef object gather(self, int what, Py_ssize_t a, Py_ssize_t b, Py_ssize_t c):
        """The tree's shape with each leaf Column replaced as `what` says
        (see Gather); positions are the caller's to check."""
        cdef Py_ssize_t i
        cdef dict out
        if self.kind == NODE_LEAF:
            if what == GATHER_ITEM:
                return self.col.item(a)
            if what == GATHER_ROWS:
                return self.col.rows_view(a, b, c, True)
            if what == GATHER_VIEW:
                return self.col.view_rows(a, b)
            return self.col.copy_rows(a, b)
        if self.kind == NODE_DICT:
            out = {}
            for i in range(len(self.keys)):
                out[self.keys[i]] = (<Node>self.children[i]).gather(what, a, b, c)
            return out
        return tuple([(<Node>child).gather(what, a, b, c) for child in self.children])

    cdef object assemble(self, list leaves):
        """The tree's shape with the leaf at dm-tree position k replaced by leaves[k]."""
        cdef Py_ssize_t i
        cdef dict out
        if self.kind == NODE_LEAF:
            return leaves[self.leaf]
        if self.kind == NODE_DICT:
            out = {}
            for i in range(len(self.keys)):
                out[self.keys[i]] = (<Node>self.children[i]).assemble(leaves)
            return out
        return tuple([(<Node>child).assemble(leaves) for child in self.children])


cdef Node tree_node(object tree, list leaves):
    """Walks `tree`, a dict/tuple of Columns, appending its Columns to
    `leaves` in dm-tree (sorted-key) order. Returns the Node that walks it,
    or None when a container in it is not an exact dict or tuple (an
    OrderedDict of finalized data) or it nests too deeply: the facade
    handles those. TypeError for a leaf that is not a Column."""
    cdef bint exact = True
    node = _node(tree, leaves, 0, &exact)
    return node if exact else None


cdef Node _node(object tree, list leaves, int depth, bint* exact):
    cdef Node node = Node.__new__(Node)
    cdef Py_ssize_t i
    if type(tree) is Column:
        node.kind = NODE_LEAF
        node.col = <Column>tree
        node.leaf = len(leaves)
        leaves.append(tree)
        return node
    if depth > MAX_DEPTH:
        exact[0] = False
    if isinstance(tree, dict):
        exact[0] = exact[0] and type(tree) is dict
        node.kind = NODE_DICT
        node.keys = tuple(tree)
        # Leaves are numbered in sorted-key order; children kept in the dict's.
        children = [None] * len(node.keys)
        position = {key: i for i, key in enumerate(node.keys)}
        for key in sorted(node.keys):
            children[position[key]] = _node(tree[key], leaves, depth + 1, exact)
        node.children = tuple(children)
    elif isinstance(tree, tuple):
        exact[0] = exact[0] and type(tree) is tuple
        node.kind = NODE_TUPLE
        node.children = tuple([_node(part, leaves, depth + 1, exact) for part in tree])
    else:
        raise TypeError(f"a tree's leaves are Columns, not {tree!r}")
    return node


cdef object new_tree(object item):
    """Empty list-mode Columns in the shape of `item`, or None when it has
    no such shape: not an exact dict/tuple all the way down to its leaves,
    too deep, or without a single leaf."""
    tree = _shape_of(item, 0)
    if tree is None or not flatten_struct(tree):
        return None
    return tree


cdef object _shape_of(object item, int depth):
    if depth > MAX_DEPTH:
        return None
    if type(item) is dict:
        out = {}
        for key, value in (<dict>item).items():
            part = _shape_of(value, depth + 1)
            if part is None:
                return None
            out[key] = part
        return out
    if type(item) is tuple:
        parts = []
        for value in <tuple>item:
            part = _shape_of(value, depth + 1)
            if part is None:
                return None
            parts.append(part)
        return tuple(parts)
    return Column() if is_leaf(item) else None


cdef int truncate_leaves(tuple leaves, Py_ssize_t n) except -1:
    """Cuts every leaf Column back to `n` rows: undoes a push that failed
    part-way, so that the leaves keep one length."""
    cdef Column col
    for leaf in leaves:
        col = <Column>leaf
        if col.kind == KIND_OBJECT:
            del col.items[n:]
        elif col.size > n:
            col.size = n
    return 0
