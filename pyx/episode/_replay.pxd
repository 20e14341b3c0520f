# Replay storage: stored episodes' rows in blocks of Columns, their steps in
# insertion order.
cimport cython
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

from episode._blocks cimport Block, Blocks
from episode._buffer cimport BufferCore
from episode._column cimport Column
from episode._episode cimport EpisodeCore
from episode._frames cimport FramePool
from episode._keys cimport KeyTable
from episode._priority cimport Num, PriorityTrees
from episode._runs cimport Run, Runs


# A stored episode. Its steps' rows are in its runs; the observation and
# infos after its last step (its last observation) live in the store's
# `final` rows, one per slot, until a next chunk makes them a step's.
cdef struct Ep:
    int64_t first_run    # its first run (the lookback run, if it has one)
    int64_t last_run
    int64_t length       # steps, lookback excluded
    int64_t t_started
    int32_t lookback     # lookback steps stored (rows before step 0)
    unsigned char terminated
    unsigned char truncated
    unsigned char finalized   # the first chunk was numpy'ized (items come back as numpy's)
    unsigned char live
    int32_t prev         # the episode stored before it (-1: none)
    int32_t next         # the one stored after it (-1: none)
    double start_time    # NaN: None
    double last_step_time


# A tree leaf's key: run << 20 | offset; the keys sample_batch() hands out
# carry their store's tag from bit 56 (see _replay.pyx).
cdef enum:
    KEY_OFFSET_MASK = (1 << 20) - 1
    KEY_TAG_SHIFT = 56


cdef class EpisodeMeta:
    # What a stored episode keeps besides its rows.
    cdef readonly object agent_id, module_id, multi_agent_episode_id
    cdef readonly object observation_space, action_space
    cdef readonly tuple extra_keys       # its extra model outputs, in their order
    cdef public object custom_data       # a dict, or None for an empty one
    cdef readonly bint defaultdict_extras   # extra_model_outputs was a defaultdict
    cdef bint same_as(self, EpisodeMeta other)


