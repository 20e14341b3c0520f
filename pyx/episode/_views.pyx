# Gathers of view rows in one C pass: the inference input of many episodes
# (each episode's rows around its next timestep) without a Python step per
# episode, and the inference input of one AgentCollector without a Python
# step per view. The rules are those of episode/views.py; tracks that do not
# fit here (Dict/Tuple items, the object path, mixed dtypes) take its path.

cimport cython
cimport numpy as cnp
from cpython.dict cimport PyDict_Copy, PyDict_Update
from cpython.object cimport PyObject, PyTypeObject
from libc.string cimport memcpy, memset

from episode._buffer cimport BufferCore
from episode._column cimport (Column, KIND_OBJECT, KIND_EMPTY, KIND_EMPTY_DICT, array_bytes,
                              empty_array)
from episode._episode cimport EpisodeCore, own_extras, steps

import sys

import numpy as np

cnp.import_array()

cdef tuple EMPTY_TUPLE = ()

cdef extern from "Python.h":
    # obj.__dict__ = d, without the attribute lookup.
    int PyObject_GenericSetDict(object o, object d, void* context) except -1

cdef dict _modules = sys.modules

# Larger shifts take the general path (no overflow in the position sums).
cdef long long SHIFT_LIMIT = 1 << 40


cdef BufferCore track_of(EpisodeCore e, str data_col):
    # The buffer holding `data_col`, or None.
    if data_col == "obs":
        return e.observations
    if data_col == "actions":
        return e.actions
    if data_col == "rewards":
        return e.rewards
    if data_col == "infos":
        return None
    found = own_extras(e).get(data_col)
    return found if isinstance(found, BufferCore) else None


cdef bint same_layout(Column col, Column first):
    cdef int k
    if not (col.descr == first.descr and col.row_bytes == first.row_bytes
            and col.row_ndim == first.row_ndim):
        return False
    for k in range(col.row_ndim):
        if col.row_shape[k] != first.row_shape[k]:
            return False
    return True


cdef bint zeros_fit(object space, Column first) except -1:
    # Whether zero rows shaped by `space` (what the general path pads an
    # empty track with) batch with `first`'s rows to the same result: the
    # same dtype (float32 and float64 both end as float32) and row shape.
    if space is None or not hasattr(space, "dtype") or not hasattr(space, "shape"):
        return False
    if space.shape is None or tuple(space.shape) != tuple(
            [first.row_shape[k] for k in range(first.row_ndim)]):
        return False
    dtype = np.dtype(space.dtype)
    floats = (np.dtype(np.float32), np.dtype(np.float64))
    return dtype == first.descr or (dtype in floats and first.descr in floats)


def gather_next_rows(list episodes, str data_col, object shifts, bint zeros_before):
    """Rows len(e) + shift of `data_col` ("obs", "actions", "rewards" or an
    extra model output) of each of `episodes`, as one (episodes, shifts,
    *row) array: before a track's first row its first row again (zeros if
    `zeros_before`), past its last row zeros. None if a track does not fit
    (not one flat typed Column with rows, or dtypes or row shapes that
    differ), for the caller's general path."""
    cdef cnp.ndarray shift_arr = np.ascontiguousarray(shifts, dtype=np.int64)
    cdef Py_ssize_t n_eps = len(episodes), n_shifts = cnp.PyArray_SIZE(shift_arr)
    cdef const long long* shift = <const long long*>array_bytes(
        shift_arr, n_shifts * <Py_ssize_t>sizeof(long long))
    cdef Py_ssize_t i, j, k, pos, rows, row_bytes = 0
    cdef Column col, first = None
    cdef BufferCore buffer
    cdef list cols = [None] * n_eps
    cdef cnp.ndarray out
    cdef char* dst
    cdef Py_ssize_t[::1] base = np.empty(n_eps, dtype=np.intp)
    if n_eps == 0 or cnp.PyArray_NDIM(shift_arr) != 1:
        return None
    for j in range(n_shifts):
        if not -SHIFT_LIMIT <= shift[j] <= SHIFT_LIMIT:
            return None
    for i in range(n_eps):
        e = episodes[i]
        if not isinstance(e, EpisodeCore):
            return None
        buffer = track_of(<EpisodeCore>e, data_col)
        if buffer is None or buffer.flat() is None:
            return None
        col = buffer.flat()
        if col.kind == KIND_EMPTY and not col.finalized:
            # No rows yet (a fresh episode's actions): zeros, checked below.
            if steps(<EpisodeCore>e) != 0:
                return None
            cols[i] = buffer
            base[i] = 0
            continue
        if (col.kind in (KIND_OBJECT, KIND_EMPTY, KIND_EMPTY_DICT) or col.row_type_open
                or not col.pod or col.size == 0 or col.descr is None):
            return None
        if first is None:
            first = col
            row_bytes = col.row_bytes
        elif not same_layout(col, first):
            return None
        if steps(<EpisodeCore>e) > col.size:
            return None  # more steps than rows: not an episode this path reads
        cols[i] = buffer
        base[i] = buffer._lookback + steps(<EpisodeCore>e)
    if first is None:
        return None
    for i in range(n_eps):
        buffer = <BufferCore>cols[i]
        if buffer.flat().size == 0 and not zeros_fit(buffer._space, first):
            return None
    shape = (n_eps, n_shifts) + tuple([first.row_shape[k] for k in range(first.row_ndim)])
    out = np.empty(shape, dtype=first.descr)
    dst = array_bytes(out, n_eps * n_shifts * row_bytes)
    for i in range(n_eps):
        buffer = <BufferCore>cols[i]
        col = buffer.flat()
        rows = col.size
        for j in range(n_shifts):
            pos = base[i] + shift[j]
            if pos >= rows or (pos < 0 and (zeros_before or rows == 0)):
                memset(dst, 0, row_bytes)
            else:
                memcpy(dst, col.row_ptr(pos if pos > 0 else 0, 1), row_bytes)
            dst += row_bytes
    return out


