# A replay store's rows: blocks of consecutive rows, a Column per leaf, in
# RAM or in files of the store's folder.
cimport cython
from libc.stdint cimport int32_t, int64_t


cdef class Block:
    # Rows of consecutive steps: one Column per leaf (an ndarray it adopts,
    # in RAM or a file), infos that are not empty by row.
    cdef list cols               # Column per numeric leaf; a list of items per object leaf
    cdef char** first_rows       # each numeric leaf's first row (NULL: an object leaf)
    cdef dict infos              # row -> infos (non-empty ones only)
    cdef int32_t* leaf_of_row    # prioritized stores: each row's tree leaf
    cdef Py_ssize_t size, capacity


@cython.final
cdef class Blocks:
    # The blocks by sequence number (items[seq - first]), oldest first, and
    # what a stored row of each leaf is.
    cdef list items
    cdef readonly int64_t first
    cdef char*** row_tables          # each block's first_rows, for the gathers
    cdef readonly Py_ssize_t rows    # a full block's rows
    cdef readonly object storage     # None: in memory; else the files' folder
    cdef bint tree_leaves            # each row keeps its priority tree leaf
    cdef readonly Py_ssize_t nleaves
    cdef list shapes, dtypes         # per leaf: a stored row's shape and dtype (None: objects)
    cdef Py_ssize_t* row_bytes       # per leaf: a stored row's bytes (0: objects)

    cdef inline Block at(self, int64_t seq):
        return <Block>self.items[seq - self.first]

    cdef inline int64_t last(self) noexcept:
        # The newest block's sequence number.
        return self.first + len(self.items) - 1

    cdef int add_leaf(self, object shape, object dtype) except -1
    cdef Block tail(self, Py_ssize_t rows)
    cdef int append(self, Block block) except -1
    cdef int ensure_leaf(self, Block block, Py_ssize_t leaf) except -1
    cdef int drop_before(self, int64_t seq) except -1
    cdef int refresh(self, Block block) except -1
    cdef int _sync(self) except -1
    cdef int _resize(self, Block block, Py_ssize_t cap) except -1
    cdef object _new_storage(self, Py_ssize_t leaf, Py_ssize_t rows)
