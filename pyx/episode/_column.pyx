"""Column: one growable, typed, contiguous buffer.

A Column stores one data track (observations, actions, ...). Numeric items go
into a typed block with spare capacity that doubles when full, so an append is
a type check and a memcpy; getters hand out numpy views of the block. Items
that cannot be stored that way (strings, dicts, ragged rows, a change of type)
move the Column to the object path: a Python list, exactly what RLlib keeps. A Column that has only seen empty dicts
(an episode's infos, most of the time) stores just their count.

Two sets of semantics, chosen by ``finalized``:

* before: items come back as the very types they went in as (Python float,
  int, bool, numpy scalar, ndarray row), and any change of type moves to the
  object path, so no value or type is ever altered;
* after: numpy semantics, the same as RLlib's ``np.concatenate`` appends
  (dtype promotion by ``np.result_type``, shape must match).
"""
from pickle import PickleBuffer

import numpy as np

cimport cython
cimport numpy as cnp
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_FromDouble
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_FromLongLong
from cpython.object cimport PyObject, PyTypeObject
from cpython.buffer cimport PyBuffer_IsContiguous
from cpython.memoryview cimport PyMemoryView_FromObject, PyMemoryView_GET_BUFFER
from cpython.pyport cimport PY_SSIZE_T_MAX
from cpython.ref cimport Py_INCREF
from libc.stdint cimport int64_t, SIZE_MAX
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_RawFree, PyMem_RawMalloc, PyMem_RawRealloc
from libc.string cimport memcpy, memmove

cdef extern from "Python.h":
    # On a borrowed pointer: no temporary reference skews the count.
    Py_ssize_t refcount "Py_REFCNT"(PyObject* obj)

cdef extern from "numpy/arrayobject.h":
    # numpy's own .pxd leaves these out; declared with numpy's C types.
    # PyArray_NewFromDescr steals a reference to `descr` (which Cython cannot
    # express): its caller INCREFs it first.
    object PyArray_Scalar(void* data, cnp.PyArray_Descr* descr, PyObject* base)
    object PyArray_NewFromDescr(PyTypeObject* subtype, cnp.PyArray_Descr* descr, int nd,
                                cnp.npy_intp* dims, cnp.npy_intp* strides, void* data,
                                int flags, PyObject* obj)
    bint PyDataType_REFCHK(cnp.PyArray_Descr* descr)   # the dtype holds object references

cnp.import_array()


cdef Py_ssize_t MIN_CAPACITY = 16

# The layout of a pickled Column (see __reduce_ex__); unknown ones are refused.
COLUMN_FORMAT = 1

# The kinds of list-mode items (Column.kind, Column.from_rows), for Python.
KINDS = {"empty": KIND_EMPTY, "float": KIND_FLOAT, "int": KIND_INT, "bool": KIND_BOOL,
         "scalar": KIND_SCALAR, "array": KIND_ARRAY, "object": KIND_OBJECT,
         "empty_dict": KIND_EMPTY_DICT}

# True when compiled with EPISODE_CHECKED=ON (bounds checks on raw accesses).
CHECKED_BUILD = bool(CHECKED)

cdef object ndarray_type = np.ndarray
cdef object generic_type = np.generic
cdef object float64 = np.dtype(np.float64)
cdef object int64 = np.dtype(np.int64)
cdef object bool_ = np.dtype(np.bool_)


cdef Py_ssize_t _product(tuple shape):
    cdef Py_ssize_t n = 1
    for d in shape:
        n *= d
    return n


cdef class Memory:
    """A Column's block (from Python's raw allocator, so tracemalloc sees it)
    once array views of it are out: their base, freeing the block with the
    last of them. Until then the Column owns its block alone and may realloc
    it, which numpy arrays cannot do without zero-filling."""

    def __dealloc__(self):
        PyMem_RawFree(self.ptr)


cdef char* allocate(size_t nbytes) except NULL:
    cdef char* block = <char*>PyMem_RawMalloc(nbytes if nbytes else 1)
    if block == NULL:
        raise MemoryError(f"cannot allocate {nbytes} bytes")
    return block


cdef inline bint is_plain_numeric(cnp.dtype dt):
    # Only native-order bool/int/uint/float/complex rows take the typed path:
    # their bytes can be memcpy'd and read back unchanged.
    return dt.kind in "biufc" and dt.isnative


# Only the checked build calls these two: a core bug, reported instead of a
# read or write outside a block.
cdef int rows_out_of_bounds(Py_ssize_t pos, Py_ssize_t count, Py_ssize_t capacity) except -1:
    raise SystemError(f"episode core: rows [{pos}, {pos} + {count}) outside a storage "
                      f"block of {capacity} rows")


cdef int bytes_out_of_bounds(Py_ssize_t nbytes, Py_ssize_t available) except -1:
    raise SystemError(f"episode core: {nbytes} bytes asked of a block of {available}")


