"""Replay storage: the stored episodes' rows, and their sampling in C.

A Store keeps every stored step once, in insertion order: blocks of rows
(episode._blocks), one Column per leaf (observations, actions, rewards,
each extra model output; Dict/Tuple items a Column per leaf) and the
non-empty infos by row; its episodes are found by key (episode._keys).
A step's row holds its observation, its action, its reward; the observation
after an episode's last step (and its infos) sits in the episode's `final`
row until the next chunk of the episode arrives, whose first step then holds
it. So each observation is stored once, `new_obs` of a step is the next
step's row, and an n-step transition or a sequence is a walk along rows.

The steps of all episodes in the order they were added are runs (one per
chunk, cut where a block ends; episode._runs): that order is RLlib's list
of sampleable steps, the k-th of which a uniform draw picks. Evicting the
oldest episode marks its runs dead; a block is freed once every run in it
is dead.

The draws (episode._picks) reproduce RLlib's buffers draw for draw (same
Generator calls in the same order: episode._draws) and hand back the drawn
steps; episode._gather copies their rows into batch arrays.
"""
import copy
import os

import numpy as np

cimport cython
cimport numpy as cnp
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.math cimport INFINITY, NAN, isnan
from libc.stdint cimport INT32_MAX, int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

from episode._column cimport CHECKED

from episode._arrays cimport copy_row
from episode._blocks cimport Block, Blocks
from episode._buffer cimport BufferCore
from episode._column cimport (Column, KIND_ARRAY, KIND_BOOL, KIND_EMPTY, KIND_EMPTY_DICT,
                              KIND_OBJECT, KIND_SCALAR, array_bytes)
from episode._episode cimport EpisodeCore, own_extras
from episode._frames cimport FramePool
from episode._keys cimport KeyTable
from episode import _frames
from episode._pages cimport drop_pages, new_array
from episode._priority cimport (Num, PriorityTrees, add, div, from_num, greater, mul, num,
                                power, to_num)
from episode._priority cimport TAG_F32, TAG_F64, TAG_FLOAT, TAG_INT

cnp.import_array()

# Rows a block holds: a sixteenth of the capacity, at least 64 and at most
# 2^20 (a tree leaf's key keeps a row offset in 20 bits).
cdef Py_ssize_t MIN_BLOCK_ROWS = 64
cdef Py_ssize_t MAX_BLOCK_ROWS = 1 << 20

# A tree leaf's key: run << 20 | offset (KEY_OFFSET_MASK, in _replay.pxd).
# The keys sample_batch() hands out as `indices` carry their store's tag in
# bits 56-62 (KEY_TAG_SHIFT), so that update_priorities() can tell them from
# another store's (or another buffer's before a set_state()).
cdef int64_t KEY_STEP_MASK = ((<int64_t>1) << 56) - 1
cdef int64_t last_key_tag = 0
cdef object F32_DTYPE = np.dtype(np.float32)
cdef object F64_DTYPE = np.dtype(np.float64)


cdef inline bint is_pod_leaf(Column col):
    # A Column whose rows are plain numeric bytes (typed in list mode, or
    # finalized plain numbers).
    return (col.descr is not None and col.kind != KIND_OBJECT and col.kind != KIND_EMPTY_DICT
            and col.kind != KIND_EMPTY and col.pod and col.plain())


cdef unsigned char handback_kind(Column col):
    # The list-mode kind sampled items of this leaf come back as.
    if col.finalized:
        return KIND_ARRAY if col.row_ndim else KIND_SCALAR
    return col.kind


cdef object leaf_structure(object tree, list leaves, Py_ssize_t* next_leaf):
    # `tree` (a BufferCore's storage) with each Column replaced by its leaf
    # number, numbered in dm-tree (sorted-key) order as BufferCore._leaves.
    cdef dict mapping = {}
    cdef Py_ssize_t i
    for i in range(len(leaves)):
        mapping[id(leaves[i])] = next_leaf[0] + i
    next_leaf[0] += len(leaves)
    return _replace_leaves(tree, mapping)


cdef object _replace_leaves(object tree, dict mapping):
    if type(tree) is Column:
        return mapping[id(tree)]
    if isinstance(tree, dict):
        return {k: _replace_leaves(v, mapping) for k, v in tree.items()}
    return tuple(_replace_leaves(v, mapping) for v in tree)


cdef object signature(object tree):
    # The nesting of a storage tree, independent of dict order and leaves.
    if type(tree) is Column or isinstance(tree, int):
        return None
    if isinstance(tree, dict):
        return tuple(sorted((repr(k), signature(v)) for k, v in tree.items()))
    return tuple(signature(v) for v in tree)


cdef list buffer_leaves(BufferCore buf):
    return [buf.flat()] if buf.flat() is not None else list(buf._tree_leaves)


cdef list _leaf_list(object structure):
    # A track's leaf numbers, in dm-tree order (the order they were numbered in).
    cdef list out = []
    _collect_leaves(structure, out)
    out.sort()
    return out


cdef int _collect_leaves(object structure, list out) except -1:
    if isinstance(structure, int):
        out.append(structure)
    else:
        for v in (structure.values() if isinstance(structure, dict) else structure):
            _collect_leaves(v, out)
    return 0


cdef object _description_of(BufferCore buf):
    # A buffer's layout: its nesting, and each leaf's dtype and row shape
    # (None for a leaf of other objects).
    cdef list leaves = []
    cdef Column col
    for col in buffer_leaves(buf):
        leaves.append((col.descr, row_shape_of(col)) if is_pod_leaf(col) else None)
    return signature(buf._tree), tuple(leaves)


cdef tuple row_shape_of(Column col):
    cdef list shape = []
    cdef int i
    for i in range(col.row_ndim):
        shape.append(col.row_shape[i])
    return tuple(shape)


cdef str _describe_layout(object description):
    leaves = ["objects" if leaf is None else f"{leaf[0]} rows of shape {leaf[1]}"
              for leaf in description[1]]
    return ", ".join(leaves) if len(leaves) > 1 else leaves[0]


cdef bint _same_row(list a_cols, Py_ssize_t a_pos, list b_cols, Py_ssize_t b_pos) except -1:
    # numpy's == on two items, leaf by leaf (RLlib's concat_episode check).
    cdef Column a, b
    if len(a_cols) != len(b_cols):
        return False
    for a, b in zip(a_cols, b_cols):
        if not np.array_equal(np.asarray(a.item(a_pos)), np.asarray(b.item(b_pos))):
            return False
    return True


cdef str _describe(Column col):
    if not is_pod_leaf(col):
        return "objects"
    return f"{col.descr}, rows of shape {row_shape_of(col)}"


# -- the store -------------------------------------------------------------------------


cdef class EpisodeMeta:
    """What a stored episode keeps besides its rows (shared between episodes
    where equal: most episodes have the same spaces and no custom data)."""

    def __init__(self, agent_id, module_id, multi_agent_episode_id, observation_space,
                 action_space, extra_keys, custom_data, defaultdict_extras):
        self.agent_id = agent_id
        self.module_id = module_id
        self.multi_agent_episode_id = multi_agent_episode_id
        self.observation_space = observation_space
        self.action_space = action_space
        self.extra_keys = extra_keys
        self.custom_data = custom_data
        self.defaultdict_extras = defaultdict_extras

    cdef bint same_as(self, EpisodeMeta other):
        return (other is not None and self.custom_data is None and other.custom_data is None
                and self.agent_id is other.agent_id and self.module_id is other.module_id
                and self.multi_agent_episode_id is other.multi_agent_episode_id
                and self.observation_space is other.observation_space
                and self.action_space is other.action_space
                and self.extra_keys == other.extra_keys
                and self.defaultdict_extras == other.defaultdict_extras)


