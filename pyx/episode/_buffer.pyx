"""BufferCore: the compiled half of InfiniteLookbackBuffer.

It owns the storage, a tree of Columns whose trivial case is one Column
(flat items) and whose other cases hold Dict/Tuple items one Column per leaf
(see _tree.pyx), and the per-step methods: append, len, get/[] (with scalar
fill) and sub-buffers. Everything else lives in the Python facade
(episode/lookback_buffer.py), which subclasses this type so that the hot
methods are reached without an extra Python frame.
"""
cimport cython
cimport numpy as cnp
from cpython.object cimport PyObject, PyTypeObject
from libc.stdint cimport int64_t
from libc.string cimport memcpy

import gymnasium as gym
import numpy as np

from episode._column cimport (Column, PyObject_GC_IsTracked, PyObject_GC_Track,
                              PyObject_GC_UnTrack, array_bytes, column_from_state, column_state)
from episode._index cimport (SliceSpec, checked_lookback, clamped_index, interpret_slice,
                             int_position, slice_positions)
from episode._tree cimport (GATHER_COPY, GATHER_ITEM, GATHER_ROWS, GATHER_VIEW, Node,
                            new_tree, tree_node, truncate_leaves)
from episode.spaces import _space_key as space_key
from episode.spaces import base_struct, flatten_struct, is_struct, map_struct, shared_space


cnp.import_array()

# Fill values the compiled path handles; others (arrays, structs) take the
# general path in the facade.
cdef object ALL = slice(None)
SCALAR_FILLS = frozenset([float, int, bool, np.float32, np.float64, np.int64, np.int32])
# Spaces whose fill rows are np.full(shape, fill, dtype) of the space.
FLAT_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete,
               gym.spaces.MultiBinary)


cdef tuple NO_ARGS = ()


cdef BufferCore new_buffer(type cls):
    """An empty instance of `cls` (a BufferCore subclass) without __init__:
    the type's own tp_new, as `cls.__new__(cls)` would call, minus the lookup."""
    return <BufferCore>(<PyTypeObject*>cls).tp_new(cls, <PyObject*>NO_ARGS, NULL)



cdef class FillPlan:
    """Works out, once per (Column, space, fill), the dtypes RLlib's
    concatenation of fill rows and data rows gives, and the fill element in
    them; rows() then builds a padded slice in one pass."""

    cdef bint fits(self, Column col, object space, object fill):
        # The storage's very dtype object, held by the plan (so its address
        # cannot be reused): a dtype widened within one type number (U5 to
        # U20, m8[D] to m8[s]) needs a new plan.
        return (self.col is col and <void*>self.data_dtype == <void*>col.descr
                and self.space is space and type(fill) is type(self.fill)
                and fill == self.fill)

    cdef bint make(self, Column col, object space, object fill) except -1:
        """False: not a case for the compiled path."""
        if space is None:
            fill_dtype = np.asarray(fill).dtype
        elif isinstance(space, FLAT_SPACES) and space.shape == col.row_shape_tuple:
            fill_dtype = space.dtype
        else:
            return False
        data_dtype = col.descr
        try:
            dtype = fill_dtype if fill_dtype == data_dtype \
                else np.result_type(fill_dtype, data_dtype)
        except TypeError:           # no common dtype: only all-fill requests are planned
            dtype = None
        if fill_dtype.hasobject or (dtype is not None and dtype.hasobject):
            return False
        fill_value = np.array(fill, dtype=fill_dtype)     # cast as np.full would
        self.fill_dtype, self.fill_value = fill_dtype, fill_value
        self.dtype = dtype
        self.value = None if dtype is None else \
            fill_value if dtype == fill_dtype else fill_value.astype(dtype)
        self.col, self.data_dtype = col, data_dtype
        self.space, self.fill = space, fill
        return True

    cdef object rows(self, Column col, SliceSpec* spec, Py_ssize_t first, Py_ssize_t count,
                     Py_ssize_t step):
        """Fill rows, `count` data rows from `first` every `step`, fill rows:
        one array of the promoted dtype. None when data and fill have no
        common dtype (the caller takes the general path)."""
        cdef Py_ssize_t left = spec.fill_left, total, row_bytes, i
        cdef cnp.ndarray out, value
        cdef char* dst
        cdef char* element
        cdef cnp.npy_intp dims[65]
        total = left + count + spec.fill_right
        if count:
            if self.dtype is None:
                return None
            dtype, value = self.dtype, self.value
        else:
            dtype, value = self.fill_dtype, self.fill_value
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
            if col.pod and (<void*>cnp.PyArray_DESCR(out) == <void*>col.descr or cnp.PyArray_EquivTypes(
                    <cnp.dtype>cnp.PyArray_DESCR(out), <cnp.dtype>col.descr)):
                dst += left * row_bytes
                for i in range(count):
                    memcpy(dst + i * row_bytes, col.row_ptr(first + i * step, 1), row_bytes)
            else:
                out[left:left + count] = col.rows_view(first, count, step, True)
        return out