@cython.final
cdef class Store:
    cdef readonly Py_ssize_t nleaves
    cdef list dtypes             # per leaf: numpy dtype, None for an object leaf
    cdef list shapes             # per leaf: row shape
    cdef Py_ssize_t* row_bytes   # per leaf; 0 for an object leaf
    cdef unsigned char* kinds    # per leaf: the list-mode Column kind items come back as
    cdef readonly object layout  # track name -> its leaves' numbers in its structure
    cdef readonly Py_ssize_t block_rows
    cdef readonly object storage # None: blocks in memory; else their files' folder

    cdef Blocks blocks           # the stored rows

    cdef Runs runs               # the stored steps in insertion order

    cdef Ep* eps
    cdef Py_ssize_t ep_cap
    cdef int32_t* free_slots
    cdef Py_ssize_t n_free
    cdef int32_t first_slot, last_slot   # the oldest and the newest episode (-1: none)
    cdef readonly Py_ssize_t num_episodes
    cdef readonly int64_t num_evicted
    cdef list ids                # slot -> episode id
    cdef list keys               # slot -> what the episode is found by (its id by default)
    cdef list meta               # slot -> EpisodeMeta
    cdef KeyTable table          # key -> slot (the key itself is keys[slot])

    cdef list final              # per numeric observation leaf: a Column, a row per slot
    cdef list final_objects      # per object observation leaf: a list by slot
    cdef dict final_infos        # slot -> the last infos, where not empty

    cdef readonly PriorityTrees priorities   # a tree leaf per stored step, or None
    cdef readonly int64_t key_tag  # 1..127: marks the step keys sample_batch() hands out
    cdef bint restoring          # restore() is adding: it sets the tree leaves itself

    # Frame-stacked observations (frame_stack > 0: frames per row, along
    # frame_axis, None: the one axis of that length): a FramePool per
    # stacked observation leaf (None for the others), whose rows, in the
    # blocks and in `final`, are the numbers of their frames.
    cdef readonly Py_ssize_t frame_stack
    cdef readonly object frame_axis
    cdef list pools

    cdef int _reserve_slots(self) except -1
    cdef int _grow_final(self, Py_ssize_t cap) except -1
    cdef Py_ssize_t _add_leaves(self, list cols, bint with_final) except -1
    cdef object _track_layout(self, BufferCore buf, object known, bint with_final, str what)
    cdef int32_t _new_slot(self, object id_, object key, int64_t t_started, Py_ssize_t lookback,
                           int64_t length, bint finalized, double start_time,
                           double last_step_time) except -1
    cdef int _append_run(self, int32_t slot, int64_t run) noexcept
    cdef object _checked_layout(self, EpisodeCore episode, object extras, bint is_new)
    cdef EpisodeMeta _meta_of(self, EpisodeCore episode, object extras, int32_t slot)
    cdef int _check_joins(self, int32_t slot, BufferCore obs) except -1
    cdef int _check_chunk(self, EpisodeCore episode, int64_t end_t, bint done, tuple keys,
                          object extras, Py_ssize_t n) except -1
    cdef object _description(self, object structure)
    cdef int _write_steps(self, int32_t slot, EpisodeCore episode, object extras, object layout,
                          Py_ssize_t lookback, Py_ssize_t first_ts, Py_ssize_t n,
                          Num weight) except -1
    cdef list _source_tracks(self, EpisodeCore episode, object extras, object layout)
    cdef int _copy_rows(self, Block block, Py_ssize_t row, tuple source, Py_ssize_t ts,
                        Py_ssize_t count) except -1
    cdef int _copy_infos(self, Block block, Py_ssize_t row, BufferCore infos, Py_ssize_t ts,
                         Py_ssize_t count) except -1
    cdef int _write_final(self, int32_t slot, EpisodeCore episode, object layout,
                          Py_ssize_t n) except -1
    cdef int _restore_fields(self, int32_t slot, EpisodeCore episode) except -1
    cdef int _evict_slots(self, list slots) except -1
    cdef int _propagate(self, list leaves) except -1
    cdef int64_t _leaf_of(self, int64_t key, bint public) except -3
    cdef int _locate(self, int32_t slot, int64_t ts, int64_t* run, int32_t* off) except -1
    cdef int _advance(self, int64_t* run, int32_t* off, int64_t steps) except -1
    cdef char* _row_ptr(self, int64_t run, int32_t off, Py_ssize_t leaf) except NULL
    cdef int _read_row(self, char* dst, int64_t run, int32_t off, Py_ssize_t leaf) except -1
    cdef object _stack_axes(self, list cols)
    cdef tuple _stored_layout(self, Py_ssize_t leaf)
    cdef int _begin_frames(self, int32_t slot, bint is_new) except -1
    cdef int _release_frames(self) except -1
    cdef object _final_row(self, int32_t slot, Py_ssize_t leaf)
    cdef Column _block_frames(self, FramePool pool, Column rows, Py_ssize_t nrows,
                              int64_t[::1] starts, int32_t[::1] lookbacks,
                              int64_t[::1] lengths)
    cdef object _row_object(self, int64_t run, int32_t off, Py_ssize_t leaf)
    cdef object _infos_at(self, int64_t run, int32_t off)


# A drawn batch's rows as episodes' tracks, read in place (make_transitions,
# in _gather, builds its one-step episodes of them).
cdef Column shared_rows(cnp.ndarray arr, Py_ssize_t first, Py_ssize_t rows, unsigned char kind)
cdef object shared_tree(object structure, dict arrays, Py_ssize_t first, Py_ssize_t rows,
                        list kinds)
cdef BufferCore track_buffer(object storage, object space)
cdef BufferCore empty_dicts_buffer(Py_ssize_t count)
