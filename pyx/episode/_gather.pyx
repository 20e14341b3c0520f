"""Gathers: the rows of drawn steps into batch arrays, and their n-step returns.

A draw (episode._picks) hands out Picks: each a stored step
(its run and offset), the step its transition or sequence ends at, and what
the draw made of it. These functions read the picks' rows from the store's
blocks (frame-stacked observations rebuilt from their frames) into arrays
of the batch, walk each pick's rewards along its runs for the discounted
return, and find where each end step's row is (new_obs); make_transitions builds
RLlib's one-step episodes of a batch, reading their rows in place.
"""
import numpy as np

cimport numpy as cnp
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.math cimport NAN
from libc.stdint cimport int32_t, int64_t

from episode._arrays cimport copy_row, flat_array
from episode._buffer cimport BufferCore, empty_buffer
from episode._column cimport (Column, KIND_ARRAY, KIND_FLOAT, KIND_INT, KIND_SCALAR,
                              array_bytes, empty_array)
from episode._episode cimport EpisodeCore, buffer_class, new_id
from episode._episode import REWARDS_SPACE
from episode._frames cimport FramePool
from episode._picks cimport Pick, Picks
from episode._replay cimport (KEY_TAG_SHIFT, Ep, EpisodeMeta, Store, empty_dicts_buffer,
                              shared_rows, shared_tree, track_buffer)
from episode._runs cimport Run

cnp.import_array()


cdef cnp.ndarray rows_array(Py_ssize_t n, tuple row_shape, object dtype):
    # np.empty((n,) + row_shape, dtype) without the Python call: the draws'
    # output arrays, several per call of a few hundred rows.
    cdef cnp.npy_intp dims[cnp.NPY_MAXDIMS]
    cdef Py_ssize_t k, nd = len(row_shape) + 1
    if nd > cnp.NPY_MAXDIMS:
        raise ValueError(f"rows of {nd - 1} dimensions")
    dims[0] = n
    for k in range(nd - 1):
        dims[k + 1] = row_shape[k]
    return empty_array(<int>nd, dims, dtype)


cdef double read_real(const char* p, int type_num) except? -1:
    # A stored reward as float64 (what lfilter computes in).
    if type_num == cnp.NPY_DOUBLE:
        return (<const double*>p)[0]
    if type_num == cnp.NPY_FLOAT:
        return (<const float*>p)[0]
    if type_num == cnp.NPY_INT64:
        return <double>(<const int64_t*>p)[0]
    if type_num == cnp.NPY_INT32:
        return (<const int32_t*>p)[0]
    if type_num == cnp.NPY_BOOL:
        return (<const unsigned char*>p)[0] != 0
    raise TypeError("rewards must be float64, float32, int64, int32 or bool numbers")


cdef int _gather_rows(Store store, Picks picks, Py_ssize_t leaf, char* at_step, char* at_end,
                      Py_ssize_t stride) except -1:
    # A numeric leaf's row of each pick i at its step into at_step +
    # i * stride and at its end step into at_end + i * stride (either
    # may be NULL), a pick's two rows one after the other: for 1-step
    # transitions of stacked frames they share all but one frame, which
    # the second read then finds in cache.
    cdef Py_ssize_t i, n = 0, rb = store.row_bytes[leaf]
    cdef Pick* p
    cdef int64_t** refs
    cdef char** dsts
    if store.pools[leaf] is None:
        for i in range(picks.size):
            p = &picks.items[i]
            if at_step != NULL:
                copy_row(at_step + i * stride, store._row_ptr(p.run, p.off, leaf), rb)
            if at_end != NULL:
                copy_row(at_end + i * stride, store._row_ptr(p.end_run, p.end_off, leaf), rb)
        return 0
    # Frame-stacked: the batch's frame numbers first, so that the pool
    # reads them a row or two ahead (FramePool.assemble_rows).
    refs = <int64_t**>PyMem_Malloc(max(1, 2 * picks.size) * sizeof(int64_t*))
    dsts = <char**>PyMem_Malloc(max(1, 2 * picks.size) * sizeof(char*))
    try:
        if refs == NULL or dsts == NULL:
            raise MemoryError()
        for i in range(picks.size):
            p = &picks.items[i]
            if at_step != NULL:
                refs[n] = <int64_t*>store._row_ptr(p.run, p.off, leaf)
                dsts[n] = at_step + i * stride
                n += 1
            if at_end != NULL:
                refs[n] = <int64_t*>store._row_ptr(p.end_run, p.end_off, leaf)
                dsts[n] = at_end + i * stride
                n += 1
        (<FramePool>store.pools[leaf]).assemble_rows(dsts, refs, n)
    finally:
        PyMem_Free(refs)
        PyMem_Free(dsts)
    return 0