cdef object Discrete = gym.spaces.Discrete
cdef object MultiDiscrete = gym.spaces.MultiDiscrete


cdef Py_ssize_t one_hot_width(object space) except -2:
    """The one-hot width of a Discrete or 1-D MultiDiscrete space; -1 for
    any other space (the general path encodes those)."""
    if type(space) is Discrete:
        return space.n
    if type(space) is MultiDiscrete and space.nvec.ndim == 1:
        return int(space.nvec.sum())
    return -1


cdef bint finite_float(object fill, double* out) except -1:
    # The fill as the float32 that np.full(..., fill, np.float32) stores;
    # False for values a C cast cannot take (out of float32's range).
    try:
        value = float(fill)
    except OverflowError:
        return False
    if value == value and not (-3.4028234663852886e38 <= value <= 3.4028234663852886e38):
        return False
    out[0] = value
    return True


cdef object one_hot_values(object values, object space, bint rows, Py_ssize_t left,
                           Py_ssize_t right, double fill_value):
    """RLlib's one-hot encoding (float32) of integer `values` for a Discrete
    or 1-D MultiDiscrete `space`: a batch of rows when `rows` (then `left` and
    `right` rows of `fill_value` around it), else one item; values None:
    a fill item only. None for anything RLlib's encoding treats otherwise
    (bools, other dtypes or shapes, values outside the space's range: the
    general path gives RLlib's result or error)."""
    cdef cnp.ndarray x, out
    cdef Py_ssize_t width = one_hot_width(space), k, m, r, j, offset, v, total
    cdef Py_ssize_t data_rows = 0
    cdef const int64_t* src
    cdef float* dst
    cdef cnp.npy_intp dims[2]
    cdef Py_ssize_t depths[64]
    multi = type(space) is MultiDiscrete
    k = len(space.nvec) if multi else 1
    if k > 64:
        return None
    if multi:
        for j in range(k):
            depths[j] = space.nvec[j]
    else:
        depths[0] = width
    if values is not None:
        x = np.asarray(values)
        if cnp.PyArray_TYPE(x) == cnp.NPY_BOOL or x.dtype.kind not in "iu":
            return None
        # Rows of the space's shape: () for Discrete, (k,) for MultiDiscrete.
        if x.ndim != rows + multi or (multi and x.shape[x.ndim - 1] != k):
            return None
        data_rows = x.shape[0] if rows else 1
        x = np.ascontiguousarray(x, dtype=np.int64)
    elif not rows:
        left = 1                 # the fill item: one row of fill, no leading axis
    total = left + data_rows + right
    dims[0] = total
    dims[1] = width
    cdef cnp.npy_intp* shape = &dims[0] if rows else &dims[1]
    out = cnp.PyArray_ZEROS(2 if rows else 1, shape, cnp.NPY_FLOAT32, 0)
    dst = <float*>array_bytes(out, total * width * sizeof(float))
    for r in range(left * width):
        dst[r] = <float>fill_value
    for r in range((left + data_rows) * width, total * width):
        dst[r] = <float>fill_value
    if data_rows:
        src = <const int64_t*>array_bytes(x, data_rows * k * sizeof(int64_t))
        for r in range(data_rows):
            offset = (left + r) * width
            for j in range(k):
                v = src[r * k + j]
                if v < 0 or v >= depths[j]:
                    return None
                dst[offset + v] = 1.0
                offset += depths[j]
    return out


