"""BufferCore: the compiled half of InfiniteLookbackBuffer.

It owns the storage (one Column, or after finalize() of Dict/Tuple data a tree
of Columns) and the per-step methods: append, len, and get/[] without fill or
one-hot. Everything else lives in the Python facade
(episode/lookback_buffer.py), which subclasses this type so that the hot
methods are reached without an extra Python frame.
"""
cimport numpy as cnp
from cpython.object cimport PyObject, PyTypeObject
from libc.string cimport memcpy

import gymnasium as gym
import numpy as np

from episode._column cimport Column, array_bytes
from episode._index cimport (SliceSpec, checked_lookback, clamped_index, interpret_slice,
                             int_position, slice_positions)
from episode.spaces import flatten_struct, is_struct


cnp.import_array()

# Fill values the compiled path handles; others (arrays, structs) take the
# general path in the facade.
SCALAR_FILLS = frozenset([float, int, bool, np.float32, np.float64, np.int64, np.int32])
# Spaces whose fill rows are np.full(shape, fill, dtype) of the space.
FLAT_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete,
               gym.spaces.MultiBinary)


cdef tuple NO_ARGS = ()


cdef BufferCore new_buffer(type cls):
    """An empty instance of `cls` (a BufferCore subclass) without __init__:
    the type's own tp_new, as `cls.__new__(cls)` would call, minus the lookup."""
    return <BufferCore>(<PyTypeObject*>cls).tp_new(cls, <PyObject*>NO_ARGS, NULL)