def locate_ends(Store store, Picks picks):
    """Finds where each pick's `end` step is (the rows new_obs come from)."""
    cdef Py_ssize_t i
    cdef Pick* p
    for i in range(picks.size):
        p = &picks.items[i]
        p.end_run = p.run
        p.end_off = p.off
        store._advance(&p.end_run, &p.end_off, p.end - p.ts)


def gather(Store store, Picks picks, Py_ssize_t leaf, bint at_end=False):
    """Leaf `leaf` of each pick's step (or of its end step): an array of
    rows for a numeric leaf, a list for an object leaf."""
    if not 0 <= leaf < store.nleaves:
        raise IndexError(f"no leaf {leaf}")
    if at_end and (store.final[leaf] if store.row_bytes[leaf]
                   else store.final_objects[leaf]) is None:
        raise ValueError(f"leaf {leaf} has no rows after an episode's last step "
                         f"(observation leaves do)")
    return _gather_leaf(store, picks, leaf, at_end)


cdef object _gather_leaf(Store store, Picks picks, Py_ssize_t leaf, bint at_end):
    cdef Py_ssize_t i, rb = store.row_bytes[leaf]
    cdef cnp.ndarray out
    cdef char* dst
    cdef Pick* p
    if rb == 0:
        return [store._row_object(picks.items[i].end_run if at_end else picks.items[i].run,
                                 picks.items[i].end_off if at_end else picks.items[i].off,
                                 leaf)
                for i in range(picks.size)]
    out = rows_array(picks.size, store.shapes[leaf], store.dtypes[leaf])
    dst = array_bytes(out, picks.size * rb)
    _gather_rows(store, picks, leaf, NULL if at_end else dst, dst if at_end else NULL, rb)
    return out


cdef object _gather_track(Store store, Picks picks, object structure, bint at_end):
    # A track's rows for each pick, nested as the track is.
    if structure is None:
        return None
    if type(structure) is int:
        return _gather_leaf(store, picks, structure, at_end)
    if isinstance(structure, dict):
        return {k: _gather_track(store, picks, v, at_end) for k, v in structure.items()}
    return tuple(_gather_track(store, picks, v, at_end) for v in structure)


cdef tuple _gather_both(Store store, Picks picks, object structure):
    # A track's rows at each pick's step and at its end step, as two
    # trees nested as the track is, read pick by pick (_gather_rows).
    cdef Py_ssize_t leaf, rb
    cdef cnp.ndarray first, last
    if type(structure) is int:
        leaf = structure
        rb = store.row_bytes[leaf]
        if rb == 0:
            return (_gather_leaf(store, picks, leaf, False),
                    _gather_leaf(store, picks, leaf, True))
        first = rows_array(picks.size, store.shapes[leaf], store.dtypes[leaf])
        last = rows_array(picks.size, store.shapes[leaf], store.dtypes[leaf])
        _gather_rows(store, picks, leaf, array_bytes(first, picks.size * rb),
                          array_bytes(last, picks.size * rb), rb)
        return first, last
    if isinstance(structure, dict):
        pairs = {k: _gather_both(store, picks, v) for k, v in structure.items()}
        return ({k: v[0] for k, v in pairs.items()}, {k: v[1] for k, v in pairs.items()})
    pairs = [_gather_both(store, picks, v) for v in structure]
    return tuple([v[0] for v in pairs]), tuple([v[1] for v in pairs])


