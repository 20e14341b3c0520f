"""A replay Store taken apart for a folder and put together again.

`store_state()` hands out what a Store holds besides its rows (its runs,
episodes, layout, final rows, priority trees: small, per episode or per
run) and, per block and leaf, the rows as memory to write. `build_store()`
fills a new Store from that state and from rows the caller has mapped from
files, without copying them: every index the state names is checked against
the sizes it comes with before anything is installed, so a damaged or
foreign state is refused with ValueError and never read out of bounds.
The files themselves (names, checks, atomic writes) are
episode/replay/kept.py's.
"""
import numpy as np

cimport numpy as cnp
from cpython.buffer cimport PyBUF_READ
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.memoryview cimport PyMemoryView_FromMemory
from libc.math cimport INFINITY, isnan
from libc.stdint cimport INT32_MAX, int32_t, int64_t
from libc.string cimport memcpy

from episode._column cimport (Column, KIND_ARRAY, KIND_BOOL, KIND_FLOAT, KIND_INT,
                              KIND_OBJECT, KIND_SCALAR)
from episode._frames cimport FramePool
from episode._priority cimport Num, PriorityTrees, num
from episode._priority cimport TAG_F32, TAG_FLOAT
from episode._blocks cimport Block
from episode._replay cimport EpisodeMeta, Ep, Store
from episode._runs cimport Run

cnp.import_array()

RUN_DTYPE = np.dtype([("block", "<i8"), ("next", "<i8"), ("row", "<i4"), ("n", "<i4"),
                      ("ep", "<i4"), ("ts", "<i4")])
EP_DTYPE = np.dtype([("first_run", "<i8"), ("last_run", "<i8"), ("length", "<i8"),
                     ("t_started", "<i8"), ("lookback", "<i4"), ("terminated", "u1"),
                     ("truncated", "u1"), ("finalized", "u1"), ("live", "u1"),
                     ("prev", "<i4"), ("next", "<i4"), ("start_time", "<f8"),
                     ("last_step_time", "<f8")])
# Rows a mapped block may hold (a run's row is an int32).
cdef Py_ssize_t MAX_ROWS = INT32_MAX


cdef object _rows_memory(Column col, Py_ssize_t rows, Py_ssize_t row_bytes):
    # Rows [0, rows) of a block's Column as a read-only memoryview (no copy;
    # the caller keeps the store alive while it reads them).
    if rows == 0:
        return memoryview(b"")
    return PyMemoryView_FromMemory(col.row_ptr(0, rows), rows * row_bytes, PyBUF_READ)


cdef object _mapped_file(Column col):
    # The np.memmap a Column's rows are in (kept.py marks the ones it
    # mapped from a saved folder), or None.
    owner = col.owner
    while owner is not None:
        if isinstance(owner, np.memmap):
            return owner
        owner = getattr(owner, "base", None)
    return None


