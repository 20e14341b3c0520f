"""Gathers: the rows of drawn steps into batch arrays, and their n-step returns.

A draw (episode._replay's Store.draw_*) hands out Picks: each a stored step
(its run and offset), the step its transition or sequence ends at, and what
the draw made of it. These functions read the picks' rows from the store's
blocks (frame-stacked observations rebuilt from their frames) into arrays
of the batch, walk each pick's rewards along its runs for the discounted
return, and find where each end step's row is (new_obs).
"""
import numpy as np

cimport numpy as cnp
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t, int64_t

from episode._arrays cimport copy_row, flat_array
from episode._column cimport array_bytes, empty_array
from episode._frames cimport FramePool
from episode._replay cimport Pick, Picks, Store
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
    steps, weights, indices, terminateds, truncateds = store.native_fields(picks)
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