def gather_both(Store store, Picks picks, Py_ssize_t leaf):
    """Leaf `leaf` at each pick's step and at its end step: two arrays
    of rows for a numeric leaf (read pick by pick), two lists for an
    object leaf."""
    if not 0 <= leaf < store.nleaves:
        raise IndexError(f"no leaf {leaf}")
    return _gather_both(store, picks, leaf)


def gather_pairs(Store store, Picks picks, Py_ssize_t leaf):
    """Leaf `leaf` at each pick's step and at its end step, interleaved:
    rows 2i and 2i + 1 are pick i's (a list for an object leaf)."""
    cdef Py_ssize_t i, rb = store.row_bytes[leaf] if 0 <= leaf < store.nleaves else -1
    cdef cnp.ndarray out
    cdef char* dst
    cdef Pick* p
    if rb < 0:
        raise IndexError(f"no leaf {leaf}")
    if rb == 0:
        out_list = []
        for i in range(picks.size):
            p = &picks.items[i]
            out_list.append(store._row_object(p.run, p.off, leaf))
            out_list.append(store._row_object(p.end_run, p.end_off, leaf))
        return out_list
    out = rows_array(2 * picks.size, store.shapes[leaf], store.dtypes[leaf])
    dst = array_bytes(out, 2 * picks.size * rb)
    _gather_rows(store, picks, leaf, dst, dst + rb, 2 * rb)
    return out


def gather_infos(Store store, Picks picks, bint at_end=False):
    cdef Py_ssize_t i
    return [store._infos_at(picks.items[i].end_run if at_end else picks.items[i].run,
                           picks.items[i].end_off if at_end else picks.items[i].off)
            for i in range(picks.size)]


def native_transitions(Store store, Picks picks, double gamma, bint extras):
    """sample_batch()'s transition batch for drawn picks: obs, actions,
    rewards (discounted over the steps taken), new_obs, terminateds,
    truncateds, n_step, weights, indices (see native_fields()), and with
    `extras` each extra model output at the step."""
    cdef dict batch
    returns = _returns_and_ends(store, picks, gamma)
    steps, weights, indices, terminateds, truncateds = native_fields(store, picks)
    obs, new_obs = _gather_both(store, picks, store.layout["obs"])
    batch = {"obs": obs,
             "actions": _gather_track(store, picks, store.layout["actions"], False),
             "rewards": returns,
             "new_obs": new_obs}
    if extras:
        for key, structure in store.layout["extras"].items():
            batch[key] = _gather_track(store, picks, structure, False)
    batch["terminateds"] = terminateds
    batch["truncateds"] = truncateds
    batch["n_step"] = steps
    batch["weights"] = weights
    batch["indices"] = indices
    return batch


