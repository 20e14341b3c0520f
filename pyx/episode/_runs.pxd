# The stored steps in the order they were added: runs in a ring, and a
# Fenwick tree of their live steps that finds the k-th live step.
cimport cython
from libc.stdint cimport int32_t, int64_t


# A run: consecutive steps of one stored episode, in consecutive rows of one
# block. An episode's chunks (one per add() call) are runs in the order they
# came; the runs of all episodes, in that order, are RLlib's list of
# sampleable steps (`_indices`).
cdef struct Run:
    int64_t block        # the block's sequence number
    int64_t next         # the episode's next run (its sequence number), -1: none yet
    int32_t row          # the first step's row in the block
    int32_t n            # steps
    int32_t ep           # the episode's slot (< 0: evicted)
    int32_t ts           # the first step's index in the stored episode (< 0: lookback)


@cython.final
cdef class Runs:
    # Runs by sequence number: seq's record is items[seq & (cap - 1)], for
    # head <= seq < tail; tree[1 .. cap] is the Fenwick tree of each ring
    # slot's live steps (a lookback or evicted run has none).
    cdef Run* items
    cdef int64_t* tree
    cdef readonly Py_ssize_t cap     # a power of two
    cdef readonly int64_t head, tail
    cdef readonly int64_t live_steps

    cdef inline Run* at(self, int64_t seq) noexcept:
        return &self.items[seq & (self.cap - 1)]

    cdef int reserve(self, Py_ssize_t n) except -1
    cdef int64_t push(self, int64_t block, int32_t row, int32_t n, int32_t ep,
                      int32_t ts) except -1
    cdef int add_live(self, int64_t seq, int64_t delta) noexcept
    cdef int drop_dead(self) noexcept
    cdef int _tree_add(self, int64_t seq, int64_t delta) noexcept
    cdef int64_t before_head(self) noexcept
    cdef int kth(self, int64_t k, int64_t* run, int32_t* off) except -1
    cdef int kth_from(self, int64_t k, int64_t before_head, int64_t* run,
                      int32_t* off) except -1
    cdef int kth_group(self, const int64_t* ks, int64_t* runs, int32_t* offs, Py_ssize_t g,
                       int64_t before_head) except -1