def _key_orders(x):
    """The dict key orders of a nested struct (to compare two structs' orders)."""
    if isinstance(x, dict):
        return tuple([(k, _key_orders(v)) for k, v in x.items()])
    if isinstance(x, tuple):
        return tuple([_key_orders(v) for v in x])
    return None


# no_gc_clear: __dealloc__ reads the storage to release its leaves (see
# untrack); a cycle through a buffer always also runs through a clearable
# object (a Column's items list, a dict tree, a fill state, a space).
@cython.no_gc_clear
cdef class BufferCore:

    def __cinit__(self):
        # Every buffer has storage from the start (an empty list-mode
        # Column), so no C path meets a missing one.
        self.set_storage(Column.__new__(Column))
        self._lookback = 0

    def __dealloc__(self):
        self.release_leaves()

    cdef int untrack(self) except -1:
        """Takes the buffer out of the cyclic collector's sight while nothing
        it holds can lead back to it: leaves of numbers (Columns the
        collector does not track), no fill state (fill values are the
        caller's objects). Its spaces are taken to lead nowhere (a space is
        the env's, never holding an episode's buffer). A replay batch's
        transitions are made of such buffers, hundreds per draw: untracked,
        they cost collections nothing. It is tracked again as soon as a
        leaf is (Column.holder), its storage or space changes, or a fill
        state is made (track)."""
        cdef Py_ssize_t k
        cdef Column leaf
        if self._fill is not None or not PyObject_GC_IsTracked(self):
            return 0
        for k in range(self.nleaves()):
            leaf = self.leaf(k)
            if PyObject_GC_IsTracked(leaf) or leaf.holder != NULL:
                return 0
        for k in range(self.nleaves()):
            self.leaf(k).holder = <PyObject*>self
        PyObject_GC_UnTrack(self)
        return 0

    cdef void track(self) noexcept:
        """Back in the collector's sight, before anything it holds changes."""
        if not PyObject_GC_IsTracked(self):
            self.release_leaves()
            PyObject_GC_Track(self)

    cdef void release_leaves(self) noexcept:
        # The leaves stop pointing back at this buffer (untrack).
        cdef Py_ssize_t k
        cdef Column leaf
        if self._tree is None:
            return
        for k in range(self.nleaves()):
            leaf = self.leaf(k)
            if leaf.holder == <PyObject*>self:
                leaf.holder = NULL

    def _set_space(self, space, space_struct):
        """Sets the space and its struct (spaces.base_struct)."""
        self.track()
        self._space = space
        self._space_struct = space_struct

    @property
    def lookback(self):
        """How many of the first items form the lookback (an int >= 0)."""
        return self._lookback

    @lookback.setter
    def lookback(self, value):
        self._lookback = checked_lookback(value)

    cdef int set_storage(self, object tree) except -1:
        """Makes `tree` the storage, after checking that it is one: a Column,
        or a dict/tuple of distinct Columns of one length and one mode, whose
        containers are exact dicts/tuples when in list mode."""
        cdef Py_ssize_t n, i
        cdef Node node
        cdef Column first
        self.track()
        if type(tree) is Column:
            self._tree, self._node, self._tree_leaves = tree, None, None
            return 0
        if not isinstance(tree, (dict, tuple)):
            raise TypeError(f"a buffer's storage is a Column or a dict/tuple of Columns, "
                            f"not {type(tree).__name__}")
        leaves = []
        node = tree_node(tree, leaves)
        if not leaves:
            raise ValueError("a tree of Columns needs at least one Column")
        first = <Column>leaves[0]
        n = first.nrows()
        for i in range(len(leaves)):
            if (<Column>leaves[i]).nrows() != n:
                raise ValueError("the Columns of a tree must have one length")
            if (<Column>leaves[i]).finalized != first.finalized:
                raise ValueError("the Columns of a tree are all finalized or none is")
        if len({id(leaf) for leaf in leaves}) != len(leaves):
            raise ValueError("the Columns of a tree must be distinct objects")
        if node is None and not first.finalized:
            raise TypeError("a list-mode tree is made of exact dicts and tuples")
        self._tree, self._node, self._tree_leaves = tree, node, tuple(leaves)
        return 0

    def _set_storage(self, tree):
        """Python's way to set the storage (see set_storage)."""
        self.set_storage(tree)

    @property
    def _col(self):
        """The storage's one Column (flat items), else None."""
        return self.flat()

    @property
    def _leaves(self):
        """The storage's Columns, in dm-tree (sorted-key) order."""
        return [self.flat()] if self.flat() is not None else list(self._tree_leaves)

    @property
    def finalized(self):
        """True once finalize() turned the data into numpy arrays."""
        return self.first().finalized

    def append(self, item):
        """Appends `item` at the end of the buffer."""
        self.push(item)

    cpdef finalize(self):
        """Turns the data into numpy arrays (a dict/tuple of them for Dict/Tuple
        items). Typed Columns already are arrays, so this only flips their
        mode; items on the object path are batched as RLlib batches them."""
        self.commit_finalize(self.prepare_finalize())

    cpdef object prepare_finalize(self):
        """The first half of finalize(), which changes nothing: None when it
        only flips typed leaves (or the data is finalized already), else the
        storage it makes (batching may raise; the buffer is unchanged)."""
        cdef Py_ssize_t k
        if self.first().finalized:
            return None
        if self.first().nrows() > 0:
            for k in range(self.nleaves()):
                if self.leaf(k).kind == KIND_OBJECT or self.leaf(k).kind == KIND_EMPTY_DICT:
                    break
            else:
                return None
        return self._batched_storage()

    cpdef commit_finalize(self, object storage):
        """The second half of finalize(), which cannot fail on what
        prepare_finalize() gave: flips typed leaves, sets new storage."""
        cdef Py_ssize_t k
        if self.first().finalized:
            return
        if storage is None:
            for k in range(self.nleaves()):
                self.leaf(k).finalize()
            return
        for leaf in ([storage] if type(storage) is Column else flatten_struct(storage)):
            if not (<Column>leaf).finalized:
                (<Column>leaf).finalize()
        self.set_storage(storage)

    def _extend_items(self, items):
        """Appends each of `items` (a list-mode extend)."""
        for item in items:
            self.push(item)

    cdef int push_struct(self, object item) except -1:
        """push() for all but the flat fast path: the first list-mode item
        (a dict/tuple starts a tree) and trees."""
        cdef Column col = self.flat()
        cdef Node node = self._node
        cdef Py_ssize_t n
        if col is not None:
            tree = new_tree(item) if type(item) is dict or type(item) is tuple else None
            if tree is None:
                return col.push(item)
            self.set_storage(tree)
            node = self._node
        elif node is None or not node.matches(item):
            if self.first().finalized:
                self._append_struct(item)     # dm-tree's rules (the facade)
                return 0
            # Another shape: every item as it was given, on the object path.
            self.to_object_path()
            return self.flat().push(item)
        if self.first().finalized:
            node.check_rows(item)
        n = self.first().nrows()
        try:
            node.push(item)
        except BaseException as error:
            # Only an item that changes while it is read gets here: the
            # leaves go back to one length, and list mode keeps the item
            # as it is on the object path.
            truncate_leaves(self._tree_leaves, n)
            if self.first().finalized or not isinstance(error, Exception):
                raise
            self.to_object_path()
            return self.flat().push(item)
        return 0

    cdef int to_object_path(self) except -1:
        """Moves list-mode tree storage to the object path: one Column
        holding each item as a dict/tuple (as RLlib's list does)."""
        cdef Py_ssize_t i
        if self._node is None or self.first().finalized:
            return 0
        items = [self._node.gather(GATHER_ITEM, i, 0, 0) for i in range(self.first().nrows())]
        col = Column()
        for item in items:
            col.push(item)
        self.set_storage(col)
        return 0

    def _to_object_path(self):
        """Python's way to call to_object_path."""
        self.to_object_path()

    def _matches(self, item):
        """True when `item` has exactly the shape of list-mode tree storage."""
        return self._node is not None and self._node.matches(item)

    def _set_item(self, Py_ssize_t pos, item):
        """Overwrites list-mode row `pos` (0 <= pos < len) with `item`,
        leaf by leaf when it has the tree's shape."""
        if pos < 0 or pos >= self.first().nrows():
            raise IndexError(f"row {pos} is out of range for {self.first().nrows()} rows")
        if self.flat() is None and not self.first().finalized and not self._node.matches(item):
            self.to_object_path()
        if self.flat() is not None:
            self.flat().set(pos, item)
        else:
            self._node.set(pos, item)

    cpdef check_append(self, object item):
        """Raises (ValueError) if `item` cannot be appended to finalized data."""
        if not self.first().finalized:
            return
        if self.flat() is not None:
            self.flat().check_row(item)
        elif self._node is not None and self._node.matches(item):
            self._node.check_rows(item)
        else:
            self._check_struct(item)

    def __len__(self):
        """Number of items after the lookback."""
        cdef Py_ssize_t n = self.first().nrows()
        return n - self._lookback if n > self._lookback else 0

    cpdef Py_ssize_t len_incl_lookback(self):
        """Number of items, lookback included."""
        return self.first().nrows()

    cdef object item_at(self, Py_ssize_t pos):
        # 0 <= pos < len_incl_lookback(), checked by the caller.
        if self.flat() is not None:
            return self.flat().item(pos)
        if self._node is not None:
            return self._node.gather(GATHER_ITEM, pos, 0, 0)
        return map_struct(lambda col: col.get(pos), self._tree)

    cdef object assembled(self, list results):
        # One result per leaf (dm-tree order) in the items' shape.
        return results[0] if self.flat() is not None else self._node.assemble(results)

    def _item(self, Py_ssize_t pos):
        """The item at raw position `pos` (lookback included)."""
        if pos < 0 or pos >= self.first().nrows():
            raise IndexError(f"row {pos} is out of range for {self.first().nrows()} rows")
        return self.item_at(pos)

    def _items(self):
        """All items as a list (list mode; the object path's own list)."""
        cdef Py_ssize_t i
        if self.flat() is not None:
            return self.flat().to_list()
        return [self.item_at(i) for i in range(self.first().nrows())]

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
        if (not one_hot_discrete and not ignore_last_ts and add_last_ts_value is None
                and (self.flat() is not None or self._node is not None)):
            if indices is None:
                # Everything after the lookback (a fill has nothing to pad).
                return self._get_slice(ALL, False)
            if fill is None:
                if type(indices) is int:
                    return self._get_int(indices, neg_index_as_lookback)
                if type(indices) is slice:
                    return self._get_slice(indices, neg_index_as_lookback)
            elif type(indices) is slice and type(fill) in SCALAR_FILLS:
                return self._get_slice_filled(indices, neg_index_as_lookback, fill)
        elif (one_hot_discrete and not ignore_last_ts and add_last_ts_value is None
                and (self.flat() is not None or self._node is not None)
                and (type(indices) is int or type(indices) is slice)
                and (fill is None or type(fill) in SCALAR_FILLS)):
            out = self._get_one_hot(indices, neg_index_as_lookback, fill)
            if out is not None:
                return out
        return self._get_general(indices, neg_index_as_lookback, fill,
                                 one_hot_discrete, ignore_last_ts, add_last_ts_value)

    def __getitem__(self, item):
        if self.flat() is not None or self._node is not None:
            if type(item) is int:
                return self._get_int(item, False)
            if type(item) is slice:
                return self._get_slice(item, False)
        return self._get_general(item, False, None, False, False, None)

    cpdef BufferCore sub_buffer(self, object slice_, bint neg_index_as_lookback,
                                Py_ssize_t lookback, object space):
        """A new buffer of this class holding `self.get(slice_, neg_index_as_lookback)`
        with `lookback` (capped at its length) and `space`. Finalized data is
        shared (a view), list-mode rows are copied as one block per leaf."""
        cdef Column col = self.flat()
        cdef Py_ssize_t n, first, step, count
        cdef SliceSpec spec
        cdef BufferCore out
        cdef bint finalized = self.first().finalized
        if type(slice_) is not slice or (col is None and self._node is None):
            return self._sub_buffer_general(slice_, neg_index_as_lookback, lookback, space)
        if lookback < 0:
            checked_lookback(lookback)      # raises
        n = self.first().nrows()
        interpret_slice(slice_, neg_index_as_lookback, self._lookback, n, &spec)
        count = slice_positions(&spec, n, &first, &step)
        if step != 1:
            return self._sub_buffer_general(slice_, neg_index_as_lookback, lookback, space)
        out = new_buffer(type(self))
        if col is not None:
            out.set_storage(col.view_rows(first, first + count) if finalized
                            else col.copy_rows(first, first + count))
        else:
            out.set_storage(self._node.gather(GATHER_VIEW if finalized else GATHER_COPY,
                                              first, first + count, 0))
        out._lookback = min(lookback, count)
        if space is self._space:
            out._space, out._space_struct = self._space, self._space_struct
        elif space is None:
            out._space = out._space_struct = None
        else:
            out.space = space
        return out

    cdef object _get_int(self, object index, bint neg_index_as_lookback):
        cdef Py_ssize_t n = self.first().nrows()
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
        return self.item_at(pos)

    cdef object _get_slice(self, object slice_, bint neg_index_as_lookback):
        cdef SliceSpec spec
        interpret_slice(slice_, neg_index_as_lookback, self._lookback, self.first().nrows(), &spec)
        return self._slice_rows(&spec)

    cdef object _slice_rows(self, SliceSpec* spec):
        """The rows `spec` selects (no fill): views once finalized, else a list."""
        cdef Py_ssize_t first, step, count, i
        count = slice_positions(spec, self.first().nrows(), &first, &step)
        if self.first().finalized:
            if self.flat() is not None:
                return self.flat().rows_view(first, count, step, True)
            return self._node.gather(GATHER_ROWS, first, count, step)
        return [self.item_at(first + i * step) for i in range(count)]

    cdef object _get_slice_filled(self, object slice_, bint neg_index_as_lookback,
                                  object fill):
        """A slice padded with `fill` where it runs past the data, one gather per leaf."""
        cdef Py_ssize_t n = self.first().nrows()
        cdef SliceSpec spec
        cdef Py_ssize_t first, step, count, i, k
        cdef FillPlan plan
        cdef FillState state
        cdef Column leaf
        interpret_slice(slice_, neg_index_as_lookback, self._lookback, n, &spec)
        if spec.fill_left == 0 and spec.fill_right == 0:
            return self._slice_rows(&spec)
        count = slice_positions(&spec, n, &first, &step)
        if spec.length <= 0:
            count = 0
        if not self.first().finalized:
            item = fill if self._space is None else self._fill_item(fill, False)
            return ([item] * spec.fill_left + [self.item_at(first + i * step) for i in range(count)]
                    + [item] * spec.fill_right)
        # Finalized: RLlib concatenates fill rows (typed by the space, else as
        # np.array([fill])) with the data rows, leaf by leaf; its result's
        # keys follow the fill rows' struct (the space's order).
        state = self.fill_state()
        if state.spaces is None or not state.same_order:
            return self._get_general(slice_, neg_index_as_lookback, fill, False, False, None)
        results = []
        for k in range(self.nleaves()):
            leaf = self.leaf(k)
            plan = <FillPlan>state.plans[k]
            space = state.spaces[k]
            if not plan.fits(leaf, space, fill) and not plan.make(leaf, space, fill):
                return self._get_general(slice_, neg_index_as_lookback, fill, False, False, None)
            rows = plan.rows(leaf, &spec, first, count, step)
            if rows is None:
                return self._get_general(slice_, neg_index_as_lookback, fill, False, False, None)
            results.append(rows)
        return self.assembled(results)

    cdef object _get_one_hot(self, object indices, bint neg_index_as_lookback, object fill):
        """get() with one_hot_discrete for Discrete/MultiDiscrete leaves, one
        pass per leaf. None: a case for the general path (other spaces, fill
        rows that need the space's shape, values the encoding refuses)."""
        cdef Py_ssize_t n = self.first().nrows(), lb = self._lookback
        cdef Py_ssize_t pos, first, step, count, i, k, left = 0, right = 0
        cdef SliceSpec spec
        cdef double fill_value = 0.0
        cdef bint finalized = self.first().finalized
        cdef FillState state = self.fill_state()
        if state.spaces is None or self._space is None:
            return None
        for space in state.spaces:
            if one_hot_width(space) < 0:
                return None
        if fill is not None:
            # Fill rows follow the space's key order (fill_batch's), data rows
            # the data's: only the general path mixes the two.
            if not finite_float(fill, &fill_value) or not state.same_order:
                return None
        if type(indices) is int:
            pos = int_position(clamped_index(indices), neg_index_as_lookback, lb, n,
                               (n - lb if n > lb else 0) + lb)
            if pos < 0:
                if fill is None:
                    return self._get_int(indices, neg_index_as_lookback)     # raises
                return self._one_hot_leaves(0, 0, 1, False, 0, 0, fill_value)
            return self._one_hot_leaves(pos, 1, 1, False, 0, 0, 0.0)
        interpret_slice(indices, neg_index_as_lookback, lb, n, &spec)
        count = slice_positions(&spec, n, &first, &step)
        if fill is not None:
            left, right = spec.fill_left, spec.fill_right
        if spec.length <= 0:
            if not (left or right):
                return self._slice_rows(&spec)      # RLlib encodes no empty data
            count = 0
        if finalized:
            return self._one_hot_leaves(first, count, step, True, left, right, fill_value)
        # List mode: one encoded item per row, the fill item repeated (one object).
        fill_item = self._one_hot_leaves(0, 0, 1, False, 0, 0, fill_value) \
            if left or right else None
        items = [self._one_hot_leaves(first + i * step, 1, 1, False, 0, 0, 0.0)
                 for i in range(count)]
        if any(x is None for x in items):
            return None
        return [fill_item] * left + items + [fill_item] * right

    cdef object _one_hot_leaves(self, Py_ssize_t first, Py_ssize_t count, Py_ssize_t step,
                                bint rows, Py_ssize_t left, Py_ssize_t right, double fill_value):
        """Each leaf's one-hot encoding of `count` rows from `first` every
        `step` (with a leading axis when `rows`, then `left`/`right` fill
        rows around them), or of nothing (count 0, no leading axis: one fill
        item), put back into the item's shape. None when a leaf needs the
        general path."""
        cdef Py_ssize_t k
        cdef Column leaf
        cdef list spaces = self._fill.spaces       # fill_state() made it
        results = []
        for k in range(self.nleaves()):
            leaf = self.leaf(k)
            if rows:
                values = leaf.rows_view(first, count, step, True)
            elif count:
                values = leaf.item(first)
            else:
                values = None
            out = one_hot_values(values, spaces[k], rows, left, right, fill_value)
            if out is None:
                return None
            results.append(out)
        return self.assembled(results)

    cdef FillState fill_state(self):
        """The leaves' fill plans and spaces for the current storage and space."""
        cdef FillState state = self._fill
        if state is not None and state.tree is self._tree and state.space is self._space:
            return state
        self.track()
        state = self._fill = FillState()
        state.plans = [FillPlan() for _ in range(self.nleaves())]
        state.tree, state.space = self._tree, self._space
        state.same_order = True
        if self.flat() is not None:
            state.spaces = [self._space]
        elif self._node is None:
            pass                           # an OrderedDict tree: the general path
        elif self._space is None:
            state.spaces = [None] * self.nleaves()
        else:
            try:
                paired = map_struct(lambda col, s: s, self._tree, self._space_struct)
            except ValueError:
                return state
            state.spaces = flatten_struct(paired)
            state.same_order = _key_orders(self._tree) == _key_orders(self._space_struct)
        return state


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
    cdef BufferCore buffer = new_buffer(cls)      # its storage: an empty Column
    buffer._space = space
    buffer._space_struct = space_struct
    return buffer