cdef object _returns_and_ends(Store store, Picks picks, double gamma):
    # returns() and locate_ends() in one walk along each pick's rows:
    # the rewards of a run are consecutive rows.
    cdef Py_ssize_t i, leaf = store.layout["rewards"], rb = store.row_bytes[leaf]
    cdef cnp.ndarray out = flat_array(picks.size, cnp.NPY_FLOAT64)
    cdef double* dst = <double*>array_bytes(out, picks.size * sizeof(double))
    cdef double acc
    cdef double values[64]
    cdef Pick* p
    cdef Run* r
    cdef int64_t run, j, m, left, take, k
    cdef int32_t off
    cdef char* base
    cdef int type_num = (<cnp.dtype>store.dtypes[leaf]).type_num
    for i in range(picks.size):
        p = &picks.items[i]
        m = p.end - p.ts
        if m <= 0 or m > 64:
            p.end_run, p.end_off = p.run, p.off
            store._advance(&p.end_run, &p.end_off, m)
            dst[i] = _long_return(store, p.run, p.off, m, gamma, type_num, leaf) if m > 0 \
                else 0.0
            continue
        run = p.run
        off = p.off
        left = m
        j = 0
        while True:
            r = store.runs.at(run)
            take = min(left, r.n - off)
            base = store.blocks.row_tables[r.block - store.blocks.first][leaf] + (r.row + off) * rb
            for k in range(take):
                values[j + k] = read_real(base + k * rb, type_num)
            j += take
            left -= take
            off += <int32_t>take
            if off == r.n:
                # Past the run: its episode's next run, or the final row.
                if r.next >= 0:
                    run = r.next
                    off = 0
                else:
                    run = -1 - r.ep
                    off = 0
            if left == 0:
                break
            if run < 0:
                raise IndexError("past the stored episode's end")
        p.end_run = run
        p.end_off = off
        acc = 0.0 + values[m - 1]
        for j in range(m - 2, -1, -1):
            acc = (-gamma) * acc
            acc = values[j] - acc
        dst[i] = acc
    if store.layout["rewards"] is not None and \
            store.dtypes[store.layout["rewards"]] == np.float32:
        return out.astype(np.float32)
    return out


def returns(Store store, Picks picks, double gamma):
    """Each pick's discounted reward sum over steps ts .. end - 1, as
    scipy.signal.lfilter([1], [1, -gamma], rewards[::-1])[-1] computes
    it (float64)."""
    cdef Py_ssize_t i, leaf = store.layout["rewards"]
    cdef cnp.ndarray out = flat_array(picks.size, cnp.NPY_FLOAT64)
    cdef double* dst = <double*>array_bytes(out, picks.size * sizeof(double))
    cdef double values[64]
    cdef Pick* p
    cdef int64_t m
    cdef int type_num = (<cnp.dtype>store.dtypes[leaf]).type_num
    for i in range(picks.size):
        p = &picks.items[i]
        m = p.end - p.ts
        if m <= 0:
            dst[i] = 0.0          # lfilter of nothing: RLlib's [-1] fails before this
        elif m <= 64:
            dst[i] = _discounted(store, p.run, p.off, m, gamma, type_num, leaf, values)
        else:
            dst[i] = _long_return(store, p.run, p.off, m, gamma, type_num, leaf)
    return out


cdef double _long_return(Store store, int64_t run, int32_t off, int64_t m, double gamma,
                         int type_num, Py_ssize_t leaf) except? -1:
    # More rewards than the callers' 64 on the stack.
    cdef cnp.ndarray values = np.empty(m, np.float64)
    return _discounted(store, run, off, m, gamma, type_num, leaf,
                       <double*>array_bytes(values, m * sizeof(double)))


cdef double _discounted(Store store, int64_t run, int32_t off, int64_t m, double gamma,
                        int type_num, Py_ssize_t leaf, double* v) except? -1:
    """The m rewards from (run, off) read into v (room for m), then filtered
    backwards, in lfilter's order of operations."""
    cdef double acc
    cdef int64_t j
    for j in range(m):
        v[j] = read_real(store._row_ptr(run, off, leaf), type_num)
        if j + 1 < m:
            store._advance(&run, &off, 1)
    acc = 0.0 + v[m - 1]
    for j in range(m - 2, -1, -1):
        acc = (-gamma) * acc
        acc = v[j] - acc
    return acc


def pick_fields(Store store, Picks picks):
    """(slot, ts, n, end) of each pick, as int64 arrays."""
    cdef Py_ssize_t i
    cdef cnp.ndarray slots = flat_array(picks.size, cnp.NPY_INT64)
    cdef cnp.ndarray ts = flat_array(picks.size, cnp.NPY_INT64)
    cdef cnp.ndarray n = flat_array(picks.size, cnp.NPY_INT64)
    cdef cnp.ndarray end = flat_array(picks.size, cnp.NPY_INT64)
    cdef int64_t* a = <int64_t*>array_bytes(slots, picks.size * 8)
    cdef int64_t* b = <int64_t*>array_bytes(ts, picks.size * 8)
    cdef int64_t* c = <int64_t*>array_bytes(n, picks.size * 8)
    cdef int64_t* d = <int64_t*>array_bytes(end, picks.size * 8)
    for i in range(picks.size):
        a[i] = picks.items[i].slot
        b[i] = picks.items[i].ts
        c[i] = picks.items[i].n
        d[i] = picks.items[i].end
    return slots, ts, n, end


