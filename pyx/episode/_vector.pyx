"""Vector env steps into the episodes of its sub-envs, in C.

`PendingRows` keeps a vector env's latest steps in one block and writes
them into the sub-envs' episodes a few dozen steps at a time. `VectorCore`
is the compiled half of `episode.sampling.VectorEpisodes`: its fields and
the usual step (NextStep autoreset, ndarray batches and extra outputs, no
infos) with no Python in between; the facade adds the other cases.
"""
from operator import itemgetter

import numpy as np

from cpython.dict cimport PyDict_GetItemWithError, PyDict_Keys, PyDict_Values
from cpython.list cimport PyList_AsTuple, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyObject
from cpython.pyport cimport PY_SSIZE_T_MAX
from libc.string cimport memcpy

cimport numpy as cnp

from episode._buffer cimport BufferCore
from episode._column cimport Column, array_bytes
from episode._episode cimport EpisodeCore, empty_episode, now, start_episode

cnp.import_array()


# A block holds about this many bytes of steps, and at most so many steps:
# each episode is then written once per 128 CartPole steps of 64 sub-envs.
cdef Py_ssize_t BLOCK_BYTES = 1 << 18
cdef Py_ssize_t MAX_CAPACITY = 128

cdef object NP_TRUE = np.True_      # what a numpy bool array hands out per element
cdef object NP_FALSE = np.False_
cdef object FIRST = itemgetter(0)


cdef inline bint is_batch(object batch, Py_ssize_t n) noexcept:
    # A C-contiguous ndarray with a leading axis of n: what the row writes
    # index into.
    return (cnp.PyArray_CheckExact(batch) and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>batch)
            and cnp.PyArray_NDIM(<cnp.ndarray>batch) >= 1
            and cnp.PyArray_DIMS(<cnp.ndarray>batch)[0] == n)


cdef inline bint is_flags(object batch, Py_ssize_t n) noexcept:
    return (is_batch(batch, n) and cnp.PyArray_NDIM(<cnp.ndarray>batch) == 1
            and cnp.PyArray_TYPE(<cnp.ndarray>batch) == cnp.NPY_BOOL)


cdef inline bint plain_rows(object batch) noexcept:
    # Rows without object references (a block copies their bytes); structured
    # dtypes are left to the general path too.
    return cnp.PyArray_TYPE(<cnp.ndarray>batch) not in (cnp.NPY_OBJECT, cnp.NPY_VOID)


cdef object block_item(object block, Py_ssize_t row):
    # block[row] as add_env_step would be handed it: a copy of an array row
    # (the block's rows are overwritten later), a numpy scalar or a kept
    # item (a list block's) as it is.
    if type(block) is list:
        return <object>PyList_GET_ITEM(block, row)
    item = (<cnp.ndarray>block)[row]
    return item.copy() if cnp.PyArray_Check(item) else item


cdef inline bint is_kept_rows(object batch, Py_ssize_t n) noexcept:
    # A list of n Python numbers: a block keeps the items themselves (they
    # are immutable, so the episode later stores what it would store now,
    # and hands them back as the same Python type).
    cdef Py_ssize_t k
    cdef object t
    if type(batch) is not list or PyList_GET_SIZE(batch) != n:
        return False
    for k in range(n):
        t = type(<object>PyList_GET_ITEM(batch, k))
        if not (t is int or t is float or t is bool):
            return False
    return True


cdef tuple extra_batches(dict outputs, Py_ssize_t n):
    # (keys, batches) of the extra outputs a block takes: C-contiguous
    # object-free ndarrays of n rows, or kept rows (is_kept_rows, as a
    # tuple: nothing can change their items or length until they are
    # copied in); None if any other. One snapshot, so that Python code run
    # before the copy (a key's __eq__, the writes of a flush) cannot change
    # what was checked.
    cdef list keys = PyDict_Keys(outputs), batches = PyDict_Values(outputs)
    cdef Py_ssize_t j
    cdef object batch
    for j in range(PyList_GET_SIZE(batches)):
        batch = <object>PyList_GET_ITEM(batches, j)
        if is_kept_rows(batch, n):
            batches[j] = PyList_AsTuple(batch)
        elif not (is_batch(batch, n) and plain_rows(batch)):
            return None
    return tuple(keys), batches