cdef object Box = gym.spaces.Box


cdef object space_struct(object space):
    # spaces.base_struct(space), without the call for the usual spaces.
    if space is None or type(space) is Box or type(space) is Discrete:
        return space
    return base_struct(space)


# -- a buffer's pickled state -------------------------------------------------------
#
# (lookback, space, kind, finalized, row_type_open, payload): the lookback,
# the space's state (see StateWriter.space_state), and the flat Column's
# state (see column_state); Dict/Tuple storage has kind KIND_TREE and the
# tree of Columns (each pickling itself) as payload.

cdef int KIND_TREE = -1


# Spaces described once for all pickles: the rewards space every episode
# has (a constant of ours), by id (see StateWriter.space_state).
cdef dict DESCRIBED = {}


def _describe_once(space):
    """Describes `space`, a constant that nobody changes, for every pickle."""
    DESCRIBED[id(space)] = StateWriter(False).space_state(space)


cdef class StateWriter:
    """What one pickled state is written with: whether rows go as raw
    buffers, the spaces described so far (an episode's agents share their
    env's spaces: each is described once and pickled once) and the rows'
    dtype strings (likewise)."""

    def __cinit__(self, bint raw):
        self.raw = raw
        self.spaces = DESCRIBED.copy()
        self.dtype_texts = {}

    cdef object space_state(self, object space):
        # None, the space's description (a tuple of 2+ items, see
        # spaces.pickled_space) or (space,): a space without one.
        if space is None:
            return None
        key = id(space)
        found = self.spaces.get(key)
        if found is None:
            description = space_key(space)
            found = self.spaces[key] = (space,) if description is None else description
        return found