def store_state(Store store):
    """(state, blocks): the Store's state (see the module docstring), and
    per block a dict of its `size`, `infos`, `leaf_of_row` (an int32 array,
    prioritized stores) and `leaves`: per leaf None (no rows yet), a list of
    objects, or (memoryview of the rows, the np.memmap they are in or None)."""
    cdef Py_ssize_t leaf, i, n_runs = store.runs.tail - store.runs.head
    cdef int64_t seq
    cdef Run* r
    cdef Ep* e
    cdef Block block
    cdef PriorityTrees trees = store.priorities
    runs = np.zeros(n_runs, RUN_DTYPE)
    for i in range(n_runs):
        seq = store.runs.head + i
        r = store.runs.at(seq)
        runs[i] = (r.block, r.next, r.row, r.n, r.ep, r.ts)
    eps = np.zeros(store.ep_cap, EP_DTYPE)
    for i in range(store.ep_cap):
        e = &store.eps[i]
        if not e.live:
            continue             # (a free slot's fields mean nothing: zeros)
        eps[i] = (e.first_run, e.last_run, e.length, e.t_started, e.lookback, e.terminated,
                  e.truncated, e.finalized, e.live, e.prev, e.next, e.start_time,
                  e.last_step_time)
    free = np.array([store.free_slots[i] for i in range(store.n_free)], np.int32)
    final = []
    for leaf in range(store.nleaves):
        col = store.final[leaf]
        # (A frame-stacked leaf's final rows are its frames' numbers.)
        dtype, shape = _stored_layout(store, leaf)
        final.append(None if col is None else np.frombuffer(
            _rows_memory(<Column>col, store.ep_cap, store.blocks.row_bytes[leaf]),
            dtype).reshape((store.ep_cap,) + shape).copy())
    state = {
        "block_rows": store.block_rows, "nleaves": store.nleaves,
        "dtypes": list(store.dtypes), "shapes": list(store.shapes),
        "row_bytes": [store.row_bytes[leaf] for leaf in range(store.nleaves)],
        "kinds": [store.kinds[leaf] for leaf in range(store.nleaves)],
        "layout": store.layout, "first_block": store.blocks.first,
        "run_cap": store.runs.cap, "run_head": store.runs.head, "runs": runs,
        "ep_cap": store.ep_cap, "eps": eps, "free_slots": free,
        "first_slot": store.first_slot, "last_slot": store.last_slot,
        "num_episodes": store.num_episodes, "num_evicted": store.num_evicted,
        "live_steps": store.runs.live_steps,
        "ids": list(store.ids), "keys": list(store.keys), "meta": list(store.meta),
        "final": final, "final_objects": [None if x is None else list(x)
                                          for x in store.final_objects],
        "final_infos": dict(store.final_infos),
        "trees": None,
    }
    if trees is not None:
        values = np.empty(trees.alloc, np.float64)
        tags = np.empty(trees.alloc, np.uint8)
        for i in range(trees.alloc):
            values[i] = trees.sum_v[trees.alloc + i]
            tags[i] = trees.sum_t[trees.alloc + i]
        state["trees"] = {
            "size": trees.size, "alloc": trees.alloc, "values": values, "tags": tags,
            "queue": np.array([trees.queue[(trees.queue_head + i) % trees.queue_cap]
                               for i in range(trees.queue_len)], np.int64),
            "fresh": trees.fresh, "max_leaf": trees.max_leaf}
    blocks = []
    for block in store.blocks.items:
        leaves = []
        for leaf in range(store.nleaves):
            col = block.cols[leaf]
            if type(col) is Column:
                leaves.append((_rows_memory(<Column>col, block.size, store.blocks.row_bytes[leaf]),
                               _mapped_file(<Column>col)))
            elif col is None:
                leaves.append(None)
            else:
                leaves.append(list(col))
        leaf_of_row = None
        if trees is not None:
            leaf_of_row = np.empty(block.size, np.int32)
            for i in range(block.size):
                leaf_of_row[i] = block.leaf_of_row[i]
        blocks.append({"size": block.size, "infos": dict(block.infos),
                       "leaf_of_row": leaf_of_row, "leaves": leaves})
    return state, blocks


cdef tuple _stored_layout(Store store, Py_ssize_t leaf):
    # A stored row's dtype and shape: the leaf's, or (frame-stacked) its
    # frames' numbers.
    if store.pools[leaf] is not None:
        return np.dtype(np.int64), (store.frame_stack,)
    return store.dtypes[leaf], store.shapes[leaf]


def frame_pools(Store store):
    """Per leaf None, or for a frame-stacked leaf its FramePool's export():
    (its numbering, its chunks of frames). A block's rows of such a leaf
    (store_state()'s) are int64 frame numbers, `frame_stack` per row."""
    return [None if pool is None else (<FramePool>pool).export() for pool in store.pools]


# -- building -----------------------------------------------------------------------------


cdef int _check(bint ok, str what) except -1:
    if not ok:
        raise ValueError(what)
    return 0


cdef Py_ssize_t _count(object value, str what, Py_ssize_t low, Py_ssize_t high) except? -1:
    # An int of the state in [low, high].
    _check(type(value) is int and low <= value <= high, f"{what} is {value!r}")
    return value


def plain_dtype(object dtype):
    """`dtype` (unpickled from a file) as numpy's own dtype of the same
    numbers, or None where it is no dtype of plain numbers. (numpy unpickles
    a dtype whose fields are not dtypes without a word, then crashes
    comparing or copying through it: an unpickled dtype is only read, through
    attributes that cannot crash, and replaced by numpy's own.)"""
    if not isinstance(dtype, np.dtype):
        return None
    try:
        text = dtype.str
        if type(text) is not str or dtype.fields is not None or dtype.subdtype is not None:
            return None
        plain = np.dtype(text)
    except Exception:     # (anything a damaged dtype raises)
        return None
    if plain.kind not in "biufc" or plain.hasobject:
        return None
    return plain


cdef object _as_dtype(object value, object dtype):
    # An unpickled ndarray viewed as `dtype` (plain or one of ours) where
    # its dtype describes the same fields, else None (see plain_dtype()).
    try:
        got = value.dtype
        if not (isinstance(got, np.dtype) and got.descr == dtype.descr
                and got.flags == dtype.flags and got.itemsize == dtype.itemsize):
            return None
    except Exception:     # (anything a damaged dtype raises)
        return None
    return value.view(dtype)