cdef class PendingRows:
    """The latest steps of a vector env's sub-envs, kept in one block and
    written into the sub-envs' episodes a few dozen steps at a time.

    A sampler's step writes one row per sub-env into as many episodes;
    right after `env.step` has run through every sub-env, their storage is
    out of the caches, and the writes cost several times the copy. Here a
    step is a few block copies, and each episode is written once per
    `capacity` steps (and whenever it is read: `flush_all`).

    Block row r * n + k holds sub-env k's item of step r (n sub-envs); the
    flat layout lets a row be written into an episode as a batch row is.

    A deferred block (`add(..., defer=True)`) also keeps the resets and the
    ends: a step is then only the copies, and the episodes that ended are
    written, and those the resets start are made, when the block is
    written, in one pass over each sub-env's rows that finds the code and
    the allocator's memory warm (right after `env.step` both are cold, and
    each of those steps costs several times as much). The episodes that
    ended wait in `take_ended()`.

    `capacity`: steps per block; None (the default) sizes each block to
    about BLOCK_BYTES (at most MAX_CAPACITY steps, at least one), so that
    large observations do not take a block of many megabytes."""

    cdef readonly Py_ssize_t capacity, filled, n
    cdef Py_ssize_t fixed_capacity  # the capacity asked for, 0: sized by the rows
    cdef cnp.ndarray obs, act, rew, term, trunc
    cdef cnp.ndarray reset         # the row is its sub-env's NextStep reset
    cdef bint deferred             # the pending rows' resets and ends are not written yet
    cdef tuple start               # a deferred block's (episode class, observation space,
                                   # action space): what its resets start
    cdef list ended                # (row in the order add() saw them, sub-env, episode) of
                                   # the deferred episodes that ended, for take_ended()
    cdef tuple extra_keys          # the extra outputs' keys in the steps' order (() for none)
    cdef list extras               # each key's block: an ndarray of rows, or a list of
                                   # kept items (is_kept_rows), row r * n + k as the others
    cdef double[::1] times
    cdef Py_ssize_t[::1] first     # sub-env k's pending rows: first[k]..filled - 1

    def __cinit__(self, capacity=None):
        if capacity is not None and capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.fixed_capacity = 0 if capacity is None else capacity
        self.capacity = self.fixed_capacity or MAX_CAPACITY
        self.filled = 0
        self.n = 0
        self.extra_keys = ()
        self.extras = []
        self.ended = []

    cdef bint fits(self, cnp.ndarray batch, cnp.ndarray block) noexcept:
        # The batch's rows are the block's rows: same type, item size, byte
        # order and row shape (block: (capacity * n, *row); batch: (n, *row)).
        cdef int i
        if block is None or cnp.PyArray_NDIM(batch) != cnp.PyArray_NDIM(block):
            return False
        if not (cnp.PyArray_TYPE(batch) == cnp.PyArray_TYPE(block)
                and cnp.PyArray_ITEMSIZE(batch) == cnp.PyArray_ITEMSIZE(block)
                and cnp.PyArray_ISNOTSWAPPED(batch) == cnp.PyArray_ISNOTSWAPPED(block)):
            return False
        for i in range(1, cnp.PyArray_NDIM(batch)):
            if cnp.PyArray_DIMS(batch)[i] != cnp.PyArray_DIMS(block)[i]:
                return False
        return True

    cdef bint extras_fit(self, tuple keys, list batches) except -1:
        # The step's extra outputs (extra_batches) have the block's keys, in
        # its order, and each fits its block.
        cdef Py_ssize_t j
        cdef object block, batch
        if len(keys) != len(self.extra_keys):
            return False
        for j in range(len(keys)):
            if keys[j] is not self.extra_keys[j] and not (keys[j] == self.extra_keys[j]):
                return False
            block, batch = self.extras[j], batches[j]
            if type(block) is list:
                if type(batch) is not tuple:
                    return False
            elif type(batch) is tuple or not self.fits(batch, block):
                return False
        return True

    cdef cnp.ndarray new_block(self, cnp.ndarray batch):
        shape = (self.capacity * self.n,) + tuple(
            [cnp.PyArray_DIMS(batch)[i] for i in range(1, cnp.PyArray_NDIM(batch))])
        return np.empty(shape, dtype=batch.dtype)

    def add(self, list episodes, observations, actions, rewards, terminateds, truncateds,
            resetting, bint same_step=False, bint final_obs_given=False, tuple start=None,
            dict extra_model_outputs=None, bint defer=False):
        """One vector env step: for each sub-env k that is not resetting
        (resetting[k]: its NextStep reset is this step) and, with
        `same_step`, whose episode did not end in it, what
        episodes[k].add_env_step(observations[k], actions[k], rewards[k],
        terminated=terminateds[k], truncated=truncateds[k],
        extra_model_outputs={key: batch[k] for each extra output}) adds
        (no infos), kept here until the episode is written. An
        episode that ended is written before this returns (with
        `same_step`, up to the step before this one: its last observation
        is in the infos, for the caller to add).

        Returns (the resetting sub-envs, the sub-envs whose episode ended),
        or None, adding nothing and with every pending row written, unless
        every batch is a C-contiguous object-free ndarray with a leading
        axis of len(episodes) (the flags and `resetting` 1-d bool), each
        extra output such an ndarray or a list of len(episodes) Python
        ints, floats or bools, and, with `same_step`, an episode that ended
        has its final observation (`final_obs_given`). An episode that add_env_step would refuse (a
        done one) raises its error when its rows are written.

        With `start` = (episode class, observation space, action space) and
        not `same_step`, the NextStep bookkeeping is done here too: each
        resetting sub-env's new episode starts with its observation (no
        infos) and is no longer resetting; each sub-env whose episode ended
        is resetting.

        With `defer` (and `start`), the resets and the ends are only kept:
        the episodes are started, written and ended when the rows are (the
        ones that ended then wait in take_ended())."""
        return self.add_rows(episodes, observations, actions, rewards, terminateds, truncateds,
                             resetting, same_step, final_obs_given, start, extra_model_outputs,
                             defer)

    cdef object add_rows(self, list episodes, observations, actions, rewards, terminateds,
                         truncateds, resetting, bint same_step, bint final_obs_given,
                         tuple start, dict outputs, bint defer=False):
        # add(), for the compiled step (`outputs`: the extra outputs, or None).
        cdef Py_ssize_t n = len(episodes), k, r, j, extra_bytes = 0
        cdef list resets = [], ends = []
        cdef object ep, block, batch
        cdef tuple keys = (), found
        cdef list batches = []
        if not (is_batch(observations, n) and is_batch(actions, n) and is_batch(rewards, n)
                and is_flags(terminateds, n) and is_flags(truncateds, n)
                and is_flags(resetting, n) and n > 0
                and plain_rows(observations) and plain_rows(actions) and plain_rows(rewards)):
            self.flush_all(episodes)
            return None
        if outputs:
            found = extra_batches(outputs, n)
            if found is None:
                self.flush_all(episodes)
                return None
            keys, batches = found
            for batch in batches:
                extra_bytes += (n * sizeof(PyObject*) if type(batch) is tuple
                                else cnp.PyArray_NBYTES(<cnp.ndarray>batch))
        cdef const cnp.npy_bool* term_k = <const cnp.npy_bool*>array_bytes(terminateds, n)
        cdef const cnp.npy_bool* trunc_k = <const cnp.npy_bool*>array_bytes(truncateds, n)
        cdef cnp.npy_bool* reset_k = <cnp.npy_bool*>array_bytes(resetting, n)
        if (start is not None and (same_step or len(start) != 3
                                   or not isinstance(start[0], type)
                                   or not issubclass(start[0], EpisodeCore)
                                   or not cnp.PyArray_ISWRITEABLE(<cnp.ndarray>resetting))
                or defer and start is None):
            raise ValueError("start=(episode class, observation space, action space) is for "
                             "NextStep steps with a writeable `resetting` (and defer=True "
                             "needs it)")
        # Only the flags are read here: the episodes themselves (out of the
        # caches after env.step) are checked when their rows are written.
        if same_step and not final_obs_given:
            for k in range(n):
                if not reset_k[k] and (term_k[k] or trunc_k[k]):
                    # The caller's general path raises (before adding anything).
                    self.flush_all(episodes)
                    return None
        if self.filled and defer != self.deferred:
            self.flush_all(episodes)
        if not (n == self.n and self.fits(observations, self.obs)
                and self.fits(actions, self.act) and self.fits(rewards, self.rew)
                and self.extras_fit(keys, batches)):
            # Another vector env or another row layout: a new block.
            self.flush_all(episodes)
            self.n = n
            self.capacity = self.fixed_capacity or max(1, min(
                MAX_CAPACITY, BLOCK_BYTES // max(1, cnp.PyArray_NBYTES(observations)
                                                 + cnp.PyArray_NBYTES(actions)
                                                 + cnp.PyArray_NBYTES(rewards) + 2 * n
                                                 + extra_bytes)))
            self.obs = self.new_block(observations)
            self.act = self.new_block(actions)
            self.rew = self.new_block(rewards)
            self.extra_keys = keys
            self.extras = [[None] * (self.capacity * n) if type(batch) is tuple
                           else self.new_block(batch) for batch in batches]
            self.term = np.empty(self.capacity * n, dtype=bool)
            self.trunc = np.empty(self.capacity * n, dtype=bool)
            self.reset = np.empty(self.capacity * n, dtype=bool)
            self.times = np.empty(self.capacity, dtype=np.float64)
            self.first = np.zeros(n, dtype=np.intp)
        elif self.filled == self.capacity:
            self.flush_all(episodes)
        self.deferred = defer
        self.start = start if defer else None
        r = self.filled
        self.copy_in(self.obs, observations, r)
        self.copy_in(self.act, actions, r)
        self.copy_in(self.rew, rewards, r)
        self.copy_in(self.term, terminateds, r)
        self.copy_in(self.trunc, truncateds, r)
        self.copy_in(self.reset, resetting, r)
        for j in range(len(batches)):
            block, batch = self.extras[j], batches[j]
            if type(block) is list:
                for k in range(n):
                    (<list>block)[r * n + k] = (<tuple>batch)[k]
            else:
                self.copy_in(block, batch, r)
        self.times[r] = now()
        self.filled = r + 1
        for k in range(n):
            if reset_k[k]:
                resets.append(k)
                if not defer:
                    # Its next episode starts with the next step.
                    self.first[k] = r + 1
            elif term_k[k] or trunc_k[k]:
                ends.append(k)
                if not defer:
                    self.flush(episodes, k, r if same_step else r + 1)
                    self.first[k] = r + 1
        if start is not None:
            for k in resets:
                if not defer:
                    episodes[k] = start_episode(start[0], start[1], start[2], observations[k],
                                                None)
                reset_k[k] = False
            for k in ends:
                reset_k[k] = True
        return resets, ends

    cdef int copy_in(self, cnp.ndarray block, object batch, Py_ssize_t r) except -1:
        cdef Py_ssize_t nbytes = cnp.PyArray_NBYTES(<cnp.ndarray>batch)
        memcpy(array_bytes(block, (r + 1) * nbytes) + r * nbytes,
               array_bytes(<cnp.ndarray>batch, nbytes), nbytes)
        return 0

    cdef int flush(self, list episodes, Py_ssize_t k, Py_ssize_t upto) except -1:
        """Writes sub-env k's rows first[k]..upto - 1 into episodes[k]; in a
        deferred block, a reset row starts the next episode (episodes[k]
        then) and the episode an end row ends goes to `ended`."""
        cdef Py_ssize_t r, i, seg = self.first[k]
        cdef bint fresh = False          # episodes[k] is new: row seg - 1 its reset
        cdef const cnp.npy_bool* reset = <const cnp.npy_bool*>array_bytes(
            self.reset, self.capacity * self.n)
        cdef const cnp.npy_bool* term = <const cnp.npy_bool*>array_bytes(
            self.term, self.capacity * self.n)
        cdef const cnp.npy_bool* trunc = <const cnp.npy_bool*>array_bytes(
            self.trunc, self.capacity * self.n)
        if self.deferred:
            for r in range(seg, upto):
                i = r * self.n + k
                if reset[i]:
                    # Its reset is written with the rows after it.
                    self.first[k] = r + 1
                    episodes[k] = empty_episode(self.start[0], self.start[1], self.start[2])
                    fresh = True
                    seg = r + 1
                elif term[i] or trunc[i]:
                    self.first[k] = r + 1
                    ep = episode_at(episodes, k)
                    self.write(ep, k, seg, r + 1, fresh)
                    self.ended.append((i, k, ep))
                    fresh = False
                    seg = r + 1
        if upto > seg or fresh:
            self.first[k] = upto
            self.write(episode_at(episodes, k), k, seg, upto, fresh)
        return 0

    cdef int write(self, EpisodeCore ep, Py_ssize_t k, Py_ssize_t start, Py_ssize_t upto,
                   bint fresh=False) except -1:
        """Writes sub-env k's rows start..upto - 1 (no reset among them, an
        end only in the last) into its episode `ep`; `fresh`: `ep` is new and
        row start - 1 its reset, whose observation (and empty infos, as
        add_env_reset's) come first, its rows and the rest in one copy."""
        cdef Py_ssize_t r, i, count = upto - start, first_obs = start - fresh
        cdef Column infos
        cdef const cnp.npy_bool* term = <const cnp.npy_bool*>array_bytes(
            self.term, self.capacity * self.n)
        cdef const cnp.npy_bool* trunc = <const cnp.npy_bool*>array_bytes(
            self.trunc, self.capacity * self.n)
        if count <= 0 and not fresh:
            return 0
        if fresh:
            # When its reset was added.
            ep.start_time = self.times[first_obs]
        if (ep.observations is None or ep.actions is None or ep.rewards is None
                or ep.infos is None or ep.is_terminated or ep.is_truncated
                or ep.rewards.is_finalized() or ep.t > PY_SSIZE_T_MAX - count
                or ep.observations.flat() is None or ep.actions.flat() is None
                or ep.rewards.flat() is None or not self.extras_writable(ep)):
            # add_env_step's own checks and paths, row by row (numpy'ized
            # data, Dict rows, outputs stored otherwise, a done episode's error).
            if fresh:
                ep.store_reset(block_item(self.obs, first_obs * self.n + k), None)
                ep.start_time = self.times[first_obs]   # (store_reset stamps it now)
            for r in range(start, upto):
                i = r * self.n + k
                ep.append_step(block_item(self.obs, i), block_item(self.act, i),
                               block_item(self.rew, i), None,
                               NP_TRUE if term[i] else NP_FALSE,
                               NP_TRUE if trunc[i] else NP_FALSE, self.row_outputs(i))
            return 0
        # add_env_step's appends, track by track (only the last row can end
        # the episode: an end is written as soon as it is added).
        self.write_rows(ep.observations, self.obs, first_obs, upto - first_obs, k)
        infos = ep.infos.flat()
        if infos is not None and infos.counts_empty_dicts():
            infos.size += count + fresh     # empty infos are only counted
        else:
            for r in range(count + fresh):
                ep.infos.push_empty_dict()
        ep.last_infos = None
        if count == 0:
            # Only the reset: its observation is the last one.
            ep.last_observation = None
            ep.last_row_observed = True
            return 0
        self.write_rows(ep.actions, self.act, start, count, k)
        self.write_rows(ep.rewards, self.rew, start, count, k)
        self.write_outputs(ep, start, count, k)
        ep.t += count
        i = (upto - 1) * self.n + k
        # The last observation is the row just written: no row view made.
        ep.end_step(None, NP_TRUE if term[i] else NP_FALSE,
                    NP_TRUE if trunc[i] else NP_FALSE, self.times[upto - 1])
        return 0

    cdef int write_rows(self, BufferCore buffer, cnp.ndarray block, Py_ssize_t start,
                        Py_ssize_t count, Py_ssize_t k) except -1:
        # push(block[(start + j) * n + k]) for j < count: the rows' bytes in
        # one strided copy where the track holds them unchanged, else row by
        # row (the first row of a track decides its type: then the rest).
        cdef Column col = buffer.flat()
        cdef Py_ssize_t j, i
        for j in range(count):
            if col.push_strided_rows(block, (start + j) * self.n + k, count - j, self.n):
                return 0
            i = (start + j) * self.n + k
            if not col.push_batch_row(block, i):
                buffer.push(block_item(block, i))
            col = buffer.flat()       # a push may have changed the storage
        return 0

    cdef bint extras_writable(self, EpisodeCore ep) except -1:
        # The episode keeps its outputs as add_env_step finds them on its
        # usual step: a dict with a flat buffer (or nothing yet) per key.
        cdef PyObject* found
        cdef object extras = ep._extras
        if not self.extra_keys:
            return True
        if type(extras) is not dict:
            return False
        for key in self.extra_keys:
            found = PyDict_GetItemWithError(extras, key)
            if found is not NULL and not (isinstance(<object>found, BufferCore)
                                          and (<BufferCore>found).flat() is not None):
                return False
        return True

    cdef object row_outputs(self, Py_ssize_t i):
        # Block row i's extra outputs, as add_env_step is handed them.
        if not self.extra_keys:
            return None
        return {key: block_item(block, i) for key, block in zip(self.extra_keys, self.extras)}

    cdef int write_outputs(self, EpisodeCore ep, Py_ssize_t start, Py_ssize_t count,
                           Py_ssize_t k) except -1:
        # add_env_step's stores of the extra outputs (extras_writable(ep)):
        # a key new to the episode gets its buffer from the first row, as
        # there; the other rows go in as write_rows puts them.
        cdef Py_ssize_t j, r, first
        cdef PyObject* found
        cdef BufferCore buffer
        cdef object block, target
        cdef object outputs = ep._extras
        if type(outputs) is not dict:
            raise TypeError(f"extra_model_outputs must be a dict, got {type(outputs).__name__}")
        for j in range(len(self.extra_keys)):
            key, block = self.extra_keys[j], self.extras[j]
            first = start
            found = PyDict_GetItemWithError(outputs, key)
            if found is NULL:
                target = ep._new_buffer([block_item(block, start * self.n + k)])
                outputs[key] = target
                first += 1
            else:
                target = <object>found
            if first == start + count:
                continue
            # (Checked again: a new buffer, or Python code run since
            # extras_writable, may have put anything there.)
            if not isinstance(target, BufferCore):
                raise TypeError(f"extra_model_outputs[{key!r}] is a {type(target).__name__}, "
                                f"not an episode.InfiniteLookbackBuffer")
            buffer = <BufferCore>target
            if type(block) is list or buffer.flat() is None:
                for r in range(first, start + count):
                    buffer.push(block_item(block, r * self.n + k))
            else:
                self.write_rows(buffer, block, first, start + count - first, k)
        return 0

    def __reduce__(self):
        # Pending rows belong to episodes the block does not hold: the owner
        # writes them (flush_all) before it is pickled. The ended episodes
        # waiting for take_ended() go with it.
        if self.filled:
            raise TypeError(f"cannot pickle a PendingRows with {self.filled} pending steps: "
                            f"flush_all() them into their episodes first")
        return (PendingRows, (self.fixed_capacity or None,),
                [(k, ep) for _, k, ep in self.ended])

    def __setstate__(self, state):
        # Checked before anything is kept: a list of (sub-env, episode).
        if type(state) is not list or not all(
                type(item) is tuple and len(item) == 2 and type(item[0]) is int
                and item[0] >= 0 and isinstance(item[1], EpisodeCore) for item in state):
            raise ValueError("a PendingRows state is a list of (sub-env index, episode)")
        self.ended = [(0, k, ep) for k, ep in state]

    def flush_all(self, list episodes):
        """Writes every pending row into its episode (episodes[k] for
        sub-env k); the block is empty after."""
        cdef Py_ssize_t k, mark = len(self.ended)
        if self.filled and self.n != len(episodes):
            raise ValueError(f"{self.filled} steps of {self.n} sub-envs are pending; "
                             f"got {len(episodes)} episodes to write them into")
        if self.filled:
            for k in range(self.n):
                self.flush(episodes, k, self.filled)
        if len(self.ended) > mark + 1:
            # Sub-env by sub-env above; in the order add() saw the ends.
            self.ended[mark:] = sorted(self.ended[mark:], key=FIRST)
        self.filled = 0
        if self.n:
            self.first[:] = 0

    def take_ended(self, list episodes):
        """Writes every pending row (flush_all(episodes)), and hands out the
        episodes of deferred blocks that ended since the last call, in the
        order add() saw their ends: (the episodes, their sub-envs)."""
        self.flush_all(episodes)
        ended, self.ended = self.ended, []
        return [item[2] for item in ended], [item[1] for item in ended]


