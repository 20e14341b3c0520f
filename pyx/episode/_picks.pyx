"""Draws: which stored steps a sample takes, into Picks.

RLlib's buffers' draws (each on its own numbers, bit for bit with RLlib's
for a seeded generator) and the native sampler's (in rounds of many draws,
uniform or by priority), as functions over a Store: each hands back Picks,
the steps drawn with what the draw made of them (their n-step, where their
transition or sequence ends, their importance weight and tree leaf), which
episode._gather then reads the rows of.
"""
cimport cython
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from libc.stdint cimport int32_t, int64_t

from episode._priority cimport (Num, PriorityTrees, div, from_num, mul, num, power, to_num,
                                TAG_FLOAT, TAG_INT)
from episode._replay cimport KEY_OFFSET_MASK, Store


@cython.final
cdef class Picks:
    """The steps a draw picked (see Pick)."""

    def __cinit__(self):
        self.resamples = 0
        self.rejected = []

    def __dealloc__(self):
        PyMem_Free(self.items)

    def __len__(self):
        return self.size

    cdef int _reserve(self, Py_ssize_t n) except -1:
        # Room for n picks in all.
        cdef Pick* grown
        if n > self.cap:
            grown = <Pick*>PyMem_Realloc(self.items, n * sizeof(Pick))
            if grown == NULL:
                raise MemoryError()
            self.items = grown
            self.cap = n
        return 0

    cdef int push(self, int64_t run, int32_t off, int32_t slot, int64_t ts, int64_t n,
                  int64_t end) except -1:
        cdef Pick* p
        if self.size == self.cap:
            self._reserve(2 * self.cap + 32)
        p = &self.items[self.size]
        p.run = run
        p.off = off
        p.slot = slot
        p.ts = ts
        p.n = n
        p.end = end
        p.end_run = -1
        p.end_off = 0
        p.weight = 1.0
        p.leaf = -1
        self.size += 1
        return 0


cdef int64_t draw_limit(Py_ssize_t batch_size) noexcept:
    # Draws a sample() may take before it gives up: RLlib's loops draw again
    # without end when no stored step can give an item (episodes shorter
    # than the n-step, every long one of zero priority).
    return 1000000 + 100 * <int64_t>batch_size


cdef int count_draws(int64_t* tries, int64_t count, int64_t limit) except -1:
    # `count` more draws; ValueError once there have been more than `limit`.
    tries[0] += count
    if tries[0] > limit:
        raise ValueError(f"no item after {tries[0] - count} draws: no stored step can give "
                         f"one (episodes shorter than the n-step, or steps too near their "
                         f"episode's end)")
    return 0


cdef bint n_step_range(object n_step, int64_t* lo, int64_t* hi, int64_t* n) except -1:
    # A draw's n-step (checked by the caller): an int, or a (low, high)
    # range drawn from per item (then `n` starts at low). True for a range.
    if isinstance(n_step, tuple):
        lo[0], hi[0] = n_step
        n[0] = lo[0]
        return True
    n[0] = n_step
    return False


# -- RLlib's draws ------------------------------------------------------------

def draw_uniform(Store store, Draws draws, Py_ssize_t batch_size_B, Py_ssize_t batch_length_T,
                 n_step, Py_ssize_t min_batch_length_T):
    """EpisodeReplayBuffer._sample_episodes' draws: a uniform step per
    draw (and a random n-step per draw for a range), skipping steps
    within min_batch_length_T of their episode's end, until the counted
    timesteps reach batch_size_B (RLlib's count: a sequence counts its
    length plus one, a transition one)."""
    cdef Picks picks = Picks()
    cdef int64_t B = 0, run, ts, n, lo = 0, hi = 0, end, length, grow
    cdef int32_t off, slot
    cdef bint random_n = n_step_range(n_step, &lo, &hi, &n)
    cdef int64_t tries = 0, limit = draw_limit(batch_size_B)
    with draws:
        while B < batch_size_B:
            count_draws(&tries, 1, limit)
            uniform_pick(store, draws, &run, &off, &slot, &ts)
            length = store.eps[slot].length
            if not batch_length_T and random_n:
                n = draws.integers(lo, hi)
            if min_batch_length_T > 0 and ts + min_batch_length_T >= length:
                continue
            if ts + batch_length_T + (n - 1) > length:
                end = length
            else:
                end = ts + batch_length_T + n - 1
            # The data: a transition's n steps (cut at the episode's
            # end), or the sequence up to `end`.
            picks.push(run, off, slot, ts, n,
                       end if batch_length_T else min(ts + n, length))
            grow = end - ts - (n - 1) + 1
            B += grow if grow else 1
    return picks