cdef cnp.ndarray _array(object value, object dtype, Py_ssize_t n, str what):
    _check(type(value) is np.ndarray and value.ndim == 1 and (n < 0 or value.shape[0] == n),
           f"{what} is not an array of {n} entries")
    value = _as_dtype(value, dtype)
    _check(value is not None, f"{what} is not an array of {dtype}")
    return np.ascontiguousarray(value)


cdef int _collect(object structure, list out, Py_ssize_t nleaves) except -1:
    # A track's leaf numbers (a nesting of dicts/tuples of ints), checked.
    if type(structure) is int:
        _check(0 <= structure < nleaves, f"the layout names leaf {structure}")
        out.append(structure)
    elif type(structure) is dict:
        for v in structure.values():
            _collect(v, out, nleaves)
    elif type(structure) is tuple:
        for v in structure:
            _collect(v, out, nleaves)
    else:
        raise ValueError(f"the layout holds a {type(structure).__name__}")
    return 0


cdef unsigned char _checked_kind(object kind, object dtype, tuple shape) except 255:
    # The kind items of a leaf come back as, which must fit its rows (a
    # list-mode Column reads a Python float's 8 bytes from a float64 row).
    _check(type(kind) is int, f"a leaf's kind is {kind!r}")
    if dtype is None:
        _check(kind == KIND_OBJECT, "an object leaf's kind is not objects")
        return KIND_OBJECT
    if kind == KIND_FLOAT:
        _check(dtype == np.float64 and shape == (), "a float leaf's rows are not float64")
    elif kind == KIND_INT:
        _check(dtype == np.int64 and shape == (), "an int leaf's rows are not int64")
    elif kind == KIND_BOOL:
        _check(dtype == np.bool_ and shape == (), "a bool leaf's rows are not bools")
    elif kind == KIND_SCALAR:
        _check(shape == (), "a scalar leaf's rows are not scalars")
    else:
        _check(kind == KIND_ARRAY, f"a numeric leaf's kind is {kind}")
    return <unsigned char>kind


cdef Py_ssize_t _row_bytes(object dtype, object shape) except -1:
    # Bytes of a numeric leaf's row; its dtype must be plain numbers.
    cdef Column col
    _check(isinstance(dtype, np.dtype) and type(shape) is tuple
           and all(type(d) is int and 0 <= d < (1 << 31) for d in shape) and len(shape) <= 32,
           "a leaf's dtype or row shape is not one")
    nbytes = dtype.itemsize
    for d in shape:
        nbytes *= d
    _check(nbytes < (1 << 40), f"a leaf's rows of {dtype} {shape} are not rows of a store")
    col = Column.from_array(np.zeros((1,) + shape, dtype))
    _check(col.pod and col.plain(), f"a leaf's dtype {dtype} is not plain numbers")
    return col.row_bytes


