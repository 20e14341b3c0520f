# The Column: one growable, typed, contiguous buffer.
cimport cython
cimport numpy as cnp
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.list cimport PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF
from libc.stdint cimport int64_t
from libc.string cimport memcpy

cdef extern from *:
    """
    #ifndef EPISODE_CHECKED
    #define EPISODE_CHECKED 0
    #endif
    """
    # 1 in the checked build (-DEPISODE_CHECKED=1): raw accesses are bounds-checked.
    const bint CHECKED "EPISODE_CHECKED"

cdef extern from "Python.h":
    # Per-object tracking by the cyclic garbage collector (see Column and
    # BufferCore: an object that cannot be part of a cycle stays out of its
    # sight, and costs collections nothing).
    void PyObject_GC_Track(object op)
    void PyObject_GC_UnTrack(object op)
    int PyObject_GC_IsTracked(object op)

cdef extern from "<stdbool.h>":
    # A one-byte C bool that Python sees as bool (bint is a C int).
    ctypedef bint flag "bool"

cdef extern from *:
    """
    #include <stddef.h>
    /* Where a numpy scalar of a plain numeric type keeps its value (numpy's
       public scalar structs, read by PyArrayScalar_VAL); -1 for other types. */
    static int episode_scalar_offset(int type_num) {
        switch (type_num) {
        case NPY_BOOL: return offsetof(PyBoolScalarObject, obval);
        case NPY_BYTE: return offsetof(PyByteScalarObject, obval);
        case NPY_UBYTE: return offsetof(PyUByteScalarObject, obval);
        case NPY_SHORT: return offsetof(PyShortScalarObject, obval);
        case NPY_USHORT: return offsetof(PyUShortScalarObject, obval);
        case NPY_INT: return offsetof(PyIntScalarObject, obval);
        case NPY_UINT: return offsetof(PyUIntScalarObject, obval);
        case NPY_LONG: return offsetof(PyLongScalarObject, obval);
        case NPY_ULONG: return offsetof(PyULongScalarObject, obval);
        case NPY_LONGLONG: return offsetof(PyLongLongScalarObject, obval);
        case NPY_ULONGLONG: return offsetof(PyULongLongScalarObject, obval);
        case NPY_HALF: return offsetof(PyHalfScalarObject, obval);
        case NPY_FLOAT: return offsetof(PyFloatScalarObject, obval);
        case NPY_DOUBLE: return offsetof(PyDoubleScalarObject, obval);
        case NPY_LONGDOUBLE: return offsetof(PyLongDoubleScalarObject, obval);
        case NPY_CFLOAT: return offsetof(PyCFloatScalarObject, obval);
        case NPY_CDOUBLE: return offsetof(PyCDoubleScalarObject, obval);
        case NPY_CLONGDOUBLE: return offsetof(PyCLongDoubleScalarObject, obval);
        default: return -1;
        }
    }
    """
    int scalar_offset "episode_scalar_offset"(int type_num) noexcept

cdef extern from "numpy/arrayobject.h":
    # Steals a reference to `descr` (which Cython cannot express): callers
    # go through empty_array.
    object PyArray_Empty(int nd, cnp.npy_intp* dims, cnp.PyArray_Descr* descr, int fortran)


cdef inline cnp.ndarray empty_array(int nd, cnp.npy_intp* dims, cnp.dtype descr):
    # np.empty(dims, descr) without the Python call.
    Py_INCREF(descr)
    return PyArray_Empty(nd, dims, <cnp.PyArray_Descr*>descr, 0)


cdef int rows_out_of_bounds(Py_ssize_t pos, Py_ssize_t count, Py_ssize_t capacity) except -1
cdef int bytes_out_of_bounds(Py_ssize_t nbytes, Py_ssize_t available) except -1


