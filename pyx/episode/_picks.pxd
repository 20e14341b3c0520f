# Draws: which stored steps a sample takes (see _picks.pyx), into Picks.
cimport cython
from libc.stdint cimport int32_t, int64_t

from episode._draws cimport Draws
from episode._replay cimport Store
from episode._runs cimport Run


# A drawn step: where it is, and what the draw made of it.
cdef struct Pick:
    int64_t run          # the step's run and offset in it
    int32_t off
    int32_t slot         # its episode
    int64_t ts           # its index in the stored episode
    int64_t n            # the n-step drawn (or asked for)
    int64_t end          # the step the transition or sequence ends at (exclusive)
    int64_t end_run      # where step `end` is (run < 0: the final row)
    int32_t end_off
    double weight        # the native sampler's importance weight
    int64_t leaf         # its priority tree leaf (-1: none)


@cython.final
cdef class Picks:
    cdef Pick* items
    cdef Py_ssize_t size, cap
    cdef public list weights     # prioritized: each pick's weight (RLlib's object)
    cdef public list leaves      # prioritized: each pick's tree leaf
    cdef public int64_t resamples
    cdef public list rejected    # the episode slot of each draw made again
    cdef int _reserve(self, Py_ssize_t n) except -1
    cdef int push(self, int64_t run, int32_t off, int32_t slot, int64_t ts, int64_t n,
                  int64_t end) except -1


cdef inline int step_of(Store store, int64_t run, int32_t off, int32_t* slot,
                        int64_t* ts) noexcept:
    # The episode slot and step index of a run's row (per draw: inline).
    cdef Run* r = store.runs.at(run)
    slot[0] = r.ep
    ts[0] = r.ts + off
    return 0


cdef inline int uniform_pick(Store store, Draws draws, int64_t* run, int32_t* off,
                             int32_t* slot, int64_t* ts) except -1:
    # A stored step drawn uniformly: its run, offset, episode slot and index.
    store.runs.kth(draws.integers(0, store.runs.live_steps), run, off)
    step_of(store, run[0], off[0], slot, ts)
    return 0
