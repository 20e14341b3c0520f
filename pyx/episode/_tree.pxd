# Dict/Tuple items as a tree of Columns, one Column per leaf.
cimport cython
from episode._column cimport Column

cdef enum NodeKind:
    NODE_LEAF = 0
    NODE_DICT = 1
    NODE_TUPLE = 2

# What gather() makes of each leaf Column.
cdef enum Gather:
    GATHER_ITEM = 0        # col.item(a): one item (list-mode types, or numpy's)
    GATHER_ROWS = 1        # col.rows_view(a, b, c, True): finalized rows
    GATHER_VIEW = 2        # col.view_rows(a, b): a finalized Column sharing rows [a, b)
    GATHER_COPY = 3        # col.copy_rows(a, b): a list-mode Column with copies


@cython.final
cdef class Node:
    cdef readonly int kind          # a NodeKind
    cdef Column col                 # a leaf: its Column
    cdef Py_ssize_t leaf            # a leaf: its position in dm-tree (sorted-key) order
    cdef tuple keys                 # a dict: its keys, in the first item's order
    cdef tuple children             # a dict's or tuple's nodes (in `keys` order)

    cdef bint matches(self, object item) except -1
    cdef int push(self, object item) except -1
    cdef int check_rows(self, object item) except -1
    cdef object gather(self, int what, Py_ssize_t a, Py_ssize_t b, Py_ssize_t c)
    cdef object assemble(self, list leaves)
    cdef int set(self, Py_ssize_t pos, object item) except -1


cdef Node tree_node(object tree, list leaves)
cdef object new_tree(object item)
cdef int truncate_leaves(tuple leaves, Py_ssize_t n) except -1