cdef inline char* array_bytes(cnp.ndarray arr, Py_ssize_t nbytes) except NULL:
    # The first `nbytes` of a C-contiguous array's data: every raw access to an
    # ndarray that is not a Column's storage goes through here, and the checked
    # build proves that the array has them.
    if CHECKED and (nbytes < 0 or not cnp.PyArray_IS_C_CONTIGUOUS(arr)
                    or nbytes > cnp.PyArray_NBYTES(arr)):
        bytes_out_of_bounds(nbytes, cnp.PyArray_NBYTES(arr))
    return <char*>cnp.PyArray_DATA(arr)


cdef class Memory:
    # A Column's block once an array view of it is handed out: the base of
    # those views, freeing the block (PyMem_RawFree) with the last of them.
    cdef char* ptr


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
cdef inline void copy_strided(char* dst, const char* src, Py_ssize_t count,
                              Py_ssize_t row_bytes, Py_ssize_t src_step) noexcept nogil:
    # count rows of row_bytes, src_step bytes apart, into consecutive rows at
    # dst. The usual sizes (a CartPole observation, an action, a reward) get
    # a fixed-size copy the compiler inlines instead of a memcpy call per row.
    cdef Py_ssize_t j
    if row_bytes == 8:
        for j in range(count):
            memcpy(dst + j * 8, src + j * src_step, 8)
    elif row_bytes == 16:
        for j in range(count):
            memcpy(dst + j * 16, src + j * src_step, 16)
    elif row_bytes == 4:
        for j in range(count):
            memcpy(dst + j * 4, src + j * src_step, 4)
    elif row_bytes == 1:
        for j in range(count):
            dst[j] = src[j * src_step]
    else:
        for j in range(count):
            memcpy(dst + j * row_bytes, src + j * src_step, row_bytes)


