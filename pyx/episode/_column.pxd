# The Column: one growable, typed, contiguous buffer (see DESIGN.md).
cimport cython
cimport numpy as cnp
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.stdint cimport int64_t
from libc.string cimport memcpy

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

    # push() is inline so that a sampler's per-step append (a row of the
    # column's own type, with room for it) costs no call in the caller's
    # module; everything else (growth, first item, a change of type,
    # finalized data) is push_slow's.
    cdef inline int push(self, object item) except -1:
        if not self.finalized and self.size < self.capacity and self.store_typed(item):
            return 0
        return self.push_slow(item)

    cdef inline bint store_typed(self, object item) noexcept:
        # List mode, room for one row: stores `item` if it is of the kind the
        # column holds. False (nothing stored) for anything else.
        cdef object t = type(item)
        cdef char* dst = self.data + self.size * self.row_bytes
        cdef int overflow = 0
        cdef long long value
        if self.kind == KIND_ARRAY:
            if not (cnp.PyArray_CheckExact(item) and self._row_matches(<cnp.ndarray>item)):
                return False
            memcpy(dst, cnp.PyArray_DATA(<cnp.ndarray>item), self.row_bytes)
        elif self.kind == KIND_FLOAT:
            if t is not float:
                return False
            (<double*>dst)[0] = PyFloat_AS_DOUBLE(item)
        elif self.kind == KIND_INT:
            if t is not int:
                return False
            value = PyLong_AsLongLongAndOverflow(item, &overflow)
            if overflow:
                return False
            (<int64_t*>dst)[0] = value
        elif self.kind == KIND_BOOL:
            if t is not bool:
                return False
            (<cnp.npy_bool*>dst)[0] = item is True
        elif self.kind == KIND_SCALAR:
            if t is not self.scalar_type:
                return False
            cnp.PyArray_ScalarAsCtype(item, dst)
        else:
            return False
        self.size += 1
        return True

    cdef inline bint _row_matches(self, cnp.ndarray arr) noexcept:
        # A C-contiguous, native-order row of the column's dtype and row shape.
        cdef int i
        if cnp.PyArray_TYPE(arr) != self.type_num or cnp.PyArray_NDIM(arr) != self.row_ndim:
            return False
        if not cnp.PyArray_IS_C_CONTIGUOUS(arr) or not cnp.PyArray_ISNOTSWAPPED(arr):
            return False
        for i in range(self.row_ndim):
            if cnp.PyArray_DIMS(arr)[i] != self.row_shape[i]:
                return False
        return True

    cdef int push_slow(self, object item) except -1
    cdef inline bint counts_empty_dicts(self):
        # Only empty dicts so far (or nothing yet, in list mode): a count will do.
        if self.kind == KIND_EMPTY and not self.finalized:
            self.kind = KIND_EMPTY_DICT
        return self.kind == KIND_EMPTY_DICT
    cdef Column copy_rows(self, Py_ssize_t start, Py_ssize_t stop)
    cdef int _push_array_mode(self, object item) except -1
    cdef int _start_typed(self, object item) except -1
    cdef int _reserve(self, Py_ssize_t rows) except -1
    cdef int _open_row_type(self, cnp.ndarray rows) except -1
    cdef int _grow_list_mode(self, Py_ssize_t new_capacity) except -1
    cdef int _to_object_path(self) except -1
    cdef int _check_position(self, Py_ssize_t pos) except -1
    cdef object item(self, Py_ssize_t pos)
    cdef object row_view(self, Py_ssize_t pos)
    cdef object rows_view(self, Py_ssize_t first, Py_ssize_t count, Py_ssize_t step,
                          bint leading_axis)
    cdef Column view_rows(self, Py_ssize_t start, Py_ssize_t stop)
