# AgentCollector's compiled core (episode/collector.py). Its steps: a step
# dict's layout (which keys it has, which of their values nest and how,
# which tracks each leaf goes to) is decided once, from a step the Python
# path took; each later step of the same layout is then checked and appended
# here. Its inference input: the views resolved once (InferencePlan), each
# build_for_inference is then one C pass that gathers the rows of every view
# straight into the batch.
cimport cython
cimport numpy as cnp
from cpython.dict cimport PyDict_Copy, PyDict_GetItem, PyDict_Next, PyDict_SetItem, PyDict_Size
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.number cimport PyNumber_Add
from cpython.object cimport PyObject, PyObject_RichCompareBool, PyTypeObject, Py_EQ
from cpython.ref cimport Py_XDECREF, Py_XINCREF
from cpython.tuple cimport PyTuple_GET_ITEM
from libc.string cimport memcpy

from episode._column cimport KIND_EMPTY_DICT, KIND_OBJECT, Column, array_bytes, empty_array

import sys

import numpy as np

from episode.spaces import _nested_leaves

cnp.import_array()

cdef object np_array = np.array
cdef tuple EMPTY_TUPLE = ()
cdef dict _modules = sys.modules
cdef str SAMPLE_BATCH = "ray.rllib.policy.sample_batch"

cdef extern from "Python.h":
    # obj.__dict__ = d, without the attribute lookup.
    int PyObject_GenericSetDict(object o, object d, void* context) except -1
cdef object DECLINE = object()   # resolve()'s answer where the Python path takes the step

# How a step's value goes into its column's tracks.
cdef enum Way:
    WAY_LEAVES = 0       # leaf i (dm-tree's flatten order) into track i
    WAY_WHOLE = 1        # the value as it is into the one track (infos, state outs)
    WAY_FLAT_ACTION = 2  # a struct as one 1-D array of its leaves into the one track

# Nesting of a value as first seen (`shape`): None for a leaf, (keys, shapes)
# for a dict with str keys (keys in sorted order), (type, shapes) for a list
# or tuple, and GENERAL for anything else that nests (dm-tree's own walk).
cdef object GENERAL = object()

cdef str OBS = "obs"
cdef str NEXT_OBS = "new_obs"
cdef str T = "t"
cdef str EPS_ID = "eps_id"
cdef str UNROLL_ID = "unroll_id"


cdef inline bint is_leaf(object x):
    # True for what dm-tree (and so spaces.is_nesting) never descends into,
    # decided by the exact type; False where that takes a closer look.
    cdef object t = type(x)
    return (t is float or t is int or t is bool or x is None or t is str or t is bytes
            or cnp.PyArray_Check(x) or cnp.PyArray_IsAnyScalar(x))


cdef object shape_of(object x):
    # The nesting of `x` as `shape` describes it.
    cdef object t = type(x)
    if is_leaf(x):
        return None
    if t is dict:
        if not all(type(k) is str for k in x):
            return GENERAL
        keys = tuple(sorted(x))
        return (keys, tuple([shape_of(x[k]) for k in keys]))
    if t is list or t is tuple:
        return (t, tuple([shape_of(v) for v in x]))
    return GENERAL


cdef bint walk(object x, object shape, list out) except -1:
    # The leaves of `x` appended to `out` in dm-tree's order, if `x` nests as
    # `shape` says (True); False (out partly filled) where it does not.
    cdef object t = type(x)
    cdef tuple parts, shapes
    cdef Py_ssize_t i, n
    cdef PyObject* v
    if shape is None:
        if not is_leaf(x):
            return False
        out.append(x)
        return True
    if shape is GENERAL:
        return False
    parts = <tuple>shape
    shapes = <tuple>parts[1]
    n = len(shapes)
    if type(parts[0]) is tuple:
        # A dict: the same keys (so the same sorted order), each value as before.
        if t is not dict or PyDict_Size(x) != n:
            return False
        for i in range(n):
            v = PyDict_GetItem(x, (<tuple>parts[0])[i])
            if v == NULL or not walk(<object>v, shapes[i], out):
                return False
        return True
    if t is not parts[0] or len(x) != n:
        return False
    for i in range(n):
        if not walk(x[i], shapes[i], out):
            return False
    return True