def native_fields(Store store, Picks picks):
    """(n-steps taken, weights, indices (each step's key: the store's tag
    << 56 | run << 20 | offset, which stays its own while it is stored),
    terminated,
    truncated) per pick, as arrays: a pick is terminated (truncated)
    when it reaches the end of a terminated (truncated) episode."""
    cdef Py_ssize_t i
    cdef cnp.ndarray n = flat_array(picks.size, cnp.NPY_INT64)
    cdef cnp.ndarray w = flat_array(picks.size, cnp.NPY_FLOAT32)
    cdef cnp.ndarray leaves = flat_array(picks.size, cnp.NPY_INT64)
    cdef cnp.ndarray term = flat_array(picks.size, cnp.NPY_BOOL)
    cdef cnp.ndarray trunc = flat_array(picks.size, cnp.NPY_BOOL)
    cdef int64_t* nd = <int64_t*>array_bytes(n, picks.size * 8)
    cdef float* wd = <float*>array_bytes(w, picks.size * 4)
    cdef int64_t* ld = <int64_t*>array_bytes(leaves, picks.size * 8)
    cdef cnp.npy_bool* td = <cnp.npy_bool*>array_bytes(term, picks.size)
    cdef cnp.npy_bool* rd = <cnp.npy_bool*>array_bytes(trunc, picks.size)
    cdef Pick* p
    cdef Ep* ep
    for i in range(picks.size):
        p = &picks.items[i]
        ep = &store.eps[p.slot]
        nd[i] = p.end - p.ts
        wd[i] = <float>p.weight
        ld[i] = (<int64_t>store.key_tag << KEY_TAG_SHIFT) | (p.run << 20) | p.off
        td[i] = p.end == ep.length and ep.terminated
        rd[i] = p.end == ep.length and ep.truncated
    return n, w, leaves, term, trunc

def gather_sequences(Store store, Picks picks, Py_ssize_t leaf, Py_ssize_t lookback,
                     Py_ssize_t T, bint next_rows):
    """Leaf `leaf` for each pick's window of rows: `lookback` steps before
    its step, then up to T steps to its `end` (with `next_rows`, each
    step's next observation instead); zeros where the window leaves the
    stored episode. (B, lookback + T, ...) array, and the (B, lookback +
    T) mask of the rows that hold data."""
    cdef Py_ssize_t i, j, width = lookback + T, rb = store.row_bytes[leaf]
    cdef cnp.ndarray out, mask
    cdef char* dst
    cdef cnp.npy_bool* md
    cdef Pick* p
    cdef Ep* ep
    cdef int64_t first, run, s
    cdef int32_t off
    if rb == 0:
        raise TypeError("sequences of non-numeric leaves are not supported")
    out = np.zeros((picks.size, width) + store.shapes[leaf], store.dtypes[leaf])
    mask = np.zeros((picks.size, width), np.bool_)
    dst = array_bytes(out, picks.size * width * rb)
    md = <cnp.npy_bool*>array_bytes(mask, picks.size * width)
    for i in range(picks.size):
        p = &picks.items[i]
        ep = &store.eps[p.slot]
        first = max(p.ts - lookback, -<int64_t>ep.lookback)
        if first >= p.end:
            continue
        store._locate(p.slot, first + next_rows, &run, &off)
        for s in range(first, p.end):
            j = s - (p.ts - lookback)
            store._read_row(dst + (i * width + j) * rb, run, off, leaf)
            md[i * width + j] = True
            if s + 1 < p.end:
                store._advance(&run, &off, 1)
    return out, mask