def build_store(Store store, dict state, list blocks, list pools=None):
    """Fills `store` (new and empty, made with the saved capacity, priorities,
    tree size and frame stack) from store_state()'s state and `blocks`: per
    block a dict of `size`, `infos`, `leaf_of_row` and `leaves`, per leaf
    None, a list of objects, or an ndarray of the block's rows (read-only:
    the rows are read in place); and, for a frame-stacked store, `pools`:
    per leaf None or frame_pools()'s (numbering, chunks), the chunks read in
    place too. Every frame number a stored row holds is checked against
    the chunks. ValueError, with the store left empty, for anything that
    does not fit."""
    cdef Py_ssize_t nleaves, leaf, i, k, n_runs, ep_cap, n_free, nblocks, size
    cdef int64_t run_head, run_cap, first_block, seq, ts, steps, live_steps = 0, tree_leaf
    cdef int32_t slot, prev
    cdef Py_ssize_t* row_bytes = NULL
    cdef unsigned char* kinds = NULL
    cdef Run* r
    cdef Ep* e
    cdef Block block
    cdef PriorityTrees trees = store.priorities
    if store.num_episodes or store.runs.tail or store.nleaves or store.blocks.items:
        raise RuntimeError("build_store() fills a new store")
    # -- the leaves ---------------------------------------------------------------------
    nleaves = _count(state.get("nleaves"), "the number of leaves", 0, 1 << 20)
    dtypes, shapes = state.get("dtypes"), state.get("shapes")
    saved_bytes, saved_kinds = state.get("row_bytes"), state.get("kinds")
    _check(all(type(x) is list and len(x) == nleaves
               for x in (dtypes, shapes, saved_bytes, saved_kinds)),
           "the leaves' dtypes, shapes, sizes and kinds are not one per leaf")
    dtypes = [None if d is None else plain_dtype(d) for d in dtypes]
    _check(all(d is not None or saved is None for d, saved in zip(dtypes, state["dtypes"])),
           "a leaf's dtype is not one of numbers")
    _check(state.get("block_rows") == store.block_rows,
           f"the blocks hold {state.get('block_rows')!r} rows, this capacity's "
           f"{store.block_rows}")
    row_list, kind_list = [], []
    for leaf in range(nleaves):
        if dtypes[leaf] is None:
            _check(shapes[leaf] is None, f"object leaf {leaf} has a row shape")
            row_list.append(0)
        else:
            row_list.append(_row_bytes(dtypes[leaf], shapes[leaf]))
        _check(saved_bytes[leaf] == row_list[leaf], f"leaf {leaf}'s rows are "
               f"{row_list[leaf]} bytes, not {saved_bytes[leaf]!r}")
        kind_list.append(_checked_kind(saved_kinds[leaf], dtypes[leaf], shapes[leaf]))
    layout = state.get("layout")
    _check(type(layout) is dict and set(layout) == {"obs", "actions", "rewards", "extras"}
           and type(layout["extras"]) is dict, "the layout is not a store's")
    track_leaves = {}
    for name in ("obs", "actions", "rewards"):
        if layout[name] is not None:
            track_leaves[name] = []
            _collect(layout[name], track_leaves[name], nleaves)
    for key, structure in layout["extras"].items():
        track_leaves[("extras", key)] = []
        _collect(structure, track_leaves[("extras", key)], nleaves)
    every = [leaf for leaves in track_leaves.values() for leaf in leaves]
    _check(sorted(every) == list(range(nleaves)), "the layout does not name each leaf once")
    if layout["rewards"] is not None:
        _check(type(layout["rewards"]) is int and row_list[layout["rewards"]] > 0 and
               dtypes[layout["rewards"]] in (np.float64, np.float32, np.int64, np.int32, np.bool_)
               and shapes[layout["rewards"]] == (), "the rewards leaf is not numbers")
    obs_leaves = set(track_leaves.get("obs", ()))
    # Frame-stacked leaves: their stored rows are frame numbers.
    if pools is None:
        pools = [None] * nleaves
    _check(len(pools) == nleaves, "the frame pools are not one per leaf")
    stored_dtypes, stored_shapes = list(dtypes), list(shapes)
    for leaf in range(nleaves):
        if pools[leaf] is not None:
            _check(store.frame_stack > 0 and leaf in obs_leaves and row_list[leaf] > 0,
                   f"leaf {leaf} has frames, but is no frame-stacked observation leaf")
            stored_dtypes[leaf], stored_shapes[leaf] = np.dtype(np.int64), (store.frame_stack,)
    # -- episodes -----------------------------------------------------------------------
    ep_cap = _count(state.get("ep_cap"), "the episode slots", 0, INT32_MAX)
    eps = _array(state.get("eps"), EP_DTYPE, ep_cap, "the episodes")
    cdef int64_t[:] e_first = np.ascontiguousarray(eps["first_run"])
    cdef int64_t[:] e_last = np.ascontiguousarray(eps["last_run"])
    cdef int64_t[:] e_length = np.ascontiguousarray(eps["length"])
    cdef int32_t[:] e_lookback = np.ascontiguousarray(eps["lookback"])
    cdef int32_t[:] e_prev = np.ascontiguousarray(eps["prev"])
    cdef int32_t[:] e_next = np.ascontiguousarray(eps["next"])
    cdef unsigned char[:] e_live = np.ascontiguousarray(eps["live"])
    flags = np.stack([eps["terminated"], eps["truncated"], eps["finalized"], eps["live"]])
    flags = flags[:, eps["live"] != 0] if bool(np.all(eps["live"] <= 1)) else flags
    _check(bool(np.all(flags <= 1)), "an episode's flags are not 0 or 1")
    free = _array(state.get("free_slots"), np.dtype(np.int32), -1, "the free slots")
    n_free = free.shape[0]
    num_episodes = _count(state.get("num_episodes"), "the stored episodes", 0, ep_cap)
    num_evicted = _count(state.get("num_evicted"), "the evicted episodes", 0, 1 << 62)
    _check(n_free + num_episodes == ep_cap, "the free and stored slots are not the slots")
    _check(int(eps["live"].sum()) == num_episodes
           and bool(np.all((free >= 0) & (free < ep_cap)))
           and len(np.unique(free)) == n_free
           and not bool(np.any(eps["live"][free])), "the free slots are not the unused ones")
    ids, keys, metas = state.get("ids"), state.get("keys"), state.get("meta")
    _check(all(type(x) is list and len(x) == ep_cap for x in (ids, keys, metas)),
           "the episodes' ids, keys and metas are not one per slot")
    first_slot = _count(state.get("first_slot"), "the first slot", -1, ep_cap - 1)
    last_slot = _count(state.get("last_slot"), "the last slot", -1, ep_cap - 1)
    # The stored episodes, oldest first: a chain through prev/next.
    order = []
    slot = first_slot
    prev = -1
    while slot >= 0:
        _check(len(order) < num_episodes and e_live[slot] and e_prev[slot] == prev,
               "the stored episodes' order is broken")
        order.append(slot)
        prev = slot
        slot = e_next[slot]
        _check(-1 <= slot < ep_cap, "the stored episodes' order is broken")
    _check(len(order) == num_episodes and prev == last_slot,
           "the stored episodes' order is broken")
    for slot in order:
        _check(type(metas[slot]) is EpisodeMeta, f"slot {slot} has no episode meta")
        _check(e_lookback[slot] >= 0 and e_length[slot] >= 0, f"episode slot {slot} is not one")
        hash(keys[slot])
    _check(len({keys[slot] for slot in order}) == num_episodes, "two episodes share a key")
    # -- blocks -------------------------------------------------------------------------
    first_block = _count(state.get("first_block"), "the first block", 0, 1 << 62)
    nblocks = len(blocks)
    sizes = np.zeros(max(1, nblocks), np.int64)
    leaves_of_rows = []
    for k in range(nblocks):
        b = blocks[k]
        _check(type(b) is dict, f"block {k} is not one")
        size = _count(b.get("size"), f"block {k}'s size", 0, MAX_ROWS)
        sizes[k] = size
        leaves = b.get("leaves")
        _check(type(leaves) is list and len(leaves) == nleaves,
               f"block {k} has not a column per leaf")
        for leaf in range(nleaves):
            data = leaves[leaf]
            if data is None:
                continue
            if row_list[leaf]:
                _check(isinstance(data, np.ndarray), f"block {k} leaf {leaf} is not rows")
                want = (size,) + stored_shapes[leaf]
                _check(_as_dtype(data, stored_dtypes[leaf]) is not None and data.shape == want
                       and data.flags.c_contiguous, f"block {k} leaf {leaf}'s rows are "
                       f"{data.shape}, not {stored_dtypes[leaf]} {want}")
            else:
                _check(type(data) is list and len(data) <= size,
                       f"block {k} leaf {leaf} is not a list of its items")
        infos = b.get("infos")
        _check(type(infos) is dict and all(type(row) is int and 0 <= row < size
                                            for row in infos), f"block {k}'s infos are not by row")
        if trees is not None:
            leaves_of_rows.append(_array(b.get("leaf_of_row"), np.dtype(np.int32), size,
                                         f"block {k}'s tree leaves"))
        else:
            _check(b.get("leaf_of_row") is None, f"block {k} has tree leaves")
    # -- runs ---------------------------------------------------------------------------
    run_head = _count(state.get("run_head"), "the first run", 0, 1 << 42)
    run_cap = _count(state.get("run_cap"), "the run ring", 16, 1 << 40)
    runs = _array(state.get("runs"), RUN_DTYPE, -1, "the runs")
    n_runs = runs.shape[0]
    _check(run_cap & (run_cap - 1) == 0 and n_runs <= run_cap, "the run ring is not one")
    cdef int64_t[:] rb = np.ascontiguousarray(runs["block"])
    cdef int64_t[:] rn = np.ascontiguousarray(runs["next"])
    cdef int32_t[:] rr = np.ascontiguousarray(runs["row"])
    cdef int32_t[:] rcount = np.ascontiguousarray(runs["n"])
    cdef int32_t[:] rep = np.ascontiguousarray(runs["ep"])
    cdef int32_t[:] rts = np.ascontiguousarray(runs["ts"])
    cdef int64_t[:] block_sizes = sizes
    for i in range(n_runs):
        if not first_block <= rb[i] < first_block + nblocks:
            raise ValueError(f"run {i} is outside the blocks")
        size = block_sizes[rb[i] - first_block]
        if not (0 <= rr[i] and 0 <= rcount[i] and <int64_t>rr[i] + rcount[i] <= size):
            raise ValueError(f"run {i}'s rows are outside its block")
        if not (rep[i] == -1 or (0 <= rep[i] < ep_cap and e_live[rep[i]])):
            raise ValueError(f"run {i}'s episode is not stored")
        if not (rn[i] == -1 or run_head + i < rn[i] < run_head + n_runs):
            raise ValueError(f"run {i}'s next run is not after it")
        if rep[i] >= 0 and rts[i] >= 0:
            live_steps += rcount[i]
    _check(live_steps == state.get("live_steps"), "the stored steps do not add up")
    # Each episode's runs: a chain from its first to its last run, its
    # lookback then its steps, in order (a chain only goes forward: it ends).
    for slot in order:
        seq = e_first[slot]
        ts = -e_lookback[slot]
        steps = 0
        while seq >= 0:
            if not run_head <= seq < run_head + n_runs:
                raise ValueError(f"episode slot {slot}'s runs are not stored")
            i = seq - run_head
            if not (rep[i] == slot and rts[i] == ts and (rcount[i] > 0 or ts >= 0)):
                raise ValueError(f"episode slot {slot}'s runs do not follow each other")
            ts += rcount[i]
            if rts[i] >= 0:
                steps += rcount[i]
            if rn[i] < 0:
                break
            seq = rn[i]
        if not (seq == e_last[slot] and (seq >= 0 or ts == 0)
                and steps == e_length[slot] and ts == steps):
            raise ValueError(f"episode slot {slot}'s runs do not hold its steps")
    # -- final rows ---------------------------------------------------------------------
    final, final_objects = state.get("final"), state.get("final_objects")
    final_infos = state.get("final_infos")
    _check(type(final) is list and type(final_objects) is list and len(final) == nleaves
           and len(final_objects) == nleaves and type(final_infos) is dict,
           "the final rows are not one column per leaf")
    final = list(final)
    for leaf in range(nleaves):
        if leaf in obs_leaves and row_list[leaf]:
            _check(type(final[leaf]) is np.ndarray
                   and final[leaf].shape == (ep_cap,) + stored_shapes[leaf]
                   and final_objects[leaf] is None,
                   f"leaf {leaf}'s final rows are not one per slot")
            final[leaf] = _as_dtype(final[leaf], stored_dtypes[leaf])
            _check(final[leaf] is not None, f"leaf {leaf}'s final rows are not its rows")
        elif leaf in obs_leaves:
            _check(final[leaf] is None and type(final_objects[leaf]) is list
                   and len(final_objects[leaf]) == ep_cap,
                   f"leaf {leaf}'s final items are not one per slot")
        else:
            _check(final[leaf] is None and final_objects[leaf] is None,
                   f"leaf {leaf} has final rows")
    _check(all(type(s) is int and 0 <= s < ep_cap and e_live[s] for s in final_infos),
           "the final infos are not by stored episode")
    # -- frames -------------------------------------------------------------------------
    # Each frame-stacked leaf's pool over the saved chunks, and every frame
    # number a stored episode's rows hold within it (see _check_frames).
    built_pools = [None] * nleaves
    for leaf in range(nleaves):
        if pools[leaf] is None:
            continue
        saved = pools[leaf]
        _check(type(saved) is tuple and len(saved) == 2 and type(saved[0]) is dict
               and type(saved[1]) is list and type(saved[0].get("axis")) is int,
               f"leaf {leaf}'s frames are not a pool's")
        try:
            pool = FramePool(shapes[leaf], dtypes[leaf], store.frame_stack, saved[0]["axis"],
                             store.block_rows * 16, store.storage)
            lo, hi = pool.adopt(saved[0], saved[1])
        except ValueError as error:
            raise ValueError(f"leaf {leaf}'s frames: {error}") from None
        _check_frames(leaf, store.frame_stack, lo, hi, order, e_first, rb, rr, rcount, rn,
                      run_head, first_block, blocks, final[leaf])
        built_pools[leaf] = pool
    # -- priority trees -----------------------------------------------------------------
    cdef Py_ssize_t tsize = 0, alloc = 0, fresh = 0
    cdef cnp.ndarray values = None, tags = None, queue = None, owners = None
    cdef int32_t[:] lor
    cdef int64_t[:] owner_v
    cdef double[:] value_v
    cdef unsigned char[:] tag_v
    if trees is not None:
        saved = state.get("trees")
        _check(type(saved) is dict, "the priority trees are missing")
        tsize = _count(saved.get("size"), "the trees' size", trees.size, 1 << 31)
        alloc = _count(saved.get("alloc"), "the trees' allocated leaves", 1, tsize)
        fresh = _count(saved.get("fresh"), "the trees' used leaves", 0, alloc)
        _check(tsize & (tsize - 1) == 0 and alloc & (alloc - 1) == 0,
               "the trees' sizes are not powers of two")
        values = _array(saved.get("values"), np.dtype(np.float64), alloc, "the trees' leaves")
        tags = _array(saved.get("tags"), np.dtype(np.uint8), alloc, "the trees' leaf types")
        queue = _array(saved.get("queue"), np.dtype(np.int64), -1, "the trees' free leaves")
        _count(saved.get("max_leaf"), "the trees' highest leaf", -(1 << 31), 1 << 31)
        value_v, tag_v = values, tags
        owners = np.full(alloc, -1, np.int64)
        owner_v = owners
        for i in range(n_runs):
            if rep[i] < 0 or rts[i] < 0:
                continue
            lor = leaves_of_rows[rb[i] - first_block]
            for k in range(rcount[i]):
                tree_leaf = lor[rr[i] + k]
                if not (0 <= tree_leaf < fresh and owner_v[tree_leaf] < 0):
                    raise ValueError(f"tree leaf {tree_leaf} is out of range or used twice")
                if not (tag_v[tree_leaf] <= TAG_F32 and value_v[tree_leaf] >= 0.0):
                    raise ValueError(f"tree leaf {tree_leaf} holds no priority")
                owner_v[tree_leaf] = ((run_head + i) << 20) | k
        in_use = owners >= 0
        q = queue
        _check(bool(np.all((q >= 0) & (q < fresh))) and not bool(np.any(in_use[q]))
               and len(np.unique(q)) == len(q) and len(q) + int(in_use.sum()) == fresh,
               "the free tree leaves and the stored steps' leaves are not the used leaves")
        _check(bool(np.all(values[~in_use] == 0.0)) and bool(np.all(tags[~in_use] == TAG_FLOAT)),
               "a free tree leaf holds a priority")
    # -- installing (nothing above changed the store) -----------------------------------
    row_bytes = <Py_ssize_t*>PyMem_Malloc(max(1, nleaves) * sizeof(Py_ssize_t))
    kinds = <unsigned char*>PyMem_Malloc(max(1, nleaves))
    if row_bytes == NULL or kinds == NULL:
        PyMem_Free(row_bytes)
        PyMem_Free(kinds)
        raise MemoryError()
    for leaf in range(nleaves):
        row_bytes[leaf] = row_list[leaf]
        kinds[leaf] = kind_list[leaf]
    PyMem_Free(store.row_bytes)
    PyMem_Free(store.kinds)
    store.row_bytes, store.kinds = row_bytes, kinds
    store.pools = built_pools
    store.nleaves = nleaves
    store.dtypes = list(dtypes)
    store.shapes = list(shapes)
    store.layout = layout
    for leaf in range(nleaves):
        shape, dtype = store._stored_layout(leaf)
        store.blocks.add_leaf(shape, dtype)
    # Episodes (their slots as they were; the key table is made anew).
    _resize_slots(store, ep_cap)
    for i in range(ep_cap):
        e = &store.eps[i]
        e.first_run, e.last_run = e_first[i], e_last[i]
        e.length, e.t_started = e_length[i], eps["t_started"][i]
        e.lookback = e_lookback[i]
        e.terminated, e.truncated = eps["terminated"][i], eps["truncated"][i]
        e.finalized, e.live = eps["finalized"][i], e_live[i]
        e.prev, e.next = e_prev[i], e_next[i]
        e.start_time, e.last_step_time = eps["start_time"][i], eps["last_step_time"][i]
    for i in range(n_free):
        store.free_slots[i] = free[i]
    store.n_free = n_free
    store.ids, store.keys, store.meta = list(ids), list(keys), list(metas)
    store.first_slot, store.last_slot = first_slot, last_slot
    store.num_episodes, store.num_evicted = num_episodes, num_evicted
    for slot in order:
        store.table.insert(store.keys[slot], slot, store.num_episodes)
    store.final = [None if x is None else Column.from_array(np.array(x)) for x in final]
    store.final_objects = [None if x is None else list(x) for x in final_objects]
    store.final_infos = dict(final_infos)
    # Blocks over the given rows.
    store.blocks.first = first_block
    for k in range(nblocks):
        b = blocks[k]
        block = Block.__new__(Block)
        block.size = block.capacity = b["size"]
        block.cols = [None if data is None else
                      (Column.from_array(data) if row_list[leaf] else list(data))
                      for leaf, data in enumerate(b["leaves"])]
        block.infos = dict(b["infos"])
        if trees is not None:
            block.leaf_of_row = <int32_t*>PyMem_Malloc(max(1, block.size) * sizeof(int32_t))
            if block.leaf_of_row == NULL:
                raise MemoryError()
            lor = leaves_of_rows[k]
            for i in range(block.size):
                block.leaf_of_row[i] = lor[i]
        store.blocks.append(block)
    # Runs, in a ring of the saved size, and the Fenwick tree of their steps.
    store.runs.head = store.runs.tail = run_head
    store.runs.reserve(run_cap)
    for i in range(n_runs):
        seq = run_head + i
        r = store.runs.at(seq)
        r.block, r.next, r.row, r.n = rb[i], rn[i], rr[i], rcount[i]
        r.ep, r.ts = rep[i], rts[i]
        store.runs.tail = seq + 1
        if r.ep >= 0 and r.ts >= 0:
            store.runs.add_live(seq, r.n)
    # Priority trees: the leaves, their keys, the free queue; every node
    # above them recomputed from its children (as each update leaves it).
    if trees is not None:
        _restore_trees(trees, tsize, alloc, fresh, values, tags, queue, owners,
                       state["trees"]["max_leaf"])
    return None