@cython.final
cdef class Store:
    """Stored episodes' rows and steps (see the module docstring).

    `capacity` (steps) sizes the blocks; `prioritized` gives each stored
    step a leaf of RLlib's priority trees (`tree_size` leaves); `storage`, a
    folder, keeps the blocks in files there instead of in memory.
    `frame_stack` > 0 stores frame-stacked observations once per frame: each
    observation leaf whose rows stack that many frames along `frame_axis`
    (None: along their one axis of that length) keeps its frames in a
    FramePool (see episode._frames); every row read is the row added."""

    def __cinit__(self, Py_ssize_t capacity, bint prioritized=False, Py_ssize_t tree_size=0,
                  storage=None, Py_ssize_t frame_stack=0, frame_axis=None):
        if capacity <= 0:
            raise ValueError(f"capacity must be a positive number of timesteps, not {capacity}")
        if frame_stack != 0 and not 2 <= frame_stack <= _frames.MAX_STACK:
            raise ValueError(f"frame_stack must be 0 (off) or 2 to {_frames.MAX_STACK} "
                             f"frames, not {frame_stack}")
        if frame_axis is not None and type(frame_axis) is not int:
            raise TypeError(f"frame_axis must be an int or None, not "
                            f"{type(frame_axis).__name__}")
        self.frame_stack = frame_stack
        self.frame_axis = frame_axis
        self.pools = []
        self.nleaves = 0
        self.dtypes = []
        self.shapes = []
        self.layout = {"obs": None, "actions": None, "rewards": None, "extras": {}}
        self.block_rows = max(MIN_BLOCK_ROWS, min(MAX_BLOCK_ROWS, capacity // 16))
        self.storage = None
        if storage is not None:
            # Checked here: a folder that fails later fails an add() half done.
            self.storage = os.fsdecode(os.fspath(storage))
            if not os.path.isdir(self.storage):
                raise (NotADirectoryError if os.path.exists(self.storage)
                       else FileNotFoundError)(f"no storage folder {self.storage!r}")
        self.blocks = Blocks(self.block_rows, self.storage, prioritized)
        self.table = KeyTable()
        self.ids = []
        self.keys = []
        self.meta = []
        self.final = []
        self.final_objects = []
        self.final_infos = {}
        self.priorities = PriorityTrees(tree_size) if prioritized else None
        global last_key_tag
        last_key_tag = last_key_tag % 127 + 1
        self.key_tag = last_key_tag
        self.runs = Runs()
        self.first_slot = -1
        self.last_slot = -1

    def __dealloc__(self):
        PyMem_Free(self.row_bytes)
        PyMem_Free(self.kinds)
        PyMem_Free(self.eps)
        PyMem_Free(self.free_slots)

    # -- finding episodes by key ------------------------------------------------------

    def __contains__(self, key):
        """Whether an episode is stored under `key`."""
        return self.table.find(key, self.keys) >= 0

    def slot_for(self, key):
        """The slot of the episode stored under `key` (KeyError if none)."""
        cdef int32_t slot = self.table.find(key, self.keys)
        if slot < 0:
            raise KeyError(key)
        return slot

    def stored_keys(self):
        """{key: slot} of the stored episodes, oldest first."""
        return {self.keys[slot]: slot for slot in live_slots(self)}

    # -- sizes ---------------------------------------------------------------------

    @property
    def live_steps(self):
        """The stored steps a draw may land on (lookback rows excluded)."""
        return self.runs.live_steps

    cdef int _reserve_slots(self) except -1:
        # A free episode slot (the slot arrays and the final rows grow by 1/8).
        cdef Py_ssize_t cap, i
        cdef Ep* eps
        cdef int32_t* free_slots
        if self.n_free:
            return 0
        cap = max(16, self.ep_cap + self.ep_cap // 8)
        if cap > INT32_MAX:
            raise MemoryError("too many stored episodes")
        eps = <Ep*>PyMem_Realloc(self.eps, cap * sizeof(Ep))
        if eps == NULL:
            raise MemoryError()
        self.eps = eps
        free_slots = <int32_t*>PyMem_Realloc(self.free_slots, cap * sizeof(int32_t))
        if free_slots == NULL:
            raise MemoryError()
        self.free_slots = free_slots
        self._grow_final(cap)
        for i in range(cap - 1, self.ep_cap - 1, -1):
            self.eps[i].live = 0
            self.free_slots[self.n_free] = <int32_t>i
            self.n_free += 1
            self.ids.append(None)
            self.keys.append(None)
            self.meta.append(None)
        self.ep_cap = cap
        return 0

    cdef int _grow_final(self, Py_ssize_t cap) except -1:
        cdef Py_ssize_t leaf
        cdef Column col, grown
        for leaf in range(len(self.final)):
            col = self.final[leaf]
            if col is None:
                continue
            shape, dtype = self._stored_layout(leaf)
            grown = Column.from_array(new_array((cap,) + shape, dtype, None))
            if self.ep_cap:
                memcpy(grown.row_ptr(0, self.ep_cap), col.row_ptr(0, self.ep_cap),
                       self.ep_cap * self.blocks.row_bytes[leaf])
            self.final[leaf] = grown
        for leaf in range(len(self.final_objects)):
            if self.final_objects[leaf] is not None:
                self.final_objects[leaf].extend([None] * (cap - len(self.final_objects[leaf])))
        return 0

    # -- layout ------------------------------------------------------------------------

    cdef Py_ssize_t _add_leaves(self, list cols, bint with_final) except -1:
        # New leaves shaped as `cols` (the first episode's Columns of a
        # track); returns the first one's number.
        cdef Py_ssize_t first = self.nleaves, k, leaf
        cdef Column col
        cdef Py_ssize_t* row_bytes
        cdef unsigned char* kinds
        cdef FramePool pool
        # (Checked before anything changes: ValueError for observations
        # that do not stack as declared.)
        axes = self._stack_axes(cols) if with_final and self.frame_stack else [-1] * len(cols)
        row_bytes = <Py_ssize_t*>PyMem_Realloc(self.row_bytes,
                                                (self.nleaves + len(cols)) * sizeof(Py_ssize_t))
        if row_bytes == NULL:
            raise MemoryError()
        self.row_bytes = row_bytes
        kinds = <unsigned char*>PyMem_Realloc(self.kinds, self.nleaves + len(cols))
        if kinds == NULL:
            raise MemoryError()
        self.kinds = kinds
        for k in range(len(cols)):
            col = cols[k]
            leaf = first + k
            if is_pod_leaf(col):
                self.dtypes.append(col.descr)
                self.shapes.append(row_shape_of(col))
                self.row_bytes[leaf] = col.row_bytes
                self.kinds[leaf] = handback_kind(col)
            else:
                self.dtypes.append(None)
                self.shapes.append(None)
                self.row_bytes[leaf] = 0
                self.kinds[leaf] = KIND_OBJECT
            if axes[k] >= 0:
                pool = FramePool(self.shapes[leaf], self.dtypes[leaf], self.frame_stack,
                                 axes[k], self.block_rows * 16, self.storage)
                self.pools.append(pool)
            else:
                self.pools.append(None)
            self.nleaves += 1
            shape, dtype = self._stored_layout(leaf)
            self.blocks.add_leaf(shape, dtype)
            if with_final and self.row_bytes[leaf]:
                shape, dtype = self._stored_layout(leaf)
                self.final.append(Column.from_array(new_array((self.ep_cap,) + shape, dtype,
                                                              None)))
                self.final_objects.append(None)
            elif with_final:
                self.final.append(None)
                self.final_objects.append([None] * self.ep_cap)
            else:
                self.final.append(None)
                self.final_objects.append(None)
        return first

    cdef object _stack_axes(self, list cols):
        # Per observation leaf of the first episode, the axis its rows
        # stack frame_stack frames along (-1: not stacked). ValueError where
        # none does, or where the axis is not declared and a row has more
        # than one of that length.
        cdef Column col
        cdef Py_ssize_t k = self.frame_stack
        axes = []
        for col in cols:
            axis = -1
            if is_pod_leaf(col):
                shape = row_shape_of(col)
                if self.frame_axis is None:
                    found = [a for a in range(len(shape)) if shape[a] == k]
                    if len(shape) >= 2 and len(found) > 1:
                        raise ValueError(
                            f"frame_stack={k}: observation rows of shape {shape} have "
                            f"{len(found)} axes of length {k}; say which one stacks the "
                            f"frames (frame_stack_axis)")
                    if len(shape) >= 2 and found and _frames.stack_layout(shape, k, found[0]):
                        axis = found[0]
                else:
                    a = self.frame_axis + len(shape) if self.frame_axis < 0 else self.frame_axis
                    if _frames.stack_layout(shape, k, a):
                        axis = a
            axes.append(axis)
        if all(a < 0 for a in axes):
            where = "an axis of length" if self.frame_axis is None else \
                f"axis {self.frame_axis} of a length divisible by"
            raise ValueError(
                f"frame_stack={k}: no observation has {where} {k} "
                f"(observations: {', '.join(_describe(col) for col in cols)})")
        return axes

    cdef tuple _stored_layout(self, Py_ssize_t leaf):
        # A stored row's shape and dtype: the row's, or its frames' numbers.
        if self.pools[leaf] is not None:
            return (self.frame_stack,), np.dtype(np.int64)
        return self.shapes[leaf], self.dtypes[leaf]

    cdef object _final_row(self, int32_t slot, Py_ssize_t leaf):
        # The final observation's row of a numeric leaf, as an array.
        cdef cnp.ndarray row
        cdef FramePool pool = self.pools[leaf]
        if pool is None:
            return (<Column>self.final[leaf]).rows(slot, slot + 1)[0]
        row = np.empty(self.shapes[leaf], self.dtypes[leaf])
        pool.assemble(array_bytes(row, pool.row_bytes),
                      <int64_t*>(<Column>self.final[leaf]).row_ptr(slot, 1))
        return row

    cdef int _begin_frames(self, int32_t slot, bint is_new) except -1:
        # Before an episode's rows are written: a new episode's first row
        # follows no row, a chunk's first row follows the stored last one.
        cdef Py_ssize_t leaf
        cdef FramePool pool
        for leaf in range(self.nleaves):
            pool = self.pools[leaf]
            if pool is None:
                continue
            if is_new:
                pool.has_last = False
            else:
                pool.follow(<int64_t*>(<Column>self.final[leaf]).row_ptr(slot, 1))
        return 0

    cdef int _release_frames(self) except -1:
        # Frees the frames no stored row refers to: those written before the
        # oldest stored episode's first row (episodes are evicted oldest
        # first, and every frame an episode refers to is written at or
        # after its first row's first one).
        cdef Py_ssize_t leaf, j
        cdef FramePool pool
        cdef int64_t* refs
        cdef int64_t lo
        cdef int32_t slot = self.first_slot
        for leaf in range(self.nleaves):
            pool = self.pools[leaf]
            if pool is None:
                continue
            if slot < 0:
                pool.release_before(pool.tail)
                continue
            if self.eps[slot].first_run >= 0:
                refs = <int64_t*>self._row_ptr(self.eps[slot].first_run, 0, leaf)
            else:
                refs = <int64_t*>(<Column>self.final[leaf]).row_ptr(slot, 1)
            lo = refs[0]
            for j in range(1, self.frame_stack):
                lo = min(lo, refs[j])
            pool.release_before(lo)
        return 0

    def frame_stats(self):
        """Per frame-stacked observation leaf: {"frames": frames written,
        "chunks", "bytes": the frames' chunks held, "frame_bytes"}."""
        return {leaf: (<FramePool>self.pools[leaf]).stats()
                for leaf in range(self.nleaves) if self.pools[leaf] is not None}

    cdef object _track_layout(self, BufferCore buf, object known, bint with_final, str what):
        # The leaf structure of the store's track `what` for `buf`: the known
        # one, after checking that `buf` fits it (ValueError), or a new one.
        cdef list cols = buffer_leaves(buf)
        cdef Py_ssize_t first, k, leaf
        cdef Column col
        if known is None:
            first = self.nleaves
            structure = leaf_structure(buf._tree, cols, &first)
            self._add_leaves(cols, with_final)
            return structure
        if signature(buf._tree) != signature(known):
            raise ValueError(f"the episode's {what} are structured unlike the stored ones")
        leaves = _leaf_list(known)
        for k in range(len(cols)):
            col = cols[k]
            leaf = leaves[k]
            if col.nrows() == 0:
                continue
            if self.row_bytes[leaf] == 0:
                if is_pod_leaf(col):
                    raise ValueError(f"the episode's {what} are numbers where the stored ones "
                                     f"are other objects")
            elif not is_pod_leaf(col) or col.descr != self.dtypes[leaf] or \
                    row_shape_of(col) != self.shapes[leaf]:
                raise ValueError(
                    f"the episode's {what} ({_describe(col)}) do not match the stored ones "
                    f"({self.dtypes[leaf]}, rows of shape {self.shapes[leaf]})")
        return known

    def bytes_per_step(self):
        """Bytes of a stored step's numeric rows."""
        cdef Py_ssize_t leaf, total = 0
        for leaf in range(self.nleaves):
            total += self.row_bytes[leaf]
        return total

    def leaf_dtype(self, Py_ssize_t leaf):
        """The numpy dtype leaf `leaf` keeps (None for a leaf of objects)."""
        if not 0 <= leaf < self.nleaves:
            raise IndexError(f"no leaf {leaf}")
        return self.dtypes[leaf]

    def release_pages(self):
        """With file-backed blocks: drops the pages of every full block from
        this process's memory (they stay in their files and come back when
        read), so that the resident size stays bounded while the buffer
        grows past memory. Does nothing for blocks in memory."""
        if self.storage is None:
            return
        self.blocks.release_pages()
        for pool in self.pools:
            if pool is not None:
                (<FramePool>pool).release_pages()

    # -- adding ------------------------------------------------------------------------

    def check(self, EpisodeCore episode, dict pending, key=None):
        """Raises what add(episode) would raise, changing nothing. `pending`
        carries the episodes checked before it in the same call (to be added
        first): call check() for each episode of an add() call, then add()."""
        cdef Py_ssize_t n = episode.t - episode.t_started
        cdef BufferCore obs = episode.observations
        cdef object extras = own_extras(episode)
        cdef dict layouts = pending.setdefault(None, {})
        cdef int32_t slot
        check_steps(episode, extras, n)
        _check_rewards(episode.rewards)
        if key is None:
            key = episode.id_
        earlier = pending.get(key)
        if earlier is not None:
            end_t, done, keys, source = earlier
            self._check_chunk(episode, end_t, done, keys, extras, n)
            if not _same_row(buffer_leaves((<EpisodeCore>source).observations),
                             (<EpisodeCore>source).observations._lookback + len(source),
                             buffer_leaves(obs), obs._lookback):
                raise AssertionError("the chunk's first observation is not the stored "
                                     "episode's last one")
        elif self.table.find(key, self.keys) >= 0:
            slot = self.table.find(key, self.keys)
            self._check_chunk(episode, self.eps[slot].t_started + self.eps[slot].length,
                              self.eps[slot].terminated or self.eps[slot].truncated,
                              (<EpisodeMeta>self.meta[slot]).extra_keys, extras, n)
            self._check_joins(slot, obs)
            keys = (<EpisodeMeta>self.meta[slot]).extra_keys
        else:
            keys = tuple(extras)
        tracks = [(("obs", None), obs, "observations"),
                  (("actions", None), episode.actions, "actions"),
                  (("rewards", None), episode.rewards, "rewards")]
        tracks += [(("extras", key), buf, f"extra model outputs {key!r}")
                   for key, buf in extras.items()]
        for track, buf, what in tracks:
            if not len(buf):
                continue
            known = self.layout["extras"].get(track[1]) if track[0] == "extras" \
                else self.layout[track[0]]
            want = self._description(known) if known is not None else layouts.get(track)
            got = _description_of(buf)
            if want is None:
                if track[0] == "obs" and self.frame_stack:
                    self._stack_axes(buffer_leaves(buf))
                layouts[track] = got
            elif want != got:
                raise ValueError(f"the episode's {what} do not match the stored ones: "
                                 f"{_describe_layout(got)} against {_describe_layout(want)}")
        pending[key] = (episode.t, episode.is_terminated or episode.is_truncated, keys, episode)

    cdef int _check_chunk(self, EpisodeCore episode, int64_t end_t, bint done, tuple keys,
                          object extras, Py_ssize_t n) except -1:
        # What RLlib's concat_episode asserts (AssertionError).
        if done:
            raise AssertionError(f"episode {episode.id_!r} is done; no chunk can follow it")
        if end_t != episode.t_started:
            raise AssertionError(f"the chunk starts at t={episode.t_started}, the stored "
                                 f"episode {episode.id_!r} ends at t={end_t}")
        for key in extras:
            if key not in keys:
                raise AssertionError(f"extra model output {key!r} is not in the stored "
                                     f"episode {episode.id_!r}")
        if n and len(extras) != len(keys):
            raise AssertionError(f"the chunk lacks extra model outputs of the stored "
                                 f"episode {episode.id_!r}")
        return 0

    cdef object _description(self, object structure):
        # A track's layout as _description_of gives a buffer's.
        return (signature(structure),
                tuple((self.dtypes[leaf], self.shapes[leaf]) if self.row_bytes[leaf] else None
                      for leaf in _leaf_list(structure)))

    def add(self, EpisodeCore episode, weight=None, key=None):
        """Stores `episode` (ours), a new one or the next chunk of a stored
        one (same id): RLlib's deepcopy + append, or concat_episode. With
        priorities, each new step takes a tree leaf of `weight` (RLlib's
        `weight ** alpha`). Returns (slot, is_new, first index, steps).
        Checked before anything changes: AssertionError where RLlib's
        concat_episode asserts, ValueError for data unlike the stored."""
        cdef Py_ssize_t n = episode.t - episode.t_started
        cdef object slot_obj
        if key is None:
            key = episode.id_
        slot_obj = self.table.find(key, self.keys)
        if slot_obj < 0:
            slot_obj = None
        cdef int32_t slot
        cdef Ep* ep
        cdef BufferCore obs = episode.observations, infos = episode.infos
        cdef BufferCore actions = episode.actions, rewards = episode.rewards
        cdef object extras = own_extras(episode)
        cdef Py_ssize_t lookback, first_ts
        cdef bint is_new = slot_obj is None
        cdef Num w = num(0.0, TAG_FLOAT)
        check_steps(episode, extras, n)
        if self.priorities is not None and not self.restoring:
            w = to_num(weight)
        # Checks (nothing changes before they pass).
        if is_new:
            lookback = min(obs._lookback, infos._lookback, actions._lookback, rewards._lookback,
                           *[(<BufferCore>b)._lookback for b in extras.values()])
            layout = self._checked_layout(episode, extras, True)
        else:
            slot = slot_obj
            ep = &self.eps[slot]
            if ep.terminated or ep.truncated:
                raise AssertionError(f"episode {episode.id_!r} is done; no chunk can follow it")
            if ep.t_started + ep.length != episode.t_started:
                raise AssertionError(
                    f"the chunk starts at t={episode.t_started}, the stored episode "
                    f"{episode.id_!r} ends at t={ep.t_started + ep.length}")
            keys = (<EpisodeMeta>self.meta[slot]).extra_keys
            for key in extras:
                if key not in keys:
                    raise AssertionError(f"extra model output {key!r} is not in the stored "
                                         f"episode {episode.id_!r}")
            if n and len(extras) != len(keys):
                raise AssertionError(f"the chunk lacks extra model outputs of the stored "
                                     f"episode {episode.id_!r}")
            layout = self._checked_layout(episode, extras, False)
            self._check_joins(slot, obs)
            lookback = 0
        # Changes.
        if is_new:
            slot = self._new_slot(episode.id_, key, episode.t_started, lookback, 0,
                                  obs.is_finalized(), episode.start_time,
                                  episode.last_step_time)
            self.meta[slot] = self._meta_of(episode, extras, slot)
            first_ts = -lookback
        else:
            first_ts = ep.length
            custom = episode.custom_data_
            if custom:
                meta = <EpisodeMeta>self.meta[slot]
                self.meta[slot] = EpisodeMeta(
                    meta.agent_id, meta.module_id, meta.multi_agent_episode_id,
                    meta.observation_space, meta.action_space, meta.extra_keys,
                    dict(meta.custom_data or {}, **copy.deepcopy(custom)),
                    meta.defaultdict_extras)
        if self.frame_stack:
            self._begin_frames(slot, is_new)
        self._write_steps(slot, episode, extras, layout, lookback, first_ts, n, w)
        ep = &self.eps[slot]
        ep.length += n
        # (Both may be set, as RLlib's episodes keep both.)
        if episode.is_terminated:
            ep.terminated = 1
        if episode.is_truncated:
            ep.truncated = 1
        return slot, is_new, max(first_ts, 0), n

    cdef int32_t _new_slot(self, object id_, object key, int64_t t_started, Py_ssize_t lookback,
                           int64_t length, bint finalized, double start_time,
                           double last_step_time) except -1:
        # A new stored episode, after the newest: its slot, keyed (its
        # meta and runs are the caller's to set).
        cdef int32_t slot
        cdef Ep* ep
        self._reserve_slots()
        self.n_free -= 1
        slot = self.free_slots[self.n_free]
        ep = &self.eps[slot]
        ep.first_run = -1
        ep.last_run = -1
        ep.length = length
        ep.t_started = t_started
        ep.lookback = <int32_t>lookback
        ep.terminated = 0
        ep.truncated = 0
        ep.finalized = finalized
        ep.live = 1
        ep.start_time = start_time
        ep.last_step_time = last_step_time
        ep.prev = self.last_slot
        ep.next = -1
        if self.last_slot >= 0:
            self.eps[self.last_slot].next = slot
        else:
            self.first_slot = slot
        self.last_slot = slot
        self.num_episodes += 1
        self.ids[slot] = id_
        self.keys[slot] = key
        self.table.insert(key, slot, self.num_episodes)
        return slot

    cdef int _append_run(self, int32_t slot, int64_t run) noexcept:
        # The episode's runs are a list in the order they came.
        cdef Ep* ep = &self.eps[slot]
        if ep.last_run >= 0:
            self.runs.at(ep.last_run).next = run
        else:
            ep.first_run = run
        ep.last_run = run
        return 0

    cdef object _checked_layout(self, EpisodeCore episode, object extras, bint is_new):
        # The tracks' leaf structures for the episode (set on first sight).
        layout = self.layout
        _check_rewards(episode.rewards)
        obs = self._track_layout(episode.observations, layout["obs"], True, "observations")
        if len(episode.actions) or layout["actions"] is not None:
            actions = self._track_layout(episode.actions, layout["actions"], False, "actions") \
                if len(episode.actions) else layout["actions"]
        else:
            actions = None
        if len(episode.rewards) or layout["rewards"] is not None:
            rewards = self._track_layout(episode.rewards, layout["rewards"], False, "rewards") \
                if len(episode.rewards) else layout["rewards"]
        else:
            rewards = None
        extra_layout = dict(layout["extras"])
        for key, buf in extras.items():
            if len(buf) or key in extra_layout:
                extra_layout[key] = self._track_layout(
                    buf, extra_layout.get(key), False, f"extra model outputs {key!r}") \
                    if len(buf) else extra_layout[key]
        self.layout = {"obs": obs, "actions": actions, "rewards": rewards, "extras": extra_layout}
        return self.layout

    cdef EpisodeMeta _meta_of(self, EpisodeCore episode, object extras, int32_t slot):
        cdef EpisodeMeta meta = EpisodeMeta(
            episode.agent_id, episode.module_id, episode.multi_agent_episode_id,
            episode._observation_space, episode._action_space, tuple(extras),
            copy.deepcopy(episode.custom_data_) if episode.custom_data_ else None,
            type(episode._extras) is not dict)
        cdef int32_t prev = self.eps[slot].prev
        if prev >= 0 and meta.same_as(self.meta[prev]):
            return self.meta[prev]
        return meta

    cdef int _check_joins(self, int32_t slot, BufferCore obs) except -1:
        # RLlib's concat_episode asserts that the chunk's first observation
        # equals the stored last one (numpy's ==: NaN differs).
        cdef list cols = buffer_leaves(obs)
        cdef list leaves = _leaf_list(self.layout["obs"])
        cdef Py_ssize_t k, leaf, pos = obs._lookback
        cdef Column col
        for k in range(len(cols)):
            col = cols[k]
            leaf = leaves[k]
            if self.row_bytes[leaf]:
                same = np.array_equal(self._final_row(slot, leaf),
                                      col.rows(pos, pos + 1)[0]) if col.finalized else \
                    np.array_equal(self._final_row(slot, leaf), np.asarray(col.item(pos)))
            else:
                same = np.all(np.asarray(self.final_objects[leaf][slot] == col.item(pos)))
            if not same:
                raise AssertionError("the chunk's first observation is not the stored "
                                     "episode's last one")
        return 0

    cdef int _write_steps(self, int32_t slot, EpisodeCore episode, object extras, object layout,
                          Py_ssize_t lookback, Py_ssize_t first_ts, Py_ssize_t n,
                          Num weight) except -1:
        # Rows for the steps first_ts .. (lookback rows first, for a new
        # episode), then the final observation and infos.
        cdef Py_ssize_t done = 0, total = lookback + n if first_ts < 0 else n, count, k
        cdef Py_ssize_t ts
        cdef Block block
        cdef int64_t run, block_seq
        cdef int64_t* leaves
        cdef Ep* ep
        cdef list tracks = self._source_tracks(episode, extras, layout)
        cdef Py_ssize_t origin = max(first_ts, 0)     # the chunk's step 0, as stored
        while done < total:
            ts = first_ts + done
            # A lookback run ends at step 0.
            count = total - done if ts >= 0 else min(total - done, -ts)
            block = self.blocks.tail(count)
            count = min(count, block.capacity - block.size)
            block_seq = self.blocks.last()
            for source in tracks:
                self._copy_rows(block, block.size, source, ts - origin, count)
            self._copy_infos(block, block.size, episode.infos, ts - origin, count)
            run = self.runs.push(block_seq, <int32_t>block.size, <int32_t>count, slot,
                                 <int32_t>ts)
            if self.priorities is not None and ts >= 0 and not self.restoring:
                leaves = <int64_t*>PyMem_Malloc(count * sizeof(int64_t))
                if leaves == NULL:
                    raise MemoryError()
                try:
                    for k in range(count):
                        leaves[k] = self.priorities.take_leaf(weight, (run << 20) | k)
                        block.leaf_of_row[block.size + k] = <int32_t>leaves[k]
                    self.priorities.propagate(leaves, count)
                finally:
                    PyMem_Free(leaves)
            elif self.priorities is not None:
                # (A restore sets the leaves once the rows are in.)
                for k in range(count):
                    block.leaf_of_row[block.size + k] = -1
            block.size += count
            self._append_run(slot, run)
            done += count
        self._write_final(slot, episode, layout, n)
        return 0

    cdef list _source_tracks(self, EpisodeCore episode, object extras, object layout):
        # (store leaves, the episode's Columns, its lookback) per track with data.
        cdef list tracks = []
        for name, buf in (("obs", episode.observations), ("actions", episode.actions),
                          ("rewards", episode.rewards)):
            if layout[name] is not None and len(buf):
                tracks.append((_leaf_list(layout[name]), buffer_leaves(buf),
                               (<BufferCore>buf)._lookback))
        for key, buf in extras.items():
            if len(buf):
                tracks.append((_leaf_list(layout["extras"][key]), buffer_leaves(buf),
                               (<BufferCore>buf)._lookback))
        return tracks

    cdef int _copy_rows(self, Block block, Py_ssize_t row, tuple source, Py_ssize_t ts,
                        Py_ssize_t count) except -1:
        # The source's items for its steps ts .. ts + count - 1 (counted from
        # its step 0) into block rows.
        cdef list leaves = source[0], cols = source[1]
        cdef Py_ssize_t lookback = source[2], k, i, leaf
        cdef Column col
        cdef FramePool pool
        for k in range(len(cols)):
            col = cols[k]
            leaf = leaves[k]
            self.blocks.ensure_leaf(block, leaf)
            pool = self.pools[leaf]
            if pool is not None:
                for i in range(count):
                    pool.write_row(<int64_t*>(<Column>block.cols[leaf]).row_ptr(row + i, 1),
                                   col.row_ptr(lookback + ts + i, 1))
            elif self.row_bytes[leaf]:
                memcpy((<Column>block.cols[leaf]).row_ptr(row, count),
                       col.row_ptr(lookback + ts, count), count * self.row_bytes[leaf])
            else:
                items = block.cols[leaf]
                for i in range(count):
                    item = copy.deepcopy(col.item(lookback + ts + i))
                    if row + i < len(items):
                        items[row + i] = item
                    else:
                        items.append(item)
        return 0

    cdef int _copy_infos(self, Block block, Py_ssize_t row, BufferCore infos, Py_ssize_t ts,
                         Py_ssize_t count) except -1:
        cdef Py_ssize_t i
        cdef Column col = infos.flat()
        if col is not None and col.kind == KIND_EMPTY_DICT:
            return 0
        for i in range(count):
            item = infos.item_at(infos._lookback + ts + i)
            if item or type(item) is not dict:
                block.infos[row + i] = copy.deepcopy(item)
        return 0

    cdef int _write_final(self, int32_t slot, EpisodeCore episode, object layout,
                          Py_ssize_t n) except -1:
        # The observation and infos after the chunk's last step (its step n).
        cdef BufferCore obs = episode.observations, infos = episode.infos
        cdef list cols = buffer_leaves(obs)
        cdef list leaves = _leaf_list(layout["obs"])
        cdef Py_ssize_t k, leaf, pos = obs._lookback + n
        cdef Column col
        for k in range(len(cols)):
            col = cols[k]
            leaf = leaves[k]
            if self.pools[leaf] is not None:
                (<FramePool>self.pools[leaf]).write_row(
                    <int64_t*>(<Column>self.final[leaf]).row_ptr(slot, 1), col.row_ptr(pos, 1))
            elif self.row_bytes[leaf]:
                memcpy((<Column>self.final[leaf]).row_ptr(slot, 1), col.row_ptr(pos, 1),
                       self.row_bytes[leaf])
            else:
                self.final_objects[leaf][slot] = copy.deepcopy(col.item(pos))
        item = infos.item_at(infos._lookback + n)
        if item or type(item) is not dict:
            self.final_infos[slot] = copy.deepcopy(item)
        else:
            self.final_infos.pop(slot, None)
        return 0

    # -- a block of many episodes' rows --------------------------------------------------

    def add_block(self, EpisodeCore first, dict tracks, dict infos, Py_ssize_t nrows,
                  object rows, object lookbacks, object lengths, object t_started,
                  object terminated, object truncated, object start_times,
                  object last_step_times, list ids, list metas):
        """Stores many new episodes whose rows are already laid out in one
        block, without an episode object each: a dataset's step file. The
        block's rows are adopted as they are (read-only arrays stay where
        they are: a memory-mapped file's pages are read in place).

        `tracks` maps ("obs", None), ("actions", None), ("rewards", None)
        and ("extras", key) to the track's leaves in dm-tree order: an
        ndarray of `nrows` rows (numbers) or a list of `nrows` items. Episode
        i has `lookbacks[i]` rows before its step 0 from block row `rows[i]`
        on, then `lengths[i]` steps, then its last observation's row; it is
        stored under `ids[i]` with `metas[i]` (an EpisodeMeta). `infos` maps
        block rows to their infos (the empty ones are left out). `first` is
        an episode of the block's layout (the first one, made the usual
        way): the store's layout is checked (ValueError) or set from it
        before anything is stored. Uniform stores only (TypeError)."""
        cdef Py_ssize_t n = len(ids), i, k, leaf, row, lb, length, final_row
        cdef int64_t[::1] rows_v, lengths_v, started_v
        cdef int32_t[::1] lookbacks_v
        cdef unsigned char[::1] terminated_v, truncated_v
        cdef double[::1] start_v, last_v
        cdef Block block
        cdef int64_t block_seq, run
        cdef int32_t slot
        cdef Ep* ep
        cdef Column col
        cdef list obs_leaves
        if self.priorities is not None:
            raise TypeError("add_block() stores into a uniform store; a prioritized one "
                            "takes its episodes one by one")
        rows_v = np.ascontiguousarray(rows, np.int64)
        lookbacks_v = np.ascontiguousarray(lookbacks, np.int32)
        lengths_v = np.ascontiguousarray(lengths, np.int64)
        started_v = np.ascontiguousarray(t_started, np.int64)
        terminated_v = np.ascontiguousarray(terminated, np.uint8)
        truncated_v = np.ascontiguousarray(truncated, np.uint8)
        start_v = np.ascontiguousarray(start_times, np.float64)
        last_v = np.ascontiguousarray(last_step_times, np.float64)
        if not (len(rows_v) == len(lookbacks_v) == len(lengths_v) == len(started_v)
                == len(terminated_v) == len(truncated_v) == len(start_v) == len(last_v)
                == len(metas) == n):
            raise ValueError("add_block() takes one value per episode in each argument")
        if nrows < 0 or nrows > INT32_MAX:
            raise ValueError(f"a block of {nrows} rows")
        # Checks (nothing changes before they pass): each episode's rows in
        # the block and its key new, the layout, the block's leaves.
        if len(set(ids)) != n:
            raise ValueError("an episode id is in the block twice")
        for i in range(n):
            lb, length, row = lookbacks_v[i], lengths_v[i], rows_v[i]
            if lb < 0 or length < 0 or row < 0 or row + lb + length >= nrows:
                raise ValueError(f"episode {i}'s rows are not in the block of {nrows}")
            if self.table.find(ids[i], self.keys) >= 0:
                raise ValueError(f"episode {ids[i]!r} is stored already")
            if type(metas[i]) is not EpisodeMeta:
                raise TypeError("metas are EpisodeMeta objects")
        # The layout (set from `first` in an empty store), then the rows.
        self.check(first, {})
        extras = own_extras(first)
        layout = self._checked_layout(first, extras, True)
        store_leaves = {}
        for name in ("obs", "actions", "rewards"):
            if layout[name] is not None:
                store_leaves[(name, None)] = _leaf_list(layout[name])
        for key, structure in layout["extras"].items():
            store_leaves[("extras", key)] = _leaf_list(structure)
        if set(tracks) != set(store_leaves):
            raise ValueError(f"the block's tracks {sorted(map(str, tracks))} are not the "
                             f"store's {sorted(map(str, store_leaves))}")
        cols = [None] * self.nleaves
        for track, given in tracks.items():
            leaves = store_leaves[track]
            if len(given) != len(leaves):
                raise ValueError(f"{len(given)} leaves for the store's {len(leaves)} of {track}")
            for leaf, data in zip(leaves, given):
                if self.row_bytes[leaf]:
                    arr = np.asarray(data)
                    if (arr.dtype != self.dtypes[leaf] or arr.shape[1:] != self.shapes[leaf]
                            or len(arr) != nrows):
                        raise ValueError(f"the block's rows of {track} ({arr.dtype}, "
                                         f"{arr.shape}) do not match the store's "
                                         f"({self.dtypes[leaf]}, rows of {self.shapes[leaf]})")
                    cols[leaf] = Column.from_array(arr)
                else:
                    if type(data) is not list or len(data) != nrows:
                        raise ValueError(f"the block's items of {track} are not a list of "
                                         f"{nrows}")
                    cols[leaf] = data
        # Changes. A frame-stacked leaf's rows go to its frames, each
        # episode's rows in turn (as add() would write them).
        for leaf in range(self.nleaves):
            if self.pools[leaf] is not None:
                cols[leaf] = self._block_frames(<FramePool>self.pools[leaf], cols[leaf], nrows,
                                                rows_v, lookbacks_v, lengths_v)
        block = Block.__new__(Block)
        block.cols = cols
        block.infos = {}
        block.size = block.capacity = nrows
        self.blocks.append(block)
        block_seq = self.blocks.last()
        obs_leaves = store_leaves[("obs", None)]
        finalized = first.observations.is_finalized()
        for i in range(n):
            lb, length, row = lookbacks_v[i], lengths_v[i], rows_v[i]
            slot = self._new_slot(ids[i], ids[i], started_v[i], lb, length, finalized,
                                  start_v[i], last_v[i])
            ep = &self.eps[slot]
            ep.terminated = terminated_v[i] != 0
            ep.truncated = truncated_v[i] != 0
            self.meta[slot] = metas[i]
            # Its runs: the lookback rows (ts < 0), then its steps.
            for ts, count in ((-lb, lb), (0, length)):
                if count:
                    self._append_run(slot, self.runs.push(
                        block_seq, <int32_t>(row + lb + ts), <int32_t>count, slot,
                        <int32_t>ts))
            for r in range(row, row + lb + length):
                item = infos.get(r)
                if item is not None:
                    block.infos[r] = item
            # Its last observation and infos.
            final_row = row + lb + length
            for leaf in obs_leaves:
                if self.row_bytes[leaf]:
                    memcpy((<Column>self.final[leaf]).row_ptr(slot, 1),
                           (<Column>cols[leaf]).row_ptr(final_row, 1), self.blocks.row_bytes[leaf])
                else:
                    self.final_objects[leaf][slot] = cols[leaf][final_row]
            item = infos.get(final_row)
            if item is not None:
                self.final_infos[slot] = item
            else:
                self.final_infos.pop(slot, None)
        return None

    cdef Column _block_frames(self, FramePool pool, Column rows, Py_ssize_t nrows,
                              int64_t[::1] starts, int32_t[::1] lookbacks,
                              int64_t[::1] lengths):
        # add_block()'s rows of a frame-stacked leaf as the numbers of their
        # frames: each episode's rows (lookback, steps, last observation)
        # written in turn, the first following no row.
        cdef cnp.ndarray refs = np.zeros((nrows, self.frame_stack), np.int64)
        cdef int64_t* rp = <int64_t*>array_bytes(refs, nrows * self.frame_stack * 8)
        cdef Py_ssize_t i, r
        for i in range(len(starts)):
            pool.has_last = False
            for r in range(starts[i], starts[i] + lookbacks[i] + lengths[i] + 1):
                pool.write_row(rp + r * self.frame_stack, rows.row_ptr(r, 1))
        return Column.from_array(refs)

    # -- restoring ------------------------------------------------------------------

    def restore(self, list episodes, list indices, int64_t evicted, weights=None, keys=None):
        """Fills this new store from RLlib's checkpoint: the stored episodes
        (ours) oldest first, the sampleable steps in their order (`_indices`:
        (episode index, step[, tree leaf])), the evicted count, and with
        priorities `weights` = (sum tree values, min tree values, free
        nodes, max_idx); `keys`, what each episode is known by (its id by
        default). ValueError for a state that is not a buffer's."""
        cdef Py_ssize_t n_eps = len(episodes), e, started = 0
        cdef list lengths = [len(x) for x in episodes], groups = [], leaves = []
        cdef list seen = [0] * n_eps
        cdef int64_t seq
        cdef Run* r
        cdef Block block
        cdef Py_ssize_t k, i = 0
        if self.num_episodes or self.num_evicted or self.runs.tail:
            raise RuntimeError("restore() fills a new store")
        if evicted < 0:
            raise ValueError("_num_episodes_evicted must be >= 0")
        width = 3 if self.priorities is not None else 2
        for entry in indices:
            if len(entry) != width:
                raise ValueError(f"_indices entries must have {width} fields, not {entry!r}")
            e = entry[0] - evicted
            ts = entry[1]
            if not 0 <= e < n_eps or ts != seen[e]:
                raise ValueError(f"_indices entry {entry!r} is not the next step of a stored "
                                 f"episode")
            seen[e] += 1
            if width == 3:
                leaves.append(entry[2])
            if groups and groups[len(groups) - 1][0] == e:
                groups[len(groups) - 1][2] += 1
            else:
                groups.append([e, ts, 1])
        if seen != lengths:
            raise ValueError("_indices must list every step of the stored episodes")
        if keys is None:
            keys = [x.id_ for x in episodes]
        if len(keys) != n_eps or len(set(keys)) != n_eps:
            raise ValueError("the stored episodes' ids must be distinct")
        self.num_evicted = evicted
        self.restoring = True
        try:
            for e, first, count in groups:
                while started <= e:
                    if started < e and lengths[started]:
                        raise ValueError("_indices must reach the episodes in their order")
                    whole = episodes[started]
                    self.add(whole.slice(slice(0, first + count)) if started == e else whole,
                             key=keys[started])
                    started += 1
                if first:
                    self.add(episodes[e].slice(slice(first, first + count)), key=keys[e])
            for e in range(started, n_eps):
                if lengths[e]:
                    raise ValueError("_indices must list every step of the stored episodes")
                self.add(episodes[e], key=keys[e])
        finally:
            self.restoring = False
        for e in range(n_eps):
            self._restore_fields(self.table.find(keys[e], self.keys), episodes[e])
        if self.priorities is None:
            return
        sum_values, min_values, free_nodes, max_idx = weights
        # (The trees' state may be of trees that doubled: restore() checks it.)
        tree_size = len(sum_values) // 2 if isinstance(sum_values, list) else 0
        pairs = []
        for seq in range(self.runs.head, self.runs.tail):
            r = self.runs.at(seq)
            if r.ep < 0 or r.ts < 0:
                continue
            block = self.blocks.at(r.block)
            for k in range(r.n):
                leaf = leaves[i]
                i += 1
                if type(leaf) is not int or not 0 <= leaf < min(tree_size, 1 << 31):
                    raise ValueError(f"tree leaf {leaf!r} is out of range")
                block.leaf_of_row[r.row + k] = <int32_t>leaf
                pairs.append((leaf, (seq << 20) | k))
        self.priorities.restore(sum_values, min_values, free_nodes, max_idx, pairs)

    cdef int _restore_fields(self, int32_t slot, EpisodeCore episode) except -1:
        # What the chunks (slices) that rebuilt an episode do not carry.
        self.eps[slot].start_time = episode.start_time
        self.eps[slot].last_step_time = episode.last_step_time
        self.meta[slot] = self._meta_of(episode, own_extras(episode), slot)
        return 0

    # -- evicting ---------------------------------------------------------------------

    def oldest(self, Py_ssize_t i=0):
        """The slot of the i-th oldest stored episode."""
        cdef int32_t slot = self.first_slot
        if not 0 <= i < self.num_episodes:
            raise IndexError("no such stored episode")
        while i:
            slot = self.eps[slot].next
            i -= 1
        return slot

    def evict_oldest(self, Py_ssize_t count):
        """Evicts the `count` oldest episodes. Returns their (id, steps)."""
        if not 0 <= count <= self.num_episodes:
            raise IndexError(f"cannot evict {count} of {self.num_episodes} episodes")
        return self.evict([self.oldest(i) for i in range(count)])

    def evict(self, slots):
        """Evicts the episodes in `slots` (with priorities, their tree leaves
        go back to the free queue in the order of their steps, as RLlib's
        scan of its index list returns them). Returns their (id, steps)."""
        cdef list out = [], checked = []
        for slot in slots:
            if not 0 <= slot < self.ep_cap or not self.eps[<Py_ssize_t>slot].live \
                    or slot in checked:
                raise IndexError(f"no stored episode in slot {slot} to evict")
            checked.append(slot)
            out.append((self.ids[slot], self.eps[<Py_ssize_t>slot].length))
        self._evict_slots(checked)
        return out

    cdef int _evict_slots(self, list slots) except -1:
        cdef int32_t slot
        cdef int64_t seq
        cdef Run* run
        cdef Block block
        cdef Py_ssize_t k
        cdef list seqs
        if self.priorities is not None:
            seqs = []
            for slot in slots:
                seq = self.eps[slot].first_run
                while seq >= 0:
                    if self.runs.at(seq).ts >= 0:
                        seqs.append(seq)
                    seq = self.runs.at(seq).next
            seqs.sort()
            released = []
            for seq in seqs:
                run = self.runs.at(seq)
                block = self.blocks.at(run.block)
                for k in range(run.n):
                    self.priorities.release_leaf(block.leaf_of_row[run.row + k])
                    released.append(block.leaf_of_row[run.row + k])
            self._propagate(released)
        for slot in slots:
            seq = self.eps[slot].first_run
            while seq >= 0:
                run = self.runs.at(seq)
                if run.ts >= 0:
                    self.runs.add_live(seq, -run.n)
                run.ep = -1
                seq = run.next
            self.eps[slot].live = 0
            self.table.remove(self.keys[slot], self.keys)
            self.ids[slot] = None
            self.keys[slot] = None
            self.meta[slot] = None
            self.final_infos.pop(slot, None)
            for objects in self.final_objects:
                if objects is not None:
                    objects[slot] = None
            self.free_slots[self.n_free] = slot
            self.n_free += 1
            if self.eps[slot].prev >= 0:
                self.eps[self.eps[slot].prev].next = self.eps[slot].next
            else:
                self.first_slot = self.eps[slot].next
            if self.eps[slot].next >= 0:
                self.eps[self.eps[slot].next].prev = self.eps[slot].prev
            else:
                self.last_slot = self.eps[slot].prev
            self.num_episodes -= 1
            self.num_evicted += 1
        # Dead runs at the front go, then the blocks nothing refers to.
        self.runs.drop_dead()
        self.blocks.drop_before(self.runs.at(self.runs.head).block
                                if self.runs.head < self.runs.tail else self.blocks.last())
        if self.frame_stack:
            self._release_frames()
        return 0

    # -- reading -----------------------------------------------------------------------

    cdef int _propagate(self, list leaves) except -1:
        cdef Py_ssize_t i, n = len(leaves)
        cdef int64_t* buf = <int64_t*>PyMem_Malloc(max(1, n) * sizeof(int64_t))
        if buf == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                buf[i] = leaves[i]
            self.priorities.propagate(buf, n)
        finally:
            PyMem_Free(buf)
        return 0

    cdef int _locate(self, int32_t slot, int64_t ts, int64_t* run, int32_t* off) except -1:
        """Where stored step `ts` of the episode in `slot` is: (run, offset),
        or run = -1 - slot for its final row (ts == length)."""
        cdef Ep* ep = &self.eps[slot]
        cdef int64_t seq = ep.first_run
        cdef Run* r
        if ts == ep.length:
            run[0] = -1 - slot
            off[0] = 0
            return 0
        if ts < -ep.lookback or ts > ep.length:
            raise IndexError(f"step {ts} outside the stored episode")
        while seq >= 0:
            r = self.runs.at(seq)
            if r.ts <= ts < r.ts + r.n:
                run[0] = seq
                off[0] = <int32_t>(ts - r.ts)
                return 0
            seq = r.next
        raise SystemError("episode core: a stored step has no run")

    cdef int _advance(self, int64_t* run, int32_t* off, int64_t steps) except -1:
        """(run, off) moved `steps` steps on along its episode (to the final
        row past the last step)."""
        cdef Run* r
        cdef int64_t left = steps
        while left > 0:
            if run[0] < 0:
                raise IndexError("past the stored episode's end")
            r = self.runs.at(run[0])
            if off[0] + left < r.n:
                off[0] += <int32_t>left
                return 0
            left -= r.n - off[0]
            if r.next >= 0:
                run[0] = r.next
                off[0] = 0
            else:
                if left:
                    raise IndexError("past the stored episode's end")
                run[0] = -1 - r.ep
                off[0] = 0
        return 0

    cdef char* _row_ptr(self, int64_t run, int32_t off, Py_ssize_t leaf) except NULL:
        cdef Run* r
        cdef char* base
        if run < 0:
            if self.final[leaf] is None:
                raise ValueError(f"leaf {leaf} has no rows after an episode's last step "
                                 f"(observation leaves do)")
            return (<Column>self.final[leaf]).row_ptr(-1 - run, 1)
        r = self.runs.at(run)
        if CHECKED and not 0 <= r.block - self.blocks.first < len(self.blocks.items):
            raise SystemError("episode core: a run outside the blocks")
        base = self.blocks.row_tables[r.block - self.blocks.first][leaf]
        if base == NULL:
            raise SystemError("episode core: a leaf without storage in its block")
        return base + (r.row + off) * self.blocks.row_bytes[leaf]

    cdef int _read_row(self, char* dst, int64_t run, int32_t off, Py_ssize_t leaf) except -1:
        # A numeric leaf's row into `dst` (row_bytes), rebuilt from its
        # frames where the leaf is frame-stacked.
        cdef object pool = self.pools[leaf]
        if pool is None:
            copy_row(dst, self._row_ptr(run, off, leaf), self.row_bytes[leaf])
        else:
            (<FramePool>pool).assemble(dst, <int64_t*>self._row_ptr(run, off, leaf))
        return 0

    cdef object _row_object(self, int64_t run, int32_t off, Py_ssize_t leaf):
        cdef Run* r
        if run < 0:
            return self.final_objects[leaf][-1 - run]
        r = self.runs.at(run)
        return self.blocks.at(r.block).cols[leaf][r.row + off]

    cdef object _infos_at(self, int64_t run, int32_t off):
        cdef Run* r
        if run < 0:
            return self.final_infos.get(-1 - run, {})
        r = self.runs.at(run)
        return self.blocks.at(r.block).infos.get(r.row + off, {})

    def leaves_of(self, keys):
        """The tree leaf of each step's key as native_fields() hands them
        out (`indices`); -1 for a step no longer stored, or a key this store
        did not hand out."""
        cdef Py_ssize_t i, n = len(keys)
        cdef int64_t leaf
        out = [-1] * n
        if self.priorities is None:
            raise ValueError("a uniform store has no priority tree leaves")
        for i in range(n):
            leaf = self._leaf_of(keys[i], True)
            if leaf >= 0:
                out[i] = leaf
        return out

    cdef int64_t _leaf_of(self, int64_t key, bint public) except -3:
        # The tree leaf of a step's key (`public`: tagged, as native_fields()
        # hands keys out; else run << 20 | offset): -1 for a step evicted
        # since, -2 for a key this store never handed out.
        cdef int64_t run, leaf
        cdef int32_t off
        cdef Run* r
        if public:
            if key < 0 or (key >> KEY_TAG_SHIFT) != self.key_tag:
                return -2
            key &= KEY_STEP_MASK
        if key < 0:
            return -2
        run = key >> 20
        off = <int32_t>(key & KEY_OFFSET_MASK)
        if run >= self.runs.tail:
            return -2
        if run < self.runs.head:
            return -1
        r = self.runs.at(run)
        if r.ep < 0:
            return -1
        if r.ts < 0 or off >= r.n:
            return -2
        leaf = self.blocks.at(r.block).leaf_of_row[r.row + off]
        return leaf if self.priorities.key_of(leaf) == key else -1

    def set_priorities(self, keys, values, alpha, max_priority, bint public=True):
        """update_priorities() in one pass: the tree leaf of each step
        `keys` names = max(p, 1e-12) ** alpha, in RLlib's numbers (float32
        priorities in float32, float64 ones and Python numbers in float64),
        skipping steps evicted since they were handed out. `keys`: int64
        keys (`public`: as native_fields() hands them out); `values`: a 1-d
        float32 or float64 array, or a list of Python or numpy float32/
        float64 numbers. All of it is checked before a leaf changes
        (ValueError for a key this store never handed out or a priority that
        is negative, NaN or infinite, TypeError for a number of another
        type). Returns RLlib's running max(max_priority, max(p, 1e-12)): a
        number of the priorities' type, or `max_priority` itself where none
        is larger."""
        cdef PriorityTrees trees = self.priorities
        cdef cnp.ndarray key_array = np.ascontiguousarray(keys, dtype=np.int64)
        cdef Py_ssize_t i, n = key_array.shape[0] if key_array.ndim == 1 else -1, m = 0
        cdef const int64_t* kp
        cdef const float* fp = NULL
        cdef const double* dp = NULL
        cdef cnp.ndarray value_array = None
        cdef Num a = to_num(alpha), top = to_num(max_priority), floor = num(1e-12, TAG_FLOAT)
        cdef Num p
        cdef bint raised = False
        cdef int64_t leaf
        cdef int64_t* leaves
        cdef Num* nums
        if trees is None:
            raise ValueError("a uniform store keeps no priorities")
        if n < 0:
            raise ValueError("keys must be a 1-d sequence of ints")
        if isinstance(values, cnp.ndarray):
            value_array = <cnp.ndarray>values
            if value_array.ndim != 1 or value_array.shape[0] != n or not (
                    value_array.dtype == F32_DTYPE or value_array.dtype == F64_DTYPE):
                raise ValueError("values must be a 1-d float32 or float64 array of one "
                                 "priority per key")
            value_array = np.ascontiguousarray(value_array)
            if value_array.dtype == F32_DTYPE:
                fp = <const float*>array_bytes(value_array, n * sizeof(float))
            else:
                dp = <const double*>array_bytes(value_array, n * sizeof(double))
        elif len(values) != n:
            raise ValueError(f"{len(values)} priorities for {n} keys")
        kp = <const int64_t*>array_bytes(key_array, n * sizeof(int64_t))
        leaves = <int64_t*>PyMem_Malloc(max(1, n) * sizeof(int64_t))
        nums = <Num*>PyMem_Malloc(max(1, n) * sizeof(Num))
        try:
            if leaves == NULL or nums == NULL:
                raise MemoryError()
            for i in range(n):
                leaf = self._leaf_of(kp[i], public)
                if leaf == -2:
                    raise ValueError(
                        f"index {kp[i]} (at {i}) names no step this buffer handed out "
                        f"(indices come from its own sample_batch(), since its last "
                        f"set_state())")
                if fp != NULL:
                    p = num(fp[i], TAG_F32)
                elif dp != NULL:
                    p = num(dp[i], TAG_F64)
                else:
                    p = to_num(values[i])
                if not 0.0 <= p.v < INFINITY:
                    raise ValueError(f"priorities must be finite and >= 0, not {p.v} (at {i})")
                # RLlib: priority = max(priority, 1e-12); its running max
                # takes a priority that is larger (the first of equal ones).
                if greater(floor, p):
                    p = floor
                if greater(p, top):
                    top = p
                    raised = True
                if leaf >= 0:
                    leaves[m] = leaf
                    nums[m] = power(p, a)
                    m += 1
            for i in range(m):
                trees._set_raw(leaves[i], nums[i], nums[i])
            trees.propagate(leaves, m)
        finally:
            PyMem_Free(leaves)
            PyMem_Free(nums)
        return from_num(top) if raised else max_priority

    # -- one step per env, without episode objects ----------------------------------------

    def add_steps(self, list keys, list ids, object t_started, list obs, list next_obs,
                  list actions, list rewards, object terminated, object truncated,
                  object infos, object envs, weight=None, object first_infos=None):
        """Stores step e of each env e in `envs` as add() of the one-step
        chunk [obs[e], next_obs[e]] (numpy'ized, no lookback, no extra model
        outputs) would: joined to the episode stored under keys[e], which
        must end at step t_started[e], or as a new episode ids[e] from
        t_started[e] where none is stored. obs, next_obs, actions and
        rewards are one C-contiguous array per leaf of the stored tracks,
        with the leaf's dtype and shape (n, *row shape); terminated and
        truncated n bools; infos None or n infos dicts (each step's last
        infos); first_infos None or n dicts, the infos of each step's obs
        where it starts a new episode (a stored one's are its last infos);
        with priorities each step's tree leaf takes `weight`.
        Everything is checked before anything changes (TypeError,
        ValueError). Returns the number of new episodes."""
        cdef Py_ssize_t n = len(keys), i, k, leaf, row, count
        cdef int32_t slot
        cdef int64_t e, run, tree_leaf
        cdef Ep* ep
        cdef Block block
        cdef cnp.ndarray arr, starts, ends_term, ends_trunc, order
        cdef list parts = [], sources = []
        cdef int64_t* t0
        cdef int64_t* env_of
        cdef unsigned char* term
        cdef unsigned char* trunc
        cdef Num w = num(0.0, TAG_FLOAT)
        cdef int new = 0
        cdef EpisodeMeta meta = EpisodeMeta(None, None, None, None, None, (), None, False)
        layout = self.layout
        if layout["obs"] is None or layout["actions"] is None or layout["rewards"] is None:
            raise ValueError("add_steps() stores steps of laid-out tracks: add() an episode first")
        if self.frame_stack:
            # (It writes whole observation rows; stacked rows are frames.)
            raise ValueError("add_steps() writes whole observation rows: a frame-stacked "
                             "store takes its steps through add()")
        obs_leaves = _leaf_list(layout["obs"])
        for name, leaves, arrays in (("obs", obs_leaves, obs), ("next_obs", obs_leaves, next_obs),
                                     ("actions", _leaf_list(layout["actions"]), actions),
                                     ("rewards", _leaf_list(layout["rewards"]), rewards)):
            if len(arrays) != len(leaves):
                raise ValueError(f"{name}: {len(arrays)} arrays for {len(leaves)} stored leaves")
            for leaf, item in zip(leaves, arrays):
                if type(item) is not np.ndarray:
                    raise TypeError(f"{name}: arrays, not {type(item).__name__}")
                arr = item
                if not self.row_bytes[leaf]:
                    raise TypeError(f"{name}: the stored leaf {leaf} keeps Python objects")
                if arr.dtype != self.dtypes[leaf] or \
                        (<object>arr).shape != (n,) + tuple(self.shapes[leaf]) or \
                        not cnp.PyArray_IS_C_CONTIGUOUS(arr):
                    raise ValueError(f"{name}: leaf {leaf} must be a C-contiguous "
                                     f"{self.dtypes[leaf]} array of shape "
                                     f"{(n,) + tuple(self.shapes[leaf])}, not {arr.dtype} "
                                     f"{(<object>arr).shape}")
                parts.append((name, leaf, arr))
        if len(ids) != n:
            raise ValueError(f"{len(ids)} ids for {n} keys")
        starts = _flat_of(t_started, np.int64, n, "t_started")
        ends_term = _flat_of(terminated, np.bool_, n, "terminated")
        ends_trunc = _flat_of(truncated, np.bool_, n, "truncated")
        order = _flat_of(envs, np.int64, -1, "envs")
        count = cnp.PyArray_DIM(order, 0)
        t0 = <int64_t*>array_bytes(starts, n * 8)
        term = <unsigned char*>array_bytes(ends_term, n)
        trunc = <unsigned char*>array_bytes(ends_trunc, n)
        env_of = <int64_t*>array_bytes(order, count * 8)
        if infos is not None and (type(infos) is not list or len(infos) != n):
            raise TypeError(f"infos must be None or a list of {n} dicts")
        if first_infos is not None and (type(first_infos) is not list or len(first_infos) != n
                                        or not all(type(i) is dict for i in first_infos)):
            raise TypeError(f"first_infos must be None or a list of {n} dicts")
        seen = set()
        for i in range(count):
            e = env_of[i]
            if not 0 <= e < n:
                raise ValueError(f"env {e} of {n}")
            if e in seen:
                raise ValueError(f"env {e} twice in one add_steps()")
            seen.add(e)
            slot = self.table.find(keys[e], self.keys)
            if slot >= 0:
                ep = &self.eps[slot]
                if ep.terminated or ep.truncated:
                    raise AssertionError(f"episode {ids[e]!r} is done; no step can follow it")
                if ep.t_started + ep.length != t0[e]:
                    raise AssertionError(f"the step is t={t0[e]}, the stored episode "
                                         f"{ids[e]!r} ends at t={ep.t_started + ep.length}")
                if (<EpisodeMeta>self.meta[slot]).extra_keys:
                    raise AssertionError(f"the step lacks the extra model outputs of the "
                                         f"stored episode {ids[e]!r}")
        if self.priorities is not None and not self.restoring:
            w = to_num(weight)
        # Changes.
        for i in range(count):
            e = env_of[i]
            slot = self.table.find(keys[e], self.keys)
            if slot < 0:
                slot = self._new_slot(ids[e], keys[e], t0[e], 0, 0, True, NAN, NAN)
                prev = self.eps[slot].prev
                self.meta[slot] = self.meta[prev] if prev >= 0 and \
                    meta.same_as(<EpisodeMeta>self.meta[prev]) else meta
                new += 1
                if first_infos is not None and first_infos[e]:
                    self.final_infos[slot] = copy.deepcopy(first_infos[e])
            block = self.blocks.tail(1)
            row = block.size
            for name, leaf, arr in parts:
                if name == "next_obs":
                    memcpy((<Column>self.final[leaf]).row_ptr(slot, 1),
                           array_bytes(arr, n * self.row_bytes[leaf]) + e * self.row_bytes[leaf],
                           self.row_bytes[leaf])
                else:
                    self.blocks.ensure_leaf(block, leaf)
                    memcpy((<Column>block.cols[leaf]).row_ptr(row, 1),
                           array_bytes(arr, n * self.row_bytes[leaf]) + e * self.row_bytes[leaf],
                           self.row_bytes[leaf])
            # The step's own infos are the stored last ones; its next ones
            # become the last.
            last = self.final_infos.pop(slot, None)
            if last is not None:
                block.infos[row] = last
            item = infos[e] if infos is not None else None
            if item is not None and (item or type(item) is not dict):
                self.final_infos[slot] = copy.deepcopy(item)
            run = self.runs.push(self.blocks.last(),
                                 <int32_t>row, 1, slot, <int32_t>self.eps[slot].length)
            if self.priorities is not None:
                if self.restoring:
                    block.leaf_of_row[row] = -1
                else:
                    tree_leaf = self.priorities.take_leaf(w, run << 20)
                    block.leaf_of_row[row] = <int32_t>tree_leaf
                    self.priorities.propagate(&tree_leaf, 1)
            block.size += 1
            self._append_run(slot, run)
            ep = &self.eps[slot]
            ep.length += 1
            if term[e]:
                ep.terminated = 1
            if trunc[e]:
                ep.truncated = 1
        return new


cdef cnp.ndarray _flat_of(object values, object dtype, Py_ssize_t n, str what):
    # add_steps()' per-env numbers: a 1-d C-contiguous array of `dtype`
    # (of n of them unless n < 0).
    cdef cnp.ndarray arr
    if type(values) is not np.ndarray:
        raise TypeError(f"{what} must be an array, not {type(values).__name__}")
    arr = values
    if arr.dtype != dtype or arr.ndim != 1 or (n >= 0 and cnp.PyArray_DIM(arr, 0) != n) \
            or not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        raise ValueError(f"{what} must be a C-contiguous {np.dtype(dtype)} array of "
                         f"{n if n >= 0 else 'any'} items, not {arr.dtype} {(<object>arr).shape}")
    return arr


cdef int check_steps(EpisodeCore episode, object extras, Py_ssize_t n) except -1:
    # Every track is read at its lookback + step: each must hold the n steps
    # (one more observation and info). An unpickled episode is not
    # validated, and its lookbacks may be anything.
    if (n < 0 or n != len(episode.actions) or n != len(episode.rewards)
            or n + 1 != len(episode.observations) or n + 1 != len(episode.infos)
            or any(len(b) != n for b in extras.values())):
        raise ValueError("the episode is not consistent (see its validate())")
    return 0


cdef int _check_rewards(BufferCore rewards) except -1:
    # What the n-step sums read (read_real): one number per step.
    cdef list cols = buffer_leaves(rewards)
    cdef Column col
    if len(cols) != 1:
        raise TypeError("rewards must be numbers, not a structure of them")
    col = cols[0]
    if col.nrows() and not (is_pod_leaf(col) and row_shape_of(col) == ()
                            and col.descr.type_num in REWARD_TYPES):
        raise TypeError(f"rewards must be float64, float32, int64, int32 or bool numbers, "
                        f"not {_describe(col)}")
    return 0


cdef tuple REWARD_TYPES = (cnp.NPY_DOUBLE, cnp.NPY_FLOAT, cnp.NPY_INT64, cnp.NPY_INT32,
                           cnp.NPY_BOOL)


cdef Column list_column(cnp.ndarray rows, unsigned char kind):
    # A list-mode Column holding `rows`, handing its items back as `kind`.
    cdef Column col = Column.from_array(rows)
    col.finalized = False
    col.kind = kind
    return col


def rows_of(Store store, Py_ssize_t slot, track, int64_t start, int64_t stop, bint numpy):
    """The storage (a Column, or a dict/tuple of Columns as the track is
    nested) of `track` ("obs", "infos", "actions", "rewards" or ("extras",
    key)) for steps start .. stop - 1 of the episode in `slot`: finalized
    Columns with `numpy`, else list-mode ones whose items come back as
    the added ones did. Step `length` is the final observation/infos."""
    cdef Ep* ep
    cdef int64_t run, count
    cdef int32_t off
    cdef Py_ssize_t i, leaf, rb
    cdef cnp.ndarray arr
    cdef char* dst
    if not 0 <= slot < store.ep_cap or not store.eps[slot].live:
        raise IndexError(f"no stored episode in slot {slot}")
    ep = &store.eps[slot]
    last = ep.length + 1 if track in ("obs", "infos") else ep.length
    # (The bounds first: stop - start of arbitrary int64s could overflow.)
    if start < -ep.lookback or stop > last or stop < start:
        raise IndexError(f"steps {start}..{stop} outside the stored episode")
    count = stop - start
    positions = []
    if count:
        store._locate(<int32_t>slot, start, &run, &off)
        for i in range(count):
            positions.append((run, off))
            if i + 1 < count:
                store._advance(&run, &off, 1)
    if track == "infos":
        return [store._infos_at(r, o) for r, o in positions]
    structure = store.layout["extras"][track[1]] if isinstance(track, tuple) \
        else store.layout[track]
    if structure is None:
        return Column.from_list([])
    columns = {}
    for leaf in _leaf_list(structure):
        rb = store.row_bytes[leaf]
        if rb == 0:
            items = [store._row_object(r, o, leaf) for r, o in positions]
            columns[leaf] = Column.from_list(items) if not numpy else \
                Column.from_array(np.array(items))
            continue
        arr = np.empty((count,) + store.shapes[leaf], store.dtypes[leaf])
        dst = array_bytes(arr, count * rb)
        for i in range(count):
            r, o = positions[i]
            store._read_row(dst + i * rb, r, o, leaf)
        columns[leaf] = Column.from_array(arr) if numpy else list_column(arr, store.kinds[leaf])
    return _replace_numbers(structure, columns)


cdef object _replace_numbers(object structure, dict columns):
    if isinstance(structure, int):
        return columns[structure]
    if isinstance(structure, dict):
        return {k: _replace_numbers(v, columns) for k, v in structure.items()}
    return tuple(_replace_numbers(v, columns) for v in structure)


def episode_fields(Store store, Py_ssize_t slot):
    """The stored episode in `slot`: (id, meta, t_started, length, lookback,
    terminated, truncated, finalized, start_time, last_step_time)."""
    cdef Ep* ep
    if not 0 <= slot < store.ep_cap or not store.eps[slot].live:
        raise IndexError(f"no stored episode in slot {slot}")
    ep = &store.eps[slot]
    return (store.ids[slot], store.meta[slot], ep.t_started, ep.length, ep.lookback,
            bool(ep.terminated), bool(ep.truncated), bool(ep.finalized),
            None if isnan(ep.start_time) else ep.start_time,
            None if isnan(ep.last_step_time) else ep.last_step_time)


def live_slots(Store store):
    """The stored episodes' slots, oldest first."""
    cdef list out = []
    cdef int32_t slot = store.first_slot
    while slot >= 0:
        out.append(slot)
        slot = store.eps[slot].next
    return out


def step_order(Store store):
    """RLlib's list of sampleable steps: (slot, index) per stored step, in
    insertion order, with each step's tree leaf where there are priorities
    (else -1)."""
    cdef int64_t seq
    cdef Run* r
    cdef Py_ssize_t k
    cdef Block block
    out = []
    for seq in range(store.runs.head, store.runs.tail):
        r = store.runs.at(seq)
        if r.ep < 0 or r.ts < 0:
            continue
        block = store.blocks.at(r.block)
        for k in range(r.n):
            out.append((r.ep, r.ts + k,
                        block.leaf_of_row[r.row + k] if store.priorities is not None else -1))
    return out


# -- sampled episodes ----------------------------------------------------------------------

from episode._buffer cimport empty_buffer
from episode._episode cimport buffer_class
from episode.spaces import base_struct
import gymnasium as gym

cdef object Box = gym.spaces.Box
cdef object Discrete = gym.spaces.Discrete


cdef Column shared_rows(cnp.ndarray arr, Py_ssize_t first, Py_ssize_t rows, unsigned char kind):
    # A list-mode Column of rows first .. first + rows - 1 of `arr` (C-contiguous,
    # rows along its first axis), reading them in place: `arr` owns the memory.
    cdef Column col = Column.__new__(Column)
    col._set_layout(<cnp.dtype>cnp.PyArray_DESCR(arr), cnp.PyArray_NDIM(arr) - 1,
                    cnp.PyArray_DIMS(arr) + 1)
    if first < 0 or rows < 0 or first + rows > cnp.PyArray_DIMS(arr)[0]:
        raise IndexError("rows outside the batch")
    col._install(arr, rows, rows)
    col.data = array_bytes(arr, (first + rows) * col.row_bytes) + first * col.row_bytes
    col.kind = kind
    return col


cdef object shared_tree(object structure, dict arrays, Py_ssize_t first, Py_ssize_t rows,
                        list kinds):
    # A track's storage for one episode: its leaves' rows in the batch arrays.
    if isinstance(structure, int):
        arr = arrays[structure]
        if type(arr) is list:
            return Column.from_list(arr[first:first + rows])
        return shared_rows(arr, first, rows, kinds[structure])
    if isinstance(structure, dict):
        return {k: shared_tree(v, arrays, first, rows, kinds) for k, v in structure.items()}
    return tuple(shared_tree(v, arrays, first, rows, kinds) for v in structure)


cdef BufferCore track_buffer(object storage, object space):
    cdef BufferCore buf = empty_buffer(buffer_class(), space, space if space is None
                                       or type(space) is Box or type(space) is Discrete
                                       else base_struct(space))
    buf.set_storage(storage)
    buf.untrack()      # a drawn batch's rows: out of the collector's sight if numbers
    return buf


cdef BufferCore empty_dicts_buffer(Py_ssize_t count):
    # InfiniteLookbackBuffer([{}] * count): a count.
    cdef BufferCore buf = empty_buffer(buffer_class(), None, None)
    cdef Column col = Column.__new__(Column)
    col.kind = KIND_EMPTY_DICT
    col.size = count
    buf.set_storage(col)
    buf.untrack()
    return buf


cdef bint _reads_rows(object holder, list leaves, dict arrays, Py_ssize_t first,
                      Py_ssize_t rows) except -1:
    # Whether a buffer holds just rows first .. first + rows - 1 of the
    # batch arrays of its leaves, read in place (as make_transitions made
    # it): a value set in place is in the arrays too; anything else (an
    # append, a value that moved a Column to a list, another buffer) shows.
    cdef BufferCore buf
    cdef Column col
    cdef Py_ssize_t k
    if not isinstance(holder, BufferCore):
        return False
    buf = holder
    if buf._lookback != 0 or buf.nleaves() != len(leaves):
        return False
    for k in range(len(leaves)):
        col = buf.leaf(k)
        arr = arrays.get(leaves[k])
        if type(arr) is not cnp.ndarray or col.items is not None or col.size != rows or \
                col.data != cnp.PyArray_BYTES(arr) + first * cnp.PyArray_STRIDES(arr)[0]:
            return False
    return True


def shares_batch(list episodes, object layout, dict obs_pairs, dict actions,
                 cnp.ndarray returns, dict extras):
    """Whether the episodes make_transitions() made of these batch arrays
    (in this order) are each still one step read in place from them: what
    the learner's fast path builds its train batch of."""
    cdef Py_ssize_t i
    cdef EpisodeCore episode
    cdef list obs_leaves = _leaf_list(layout["obs"])
    cdef list action_leaves = _leaf_list(layout["actions"])
    cdef dict reward_arrays = {0: returns}
    cdef list reward_leaves = [0]
    cdef dict extra_leaves = {key: _leaf_list(layout["extras"][key]) for key in extras}
    for i in range(len(episodes)):
        if not isinstance(episodes[i], EpisodeCore):
            return False
        episode = episodes[i]
        if episode.t - episode.t_started != 1 or type(episode._extras) is not dict:
            return False
        if not (_reads_rows(episode.observations, obs_leaves, obs_pairs, 2 * i, 2)
                and _reads_rows(episode.actions, action_leaves, actions, i, 1)
                and _reads_rows(episode.rewards, reward_leaves, reward_arrays, i, 1)):
            return False
        for key, arrays in extras.items():
            if not _reads_rows((<dict>episode._extras).get(key), extra_leaves[key], arrays, i, 1):
                return False
    return True