cdef EpisodeCore episode_at(list episodes, Py_ssize_t k):
    ep = episodes[k]
    if not isinstance(ep, EpisodeCore):
        raise TypeError(f"episodes[{k}] is a {type(ep).__name__}, not an episode")
    return <EpisodeCore>ep


cdef class VectorCore:
    """The fields of VectorEpisodes and its usual step, compiled (see the
    facade, episode.sampling.VectorEpisodes, for the API)."""

    cdef public Py_ssize_t num_envs
    cdef public object observation_space
    cdef public object action_space
    cdef public str autoreset_mode
    cdef public list _episodes          # sub-env k's running episode (None before a reset)
    cdef public PendingRows _pending    # the latest steps, until written into them
    cdef public cnp.ndarray _resetting  # NextStep: sub-envs whose next step is their reset
    cdef public type _episode_class     # the class of the episodes it starts
    # What the last add_step() did: the sub-env steps it recorded (a NextStep
    # reset is none), and the sub-env of each episode it returned.
    cdef public Py_ssize_t steps_added
    cdef public list ended_envs
    # An episode.offline.EpisodeWriter that gets every episode handed on
    # (by add_step, take_ended and cut), or None.
    cdef public object writer

    def add_step(self, observations, actions, rewards, terminateds, truncateds, infos=None,
                 *, extra_model_outputs=None):
        """Adds one `env.step(actions)` result to every sub-env's episode
        (batches with a leading axis of num_envs; `extra_model_outputs` a
        dict of such batches). Returns the episodes that ended in this step;
        their sub-envs go on in new episodes. Checks every batch before
        anything is added."""
        ended = self.step(observations, actions, rewards, terminateds, truncateds, infos,
                          extra_model_outputs)
        if self.writer is not None and ended:
            self.writer.write(ended)
        return ended

    cdef list step(self, observations, actions, rewards, terminateds, truncateds, infos,
                   extra_model_outputs):
        # add_step() without the writer.
        if self.block_step(observations, actions, rewards, terminateds, truncateds, infos,
                           extra_model_outputs, False):
            return [self._episodes[k] for k in self.ended_envs]
        return self._add_step_general(observations, actions, rewards, terminateds,
                                      truncateds, infos, extra_model_outputs)

    def record_step(self, observations, actions, rewards, terminateds, truncateds, infos=None,
                    *, extra_model_outputs=None):
        """add_step() for a sampler that reads the episodes once a rollout
        is done: the episodes that end wait in take_ended() instead of
        being returned. The usual step is then the block copies alone (the
        episodes are written, started and ended in one pass when they are
        read). Returns the sub-env steps it recorded (steps_added)."""
        if self.block_step(observations, actions, rewards, terminateds, truncateds, infos,
                           extra_model_outputs, True):
            return self.steps_added
        # (add_step writes the deferred rows first: their ends come first.)
        ended = self.step(observations, actions, rewards, terminateds, truncateds, infos,
                          extra_model_outputs)
        self._pending.ended.extend([(0, k, ep) for k, ep in zip(self.ended_envs, ended)])
        return self.steps_added

    cdef bint block_step(self, observations, actions, rewards, terminateds, truncateds,
                         infos, extra_model_outputs, bint defer) except -1:
        # The usual step (NextStep, no infos), resets, ends and extra outputs
        # included, in the block pass: True if it took it (steps_added and
        # ended_envs set), False if the general path must.
        cdef list episodes = self._episodes
        if not (not infos and self.autoreset_mode == "NextStep" and episodes
                and episodes[0] is not None
                and (extra_model_outputs is None or type(extra_model_outputs) is dict)):
            return False
        found = self._add_rows(episodes, observations, actions, rewards, terminateds,
                               truncateds, self._resetting, False, False,
                               (self._episode_class, self.observation_space,
                                self.action_space), extra_model_outputs, defer)
        if found is None:
            return False
        resets, ends = found
        self.steps_added = len(episodes) - len(resets)
        self.ended_envs = ends
        return True

    def take_ended(self):
        """The episodes that ended in record_step() since the last call, in
        the order add_step() would have returned them, and their sub-envs:
        (episodes, sub-env indices)."""
        if self._pending is None:
            raise TypeError("_pending must be a PendingRows, not None")
        episodes, envs = self._pending.take_ended(self._episodes)
        if self.writer is not None and episodes:
            self.writer.write(episodes)
        return episodes, envs

    cpdef object _add_rows(self, list episodes, object observations, object actions,
                           object rewards, object terminateds, object truncateds,
                           object resetting, bint same_step, bint final_obs_given,
                           tuple start=None, dict extra_model_outputs=None, bint defer=False):
        # The block pass (PendingRows.add); overridable, so that a test can
        # count it or take it away.
        if self._pending is None:
            raise TypeError("_pending must be a PendingRows, not None")
        return self._pending.add_rows(episodes, observations, actions, rewards, terminateds,
                                      truncateds, resetting, same_step, final_obs_given, start,
                                      extra_model_outputs, defer)