# no_gc_clear: __dealloc__ reads `owner` to know whether the block is the
# Column's own to free; a cycle through a Column always also runs through a
# clearable object (its `items` list, a buffer), so the collector can break it.
@cython.no_gc_clear
cdef class Column:
    """A growable data track. See the module docstring."""

    def __cinit__(self):
        self.kind = KIND_EMPTY
        self.items = None
        self.data = NULL
        self.size = 0
        self.capacity = 0
        self.value_offset = -1
        self.row_shape = NULL
        self.holder = NULL
        # Out of the cyclic collector's sight until it holds something that
        # can lead back to it (see _refs_changed).
        PyObject_GC_UnTrack(self)

    cdef int _refs_changed(self) noexcept:
        # The collector tracks a Column only while it can be part of a
        # reference cycle: once it holds items, or an owner the collector
        # tracks (an ndarray subclass). Numbers, dtypes, plain arrays and a
        # Memory lead back to nothing; untracked, the Columns of numbers (an
        # episode has several, a sampled replay batch hundreds) cost
        # collections nothing.
        if not PyObject_GC_IsTracked(self) and (
                self.items is not None
                or (self.owner is not None and PyObject_GC_IsTracked(self.owner))):
            PyObject_GC_Track(self)
            # A buffer holding it may now be part of a cycle too.
            if self.holder != NULL and not PyObject_GC_IsTracked(<object>self.holder):
                PyObject_GC_Track(<object>self.holder)
            self.holder = NULL
        return 0

    def __dealloc__(self):
        self._release_storage()
        PyMem_Free(self.row_shape)

    # -- construction ---------------------------------------------------------

    @staticmethod
    def from_list(list items):
        """A list-mode Column holding `items` (their types are kept)."""
        cdef Column col = Column()
        cdef object item
        for item in items:
            col.push(item)
        return col

    @staticmethod
    def from_array(object array):
        """A finalized Column adopting `array`'s memory (no copy) as its storage
        (the C paths keep their own copy of its layout: the caller may reshape
        the array object in place later)."""
        cdef Column col = Column()
        cdef cnp.ndarray arr = np.asarray(array)
        col._adopt_storage(arr, arr.shape[0] if arr.ndim else 0)
        col.kind = KIND_ARRAY
        col.finalized = True
        return col

    @staticmethod
    def from_rows(object rows, int kind):
        """A list-mode Column whose items are `rows` (an array with a leading
        axis), handed back as items of `kind` (KIND_FLOAT, KIND_INT and
        KIND_BOOL: Python numbers of float64, int64 and bool rows;
        KIND_SCALAR: numpy scalars; KIND_ARRAY: ndarray rows), or, for
        KIND_EMPTY_DICT, `rows` empty dicts (a count). Checked as a pickled
        Column is (ValueError). The rows are copied: list mode grows and
        sets its storage in place."""
        if kind == KIND_EMPTY_DICT:
            return column_from_state(kind, False, False, rows)
        if not KIND_FLOAT <= kind <= KIND_ARRAY:
            raise ValueError(f"no list-mode rows of kind {kind}")
        return column_from_state(kind, False, False, np.array(rows, order="C"))

    @staticmethod
    def with_open_row_type():
        """A finalized empty Column (float64 until told otherwise) whose first
        rows decide its row shape and dtype: finalized data with no items and
        no space to say what they are."""
        cdef Column col = Column.from_array(np.empty(0))
        col.row_type_open = True
        return col

    cdef int _adopt_storage(self, cnp.ndarray arr, Py_ssize_t size) except -1:
        # Storage in an ndarray (numpy's own, or one handed in): it stays the
        # owner, and is never realloc'd.
        if arr.ndim == 0:
            raise ValueError("a Column's storage needs a leading (time) axis")
        if arr.ndim - 1 > 64:
            raise ValueError("rows of more than 64 dimensions are not supported")
        # C-API reads throughout: this runs for every view that slice()/cut() make.
        if not cnp.PyArray_IS_C_CONTIGUOUS(arr) or not cnp.PyArray_ISNOTSWAPPED(arr):
            arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("="))
        if cnp.PyArray_DIMS(arr)[0] == 0 and not PyDataType_REFCHK(cnp.PyArray_DESCR(arr)):
            # No rows to share: an empty block of the same layout costs a
            # byte where keeping the array would cost an ndarray.
            return self._adopt_block(0, <cnp.dtype>cnp.PyArray_DESCR(arr), 0,
                                     cnp.PyArray_NDIM(arr) - 1, cnp.PyArray_DIMS(arr) + 1, 0)
        self._set_layout(<cnp.dtype>cnp.PyArray_DESCR(arr), cnp.PyArray_NDIM(arr) - 1,
                         cnp.PyArray_DIMS(arr) + 1)
        self._install(arr, cnp.PyArray_DIMS(arr)[0], size)
        self.data = <char*>cnp.PyArray_DATA(arr)
        if not cnp.PyArray_ISWRITEABLE(arr):
            # Shared and read-only (Ray hands an episode's arrays out of its
            # object store so): read in place, copied on the first write.
            self.read_only = True
            self.capacity = min(size, self.capacity)
        return 0

    cdef int _adopt_block(self, size_t nbytes, cnp.dtype descr, Py_ssize_t capacity,
                          int row_ndim, cnp.npy_intp* row_shape, Py_ssize_t size) except -1:
        # Storage in a new block of `nbytes` (`capacity` rows) that the Column owns.
        cdef char* block = allocate(nbytes)
        try:
            self._set_layout(descr, row_ndim, row_shape)
            if CHECKED and <size_t>(capacity * self.row_bytes) > nbytes:
                bytes_out_of_bounds(capacity * self.row_bytes, nbytes)
        except BaseException:
            PyMem_RawFree(block)
            raise
        self._install(None, capacity, size)
        self.data = block
        return 0

    cdef int _install(self, object owner, Py_ssize_t capacity, Py_ssize_t size) noexcept:
        # Lets the old storage go and takes the new one's owner and sizes (its
        # layout is set already; the caller sets `data` next).
        self._release_storage()
        self.owner = owner
        self.capacity = capacity
        self.size = size
        self.read_only = False
        return self._refs_changed()

    cdef int _release_storage(self) noexcept:
        # Lets go of the storage: frees a block the Column owns alone; views
        # keep a shared one (their Memory) or an adopted array alive.
        if self.owner is None:
            PyMem_RawFree(self.data)
        self.owner = None
        self.data = NULL
        return 0

    cdef object _view_base(self):
        # The base for a view of the storage: its Memory, made on the first
        # view of a block the Column owned alone.
        cdef Memory memory
        if self.owner is None:
            memory = Memory.__new__(Memory)
            memory.ptr = self.data
            self.owner = memory
        return self.owner

    cdef int _set_layout(self, cnp.dtype descr, int row_ndim, cnp.npy_intp* row_shape) except -1:
        cdef int i
        self._set_row_shape(row_ndim, row_shape)
        self.descr = descr
        self.pod = not PyDataType_REFCHK(<cnp.PyArray_Descr*>descr)
        self.value_offset = scalar_offset(descr.type_num) if is_plain_numeric(descr) else -1
        self.row_bytes = descr.itemsize
        for i in range(self.row_ndim):
            self.row_bytes *= self.row_shape[i]
        return 0

    cdef int _set_row_shape(self, int ndim, cnp.npy_intp* dims) except -1:
        # A copy, not a pointer into the storage's dims: the C paths must not
        # depend on an array object staying unchanged. (`dims` may be the
        # current row_shape: copied before that is freed.)
        cdef cnp.npy_intp* shape = NULL
        cdef int i
        if ndim > 0:
            shape = <cnp.npy_intp*>PyMem_Malloc(ndim * sizeof(cnp.npy_intp))
            if shape == NULL:
                raise MemoryError()
            for i in range(ndim):
                shape[i] = dims[i]
        PyMem_Free(self.row_shape)
        self.row_shape = shape
        self.row_ndim = ndim
        return 0

    # -- size -----------------------------------------------------------------

    def __len__(self):
        return len(self.items) if self.kind == KIND_OBJECT else self.size

    @property
    def is_typed(self):
        """True while the items live in a typed numpy buffer."""
        return self.kind != KIND_OBJECT

    @property
    def dtype(self):
        return self.descr

    @property
    def row_shape_tuple(self):
        return tuple([self.row_shape[i] for i in range(self.row_ndim)])

    # -- appending ------------------------------------------------------------

    def append(self, item):
        """Appends one item (never raises before finalize(); no value is altered)."""
        self.push(item)

    def extend(self, items):
        """Appends every item of the iterable `items`."""
        cdef object item
        for item in items:
            self.push(item)

    cdef int push_slow(self, object item) except -1:
        if self.kind == KIND_OBJECT:
            self.items.append(item)
            return 0
        if self.finalized:
            return self._push_array_mode(item)
        if self.kind == KIND_EMPTY:
            self._start_typed(item)
            if self.kind == KIND_OBJECT:
                self.items.append(item)
                return 0
        if self.kind == KIND_EMPTY_DICT:
            if type(item) is dict and not item:
                self.size += 1
                return 0
        else:
            if self.size == self.capacity:
                self._reserve(1)
            if self.store_typed(item):
                return 0
        # A different kind of item: keep every value and type on the object path.
        self._to_object_path()
        self.items.append(item)
        return 0

    cdef int _start_typed(self, object item) except -1:
        """Chooses the storage from the first item of a list-mode Column."""
        cdef object t = type(item)
        cdef object dtype
        cdef int kind
        cdef int overflow = 0
        cdef cnp.ndarray arr
        cdef tuple shape = ()
        if t is dict and not item:
            self.kind = KIND_EMPTY_DICT
            return 0
        if t is float:
            kind, dtype = KIND_FLOAT, float64
        elif t is bool:
            kind, dtype = KIND_BOOL, bool_
        elif t is int:
            PyLong_AsLongLongAndOverflow(item, &overflow)
            if overflow:
                kind = KIND_OBJECT
            else:
                kind, dtype = KIND_INT, int64
        elif isinstance(item, generic_type) and is_plain_numeric(item.dtype) \
                and t is item.dtype.type:
            # (Not a subclass: item() gives back the dtype's own scalar type.)
            kind, dtype = KIND_SCALAR, item.dtype
        elif t is ndarray_type and is_plain_numeric((<cnp.ndarray>item).dtype) \
                and (<cnp.ndarray>item).ndim <= 64:
            arr = <cnp.ndarray>item
            kind, dtype, shape = KIND_ARRAY, arr.dtype, (<object>arr).shape
        else:
            kind = KIND_OBJECT
        if kind == KIND_OBJECT:
            self.kind = KIND_OBJECT
            self.items = []
            return self._refs_changed()
        self._adopt_block(MIN_CAPACITY * dtype.itemsize * _product(shape),
                          dtype, MIN_CAPACITY, len(shape),
                          cnp.PyArray_DIMS(item) if kind == KIND_ARRAY else NULL, 0)
        self.kind = kind
        return 0

    cdef int start_rows_of(self, cnp.ndarray batch, Py_ssize_t rows) except -1:
        """For an empty list-mode Column: the storage _start_typed(batch[i])
        would choose, without making the row (a numpy scalar of a 1-d
        batch, an ndarray row of a wider one), with room for `rows` rows.
        Returns 1, or 0 with nothing changed where that row would not be
        stored typed."""
        cdef cnp.dtype dtype = batch.dtype
        cdef int ndim = cnp.PyArray_NDIM(batch)
        cdef Py_ssize_t i, row_items = 1
        if self.kind != KIND_EMPTY or self.finalized or not 1 <= ndim <= 65 \
                or not is_plain_numeric(dtype):
            return 0
        for i in range(1, ndim):
            row_items *= cnp.PyArray_DIMS(batch)[i]
        rows = max(rows, MIN_CAPACITY)
        self._adopt_block(rows * dtype.itemsize * row_items, dtype, rows,
                          ndim - 1, cnp.PyArray_DIMS(batch) + 1 if ndim > 1 else NULL, 0)
        self.kind = KIND_ARRAY if ndim > 1 else KIND_SCALAR
        return 1

    cdef int _push_array_mode(self, object item) except -1:
        cdef cnp.ndarray x
        if self.row_type_open:
            self._open_row_type(np.asarray(item)[None])
        self._reserve(1)
        if self.store_finalized(item):
            return 0
        # General case: what np.concatenate([data, [item]]) would give.
        x = np.asarray(item)
        self.check_row(x)
        dtype = np.result_type(self.descr, x.dtype)
        if dtype != self.descr:
            self._retype(dtype)
        # Slice assignment casts as np.concatenate does (int64 -> Python int in
        # an object column) and stores a 0-d item as its element.
        self.rows(self.size, self.size + 1)[...] = x[None]
        self.size += 1
        return 0

    def extend_rows(self, rows):
        """Appends a batch of rows: as np.concatenate would once finalized,
        row by row (types kept) before."""
        cdef cnp.ndarray arr
        cdef Py_ssize_t k
        if not self.finalized or self.kind == KIND_OBJECT:
            self.extend(rows)
            return
        arr = np.asarray(rows)
        if arr.ndim == 0:
            raise ValueError("a batch of rows needs a leading axis")
        if self.row_type_open and arr.shape[0] > 0:
            self._open_row_type(arr)
        self.check_rows(arr)
        k = arr.shape[0]
        dtype = np.result_type(self.descr, arr.dtype)
        if dtype != self.descr:
            self._retype(dtype)
        self._reserve(k)
        self.rows(self.size, self.size + k)[...] = arr
        self.size += k

    cdef int _open_row_type(self, cnp.ndarray rows) except -1:
        """Takes the row shape and dtype of `rows` (a batch): for a Column that
        was finalized empty, with nothing to say what its rows are."""
        self._adopt_storage(np.empty((MIN_CAPACITY,) + (<object>rows).shape[1:], rows.dtype), 0)
        self.row_type_open = False
        return 0

    def check_rows(self, rows):
        """Raises ValueError unless `rows` is a batch of rows of this Column's shape."""
        cdef cnp.ndarray arr = np.asarray(rows)
        if self.row_type_open:
            return
        if arr.ndim != self.row_ndim + 1 or (<object>arr).shape[1:] != self.row_shape_tuple:
            raise ValueError(
                f"cannot add rows of shape {(<object>arr).shape[1:]} to data whose rows have "
                f"shape {self.row_shape_tuple}"
            )

    def check_row(self, row):
        """Raises ValueError unless `row` has this (finalized) Column's row shape."""
        if self.row_fits(row) or (self.row_ndim == 0 and isinstance(row, generic_type)):
            return
        shape = np.shape(row)
        if shape != self.row_shape_tuple:
            raise ValueError(
                f"cannot add an item of shape {shape} to finalized data whose rows "
                f"have shape {self.row_shape_tuple}"
            )

    cdef int _reserve(self, Py_ssize_t rows) except -1:
        """Makes room for `rows` more rows: capacity doubles, old rows are kept."""
        cdef Py_ssize_t needed = self.size + rows
        cdef Py_ssize_t new_capacity
        cdef cnp.ndarray new
        self._make_writable()
        if needed <= self.capacity:
            return 0
        if needed < self.size or self.capacity > (<Py_ssize_t>(SIZE_MAX >> 2)) // max(self.row_bytes, 1):
            raise MemoryError("Column cannot grow any further")
        new_capacity = max(needed, 2 * self.capacity, MIN_CAPACITY)
        if self.pod:
            return self._resize(new_capacity)
        # Object references: numpy copies them (and their counts).
        new = np.empty((new_capacity,) + self.row_shape_tuple, dtype=self.descr)
        new[:self.size] = self.rows(0, self.size)
        self._adopt_storage(new, self.size)
        return 0

    cdef int _make_writable(self) except -1:
        # Read-only storage is copied into storage of the Column's own before
        # anything writes to it; views handed out keep the shared rows.
        if not self.read_only:
            return 0
        if self.pod:
            return self._resize(self.size)
        self._adopt_storage(np.array(self.rows(0, self.size)), self.size)
        return 0

    cdef bint _owns_block(self) noexcept:
        # Nothing but this Column uses its storage: a block it allocated, of
        # which no view is out (every view holds the block's Memory as its
        # base), and from its first byte (a view of later rows is not the
        # block's start, whatever holds the block).
        return self.data != NULL and (self.owner is None or (
            type(self.owner) is Memory and refcount(<PyObject*>self.owner) == 1
            and (<Memory>self.owner).ptr == self.data))

    cdef int _resize(self, Py_ssize_t new_capacity) except -1:
        """Moves plain-old-data storage to a block of `new_capacity` rows (at
        least the rows in use). A block only this Column uses is realloc'd:
        often in place, never zero-filled (ndarray.resize would). Otherwise
        the rows are copied to a new block, and views handed out keep the old
        one, unchanged."""
        cdef size_t nbytes = <size_t>new_capacity * <size_t>self.row_bytes
        cdef char* block
        if self._owns_block():
            if self.owner is not None:      # a Memory no view holds any more
                (<Memory>self.owner).ptr = NULL
                self.owner = None
            block = <char*>PyMem_RawRealloc(self.data, nbytes if nbytes else 1)
            if block == NULL:
                raise MemoryError("Column cannot grow any further")
        else:
            block = allocate(nbytes)
            memcpy(block, self.row_ptr(0, self.size), self.size * self.row_bytes)
            self.owner = None               # views keep the old storage
        self.data = block
        self.capacity = new_capacity
        self.read_only = False
        return 0

    cdef int _retype(self, object dtype) except -1:
        """Storage of `dtype` (same capacity) holding the rows in use, cast as
        numpy casts them; the old storage stays with views handed out.
        (numpy's own array: a finalized dtype promotion is rare.)"""
        new = np.empty((self.capacity,) + self.row_shape_tuple, dtype=dtype)
        new[:self.size] = self.rows(0, self.size)
        self._adopt_storage(new, self.size)
        return 0

    cdef int _to_object_path(self) except -1:
        if self.kind == KIND_OBJECT:
            return 0
        if self.kind == KIND_EMPTY_DICT:
            self.items = [{} for _ in range(self.size)]
        else:
            self.items = [self.item(i) for i in range(self.size)] if self.kind != KIND_EMPTY else []
        self._refs_changed()
        self.kind = KIND_OBJECT
        self._release_storage()
        self.descr = None
        self.value_offset = -1
        self.pod = False
        self.size = self.capacity = 0
        return 0

    # -- reading --------------------------------------------------------------

    cdef object item(self, Py_ssize_t pos):
        """Item at row `pos` (0 <= pos < len): list-mode types, or numpy's."""
        cdef char* src
        cdef cnp.ndarray row
        if self.kind == KIND_OBJECT:
            return self.items[pos]
        if self.kind == KIND_EMPTY_DICT:
            return {}
        src = self.row_ptr(pos, 1)
        if self.finalized:
            if self.row_ndim != 0:
                return self.row_view(pos)
            if not self.plain():
                return self.rows(pos, pos + 1)[0]    # numpy's scalar of any dtype
            return PyArray_Scalar(src, <cnp.PyArray_Descr*>self.descr, NULL)
        if self.kind == KIND_FLOAT:
            return PyFloat_FromDouble((<double*>src)[0])
        if self.kind == KIND_INT:
            return PyLong_FromLongLong((<int64_t*>src)[0])
        if self.kind == KIND_BOOL:
            return (<cnp.npy_bool*>src)[0] != 0
        if self.kind == KIND_SCALAR:
            return PyArray_Scalar(src, <cnp.PyArray_Descr*>self.descr, NULL)
        # KIND_ARRAY: a fresh copy, as RLlib hands back the caller's own array.
        row = empty_array(self.row_ndim, self.row_shape, self.descr)
        memcpy(array_bytes(row, self.row_bytes), src, self.row_bytes)
        return row

    cdef object row_view(self, Py_ssize_t pos):
        return self.rows_view(pos, 1, 1, False)

    cdef object rows_view(self, Py_ssize_t first, Py_ssize_t count, Py_ssize_t step,
                          bint leading_axis):
        """An ndarray view of `count` rows from `first` every `step` rows (all
        valid), with or without the leading axis (then count must be 1).
        Built directly with the C-API: numpy's slicing machinery costs more
        than the rest of a get()."""
        cdef cnp.npy_intp dims[65]
        cdef cnp.npy_intp strides[65]
        cdef cnp.npy_intp stride = self.itemsize()
        cdef int i, nd = 1 if leading_axis else 0
        if self.descr is None:
            raise TypeError("the object path has no array view")
        if leading_axis:
            dims[0] = count
            # One row or none: its stride is never used, and a huge step
            # times the row size would overflow.
            strides[0] = step * self.row_bytes if count > 1 else self.row_bytes
        for i in range(self.row_ndim - 1, -1, -1):     # rows are C-contiguous
            dims[nd + i] = self.row_shape[i]
            strides[nd + i] = stride
            stride *= self.row_shape[i]
        cdef char* start = self.row_ptr(first, 1) if count else self.data
        if CHECKED and count > 1:
            self.row_ptr(first + (count - 1) * step, 1)
        descr = self.descr
        Py_INCREF(descr)
        view = PyArray_NewFromDescr(
            <PyTypeObject*>ndarray_type, <cnp.PyArray_Descr*>descr, nd + self.row_ndim, dims,
            strides, start, 0 if self.read_only else cnp.NPY_ARRAY_WRITEABLE, NULL)
        cnp.set_array_base(<cnp.ndarray>view, self._view_base())
        return view

    def get(self, Py_ssize_t pos):
        """Item at row `pos`, negative counting from the end; IndexError outside."""
        cdef Py_ssize_t n = len(self)
        if pos < 0:
            pos += n
        if pos < 0 or pos >= n:
            raise IndexError(f"row {pos} is out of range for {n} rows")
        return self.item(pos)

    def live_list(self):
        """The items as the list that holds them, moving to the object path:
        changes made to that list are changes to the Column, as with RLlib."""
        self._to_object_path()
        return self.items

    def to_list(self):
        """All items as a list (the object path's own list, else a new one)."""
        if self.kind == KIND_OBJECT:
            return self.items
        return [self.item(i) for i in range(self.size)]

    def view(self):
        """Rows in use as an ndarray view of the storage (finalized or typed)."""
        if self.kind == KIND_OBJECT:
            raise TypeError("the object path has no array view")
        if self.descr is None:
            return None
        return self.rows(0, self.size)

    def writable_view(self):
        """Rows in use as a writable ndarray view: read-only storage (shared,
        as unpickled from Ray's object store) is copied into the Column's own
        first, as for every write."""
        if self.kind == KIND_OBJECT:
            raise TypeError("the object path has no array view")
        self._make_writable()
        return self.view()

    # -- changing -------------------------------------------------------------

    cdef int _check_position(self, Py_ssize_t pos) except -1:
        if pos < 0 or pos >= len(self):
            raise IndexError(f"row {pos} is out of range for {len(self)} rows")
        return 0

    def set(self, Py_ssize_t pos, object value):
        """Overwrites row `pos` (0 <= pos < len)."""
        cdef int overflow = 0
        cdef char* dst
        self._check_position(pos)
        if self.kind == KIND_OBJECT:
            self.items[pos] = value
            return
        self._make_writable()
        if self.finalized:
            self.rows(pos, pos + 1)[0] = value
            return
        t = type(value)
        if self.kind == KIND_EMPTY_DICT:
            if not (t is dict and not value):
                self._to_object_path()
                self.items[pos] = value
            return
        dst = self.row_ptr(pos, 1)
        if self.kind == KIND_ARRAY and t is ndarray_type and self._row_matches(value):
            memcpy(dst, array_bytes(<cnp.ndarray>value, self.row_bytes), self.row_bytes)
        elif self.kind == KIND_FLOAT and t is float:
            (<double*>dst)[0] = PyFloat_AS_DOUBLE(value)
        elif self.kind == KIND_BOOL and t is bool:
            (<cnp.npy_bool*>dst)[0] = value is True
        elif self.kind == KIND_SCALAR and self.is_scalar_type(t):
            self.copy_scalar(value, dst)
        elif self.kind == KIND_INT and t is int:
            v = PyLong_AsLongLongAndOverflow(value, &overflow)
            if overflow:
                self._to_object_path()
                self.items[pos] = value
            else:
                (<int64_t*>dst)[0] = v
        else:
            self._to_object_path()
            self.items[pos] = value

    def pop(self, Py_ssize_t pos):
        """Removes row `pos` (0 <= pos < len)."""
        self._check_position(pos)
        self.remove(pos)

    cdef int remove(self, Py_ssize_t pos) except -1:
        # pop(pos) for a position already checked (0 <= pos < len).
        if self.kind == KIND_OBJECT:
            del self.items[pos]
            return 0
        if self.kind == KIND_EMPTY_DICT:
            self.size -= 1
            return 0
        if self.finalized:
            # New storage, as np.delete gives: views handed out earlier keep
            # their rows even when later appends reuse the freed slot.
            self._adopt_storage(np.delete(self.rows(0, self.size), pos, axis=0), self.size - 1)
            return 0
        self._make_writable()
        if pos < self.size - 1:
            memmove(self.row_ptr(pos, self.size - pos - 1),
                    self.row_ptr(pos + 1, self.size - pos - 1),
                    (self.size - pos - 1) * self.row_bytes)
        self.size -= 1
        return 0

    def finalize(self):
        """Switches to numpy semantics. Returns False if the caller must batch
        the items itself (object path). The typed path copies nothing: its
        block is realloc'd down to the rows in use (spare capacity would
        otherwise stay with the finalized data for good)."""
        if self.kind == KIND_OBJECT:
            return False
        if self.kind == KIND_EMPTY or self.kind == KIND_EMPTY_DICT:
            return False
        self.finalize_typed()
        return True

    cdef int finalize_typed(self) except -1:
        # finalize() of typed storage.
        # Spare capacity beyond an eighth of the rows goes back; a smaller
        # tail is left alone: shrinking a large block in place makes the
        # allocator hand back its pages, which the next episode then faults
        # in again (8x slower Atari-sized collection when every block shrank).
        if self.capacity - self.size > self.size // 8 and self._owns_block():
            self._resize(self.size)
        self.finalized = True
        return 0

    # -- blocks -----------------------------------------------------------------

    cdef int check_range(self, Py_ssize_t start, Py_ssize_t stop) except -1:
        """IndexError unless 0 <= start <= stop <= len(self)."""
        cdef Py_ssize_t n = len(self.items) if self.kind == KIND_OBJECT else self.size
        if not 0 <= start <= stop <= n:
            raise IndexError(f"rows [{start}, {stop}) are not a range within {n} rows")
        return 0

    cdef Column copy_rows(self, Py_ssize_t start, Py_ssize_t stop):
        """A new list-mode Column with copies of rows [start, stop)."""
        cdef Column out = Column.__new__(Column)
        cdef Py_ssize_t n
        self.check_range(start, stop)
        n = stop - start
        out.kind = self.kind
        if self.kind == KIND_OBJECT:
            out.items = self.items[start:start + n]
            out._refs_changed()
        elif self.kind == KIND_EMPTY_DICT:
            out.size = n
        elif self.kind != KIND_EMPTY:
            out._adopt_block(max(n, MIN_CAPACITY) * self.row_bytes, self.descr,
                             max(n, MIN_CAPACITY), self.row_ndim, self.row_shape, n)
            memcpy(out.row_ptr(0, n), self.row_ptr(start, n), n * self.row_bytes)
        return out

    cdef Column view_rows(self, Py_ssize_t start, Py_ssize_t stop):
        """A new finalized Column over rows [start, stop) of this finalized
        one, sharing its memory (it copies out on its first append)."""
        cdef Column out = Column.__new__(Column)
        cdef Py_ssize_t n = stop - start
        self.check_range(start, stop)
        if self.descr is None:
            raise TypeError("the object path has no array view")
        if n == 0 and self.pod:
            # No rows to share: an empty block keeps nothing else alive.
            out._adopt_block(0, self.descr, 0, self.row_ndim, self.row_shape, 0)
        else:
            # The rows in place, kept alive by this Column's view base (no
            # ndarray per view: an episode read from a file makes several).
            out._set_layout(self.descr, self.row_ndim, self.row_shape)
            out._install(self._view_base(), n, n)
            out.data = self.row_ptr(start, n) if n else self.data
            out.read_only = self.read_only
        out.kind = KIND_ARRAY
        out.finalized = True
        return out

    def extend_from(self, Column other not None, Py_ssize_t start, Py_ssize_t stop):
        """Appends rows [start, stop) of `other`: one block copy when both hold
        the same kind of typed rows, item by item otherwise."""
        cdef Py_ssize_t n, i
        other.check_range(start, stop)
        n = stop - start
        if (not self.finalized and not other.finalized and self.kind == other.kind
                and self.kind in (KIND_FLOAT, KIND_INT, KIND_BOOL, KIND_SCALAR, KIND_ARRAY)
                and self.descr == other.descr
                and self.row_shape_tuple == other.row_shape_tuple):
            self._reserve(n)
            memcpy(self.row_ptr(self.size, n), other.row_ptr(start, n), n * self.row_bytes)
            self.size += n
        elif not self.finalized and self.kind == KIND_EMPTY_DICT and other.kind == KIND_EMPTY_DICT:
            self.size += n
        elif self.finalized and other.finalized and other.kind != KIND_OBJECT:
            self.extend_rows(other.rows(start, stop))
        else:
            for i in range(start, stop):
                self.push(other.item(i))

    # -- pickling ---------------------------------------------------------------

    def __reduce_ex__(self, protocol):
        return (_restore_column, (COLUMN_FORMAT,) + column_state(self, protocol >= 5, None))