# -- transitions as episodes --------------------------------------------------

cdef BufferCore numpy_buffer(cnp.ndarray arr, Py_ssize_t first, Py_ssize_t rows,
                             Py_ssize_t lookback):
    # InfiniteLookbackBuffer(arr[first:first + rows], lookback=lookback): a
    # numpy'ized buffer reading its rows in place.
    cdef Column col = shared_rows(arr, first, rows, KIND_ARRAY)
    cdef BufferCore buf
    col.finalized = True
    buf = track_buffer(col, None)
    buf.lookback = lookback
    return buf


cdef BufferCore items_buffer(list items):
    # InfiniteLookbackBuffer(items): empty dicts (an episode's usual infos)
    # counted, anything else pushed as the constructor would.
    cdef BufferCore buf
    for item in items:
        if type(item) is not dict or item:
            break
    else:
        return empty_dicts_buffer(len(items))
    buf = empty_buffer(buffer_class(), None, None)
    for item in items:
        buf.push(item)
    return buf


cdef object scalar_column_array(list values):
    # One row per value of a list of same-type numbers (Python float/int,
    # numpy scalars): the array and the kind its items come back as; None
    # for mixed types.
    cdef object t = type(values[0]) if values else float
    for v in values:
        if type(v) is not t:
            return None
    if t is float:
        return np.array(values, np.float64), KIND_FLOAT
    if t is int:
        return np.array(values, np.int64), KIND_INT
    if issubclass(t, np.generic):
        return np.array(values, t), KIND_SCALAR
    return None


cdef extern from "Python.h":
    Py_ssize_t Py_REFCNT(object obj)


cdef object reclaimed(list spent, Py_ssize_t* cursor, type cls):
    """The next episode of class `cls` in `spent` that only `spent` holds (no
    one else can see it: it may be made over), taken out of the list; None
    when there is none left. `spent` is a private list of an earlier draw's
    episodes (see draws._Replayed)."""
    cdef Py_ssize_t i
    cdef object episode
    for i in range(cursor[0], len(spent)):
        episode = spent[i]
        # Two references: the list's and this variable's.
        if type(episode) is cls and Py_REFCNT(episode) == 2:
            spent[i] = None
            cursor[0] = i + 1
            return episode
    cursor[0] = len(spent)
    return None