# -- one AgentCollector's inference input ---------------------------------------

cdef cnp.dtype FLOAT32 = np.dtype(np.float32)


cdef object last_rows(Column col, const long long* shift, Py_ssize_t n):
    # Rows len - 1 + shift[j] (j < n) of `col` with a batch axis of one, as
    # views.gather_inference gives them from views.column_rows (float64
    # narrowed to float32); None if the Column does not fit here (no typed
    # rows, or a position outside them: numpy's indexing decides those).
    cdef Py_ssize_t rows = col.size, row_bytes = col.row_bytes, j, k, pos
    cdef cnp.npy_intp dims[cnp.NPY_MAXDIMS]
    cdef int nd = 1, d
    cdef bint narrow
    cdef cnp.dtype descr = col.descr
    cdef cnp.ndarray out
    cdef char* dst
    cdef const double* src
    if (col.kind == KIND_OBJECT or col.kind == KIND_EMPTY_DICT or descr is None
            or not col.pod or col.row_type_open or rows == 0
            or col.row_ndim + 2 > cnp.NPY_MAXDIMS):
        return None
    for j in range(n):
        if not 0 <= shift[j] + (rows - 1) < rows:
            return None
    narrow = descr.type_num == cnp.NPY_DOUBLE and cnp.PyDataType_ISNOTSWAPPED(descr)
    dims[0] = 1
    if n != 1:
        dims[1] = n
        nd = 2
    for d in range(col.row_ndim):
        dims[nd + d] = col.row_shape[d]
    out = empty_array(nd + col.row_ndim, dims, FLOAT32 if narrow else descr)
    dst = array_bytes(out, n * (row_bytes // 2 if narrow else row_bytes))
    for j in range(n):
        pos = shift[j] + (rows - 1)
        if narrow:
            src = <const double*>col.row_ptr(pos, 1)
            for k in range(row_bytes // 8):
                (<float*>dst)[k] = <float>src[k]
            dst += row_bytes // 2
        else:
            memcpy(dst, col.row_ptr(pos, 1), row_bytes)
            dst += row_bytes
    return out


@cython.final
cdef class _View:
    # One view of an InferencePlan: its data column's tracks and its shifts.
    cdef str view_col, data_col
    cdef list tracks
    cdef Py_ssize_t n_tracks, n_shifts
    cdef cnp.ndarray shifts    # int64, contiguous, kept alive for `shift`
    cdef const long long* shift
    cdef object struct


@cython.final
cdef class BatchMaker:
    """Makes batches of class `cls` (RLlib's SampleBatch) the way one real
    `cls(columns, **kwargs)` made `example`, without running its constructor
    again: the example's attributes, with a fresh empty set/dict/list where
    it had one. Only for columns of the same layout as the example's."""

    cdef object cls
    cdef bint dict_new    # cls.__new__ is dict's: its slot is called directly
    cdef dict attributes
    cdef list fresh       # (name, type) of the empty mutable attributes

    def __init__(self, object cls, object example):
        self.cls = cls
        self.dict_new = (isinstance(cls, type) and issubclass(cls, dict)
                         and cls.__new__ is dict.__new__)
        self.attributes = dict(vars(example))
        self.fresh = []
        for name, value in self.attributes.items():
            if type(value) in (set, dict, list):
                if len(value):
                    raise ValueError(f"attribute {name!r} is not empty: not a template")
                self.fresh.append((name, type(value)))

    def __call__(self, dict columns):
        return self.make(columns)

    cdef object make(self, dict columns):
        cdef dict attributes
        cdef object batch
        cdef tuple fresh
        if self.dict_new:
            batch = (<PyTypeObject*>self.cls).tp_new(<type>self.cls, <PyObject*>EMPTY_TUPLE, NULL)
            PyDict_Update(batch, columns)
        else:
            batch = self.cls.__new__(self.cls)
            dict.update(batch, columns)
        attributes = PyDict_Copy(self.attributes)
        for fresh in self.fresh:
            kind = fresh[1]
            attributes[fresh[0]] = set() if kind is set else {} if kind is dict else []
        PyObject_GenericSetDict(batch, attributes, NULL)
        return batch


@cython.final
cdef class InferencePlan:
    """What one AgentCollector's build_for_inference reads, resolved once:
    per view, its data column's tracks and shifts (collector.py makes it and
    keeps it while the collector's layout stays). `columns()` then gathers
    every view in one pass; a track that does not fit the C gather takes
    `fallback(track, shifts)`, and struct views are rebuilt by
    `unflatten(struct, leaves)`. Once told how its batches are made
    (`set_batches`), `batch()` answers the whole call."""

    cdef readonly object view_requirements
    cdef readonly Py_ssize_t n_views
    cdef readonly bint training
    cdef list views       # _View
    cdef object fallback
    cdef object unflatten
    cdef bint ready       # set_batches() was called
    cdef object batch_module  # RLlib's sample_batch module then (None: plain dicts)
    cdef BatchMaker maker  # a BatchMaker for that module's SampleBatch

    def __init__(self, object view_requirements, bint training, list entries,
                 object fallback, object unflatten):
        cdef _View view
        self.views = []
        for view_col, data_col, tracks, shifts, struct in entries:
            if not isinstance(tracks, list) or not all(isinstance(t, Column) for t in tracks):
                raise TypeError("a view's tracks are a list of Columns")
            view = _View()
            view.view_col = view_col
            view.data_col = data_col
            view.tracks = tracks
            view.n_tracks = len(tracks)
            view.shifts = np.ascontiguousarray(shifts, dtype=np.int64).reshape(-1)
            view.n_shifts = cnp.PyArray_SIZE(view.shifts)
            view.shift = <const long long*>array_bytes(
                view.shifts, view.n_shifts * <Py_ssize_t>sizeof(long long))
            view.struct = struct
            self.views.append(view)
        self.view_requirements = view_requirements
        self.n_views = len(view_requirements)
        self.training = training
        self.fallback = fallback
        self.unflatten = unflatten

    def fits(self, object view_requirements, bint training):
        """Whether this plan was made for these views and mode."""
        return self._fits(view_requirements, training)

    cdef bint _fits(self, object view_requirements, bint training) except -1:
        return (view_requirements is self.view_requirements and training == self.training
                and len(view_requirements) == self.n_views)

    def set_batches(self, object batch_module, BatchMaker maker):
        """From now on batch() answers while `batch_module` (RLlib's
        sample_batch module, or None) is the one loaded: plain dicts of the
        columns without it, `maker`'s batches with it."""
        if batch_module is not None and maker is None:
            raise TypeError("a SampleBatch needs its BatchMaker")
        self.batch_module = batch_module
        self.maker = maker
        self.ready = True

    def batch(self, object view_requirements, bint training, dict buffers):
        """The whole build_for_inference, or None if the caller must take
        its general path (not ready, made for other views or tracks, or
        another sample_batch module loaded)."""
        if not self.ready or not self._fits(view_requirements, training):
            return None
        if _modules.get("ray.rllib.policy.sample_batch") is not self.batch_module:
            return None
        columns = self._columns(buffers)
        if columns is None or self.maker is None:
            return columns
        return self.maker.make(columns)

    def columns(self, dict buffers):
        """The views' arrays (view_col -> array or struct of arrays), or None
        if `buffers` no longer holds the tracks this plan was made for."""
        return self._columns(buffers)

    cdef object _columns(self, dict buffers):
        cdef dict out = {}
        cdef _View view
        cdef list leaves
        cdef Py_ssize_t i
        for view in self.views:
            if buffers.get(view.data_col) is not view.tracks or len(view.tracks) != view.n_tracks:
                return None
            if view.struct is None and view.n_tracks == 1:
                out[view.view_col] = self._rows(<Column?>view.tracks[0], view)
                continue
            leaves = [self._rows(<Column?>view.tracks[i], view) for i in range(view.n_tracks)]
            out[view.view_col] = (leaves[0] if view.struct is None
                                  else self.unflatten(view.struct, leaves))
        return out

    cdef object _rows(self, Column track, _View view):
        rows = last_rows(track, view.shift, view.n_shifts)
        return self.fallback(track, view.shifts) if rows is None else rows