cdef cnp.ndarray _frame_rows(list blocks, Py_ssize_t k, Py_ssize_t leaf):
    # A block's rows of a frame-stacked leaf (checked as int64 (size, stack)).
    rows = blocks[k]["leaves"][leaf]
    _check(rows is not None, f"block {k} has no rows of leaf {leaf}, which a run reads")
    return rows


cdef int _check_frames(Py_ssize_t leaf, Py_ssize_t stack, int64_t lo, int64_t hi, list order,
                       const int64_t[:] e_first, const int64_t[:] rb, const int32_t[:] rr,
                       const int32_t[:] rcount, const int64_t[:] rn, int64_t run_head,
                       int64_t first_block, list blocks, cnp.ndarray final) except -1:
    # The frame numbers of the stored episodes' rows (their runs', and their
    # final rows) in a frame-stacked leaf: each in the pool's [lo, hi), and,
    # as the store frees frames (those before the oldest episode's first
    # row's, as episodes are evicted oldest first), none before the first
    # row's frames of its own episode or of an older one.
    cdef const int64_t[:, ::1] rows
    cdef const int64_t[:, ::1] last = final
    cdef Py_ssize_t i, r, j
    cdef int64_t seq, f, floor = lo, first
    cdef int32_t slot
    for slot in order:
        seq = e_first[slot]
        if seq >= 0:
            i = seq - run_head
            if rcount[i] <= 0:
                raise ValueError(f"episode slot {slot}'s first run has no rows (leaf {leaf} "
                                 f"is frame-stacked)")
            rows = _frame_rows(blocks, rb[i] - first_block, leaf)
            r = rr[i]
        else:
            rows = last
            r = slot
        first = rows[r, 0]
        for j in range(1, stack):
            first = min(first, rows[r, j])
        floor = max(floor, first)
        while seq >= 0:
            i = seq - run_head
            rows = _frame_rows(blocks, rb[i] - first_block, leaf)
            for r in range(rr[i], rr[i] + rcount[i]):
                for j in range(stack):
                    f = rows[r, j]
                    if not floor <= f < hi:
                        raise ValueError(f"episode slot {slot}'s rows of leaf {leaf} refer to "
                                         f"frame {f}, outside the frames {floor} to {hi}")
            seq = rn[i]
        for j in range(stack):
            f = last[slot, j]
            if not floor <= f < hi:
                raise ValueError(f"episode slot {slot}'s last row of leaf {leaf} refers to "
                                 f"frame {f}, outside the frames {floor} to {hi}")
    return 0


