# The Column: one growable, typed, contiguous buffer (see DESIGN.md).
cimport cython
cimport numpy as cnp

cdef class Memory:
    cdef char* ptr                 # PyMem_RawMalloc'd block, freed in __dealloc__
    @staticmethod
    cdef Memory allocate(size_t nbytes)
    cdef object as_array(self, cnp.dtype descr, Py_ssize_t rows, int row_ndim,
                         cnp.npy_intp* row_shape)


# How an appended item is stored, and so how it is handed back before the
# owning buffer is finalized (RLlib returns the very objects it was given).
cdef enum Kind:
    KIND_EMPTY = 0    # nothing appended yet
    KIND_FLOAT = 1    # Python float  -> float64 storage
    KIND_INT = 2      # Python int    -> int64 storage
    KIND_BOOL = 3     # Python bool   -> bool storage
    KIND_SCALAR = 4   # numpy scalar  -> storage of its dtype
    KIND_ARRAY = 5    # ndarray row   -> storage of its dtype and shape
    KIND_OBJECT = 6   # anything else -> the Python list `items`
    KIND_EMPTY_DICT = 7  # only empty dicts so far (an episode's usual infos) -> a count


# final: calls between Column methods are direct (and inlinable), not virtual.
@cython.final
cdef class Column:
    cdef readonly int kind
    cdef readonly bint finalized   # numpy semantics on get/append (after finalize())
    cdef public bint row_type_open # finalized empty with no known row type: the first rows set it
    cdef object array              # ndarray (capacity, *row_shape): the typed storage
    cdef Memory memory             # the block `array` views, when the Column allocated it
    cdef char* data                # array's first byte
    cdef Py_ssize_t size           # rows in use
    cdef readonly Py_ssize_t capacity  # rows allocated
    cdef Py_ssize_t row_bytes      # bytes per row
    cdef int type_num              # numpy type number of the storage
    cdef bint pod                  # storage holds no object references: memcpy is safe
    cdef int row_ndim
    cdef cnp.npy_intp row_shape[64]
    cdef object scalar_type        # exact type of KIND_SCALAR items
    cdef list items                # object path storage

    cdef int _adopt_storage(self, cnp.ndarray arr, Py_ssize_t size) except -1
    cdef int push(self, object item) except -1
    cdef inline bint counts_empty_dicts(self):
        # Only empty dicts so far (or nothing yet, in list mode): a count will do.
        if self.kind == KIND_EMPTY and not self.finalized:
            self.kind = KIND_EMPTY_DICT
        return self.kind == KIND_EMPTY_DICT
    cdef Column copy_rows(self, Py_ssize_t start, Py_ssize_t stop)
    cdef int _push_list_mode(self, object item) except -1
    cdef int _push_array_mode(self, object item) except -1
    cdef int _start_typed(self, object item) except -1
    cdef int _reserve(self, Py_ssize_t rows) except -1
    cdef int _open_row_type(self, cnp.ndarray rows) except -1
    cdef int _grow_list_mode(self, Py_ssize_t new_capacity) except -1
    cdef int _to_object_path(self) except -1
    cdef bint _row_matches(self, cnp.ndarray arr)
    cdef int _check_position(self, Py_ssize_t pos) except -1
    cdef object item(self, Py_ssize_t pos)
    cdef object row_view(self, Py_ssize_t pos)
    cdef object rows_view(self, Py_ssize_t first, Py_ssize_t count, Py_ssize_t step,
                          bint leading_axis)
    cdef Column view_rows(self, Py_ssize_t start, Py_ssize_t stop)
