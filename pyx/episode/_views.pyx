# Gathers of view rows in one C pass: the inference input of many episodes
# (each episode's rows around its next timestep) without a Python step per
# episode. The rules are those of episode/views.py; tracks that do not fit
# here (Dict/Tuple items, the object path, mixed dtypes) take its path.
# (AgentCollector's inference input is gathered in _collect.)

cimport numpy as cnp
from libc.string cimport memcpy, memset

from episode._buffer cimport BufferCore
from episode._column cimport (Column, KIND_OBJECT, KIND_EMPTY, KIND_EMPTY_DICT, array_bytes,
                              empty_array)
from episode._episode cimport EpisodeCore, own_extras, steps

import numpy as np

cnp.import_array()

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