cdef tuple column_state(Column col, bint raw, dict dtype_texts):
    """(kind, finalized, row_type_open, payload): what column_from_state takes.
    With `raw` (pickle protocol 5), plain rows are a PickleBuffer, their
    dtype as a string and their shape: numpy's own array reduction pickles a
    dtype object and costs several times more. (Protocol 5 only: copy.deepcopy
    and older protocols cannot take a PickleBuffer. Plain numbers only: numpy
    refuses to export datetimes and the like as buffers, and pickles them itself.)
    `dtype_texts` (or None) keeps the dtype strings of one pickle by the
    dtype's id: descr.str builds a new string each time, and one string
    object pickles once."""
    if col.kind == KIND_OBJECT:
        payload = col.items
    elif col.kind == KIND_EMPTY_DICT or col.kind == KIND_EMPTY:
        payload = col.size
    elif col.plain() and raw:
        rows = col.rows(0, col.size)
        if dtype_texts is None:
            text = col.descr.str
        else:
            text = dtype_texts.get(id(col.descr))
            if text is None:
                text = dtype_texts[id(col.descr)] = col.descr.str
        payload = (PickleBuffer(rows), text, (<object>rows).shape)
    else:
        payload = col.rows(0, col.size)
    return (col.kind, <bint>col.finalized, <bint>col.row_type_open, payload)