cdef inline int put_row(Column track, object row, bint dummy) except -1:
    # Appends `row`; a track ending with a placeholder keeps it last.
    cdef Py_ssize_t n
    cdef object placeholder
    if not dummy:
        return track.push(row)
    n = track.nrows()
    if n == 0:
        raise IndexError("the placeholder row is gone")
    placeholder = track.item(n - 1)
    track.remove(n - 1)
    track.push(row)
    return track.push(placeholder)


@cython.final
cdef class _Entry:
    # One key of the step dict.
    cdef object key       # the key in the step dict
    cdef int way          # a Way
    cdef list tracks      # its column's tracks (Columns)
    cdef Py_ssize_t n     # len(tracks)
    cdef object shape     # WAY_LEAVES: the value's nesting as first seen
    cdef bint is_obs      # the next observation (a list becomes an array first)
    cdef bint dummy       # the tracks end with a placeholder row that stays last


# -- the inference input -------------------------------------------------------

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
    """Makes batches of class `cls` (RLlib's SampleBatch, a dict) the way
    one real `cls(columns, **kwargs)` made `example`, without running its
    constructor again: the example's attributes, with a fresh empty
    set/dict/list where it had one. Only for columns of the same layout as
    the example's."""

    cdef object cls
    cdef bint dict_new    # cls.__new__ is dict's: its slot is called directly
    cdef dict attributes
    cdef list fresh       # (name, type) of the empty mutable attributes

    def __init__(self, object cls, object example):
        if not (isinstance(cls, type) and issubclass(cls, dict)):
            raise TypeError("batches are dicts")
        self.cls = cls
        self.dict_new = cls.__new__ is dict.__new__
        self.attributes = dict(vars(example))
        self.fresh = []
        for name, value in self.attributes.items():
            if type(value) in (set, dict, list):
                if len(value):
                    raise ValueError(f"attribute {name!r} is not empty: not a template")
                self.fresh.append((name, type(value)))

    cdef object empty(self):
        # A batch with the example's attributes and no columns yet.
        cdef dict attributes
        cdef object batch
        cdef tuple fresh
        if self.dict_new:
            batch = (<PyTypeObject*>self.cls).tp_new(<type>self.cls, <PyObject*>EMPTY_TUPLE, NULL)
        else:
            batch = self.cls.__new__(self.cls)
            if not isinstance(batch, dict):
                raise TypeError("batches are dicts")
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
    (`set_batches`), CollectorCore.build_for_inference takes its answer
    (`answer()`) without a Python call."""

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

    cdef object answer(self, object view_requirements, bint training, object buffers):
        # The whole build_for_inference, or None where the caller takes its
        # general path (not ready, made for other views or tracks, or
        # another sample_batch module loaded).
        cdef object batch
        if (not self.ready or not self._fits(view_requirements, training)
                or type(buffers) is not dict):
            return None
        if _modules.get(SAMPLE_BATCH) is not self.batch_module:
            return None
        # The columns go straight into the batch (no dict of them first).
        batch = {} if self.maker is None else self.maker.empty()
        return batch if self._fill(batch, <dict>buffers) else None

    def columns(self, dict buffers not None):
        """The views' arrays (view_col -> array or struct of arrays), or None
        if `buffers` no longer holds the tracks this plan was made for."""
        cdef dict out = {}
        return out if self._fill(out, buffers) else None

    cdef bint _fill(self, object out, dict buffers) except -1:
        # Each view's rows into `out` (a dict or a dict subclass, written as
        # a dict); False if `buffers` no longer holds the plan's tracks.
        cdef _View view
        cdef list leaves
        cdef Py_ssize_t i
        for view in self.views:
            if buffers.get(view.data_col) is not view.tracks or len(view.tracks) != view.n_tracks:
                return False
            if view.struct is None and view.n_tracks == 1:
                PyDict_SetItem(out, view.view_col, self._rows(<Column?>view.tracks[0], view))
                continue
            leaves = [self._rows(<Column?>view.tracks[i], view) for i in range(view.n_tracks)]
            PyDict_SetItem(out, view.view_col,
                           leaves[0] if view.struct is None
                           else self.unflatten(view.struct, leaves))
        return True

    cdef object _rows(self, Column track, _View view):
        rows = last_rows(track, view.shift, view.n_shifts)
        return self.fallback(track, view.shifts) if rows is None else rows


# -- the collector and its steps -----------------------------------------------

@cython.auto_pickle(False)
cdef class CollectorCore:
    """AgentCollector's compiled base: the state a step reads and writes,
    and the step itself. The step layout is a cache of this object's own,
    never pickled or copied (the facade's __getstate__ leaves it out)."""

    cdef public object buffers       # column name -> its tracks (a list of Columns)
    cdef public object episode_id
    cdef public object unroll_id
    cdef public object agent_steps
    cdef public object _is_training
    cdef public object view_requirements
    cdef public object _inference    # build_for_inference's resolved views (an InferencePlan)
    cdef object layout               # a StepLayout, or None

    def add_action_reward_next_obs(self, input_values):
        """Adds one step: the action, the reward, the done flags and the next
        observation (key "new_obs"), and any other per-step columns."""
        # (A local reference: the step may drop the layout, see _keep_stand_ins.)
        cdef object layout = self.layout
        if (layout is None or type(input_values) is not dict
                or not (<StepLayout>layout).add(self, <dict>input_values)):
            self._add_step(input_values)

    def build_for_inference(self):
        """The input of the next forward pass: each view used for computing
        actions at the last timestep, with a batch axis of one."""
        # Samplers call this once per agent and step: the views are resolved
        # once (the facade's _plan_inference), then each call is one C pass.
        cdef object plan = self._inference
        cdef object batch
        if type(plan) is InferencePlan:
            batch = (<InferencePlan>plan).answer(self.view_requirements, self._is_training,
                                                 self.buffers)
            if batch is not None:
                return batch
        return self._build_for_inference()

    def _set_layout(self, StepLayout layout):
        """Steps of `layout` are taken here from now on (None: none)."""
        self.layout = layout

    @property
    def _step_layout(self):
        """The StepLayout steps are taken along, or None."""
        return self.layout

    @property
    def _has_layout(self):
        return self.layout is not None


@cython.final
cdef class StepLayout:
    """What AgentCollector.add_action_reward_next_obs does with a step dict
    whose keys (in their order) and nesting are those of `example`, decided
    from that step (taken by the Python path) and the collector's state
    after it. `add()` takes a later step of the same layout, or declines
    (nothing changed) for the Python path to take it."""

    cdef readonly tuple keys  # the step dict's keys, in order
    cdef list entries         # _Entry per key
    cdef Py_ssize_t n
    cdef _Entry next_t        # "t" not in the step: the last t + 1 into the t tracks
    cdef Column eps_track, unroll_track
    cdef object flatten       # the facade's struct-action flattening
    # The collector's state the layout was decided in: a step is taken here
    # only while it holds. The Python side drops the layout where it changes
    # what is not checked here (pads, fresh columns, stand-ins, placeholder
    # rows).
    cdef object buffers       # collector.buffers (the dict)
    cdef list buffer_keys     # its keys, in order
    cdef object episode_id, unroll_id, is_training
    cdef list track_lists     # its values (lists of tracks), in order
    cdef list all_tracks      # every track, in the order of the buffers
    cdef bint inference       # not training: each step drops every track's first row
    cdef list stand_ins       # tracks whose leading rows stand in for others (typed)
    cdef PyObject** resolved  # per entry, during add(): the value or its leaves
    cdef bint ran_python      # gather() ran Python code (which might change the tracks)

    def __cinit__(self):
        self.resolved = NULL

    def __dealloc__(self):
        if self.resolved != NULL:
            self.release()
            PyMem_Free(self.resolved)

    def __init__(self, CollectorCore collector not None, dict example, list entries,
                 list stand_ins, object flatten, bint t_dummy):
        # `example`: a step of this layout, or its keys each mapped to a
        # StepLayout of the same keys (whose nesting is taken over).
        cdef _Entry entry
        cdef dict buffers = collector.buffers
        cdef Py_ssize_t i
        self.keys = tuple(example)
        if len(entries) != len(self.keys):
            raise ValueError("one entry per key of the step")
        self.entries = []
        for key, (way, data_col, dummy) in zip(self.keys, entries):
            entry = _Entry()
            entry.key = key
            entry.way = way
            entry.tracks = buffers[data_col]
            entry.n = len(entry.tracks)
            entry.is_obs = key == NEXT_OBS
            value = example[key]
            if type(value) is StepLayout:
                entry.shape = (<StepLayout>value).shape_for(key) if way == WAY_LEAVES else None
            else:
                if entry.is_obs and type(value) is list:
                    value = np_array(value)
                entry.shape = shape_of(value) if way == WAY_LEAVES else None
            entry.dummy = dummy
            if way != WAY_LEAVES and entry.n != 1:
                raise ValueError(f"{data_col!r} is kept whole: one track")
            self.entries.append(entry)
        self.n = len(self.entries)
        self.next_t = None
        if T not in example:
            self.next_t = _Entry()
            self.next_t.key = T
            self.next_t.way = WAY_LEAVES
            self.next_t.tracks = buffers[T]
            self.next_t.n = len(self.next_t.tracks)
            self.next_t.dummy = t_dummy
        self.eps_track = buffers[EPS_ID][0]
        self.unroll_track = buffers[UNROLL_ID][0]
        self.flatten = flatten
        self.buffers = buffers
        self.buffer_keys = list(buffers)
        self.episode_id = collector.episode_id
        self.unroll_id = collector.unroll_id
        self.is_training = collector._is_training
        self.inference = not self.is_training
        self.track_lists = list(buffers.values())
        if not all(type(tracks) is list for tracks in self.track_lists):
            raise TypeError("a column's tracks are a list of Columns")
        self.all_tracks = [track for tracks in self.track_lists for track in tracks]
        if not all(type(track) is Column for track in self.all_tracks):
            raise TypeError("a column's tracks are a list of Columns")
        self.stand_ins = list(stand_ins)
        if not all(type(track) is Column for track in self.stand_ins):
            raise TypeError("stand-ins are Columns")
        self.resolved = <PyObject**>PyMem_Malloc((self.n + 1) * sizeof(PyObject*))
        if self.resolved == NULL:
            raise MemoryError()
        for i in range(self.n + 1):
            self.resolved[i] = NULL

    cdef object shape_for(self, object key):
        # The nesting this layout keeps for `key`'s values.
        cdef _Entry entry
        for entry in self.entries:
            if entry.key == key:
                return entry.shape
        raise KeyError(key)

    cdef bint holds(self, CollectorCore collector) noexcept:
        # Whether the collector still has the state the layout was decided in:
        # the same ids and mode, the same buffers dict mapping the same keys
        # to the same lists of the same tracks (its Python side replaces
        # tracks when it re-types them; a user may swap a column's list).
        cdef Py_ssize_t pos = 0, i = 0, j, k = 0, n
        cdef PyObject* key
        cdef PyObject* tracks
        if (collector.unroll_id is not self.unroll_id
                or collector.episode_id is not self.episode_id
                or collector._is_training is not self.is_training
                or collector.buffers is not self.buffers
                or PyDict_Size(self.buffers) != PyList_GET_SIZE(self.track_lists)):
            return False
        while PyDict_Next(self.buffers, &pos, &key, &tracks):
            if (i >= PyList_GET_SIZE(self.track_lists)
                    or key != PyList_GET_ITEM(self.buffer_keys, i)
                    or tracks != PyList_GET_ITEM(self.track_lists, i)):
                return False
            n = PyList_GET_SIZE(<list>tracks)
            if k + n > PyList_GET_SIZE(self.all_tracks):
                return False
            for j in range(n):
                if PyList_GET_ITEM(<list>tracks, j) != PyList_GET_ITEM(self.all_tracks, k):
                    return False
                k += 1
            i += 1
        return k == PyList_GET_SIZE(self.all_tracks)

    cdef object resolve(self, _Entry entry, object value):
        # What goes into the entry's tracks: the value (one track) or a list
        # of its leaves; DECLINE where the Python path takes the step.
        cdef list leaves
        cdef Column track
        if entry.dummy:
            for track in entry.tracks:
                if track.nrows() == 0:
                    return DECLINE     # no placeholder to keep last
        if entry.way == WAY_WHOLE:
            return value
        if entry.way == WAY_FLAT_ACTION:
            if is_leaf(value) or not isinstance(value, (list, tuple, dict)):
                return value
            self.ran_python = True
            return self.flatten(value)
        if entry.is_obs and type(value) is list:
            self.ran_python = True
            value = np_array(value)
        if entry.shape is None and is_leaf(value):
            return value if entry.n == 1 else DECLINE
        leaves = []
        if not walk(value, entry.shape, leaves):
            self.ran_python = True
            leaves = _nested_leaves(value)
        if len(leaves) < entry.n:
            return DECLINE             # too few leaves: the Python path raises
        if entry.n == 1:
            return leaves[0]
        return leaves

    cdef bint gather(self, dict values) except -1:
        # Every value's rows into `resolved` (True), or False (to decline):
        # the step's keys must be the layout's, in its order.
        cdef Py_ssize_t pos = 0, i = 0
        cdef PyObject* key
        cdef PyObject* value
        cdef PyObject* expected
        cdef Column track
        cdef object got
        if PyDict_Size(values) != self.n:
            return False
        try:
            while PyDict_Next(values, &pos, &key, &value):
                if i >= self.n:
                    return False        # (the dict grew meanwhile)
                expected = PyTuple_GET_ITEM(self.keys, i)
                if key != expected:
                    self.ran_python = True
                    if not PyObject_RichCompareBool(<object>key, <object>expected, Py_EQ):
                        return False
                got = self.resolve(<_Entry>PyList_GET_ITEM(self.entries, i), <object>value)
                if got is DECLINE:
                    return False
                Py_XINCREF(<PyObject*>got)
                self.resolved[i] = <PyObject*>got
                i += 1
            if i != self.n:
                return False
            if self.next_t is not None:
                track = <Column>PyList_GET_ITEM(self.next_t.tracks, 0)
                if self.next_t.n != 1 or track.nrows() <= self.next_t.dummy:
                    return False
                got = PyNumber_Add(track.item(track.nrows() - 1), 1)
                Py_XINCREF(<PyObject*>got)
                self.resolved[self.n] = <PyObject*>got
        except Exception:
            # The Python path takes the step and meets the same error there.
            return False
        return True

    cdef int put(self, _Entry entry, object resolved) except -1:
        cdef Py_ssize_t i
        if entry.n == 1:
            return put_row(<Column>PyList_GET_ITEM(entry.tracks, 0), resolved, entry.dummy)
        for i in range(entry.n):
            put_row(<Column>PyList_GET_ITEM(entry.tracks, i), (<list>resolved)[i], entry.dummy)
        return 0

    cdef bint add(self, CollectorCore collector, dict values) except -1:
        # The step, if it fits this layout (True); False (nothing changed) if not.
        cdef Py_ssize_t i
        cdef Column track
        if not self.holds(collector):
            return False
        if self.unroll_id is None:
            # A fragment ended: the first step of the next draws its unroll
            # id (as the Python path does before anything else).
            collector._new_unroll()
            if collector.unroll_id is None:
                return False
            self.unroll_id = collector.unroll_id
        # First every value's rows (the checks that may decline), then the
        # appends, which cannot fail (short of memory): a step is taken whole.
        self.ran_python = False
        if not self.gather(values) or (self.ran_python and not self.holds(collector)):
            self.release()
            return False
        try:
            self.eps_track.push(self.episode_id)
            self.unroll_track.push(self.unroll_id)
            for i in range(self.n):
                self.put(<_Entry>PyList_GET_ITEM(self.entries, i), <object>self.resolved[i])
            if self.next_t is not None:
                self.put(self.next_t, <object>self.resolved[self.n])
        finally:
            self.release()
        if self.inference:
            # Inference needs only the last rows: the oldest goes.
            for i in range(PyList_GET_SIZE(self.all_tracks)):
                track = <Column>PyList_GET_ITEM(self.all_tracks, i)
                if track.nrows():
                    track.remove(0)
        for track in self.stand_ins:
            if track.kind == KIND_OBJECT:
                collector._keep_stand_ins()
                break
        collector.agent_steps += 1
        return True

    cdef int release(self) noexcept:
        # Drops the references gather() took.
        cdef Py_ssize_t i
        for i in range(self.n + 1):
            Py_XDECREF(self.resolved[i])
            self.resolved[i] = NULL
        return 0


# The ways, for the facade that decides them.
LEAVES = WAY_LEAVES
WHOLE = WAY_WHOLE
FLAT_ACTION = WAY_FLAT_ACTION