def draw_transitions(Store store, Draws draws, Py_ssize_t batch_size_B, n_step):
    """The multi-agent buffer's uniform draws (per module): a uniform
    step per draw, a random n-step per draw for a range; a step within n
    of its episode's end is drawn again (counted in `resamples`)."""
    cdef Picks picks = Picks()
    cdef int64_t B = 0, run, ts, n, lo = 0, hi = 0
    cdef int32_t off, slot
    cdef bint random_n = n_step_range(n_step, &lo, &hi, &n)
    cdef int64_t tries = 0, limit = draw_limit(batch_size_B)
    with draws:
        while B < batch_size_B:
            count_draws(&tries, 1, limit)
            uniform_pick(store, draws, &run, &off, &slot, &ts)
            if random_n:
                n = draws.integers(lo, hi)
            if ts + n > store.eps[slot].length:
                picks.resamples += 1
                picks.rejected.append(slot)
                continue
            picks.push(run, off, slot, ts, n, ts + n)
            B += 1
    return picks

def draw_prioritized(Store store, Draws draws, Py_ssize_t batch_size_B, n_step, beta,
                     num_timesteps=None):
    """PrioritizedEpisodeReplayBuffer.sample's draws, on its numbers:
    a prefix sum per draw, the step at that tree leaf, its importance
    weight (with `num_timesteps` as the buffer's size, the stored steps
    by default), a random n-step per draw for a range; a step within n
    of its episode's end is drawn again (counted in `resamples`)."""
    cdef PriorityTrees trees = store.priorities
    cdef Picks picks = Picks()
    cdef int64_t B = 0, run, ts, n, lo = 0, hi = 0, leaf, key
    cdef int64_t steps = store.runs.live_steps if num_timesteps is None else num_timesteps
    cdef int32_t off, slot
    cdef bint random_n = n_step_range(n_step, &lo, &hi, &n)
    cdef Num total = trees.total(), N = num(<double>steps, TAG_INT)
    cdef Num neg_beta = to_num(beta), p_min, max_weight, weight
    neg_beta.v = -neg_beta.v
    p_min = div(trees.minimum(), total)
    max_weight = power(mul(p_min, N), neg_beta)
    cdef int64_t tries = 0, limit = draw_limit(batch_size_B)
    picks.weights = []
    picks.leaves = []
    with draws:
        while B < batch_size_B:
            count_draws(&tries, 1, limit)
            leaf = trees.find(mul(num(draws.random(), TAG_FLOAT), trees.total()))
            weight = power(mul(div(trees.leaf_sum(leaf), total), N), neg_beta)
            key = trees.key_of(leaf)
            if key < 0:
                raise KeyError(leaf)
            run = key >> 20
            off = <int32_t>(key & KEY_OFFSET_MASK)
            step_of(store, run, off, &slot, &ts)
            if random_n:
                n = draws.integers(lo, hi)
            if ts + n > store.eps[slot].length:
                picks.resamples += 1
                picks.rejected.append(slot)
                continue
            picks.push(run, off, slot, ts, n, ts + n)
            picks.weights.append(from_num(mul(div(weight, max_weight), num(1.0, TAG_INT))))
            picks.leaves.append(leaf)
            B += 1
    return picks

def uniform_step(Store store, Draws draws):
    """One uniform draw of a stored step (RLlib's `self._indices[
    self.rng.integers(len(self._indices))]`): its (slot, index)."""
    cdef int64_t run, ts
    cdef int32_t off, slot
    with draws:
        uniform_pick(store, draws, &run, &off, &slot, &ts)
    return slot, ts


# -- the native sampler --------------------------------------------------------