cdef int _resize_slots(Store store, Py_ssize_t cap) except -1:
    # The slot arrays at exactly `cap` entries (the saved ones'), empty.
    cdef Ep* eps
    cdef int32_t* free_slots
    PyMem_Free(store.eps)
    PyMem_Free(store.free_slots)
    store.eps = NULL
    store.free_slots = NULL
    store.ep_cap = 0
    store.n_free = 0
    eps = <Ep*>PyMem_Malloc(max(1, cap) * sizeof(Ep))
    free_slots = <int32_t*>PyMem_Malloc(max(1, cap) * sizeof(int32_t))
    if eps == NULL or free_slots == NULL:
        PyMem_Free(eps)
        PyMem_Free(free_slots)
        raise MemoryError()
    store.eps, store.free_slots, store.ep_cap = eps, free_slots, cap
    return 0


cdef int _restore_trees(PriorityTrees trees, Py_ssize_t size, Py_ssize_t alloc,
                        Py_ssize_t fresh, cnp.ndarray values, cnp.ndarray tags,
                        cnp.ndarray queue, cnp.ndarray owners, object max_leaf) except -1:
    cdef cnp.ndarray used = np.flatnonzero(owners >= 0).astype(np.int64)
    cdef int64_t[:] used_v = used
    cdef int64_t[:] owner_v = owners
    cdef double[:] value_v = values
    cdef unsigned char[:] tag_v = tags
    cdef Py_ssize_t i, n = used.shape[0]
    cdef int64_t leaf
    cdef Num v
    trees.size = size
    trees._grow(alloc - 1)
    for i in range(n):
        leaf = used_v[i]
        v = num(value_v[leaf], tag_v[leaf])
        trees._set_raw(leaf, v, v)
        trees.owner[leaf] = owner_v[leaf]
    if n:
        trees.propagate(&used_v[0], n)
    for leaf in queue.tolist():
        trees._push_back(leaf)
    trees.fresh = fresh
    trees.max_leaf = max_leaf
    return 0
