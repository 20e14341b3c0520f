"""A replay store's rows, in blocks.

A block holds consecutive rows of every leaf (observations, actions,
rewards, each extra model output; a Dict/Tuple item a leaf each), one
Column per numeric leaf and a list per leaf of objects, and the non-empty
infos by row. New rows go to the last block: in memory it grows by an
eighth until it holds `rows`, then a new one starts; in files each block is
made whole. Evicting the oldest episodes frees the blocks before the
oldest run still stored. Blocks are shared by the episodes written into
them, and their memory is on pages of their own (episode._pages).
"""
import numpy as np

cimport cython
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.string cimport memcpy

from episode._column cimport Column
from episode._pages cimport drop_pages, new_array

# A new block's rows in memory, at the least.
cdef Py_ssize_t FIRST_BLOCK_ROWS = 64


cdef class Block:
    """Rows of consecutive steps (see the module docstring)."""

    def __dealloc__(self):
        PyMem_Free(self.first_rows)
        PyMem_Free(self.leaf_of_row)


cdef int _drop_pages(Block block) except -1:
    # A file-backed block's pages out of the resident set (see _pages).
    for col in block.cols:
        if type(col) is Column:
            drop_pages((<Column>col).owner)
    return 0


@cython.final
cdef class Blocks:
    """The blocks of a store: `rows` rows each (at most), in files of
    `storage` (a folder) or in memory; `tree_leaves`: each row keeps its
    priority tree leaf."""

    def __cinit__(self, Py_ssize_t rows, storage, bint tree_leaves):
        self.items = []
        self.rows = rows
        self.storage = storage
        self.tree_leaves = tree_leaves
        self.shapes = []
        self.dtypes = []

    def __dealloc__(self):
        PyMem_Free(self.row_tables)
        PyMem_Free(self.row_bytes)

    def __len__(self):
        return len(self.items)

    cdef int add_leaf(self, object shape, object dtype) except -1:
        """A new leaf, its rows of `shape` and `dtype` (None: objects);
        the blocks made before it take it on first use (ensure_leaf)."""
        cdef Py_ssize_t* row_bytes = <Py_ssize_t*>PyMem_Realloc(
            self.row_bytes, (self.nleaves + 1) * sizeof(Py_ssize_t))
        if row_bytes == NULL:
            raise MemoryError()
        self.row_bytes = row_bytes
        self.row_bytes[self.nleaves] = 0 if dtype is None else \
            np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64))
        self.shapes.append(shape)
        self.dtypes.append(dtype)
        self.nleaves += 1
        for block in self.items:
            (<Block>block).cols.append(None)
            self.refresh(<Block>block)
        return 0

    cdef Block tail(self, Py_ssize_t rows):
        """The block new rows go to, with room for at least one row (at
        most `rows` are asked for): the last block, grown by an eighth
        while it is below `rows` (in memory), or a new one."""
        cdef Block block = self.items[len(self.items) - 1] if self.items else None
        cdef Py_ssize_t cap, leaf
        if block is not None and block.size < block.capacity:
            return block
        if block is not None and block.capacity < self.rows and self.storage is None:
            cap = min(self.rows, max(block.capacity + block.capacity // 8,
                                     block.size + min(rows, self.rows)))
            self._resize(block, cap)
            return block
        if block is not None and self.storage is not None:
            _drop_pages(block)           # full: its pages go back to its files
        block = Block.__new__(Block)
        block.cols = [None] * self.nleaves
        block.infos = {}
        block.size = 0
        if self.storage is None:
            block.capacity = min(self.rows, max(FIRST_BLOCK_ROWS, rows))
        else:
            block.capacity = self.rows
        for leaf in range(self.nleaves):
            if self.row_bytes[leaf]:
                block.cols[leaf] = Column.from_array(self._new_storage(leaf, block.capacity))
            else:
                block.cols[leaf] = []
        if self.tree_leaves:
            block.leaf_of_row = <int32_t*>PyMem_Malloc(block.capacity * sizeof(int32_t))
            if block.leaf_of_row == NULL:
                raise MemoryError()
        self.append(block)
        return block

    cdef int append(self, Block block) except -1:
        """`block` (its cols, size and capacity set) after the last one."""
        self.items.append(block)
        return self.refresh(block)

    cdef int ensure_leaf(self, Block block, Py_ssize_t leaf) except -1:
        """A leaf that came after the block was made (an extra model output
        seen later) gets its Column on first use."""
        if block.cols[leaf] is None:
            if self.row_bytes[leaf]:
                block.cols[leaf] = Column.from_array(self._new_storage(leaf, block.capacity))
            else:
                block.cols[leaf] = [None] * block.size
            self.refresh(block)
        elif not self.row_bytes[leaf] and len(block.cols[leaf]) < block.size:
            block.cols[leaf].extend([None] * (block.size - len(block.cols[leaf])))
        return 0

    cdef int drop_before(self, int64_t seq) except -1:
        """Frees the blocks before block `seq` (the last one stays)."""
        cdef Py_ssize_t drop = min(max(0, seq - self.first), len(self.items) - 1)
        if drop > 0:
            del self.items[:drop]
            self.first += drop
            self._sync()
        return 0

    cdef int refresh(self, Block block) except -1:
        """The block's row pointers, after its Columns changed."""
        cdef Py_ssize_t leaf
        cdef char** rows = <char**>PyMem_Realloc(block.first_rows,
                                                 max(1, self.nleaves) * sizeof(char*))
        if rows == NULL:
            raise MemoryError()
        block.first_rows = rows
        for leaf in range(self.nleaves):
            col = block.cols[leaf]
            block.first_rows[leaf] = (<Column>col).row_ptr(0, 0) if type(col) is Column else NULL
        return self._sync()

    cdef int _sync(self) except -1:
        # The table of the blocks' row pointers that the gathers read
        # (rebuilt whenever a block comes, goes or moves its rows).
        cdef Py_ssize_t i, n = len(self.items)
        cdef char*** table = <char***>PyMem_Realloc(self.row_tables, max(1, n) * sizeof(char**))
        if table == NULL:
            raise MemoryError()
        self.row_tables = table
        for i in range(n):
            self.row_tables[i] = (<Block>self.items[i]).first_rows
        return 0

    cdef int _resize(self, Block block, Py_ssize_t cap) except -1:
        cdef Py_ssize_t leaf
        cdef Column col, grown
        cdef int32_t* rows_leaves
        for leaf in range(self.nleaves):
            col = block.cols[leaf] if type(block.cols[leaf]) is Column else None
            if col is not None:
                grown = Column.from_array(self._new_storage(leaf, cap))
                if block.size:
                    memcpy(grown.row_ptr(0, block.size), col.row_ptr(0, block.size),
                           block.size * self.row_bytes[leaf])
                block.cols[leaf] = grown
        if self.tree_leaves:
            rows_leaves = <int32_t*>PyMem_Realloc(block.leaf_of_row, cap * sizeof(int32_t))
            if rows_leaves == NULL:
                raise MemoryError()
            block.leaf_of_row = rows_leaves
        block.capacity = cap
        return self.refresh(block)

    cdef object _new_storage(self, Py_ssize_t leaf, Py_ssize_t rows):
        # An ndarray of `rows` rows for a numeric leaf: in memory, or in a
        # file of the storage folder (pages stay on disk until touched).
        return new_array((rows,) + self.shapes[leaf], self.dtypes[leaf], self.storage)

    def release_pages(self):
        """With file-backed blocks: drops the pages of every full block from
        this process's memory (see Store.release_pages)."""
        cdef Py_ssize_t i
        if self.storage is None:
            return
        for i in range(len(self.items) - 1):
            _drop_pages(<Block>self.items[i])