def draw_native(Store store, Draws draws, Py_ssize_t batch_size, n_step, bint prioritized,
                double beta, Py_ssize_t batch_length_T, Py_ssize_t min_batch_length_T):
    """sample_batch()'s draws: `batch_size` steps, uniform or by priority
    (then with importance weights (p * N) ** -beta over their largest),
    each with its n-step (an int, or drawn from a (low, high) range) cut
    at its episode's end, or a sequence of up to batch_length_T steps;
    steps within min_batch_length_T of their episode's end are drawn
    again."""
    cdef Picks picks = Picks()
    cdef PriorityTrees trees = store.priorities
    cdef int64_t n, lo = 0, hi = 0, key, length
    cdef bint random_n = n_step_range(n_step, &lo, &hi, &n)
    # The weights in the numbers RLlib's sample() computes them in (a
    # float32 tree's sums stay float32), so that both give the same.
    cdef Num total, N = num(<double>store.runs.live_steps, TAG_INT)
    cdef Num neg_beta = num(-beta, TAG_FLOAT)
    cdef Num max_weight, one = num(1.0, TAG_INT)
    cdef Py_ssize_t i
    if store.runs.live_steps <= 0:
        raise ValueError("the buffer holds no timesteps to sample")
    cdef int64_t before_head = store.runs.before_head()
    if prioritized:
        total = trees.total()
        if not total.v > 0.0:
            raise ValueError("the priorities sum to zero")
        max_weight = power(mul(div(trees.minimum(), total), N), neg_beta)
    cdef int64_t tries = 0, limit = draw_limit(batch_size)
    cdef Py_ssize_t start, j, g, k
    cdef double sums[16]
    cdef int64_t found[16], steps[16]
    cdef int32_t offs[16]
    cdef Pick* p
    picks._reserve(batch_size)
    # In rounds: the draws still missing, then where each lands, then
    # its step (a step too near its episode's end, or a free tree leaf,
    # is dropped for the next round). Each phase on its own lets the
    # memory reads of several draws overlap instead of waiting in turn.
    # Each candidate takes its random numbers (where, then its n-step)
    # in turn, as a draw-by-draw loop would.
    while picks.size < batch_size:
        start = picks.size
        count_draws(&tries, batch_size - start, limit)
        with draws:
            for i in range(start, batch_size):
                p = &picks.items[i]
                if prioritized:
                    p.weight = draws.random()
                else:
                    p.ts = draws.integers(0, store.runs.live_steps)
                p.n = draws.integers(lo, hi) if random_n else n
        if prioritized:
            for i in range(start, batch_size, 16):
                g = min(16, batch_size - i)
                for k in range(g):
                    sums[k] = mul(num(picks.items[i + k].weight, TAG_FLOAT), total).v
                trees.find_group(sums, found, g)
                for k in range(g):
                    picks.items[i + k].leaf = found[k]
        for i in range(start, batch_size):
            p = &picks.items[i]
            p.slot = 0
            if prioritized:
                key = trees.key_of(p.leaf)
                if key < 0:
                    p.slot = -1
                    continue
                p.run = key >> 20
                p.off = <int32_t>(key & KEY_OFFSET_MASK)
            else:
                p.leaf = p.ts
        if not prioritized:
            for i in range(start, batch_size, 16):
                g = min(16, batch_size - i)
                for k in range(g):
                    steps[k] = picks.items[i + k].ts
                store.runs.kth_group(steps, found, offs, g, before_head)
                for k in range(g):
                    picks.items[i + k].run = found[k]
                    picks.items[i + k].off = offs[k]
        j = start
        for i in range(start, batch_size):
            p = &picks.items[i]
            if p.slot < 0:
                continue
            step_of(store, p.run, p.off, &p.slot, &p.ts)
            length = store.eps[p.slot].length
            if min_batch_length_T > 0 and p.ts + min_batch_length_T >= length:
                continue
            p.end = min(p.ts + (batch_length_T if batch_length_T else p.n), length)
            p.end_run = -1
            p.end_off = 0
            if prioritized:
                # (p * N) ** -beta, normalized by the largest possible weight.
                p.weight = mul(div(power(mul(div(trees.leaf_sum(p.leaf), total), N),
                                         neg_beta), max_weight), one).v
            else:
                p.weight = 1.0
            if j != i:
                picks.items[j] = p[0]
            j += 1
        picks.size = j
    return picks