cdef class StateReader:
    """What one pickled state is read with: the spaces made from it so far,
    by the id of their state (one pickled object, read once)."""

    def __cinit__(self):
        self.spaces = {}

    cdef object space_from_state(self, object state):
        if state is None:
            return None
        if type(state) is not tuple or len(<tuple>state) == 0:
            raise ValueError(f"corrupt space state: expected None or a tuple, got "
                             f"{type(state).__name__}")
        if len(<tuple>state) == 1:
            return state[0]
        key = id(state)
        found = self.spaces.get(key)
        if found is None:
            try:
                found = shared_space(state)
            except Exception as error:
                raise ValueError(f"corrupt space state: no space is described by "
                                 f"{state!r:.200}") from error
            self.spaces[key] = found
        return found


cdef tuple buffer_state(BufferCore buffer, StateWriter writer):
    space = writer.space_state(buffer._space)
    if buffer.flat() is not None:
        return (buffer._lookback, space) + column_state(buffer.flat(), writer.raw,
                                                        writer.dtype_texts)
    return (buffer._lookback, space, KIND_TREE, False, False, buffer._tree)


cdef BufferCore buffer_from_state(type cls, object state, StateReader reader):
    cdef BufferCore buffer
    cdef Py_ssize_t lookback
    if type(state) is not tuple or len(<tuple>state) != 6:
        raise ValueError(f"corrupt buffer state: expected (lookback, space, kind, finalized, "
                         f"row_type_open, payload), got {type(state).__name__}")
    lookback = checked_lookback(state[0])
    kind = state[2]
    if type(kind) is int and kind == KIND_TREE:
        if state[3] is not False or state[4] is not False:
            raise ValueError("corrupt buffer state: a tree of Columns has no flags of its own")
        storage = state[5]
    else:
        storage = column_from_state(kind, state[3], state[4], state[5])
    space = reader.space_from_state(state[1])
    buffer = empty_buffer(cls, space, space_struct(space))
    buffer.set_storage(storage)            # checks a tree
    buffer._lookback = lookback
    return buffer