# What each list-mode kind stores: the dtype its items become.
cdef dict KIND_DTYPES = {KIND_FLOAT: float64, KIND_INT: int64, KIND_BOOL: bool_}


def _restore_column(version, kind, finalized, row_type_open, payload):
    """A Column from its pickled state (see column_from_state)."""
    if type(version) is not int or version != COLUMN_FORMAT:
        raise ValueError(f"cannot restore a Column pickled in format {version!r}; "
                         f"this version of episode reads format {COLUMN_FORMAT}")
    return column_from_state(kind, finalized, row_type_open, payload)


cdef Column empty_dicts(Py_ssize_t n):
    # A list-mode Column of n empty dicts: a count (an episode's usual infos).
    cdef Column col = Column.__new__(Column)
    if n < 0:
        raise ValueError(f"{n} empty dicts")
    col.kind = KIND_EMPTY_DICT
    col.size = n
    return col


cdef Column column_from_state(object kind, object finalized, object row_type_open,
                              object payload):
    """A Column from column_state()'s fields, checked first: the typed paths
    trust kind, dtype, row shape and size to agree, and a pickle may be corrupt."""
    cdef Column col = Column.__new__(Column)
    cdef cnp.ndarray arr
    if type(kind) is not int:
        raise ValueError(f"corrupt Column state: unknown kind {kind!r}")
    if type(finalized) is not bool or type(row_type_open) is not bool:
        raise ValueError("corrupt Column state: flags must be bools")
    if kind == KIND_OBJECT:
        if type(payload) is not list or finalized or row_type_open:
            raise ValueError("corrupt Column state: the object path holds a list in list mode")
        col.items = payload
        col._refs_changed()
    elif kind == KIND_EMPTY_DICT or kind == KIND_EMPTY:
        if (type(payload) is not int or not 0 <= payload <= (0 if kind == KIND_EMPTY else 1 << 60)
                or finalized or row_type_open):
            raise ValueError("corrupt Column state: an empty or empty-dict Column holds a count")
        col.size = payload
    elif KIND_FLOAT <= kind <= KIND_ARRAY:
        arr = _restored_rows(payload)
        dtype = arr.dtype
        if not finalized:
            # List mode memcpy's and reads back raw bytes: the storage must be
            # exactly what the kind's items are stored as.
            if row_type_open or not is_plain_numeric(dtype):
                raise ValueError(f"corrupt Column state: {dtype} rows in list mode")
            if kind != KIND_ARRAY and (arr.ndim != 1 or dtype != KIND_DTYPES.get(kind, dtype)):
                raise ValueError(f"corrupt Column state: kind {kind} cannot hold {dtype} "
                                 f"rows of shape {(<object>arr).shape[1:]}")
        elif row_type_open and cnp.PyArray_DIMS(arr)[0]:
            raise ValueError("corrupt Column state: an open row type with rows")
        # Unpickled arrays may be read-only views of the pickle's buffer (out
        # of band: the object store's memory). Finalized rows are read there
        # and copied on the first write; list mode grows in place, which needs
        # storage of its own. The C paths read rows as typed values: rows at
        # an address not aligned for their dtype are copied.
        if (not cnp.PyArray_IS_C_CONTIGUOUS(arr) or not cnp.PyArray_ISALIGNED(arr)
                or not (finalized or cnp.PyArray_ISWRITEABLE(arr))):
            arr = cnp.PyArray_NewCopy(arr, cnp.NPY_CORDER)
        col._adopt_storage(arr, cnp.PyArray_DIMS(arr)[0])
    else:
        raise ValueError(f"corrupt Column state: unknown kind {kind!r}")
    col.kind = kind
    col.finalized = finalized
    col.row_type_open = row_type_open
    return col