def make_transitions(type cls, Store store, Picks picks, dict obs_pairs, dict actions,
                     cnp.ndarray returns, dict extras, list infos, list weights, bint stored_ids,
                     bint exact_end, Py_ssize_t outputs_lookback=-1, list spent=None):
    """One-step episodes of class `cls` for the picked n-step transitions,
    as RLlib's buffers build them (see replay._transitions): their data read
    in place from the batch arrays (`obs_pairs`: per observation leaf, rows
    [obs(ts), obs(end)] of each pick; `actions`, `extras[key]`: per leaf a
    row per pick; `returns`: the discounted sums). With `weights`, "weights"
    and "n_step" lead their extra model outputs (the prioritized and
    multi-agent buffers'); else with `outputs_lookback` >= 0 they follow
    them, as numpy'ized buffers of that lookback plus the step (the plain
    buffer's: n-step, and weights of 1.0).

    Episodes of an earlier draw in `spent` that no one else holds are made
    over instead of new ones (with their extra outputs' dict): a draw then
    adds no objects for the cyclic garbage collector to track (a draw's
    new episodes, kept through a learner update, are what brought its full
    collections on). Every field is set either way."""
    cdef Py_ssize_t i, B = picks.size, rows = outputs_lookback + 1, cursor = 0
    cdef Pick* p
    cdef Ep* ep
    cdef EpisodeCore episode
    cdef EpisodeMeta meta
    cdef list out = []
    # (An object leaf's shape is None: its rows come as lists, kinds unused.)
    cdef list numpy_kinds = [KIND_ARRAY if self_shape else KIND_SCALAR
                             for self_shape in store.shapes]
    cdef list list_kinds = [store.kinds[i] for i in range(store.nleaves)]
    cdef cnp.ndarray n_rows = flat_array(B, cnp.NPY_INT64)
    cdef int64_t* n_data = <int64_t*>array_bytes(n_rows, B * 8)
    layout = store.layout
    obs_structure = layout["obs"]
    action_structure = layout["actions"]
    weight_rows = scalar_column_array(weights) if weights is not None else None
    cdef cnp.ndarray n_lookback_rows, ones
    cdef int64_t* nl
    if weights is None and outputs_lookback >= 0:
        n_lookback_rows = flat_array(B * rows, cnp.NPY_INT64)
        nl = <int64_t*>array_bytes(n_lookback_rows, B * rows * 8)
        for i in range(B * rows):
            nl[i] = picks.items[i // rows].n
        ones = np.ones(B * rows, np.float64)
    for i in range(B):
        n_data[i] = picks.items[i].n
    for i in range(B):
        p = &picks.items[i]
        ep = &store.eps[p.slot]
        meta = store.meta[p.slot]
        kinds = numpy_kinds if ep.finalized else list_kinds
        made_over = reclaimed(spent, &cursor, cls) if spent is not None else None
        if made_over is None:
            episode = EpisodeCore.__new__(cls)
            outputs = {}
        else:
            episode = made_over
            outputs = episode._extras
            if type(outputs) is dict and Py_REFCNT(outputs) == 2:   # (the episode's, this)
                outputs.clear()
            else:
                outputs = {}
            episode.custom_data_ = None
        if stored_ids:
            episode.id_ = store.ids[p.slot]
            episode.agent_id = meta.agent_id
            episode.module_id = meta.module_id
        else:
            episode.id_ = new_id()
            episode.agent_id = None
            episode.module_id = None
        episode.multi_agent_episode_id = None
        episode.observations = track_buffer(shared_tree(obs_structure, obs_pairs, 2 * i, 2, kinds),
                                            meta.observation_space)
        episode._observation_space = meta.observation_space
        if infos is None:
            episode.infos = empty_dicts_buffer(2)
        else:
            episode.infos = items_buffer([infos[2 * i], infos[2 * i + 1]])
        episode.actions = track_buffer(shared_tree(action_structure, actions, i, 1, kinds),
                                       meta.action_space)
        episode._action_space = meta.action_space
        episode.rewards = track_buffer(shared_rows(returns, i, 1, KIND_SCALAR), REWARDS_SPACE)
        if weights is not None:
            if weight_rows is not None:
                outputs["weights"] = track_buffer(
                    shared_rows(weight_rows[0], i, 1, weight_rows[1]), None)
            else:
                outputs["weights"] = items_buffer([weights[i]])
            outputs["n_step"] = track_buffer(shared_rows(n_rows, i, 1, KIND_INT), None)
        for key, arrays in extras.items():
            if key in meta.extra_keys:
                outputs[key] = track_buffer(
                    shared_tree(layout["extras"][key], arrays, i, 1, kinds), None)
        if weights is None and outputs_lookback >= 0:
            outputs["n_step"] = numpy_buffer(n_lookback_rows, i * rows, rows, outputs_lookback)
            outputs["weights"] = numpy_buffer(ones, i * rows, rows, outputs_lookback)
        episode._extras = outputs
        reaches_end = (p.ts + p.n == ep.length) if exact_end else p.end >= ep.length
        episode.is_terminated = bool(ep.terminated) if reaches_end else False
        episode.is_truncated = bool(ep.truncated) if reaches_end else False
        episode.t_started = p.ts
        episode.t = p.ts + 1
        episode.start_time = NAN
        episode.last_step_time = NAN
        episode.last_observation = None
        episode.last_row_observed = False
        episode.last_infos = None
        out.append(episode)
    return out