cdef class Column:
    # Fields ordered to pack (the small ones share 8 bytes): a Column per
    # data track, several per episode, many episodes in a replay buffer.
    cdef readonly unsigned char kind    # a Kind
    cdef readonly flag finalized   # numpy semantics on get/append (after finalize())
    cdef readonly flag row_type_open  # finalized empty with no known row type: the first rows set it
    cdef flag pod                  # storage holds no object references: memcpy is safe
    cdef flag read_only            # storage is a read-only array (an unpickled episode's in
                                   # the object store): views are read-only, capacity is
                                   # the rows in use, and the first write copies it
    cdef unsigned char row_ndim    # at most 64
    cdef short value_offset        # plain storage (see plain()): where a numpy scalar of
                                   # its dtype keeps its value's bytes; else -1
    cdef object owner              # what keeps the storage alive: None while the Column
                                   # owns its block alone (freed with it), a Memory once
                                   # views share the block, or an ndarray it adopted
    cdef cnp.dtype descr           # the storage's dtype (None without storage)
    cdef char* data                # the storage's first byte
    cdef Py_ssize_t size           # rows in use
    cdef readonly Py_ssize_t capacity  # rows allocated
    cdef Py_ssize_t row_bytes      # bytes per row
    cdef list items                # object path storage
    cdef cnp.npy_intp* row_shape   # row_ndim dims in a PyMem block (NULL for scalar rows)
    cdef PyObject* holder          # a buffer out of the collector's sight with this Column
                                   # as a leaf (BufferCore.untrack), tracked again when the
                                   # Column is; borrowed: the buffer clears it before it
                                   # lets go of the Column

    cdef inline bint plain(self) noexcept:
        # Native bool/int/uint/float/complex storage: its bytes are the values.
        return self.value_offset >= 0

    cdef inline Py_ssize_t itemsize(self) noexcept:
        # Bytes per element of typed storage.
        return self.descr.itemsize

    cdef int _adopt_storage(self, cnp.ndarray arr, Py_ssize_t size) except -1
    cdef int _adopt_block(self, size_t nbytes, cnp.dtype descr, Py_ssize_t capacity,
                          int row_ndim, cnp.npy_intp* row_shape, Py_ssize_t size) except -1
    cdef int _release_storage(self) noexcept
    cdef int _install(self, object owner, Py_ssize_t capacity, Py_ssize_t size) noexcept
    cdef int _refs_changed(self) noexcept
    cdef object _view_base(self)
    cdef int _set_layout(self, cnp.dtype descr, int row_ndim, cnp.npy_intp* row_shape) except -1

    # Every raw access to the storage goes through row_ptr: rows [pos, pos +
    # count) must lie within the capacity. The checked build proves it on each
    # call; callers guarantee it otherwise.
    cdef inline char* row_ptr(self, Py_ssize_t pos, Py_ssize_t count) except NULL:
        if CHECKED and (self.data == NULL or pos < 0 or count < 0
                        or pos > self.capacity - count):
            rows_out_of_bounds(pos, count, self.capacity)
        return self.data + pos * self.row_bytes

    # push() is inline so that a sampler's per-step append (a row of the
    # column's own type, with room for it) costs no call in the caller's
    # module; everything else (growth, first item, a change of type,
    # finalized data) is push_slow's.
    cdef inline int push(self, object item) except -1:
        if self.size < self.capacity and (self.store_finalized(item) if self.finalized
                                          else self.store_typed(item)):
            return 0
        return self.push_slow(item)

    cdef inline int store_typed(self, object item) except -1:
        # List mode, room for one row: stores `item` if it is of the kind the
        # column holds (1). 0 (nothing stored) for anything else.
        cdef object t = type(item)
        cdef char* dst = self.row_ptr(self.size, 1)
        cdef int overflow = 0
        cdef long long value
        if self.kind == KIND_ARRAY:
            if not (cnp.PyArray_CheckExact(item) and self._row_matches(<cnp.ndarray>item)):
                return 0
            memcpy(dst, array_bytes(<cnp.ndarray>item, self.row_bytes), self.row_bytes)
        elif self.kind == KIND_FLOAT:
            if t is not float:
                return 0
            (<double*>dst)[0] = PyFloat_AS_DOUBLE(item)
        elif self.kind == KIND_INT:
            if t is not int:
                return 0
            value = PyLong_AsLongLongAndOverflow(item, &overflow)
            if overflow:
                return 0
            (<int64_t*>dst)[0] = value
        elif self.kind == KIND_BOOL:
            if t is not bool:
                return 0
            (<cnp.npy_bool*>dst)[0] = item is True
        elif self.kind == KIND_SCALAR:
            if not self.is_scalar_type(t):
                return 0
            self.copy_scalar(item, dst)
        else:
            return 0
        self.size += 1
        return 1

    cdef inline int store_finalized(self, object item) except -1:
        # Finalized, room for one row: stores `item` if it is a row that
        # numpy would store unchanged, without a change of dtype (1): an
        # ndarray row of the storage's layout, a numpy scalar of its dtype, a
        # Python float/int/bool in float64/int64/bool storage. 0 for anything
        # else (numpy's general path).
        cdef object t = type(item)
        cdef char* dst
        cdef int overflow = 0
        cdef long long value
        if self.row_type_open:
            return 0
        if cnp.PyArray_CheckExact(item):
            if not (self.pod and self._row_matches(<cnp.ndarray>item)):
                return 0
            memcpy(self.row_ptr(self.size, 1), array_bytes(<cnp.ndarray>item, self.row_bytes),
                   self.row_bytes)
        elif self.row_ndim != 0 or not self.plain():
            return 0
        elif self.is_scalar_type(t):
            self.copy_scalar(item, self.row_ptr(self.size, 1))
        elif t is float:
            if self.descr.type_num != cnp.NPY_DOUBLE:
                return 0
            (<double*>self.row_ptr(self.size, 1))[0] = PyFloat_AS_DOUBLE(item)
        elif t is int:
            if self.descr.type_num != cnp.NPY_INT64:
                return 0
            value = PyLong_AsLongLongAndOverflow(item, &overflow)
            if overflow:
                return 0
            (<int64_t*>self.row_ptr(self.size, 1))[0] = value
        elif t is bool:
            if self.descr.type_num != cnp.NPY_BOOL:
                return 0
            (<cnp.npy_bool*>self.row_ptr(self.size, 1))[0] = item is True
        else:
            return 0
        self.size += 1
        return 1

    cdef inline bint is_scalar_type(self, object t) noexcept:
        # `t` is the numpy scalar type of plain storage's dtype.
        return self.plain() and <PyTypeObject*>t == self.descr.typeobj

    cdef inline int copy_scalar(self, object item, char* dst) except -1:
        # The value of `item`, a numpy scalar of exactly the storage's scalar type, into
        # `dst`: read where numpy's scalar object keeps it (what
        # PyArray_ScalarAsCtype does after two lookups).
        if CHECKED and (cnp.PyArray_DescrFromScalar(item).itemsize != self.itemsize()
                        or self.value_offset < 0):
            bytes_out_of_bounds(cnp.PyArray_DescrFromScalar(item).itemsize, self.itemsize())
        memcpy(dst, <char*><void*>item + self.value_offset, self.itemsize())
        return 0

    cdef inline bint row_fits(self, object row) noexcept:
        # True when check_row(row) cannot fail: an ndarray of the row shape,
        # or a number for a Column of scalars (or a row type still open).
        cdef object t = type(row)
        if self.row_type_open:
            return True
        if cnp.PyArray_CheckExact(row):
            return self._shape_matches(<cnp.ndarray>row)
        return self.row_ndim == 0 and (t is float or t is int or t is bool
                                       or self.is_scalar_type(t))

    cdef inline bint _shape_matches(self, cnp.ndarray arr) noexcept:
        cdef int i
        if cnp.PyArray_NDIM(arr) != self.row_ndim:
            return False
        for i in range(self.row_ndim):
            if cnp.PyArray_DIMS(arr)[i] != self.row_shape[i]:
                return False
        return True

    cdef inline bint _row_matches(self, cnp.ndarray arr) noexcept:
        # A C-contiguous row of the column's row shape whose bytes mean what
        # the storage's bytes mean: the very same dtype, or for plain numbers
        # the same type, size and (native) byte order. Other dtypes of one
        # type number (str/bytes widths, structured fields) take numpy's path.
        if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
            return False
        if <void*>cnp.PyArray_DESCR(arr) != <void*>self.descr and not (
                self.plain() and cnp.PyArray_TYPE(arr) == self.descr.type_num
                and cnp.PyArray_ITEMSIZE(arr) == self.itemsize() and cnp.PyArray_ISNOTSWAPPED(arr)):
            return False
        return self._shape_matches(arr)

    cdef inline int push_batch_row(self, cnp.ndarray batch, Py_ssize_t k) except -1:
        # What push(batch[k]) does in list mode when it stores the row's bytes
        # unchanged (1), without making the row object: ndarray rows
        # (KIND_ARRAY) or numpy scalars (KIND_SCALAR) of the storage's plain
        # dtype and row shape. 0 (nothing stored) for anything else. The
        # caller has checked that `batch` is C-contiguous with k < len(batch).
        return <int>self.push_strided_rows(batch, k, 1, 1)

    cdef inline Py_ssize_t push_strided_rows(self, cnp.ndarray batch, Py_ssize_t first,
                                             Py_ssize_t count, Py_ssize_t stride) except -1:
        # push(batch[first + j * stride]) for j < count where it would store
        # each row's bytes unchanged, without making the row objects:
        # ndarray rows (KIND_ARRAY) or numpy scalars (KIND_SCALAR) of the
        # storage's plain dtype and row shape. Returns count, or 0 (nothing
        # stored) for anything else. The caller has checked that batch is
        # C-contiguous with first + (count - 1) * stride < len(batch).
        cdef int i
        cdef Py_ssize_t j
        cdef char* src
        cdef char* dst
        if count <= 0 or self.finalized:
            return 0
        if self.kind == KIND_EMPTY and not self.start_rows_of(batch, count):
            return 0
        if not self.plain():
            return 0
        if self.kind == KIND_ARRAY:
            if cnp.PyArray_NDIM(batch) != self.row_ndim + 1:
                return 0
            for i in range(self.row_ndim):
                if cnp.PyArray_DIMS(batch)[i + 1] != self.row_shape[i]:
                    return 0
        elif self.kind != KIND_SCALAR or cnp.PyArray_NDIM(batch) != 1:
            return 0
        if not (cnp.PyArray_TYPE(batch) == self.descr.type_num
                and cnp.PyArray_ITEMSIZE(batch) == self.itemsize()
                and cnp.PyArray_ISNOTSWAPPED(batch)):
            return 0
        self._reserve(count)
        src = array_bytes(batch, (first + (count - 1) * stride + 1) * self.row_bytes)
        src += first * self.row_bytes
        dst = self.row_ptr(self.size, count)
        copy_strided(dst, src, count, self.row_bytes, stride * self.row_bytes)
        self.size += count
        return count

    cdef inline Py_ssize_t nrows(self) noexcept:
        # len(self) without a call through the type's slot.
        return PyList_GET_SIZE(self.items) if self.kind == KIND_OBJECT else self.size

    cdef int push_slow(self, object item) except -1
    cdef int start_rows_of(self, cnp.ndarray batch, Py_ssize_t rows) except -1
    cdef inline bint counts_empty_dicts(self):
        # Only empty dicts so far (or nothing yet, in list mode): a count will do.
        if self.kind == KIND_EMPTY and not self.finalized:
            self.kind = KIND_EMPTY_DICT
        return self.kind == KIND_EMPTY_DICT
    cdef int check_range(self, Py_ssize_t start, Py_ssize_t stop) except -1
    cdef int finalize_typed(self) except -1
    cdef Column copy_rows(self, Py_ssize_t start, Py_ssize_t stop)
    cdef int _push_array_mode(self, object item) except -1
    cdef int _start_typed(self, object item) except -1
    cdef int _reserve(self, Py_ssize_t rows) except -1
    cdef int _make_writable(self) except -1
    cdef int _open_row_type(self, cnp.ndarray rows) except -1
    cdef bint _owns_block(self) noexcept
    cdef int _resize(self, Py_ssize_t new_capacity) except -1
    cdef int _retype(self, object dtype) except -1
    cdef int _set_row_shape(self, int ndim, cnp.npy_intp* dims) except -1
    cdef int _to_object_path(self) except -1
    cdef int _check_position(self, Py_ssize_t pos) except -1
    cdef int remove(self, Py_ssize_t pos) except -1
    cdef object item(self, Py_ssize_t pos)
    cdef object row_view(self, Py_ssize_t pos)
    cdef object rows_view(self, Py_ssize_t first, Py_ssize_t count, Py_ssize_t step,
                          bint leading_axis)
    cdef inline object rows(self, Py_ssize_t start, Py_ssize_t stop):
        # Rows [start, stop) (within the capacity) as an ndarray view.
        return self.rows_view(start, stop - start, 1, True)
    cdef Column view_rows(self, Py_ssize_t start, Py_ssize_t stop)


# A Column's pickled state, (kind, finalized, row_type_open, payload), and
# the Column it describes, checked (ValueError/TypeError for a corrupt one).
# `raw`: plain rows as a PickleBuffer (pickle protocol 5), else an ndarray;
# `dtype_texts`: a dict for the dtype strings of one pickle, or None.
cdef tuple column_state(Column col, bint raw, dict dtype_texts)
cdef Column column_from_state(object kind, object finalized, object row_type_open,
                              object payload)

# A list-mode Column of n empty dicts (a count: an episode's usual infos).
cdef Column empty_dicts(Py_ssize_t n)