# The dtypes of raw rows met so far, by their string (np.dtype() parses it
# each time otherwise): a handful of plain numeric dtypes.
cdef dict RAW_DTYPES = {}


cdef cnp.dtype raw_dtype(object text):
    """The plain numeric dtype a raw payload names (ValueError for any other)."""
    found = RAW_DTYPES.get(text) if type(text) is str else None
    if found is not None:
        return <cnp.dtype>found
    if type(text) is not str:
        raise ValueError(f"corrupt Column state: a raw payload's dtype is a string, "
                         f"not {type(text).__name__}")
    try:
        dtype = np.dtype(text)
    except (TypeError, ValueError) as error:
        raise ValueError(f"corrupt Column state: no dtype {text!r}") from error
    if not is_plain_numeric(dtype):
        raise ValueError(f"corrupt Column state: raw rows of {dtype}")
    if len(RAW_DTYPES) < 64:
        RAW_DTYPES[text] = dtype
    return <cnp.dtype>dtype


cdef object raw_rows(object data, object dtype_text, object shape):
    """The rows of a raw payload: an array over `data`'s buffer (kept alive
    by a memoryview of it, its base), once the buffer is known to hold
    exactly `shape` rows of the dtype."""
    cdef cnp.dtype dtype = raw_dtype(dtype_text)
    cdef cnp.npy_intp dims[65]
    cdef Py_ssize_t ndim, i, d, count = 1
    cdef Py_buffer* view
    if type(shape) is not tuple or not 1 <= len(<tuple>shape) <= 65:
        raise ValueError(f"corrupt Column state: rows of shape {shape!r}")
    ndim = len(<tuple>shape)
    for i in range(ndim):
        value = (<tuple>shape)[i]
        if type(value) is not int or not 0 <= value <= PY_SSIZE_T_MAX:
            raise ValueError(f"corrupt Column state: rows of shape {shape!r}")
        d = value
        dims[i] = d
        if d != 0 and count > PY_SSIZE_T_MAX // d:
            raise ValueError(f"corrupt Column state: rows of shape {shape!r}")
        count *= d
    memory = PyMemoryView_FromObject(data)       # TypeError for no buffer
    view = PyMemoryView_GET_BUFFER(memory)
    if not PyBuffer_IsContiguous(view, b'C'):
        raise ValueError("corrupt Column state: a raw payload is not one contiguous block")
    if count > PY_SSIZE_T_MAX // dtype.itemsize or view.len != count * dtype.itemsize:
        raise ValueError(f"corrupt Column state: {view.len} bytes are not rows of shape "
                         f"{shape!r} of {dtype}")
    Py_INCREF(dtype)
    arr = PyArray_NewFromDescr(<PyTypeObject*>ndarray_type, <cnp.PyArray_Descr*>dtype,
                               <int>ndim, dims, NULL, view.buf,
                               0 if view.readonly else cnp.NPY_ARRAY_WRITEABLE, NULL)
    cnp.set_array_base(<cnp.ndarray>arr, memory)
    return arr


cdef object _restored_rows(object payload):
    """The ndarray a pickled Column's payload describes (ValueError if none)."""
    if type(payload) is tuple:
        if len(payload) != 3:
            raise ValueError("corrupt Column state: a buffer payload is (data, dtype, shape)")
        data, dtype, shape = payload
        return raw_rows(data, dtype, shape)
    if type(payload) is not ndarray_type or (<cnp.ndarray>payload).ndim == 0:
        raise ValueError("corrupt Column state: the rows are not an array with a leading axis")
    return payload