cdef class BufferCore:

    def __cinit__(self, *args, **kwargs):
        # Storage is set by whoever makes the buffer (the facade's __init__,
        # sub_buffer, unpickling), so none is allocated here.
        self._col = None
        self._tree = None
        self._lookback = 0

    @property
    def lookback(self):
        """How many of the first items form the lookback (an int >= 0)."""
        return self._lookback

    @lookback.setter
    def lookback(self, value):
        self._lookback = checked_lookback(value)

    cdef int set_storage(self, Column col, object tree) except -1:
        """Makes `col` (one track) or `tree` (a dict/tuple of finalized Columns
        of one length) the storage, after checking it is one of the two."""
        cdef Py_ssize_t n = -1
        if (col is None) == (tree is None):
            raise TypeError("a buffer's storage is one Column or one tree of Columns")
        if tree is not None:
            if not is_struct(tree):
                raise TypeError(f"a tree of Columns is a dict or tuple, not {type(tree).__name__}")
            for leaf in flatten_struct(tree):
                if type(leaf) is not Column or not (<Column>leaf).finalized:
                    raise TypeError(f"a tree's leaves are finalized Columns, not {leaf!r}")
                if n >= 0 and len(leaf) != n:
                    raise ValueError("the Columns of a tree must have one length")
                n = len(leaf)
        self._col, self._tree = col, tree
        return 0

    def _set_storage(self, Column col, tree):
        """Python's way to set the storage (see set_storage)."""
        self.set_storage(col, tree)

    @property
    def finalized(self):
        """True once finalize() turned the data into numpy arrays."""
        return self._col is None or self._col.finalized

    def append(self, item):
        """Appends `item` at the end of the buffer."""
        self.push(item)

    cpdef check_append(self, object item):
        """Raises (ValueError) if `item` cannot be appended to finalized data."""
        if self._col is not None:
            if self._col.finalized:
                self._col.check_row(item)
        else:
            self._check_struct(item)

    def __len__(self):
        """Number of items after the lookback."""
        cdef Py_ssize_t n = self.len_incl_lookback()
        return n - self._lookback if n > self._lookback else 0

    cpdef Py_ssize_t len_incl_lookback(self):
        """Number of items, lookback included."""
        if self._col is not None:
            return self._col.nrows()
        return self._first_leaf_len()

    def get(self, indices=None, *, neg_index_as_lookback=False, fill=None,
            one_hot_discrete=False, _ignore_last_ts=False, _add_last_ts_value=None):
        """Returns data at `indices` (int, list of ints, slice or None for all).

        Non-negative indices start after the lookback; negative ones count from
        the end, or with `neg_index_as_lookback=True` back into the lookback.
        `fill` pads requests that run past either end of the data;
        `one_hot_discrete` turns Discrete/MultiDiscrete values into one-hot
        vectors (needs a space). See the class docstring for details.
        """
        return self.cget(indices, neg_index_as_lookback, fill, one_hot_discrete,
                         _ignore_last_ts, _add_last_ts_value)

    cdef object cget(self, object indices, bint neg_index_as_lookback, object fill,
                     bint one_hot_discrete, bint ignore_last_ts, object add_last_ts_value):
        if (self._col is not None and not one_hot_discrete
                and not ignore_last_ts and add_last_ts_value is None):
            if fill is None:
                if type(indices) is int:
                    return self._get_int(indices, neg_index_as_lookback)
                if type(indices) is slice:
                    return self._get_slice(indices, neg_index_as_lookback)
            elif type(indices) is slice and type(fill) in SCALAR_FILLS:
                return self._get_slice_filled(indices, neg_index_as_lookback, fill)
        return self._get_general(indices, neg_index_as_lookback, fill,
                                 one_hot_discrete, ignore_last_ts, add_last_ts_value)

    def __getitem__(self, item):
        if self._col is not None:
            if type(item) is int:
                return self._get_int(item, False)
            if type(item) is slice:
                return self._get_slice(item, False)
        return self._get_general(item, False, None, False, False, None)

    cpdef BufferCore sub_buffer(self, object slice_, bint neg_index_as_lookback,
                                Py_ssize_t lookback, object space):
        """A new buffer of this class holding `self.get(slice_, neg_index_as_lookback)`
        with `lookback` (capped at its length) and `space`. Finalized data is
        shared (a view), list-mode rows are copied as one block."""
        cdef Column col = self._col
        cdef Py_ssize_t n, first, step, count
        cdef SliceSpec spec
        cdef BufferCore out
        if col is None or type(slice_) is not slice:
            return self._sub_buffer_general(slice_, neg_index_as_lookback, lookback, space)
        if lookback < 0:
            checked_lookback(lookback)      # raises
        n = col.nrows()
        interpret_slice(slice_, neg_index_as_lookback, self._lookback, n, &spec)
        count = slice_positions(&spec, n, &first, &step)
        if step != 1:
            return self._sub_buffer_general(slice_, neg_index_as_lookback, lookback, space)
        out = new_buffer(type(self))
        out._col = col.view_rows(first, first + count) if col.finalized \
            else col.copy_rows(first, first + count)
        out._lookback = min(lookback, count)
        if space is self._space:
            out._space, out._space_struct = self._space, self._space_struct
        elif space is None:
            out._space = out._space_struct = None
        else:
            out.space = space
        return out

    cdef object _get_int(self, object index, bint neg_index_as_lookback):
        cdef Column col = self._col
        cdef Py_ssize_t n = col.nrows()
        cdef Py_ssize_t idx = clamped_index(index)
        cdef Py_ssize_t lb = self._lookback
        cdef Py_ssize_t underflow = (n - lb if n > lb else 0) + lb
        cdef Py_ssize_t pos = int_position(idx, neg_index_as_lookback, lb, n, underflow)
        if pos < 0:
            raise IndexError(
                f"index {index} (neg_index_as_lookback={bool(neg_index_as_lookback)}) is out "
                f"of range for a buffer of {n} items ({lb} of them lookback); "
                f"pass `fill` to pad"
            )
        return col.item(pos)

    cdef object _get_slice(self, object slice_, bint neg_index_as_lookback):
        cdef SliceSpec spec
        interpret_slice(slice_, neg_index_as_lookback, self._lookback, self._col.nrows(), &spec)
        return self._slice_rows(&spec)

    cdef object _slice_rows(self, SliceSpec* spec):
        """The rows `spec` selects (no fill): a view once finalized, else a list."""
        cdef Column col = self._col
        cdef Py_ssize_t first, step, count, i
        count = slice_positions(spec, col.nrows(), &first, &step)
        if col.finalized:
            return col.rows_view(first, count, step, True)
        return [col.item(first + i * step) for i in range(count)]

    cdef object _get_slice_filled(self, object slice_, bint neg_index_as_lookback,
                                  object fill):
        """A slice padded with `fill` where it runs past the data, one gather."""
        cdef Column col = self._col
        cdef Py_ssize_t n = col.nrows()
        cdef SliceSpec spec
        cdef Py_ssize_t first, step, count, i, left, total, row_bytes
        cdef cnp.ndarray out, value
        cdef char* dst
        cdef char* element
        interpret_slice(slice_, neg_index_as_lookback, self._lookback, n, &spec)
        if spec.fill_left == 0 and spec.fill_right == 0:
            return self._slice_rows(&spec)
        count = slice_positions(&spec, n, &first, &step)
        if spec.length <= 0:
            count = 0
        left = spec.fill_left
        total = left + count + spec.fill_right
        if not col.finalized:
            item = fill if self._space is None else self._fill_item(fill, False)
            return ([item] * left + [col.item(first + i * step) for i in range(count)]
                    + [item] * spec.fill_right)
        # Finalized: RLlib concatenates fill rows (typed by the space, else as
        # np.array([fill])) with the data rows; one array of the promoted dtype.
        if not self._fill_plan_matches(col, fill):
            if not self._make_fill_plan(col, fill):
                return self._get_general(slice_, neg_index_as_lookback, fill, False, False, None)
        if count:
            if self._plan_dtype is None:       # fill and data have no common dtype
                return self._get_general(slice_, neg_index_as_lookback, fill, False, False, None)
            dtype, value = self._plan_dtype, self._plan_value
        else:
            dtype, value = self._plan_fill_dtype, self._plan_fill_value
        cdef cnp.npy_intp dims[65]
        dims[0] = total
        for i in range(col.row_ndim):
            dims[i + 1] = col.row_shape[i]
        out = cnp.PyArray_EMPTY(col.row_ndim + 1, dims, (<cnp.dtype>dtype).type_num, 0) \
            if (<cnp.dtype>dtype).isbuiltin else np.empty((total,) + col.row_shape_tuple, dtype)
        row_bytes = (<cnp.dtype>dtype).itemsize
        for i in range(col.row_ndim):
            row_bytes *= col.row_shape[i]
        dst = array_bytes(out, total * row_bytes)
        element = array_bytes(value, (<cnp.dtype>dtype).itemsize)
        repeat_bytes(dst, element, (<cnp.dtype>dtype).itemsize, left * row_bytes)
        repeat_bytes(dst + (left + count) * row_bytes, element, (<cnp.dtype>dtype).itemsize,
                     spec.fill_right * row_bytes)
        if count:
            # Raw rows only where they mean the same in both (not, say, str
            # rows of another width): everything else is numpy's cast.
            if col.pod and (<void*>cnp.PyArray_DESCR(out) == col.descr or cnp.PyArray_EquivTypes(
                    <cnp.dtype>cnp.PyArray_DESCR(out), <cnp.dtype>col.descr)):
                dst += left * row_bytes
                for i in range(count):
                    memcpy(dst + i * row_bytes, col.row_ptr(first + i * step, 1), row_bytes)
            else:
                out[left:left + count] = col.array[first:first + count * step:step] \
                    if first + count * step >= 0 else col.array[first::step][:count]
        return out

    cdef bint _fill_plan_matches(self, Column col, object fill):
        # The storage's very dtype object, held by the plan (so its address
        # cannot be reused): a dtype widened within one type number (U5 to
        # U20, m8[D] to m8[s]) needs a new plan.
        return (self._plan_col is col and <void*>self._plan_data_dtype == col.descr
                and self._plan_space is self._space and type(fill) is type(self._plan_fill)
                and fill == self._plan_fill)

    cdef bint _make_fill_plan(self, Column col, object fill) except -1:
        """Works out, once per (column, space, fill), the dtypes RLlib's
        concatenation gives and the fill element in them. False: not a case
        for the compiled path."""
        space = self._space
        if space is None:
            fill_dtype = np.asarray(fill).dtype
        elif isinstance(space, FLAT_SPACES) and space.shape == col.row_shape_tuple:
            fill_dtype = space.dtype
        else:
            return False
        data_dtype = <object>cnp.PyArray_DESCR(col.array)
        try:
            dtype = fill_dtype if fill_dtype == data_dtype \
                else np.result_type(fill_dtype, data_dtype)
        except TypeError:           # no common dtype: only all-fill requests are planned
            dtype = None
        if fill_dtype.hasobject or (dtype is not None and dtype.hasobject):
            return False
        fill_value = np.array(fill, dtype=fill_dtype)     # cast as np.full would
        self._plan_fill_dtype, self._plan_fill_value = fill_dtype, fill_value
        self._plan_dtype = dtype
        self._plan_value = None if dtype is None else \
            fill_value if dtype == fill_dtype else fill_value.astype(dtype)
        self._plan_col, self._plan_data_dtype = col, data_dtype
        self._plan_space, self._plan_fill = space, fill
        return True


cdef inline void repeat_bytes(char* dst, const char* element, Py_ssize_t itemsize,
                              Py_ssize_t nbytes) noexcept nogil:
    """Fills `nbytes` at `dst` with copies of one `itemsize`-byte element,
    doubling the copied block each time."""
    cdef Py_ssize_t done
    if nbytes <= 0:
        return
    memcpy(dst, element, itemsize)
    done = itemsize
    while done < nbytes:
        memcpy(dst + done, dst, min(done, nbytes - done))
        done += min(done, nbytes - done)


cdef BufferCore empty_buffer(type cls, object space, object space_struct):
    """An empty list-mode buffer of class `cls` (a BufferCore subclass) with
    `space` and its struct (spaces.base_struct), as `cls(space=space)` makes
    it, without the Python-level __init__."""
    cdef BufferCore buffer = new_buffer(cls)
    buffer.set_storage(Column(), None)
    buffer._space = space
    buffer._space_struct = space_struct
    return buffer
