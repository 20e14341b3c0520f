# Priorities as RLlib keeps them: its segment trees over Python and numpy
# numbers, whose arithmetic (Python's, and numpy's NEP 50 rules for scalars)
# decides which step a draw lands on and the weight it gets.
from libc.stdint cimport int32_t, int64_t


# The type of an RLlib number: the arithmetic it takes part in follows it.
cdef enum Tag:
    TAG_FLOAT = 0    # Python float (weak: a numpy operand keeps its own type)
    TAG_INT = 1      # Python int (weak)
    TAG_F64 = 2      # numpy.float64
    TAG_F32 = 3      # numpy.float32: float arithmetic


cdef struct Num:
    double v         # the value (a float32's value exactly, for TAG_F32)
    int tag          # a Tag


cdef Num num(double v, int tag) noexcept
cdef Num to_num(object x) except *
cdef object from_num(Num x)
cdef Num add(Num a, Num b) noexcept
cdef Num sub(Num a, Num b) noexcept
cdef Num mul(Num a, Num b) noexcept
cdef Num div(Num a, Num b) except *
cdef Num power(Num a, Num b) except *
cdef bint greater(Num a, Num b) noexcept
cdef Num smaller_of(Num a, Num b) noexcept


cdef class PriorityTrees:
    # RLlib's pair of segment trees (SumSegmentTree, MinSegmentTree) of
    # `size` leaves, the queue of free leaves it hands out in order, and the
    # stored step each leaf stands for. Only the leftmost `alloc` leaves
    # (a power of two) are allocated: the leaves beyond are free and hold
    # the neutral values, and the nodes above the allocated subtree hold
    # what RLlib's would (its root's value, promoted by `+ 0.0`).
    cdef readonly Py_ssize_t size       # logical leaves (a power of two)
    cdef Py_ssize_t alloc               # allocated leaves (a power of two <= size)
    cdef double* sum_v                  # heap layout: node 1 the subtree's root,
    cdef unsigned char* sum_t           # leaves at alloc .. 2 * alloc - 1
    cdef double* min_v
    cdef unsigned char* min_t
    cdef int64_t* owner                 # per allocated leaf: its step's key, -1 if free
    # The free queue: `queue` (a ring, front at queue_head) and after it the
    # never-used leaves fresh .. size - 1.
    cdef int64_t* queue
    cdef Py_ssize_t queue_cap, queue_head, queue_len
    cdef Py_ssize_t fresh
    cdef int64_t max_leaf               # RLlib's _max_idx

    cdef int _grow(self, Py_ssize_t leaf) except -1
    cdef int _set(self, int64_t leaf, Num s, Num m) except -1
    cdef int _reserve_queue(self) except -1
    cdef int _push_back(self, int64_t leaf) except -1
    cdef int _take_over(self, PriorityTrees other) except -1
    cdef Num _root(self, bint of_sum) noexcept
    cdef list _values(self, bint of_sum)
    cdef int64_t take(self, Num value, int64_t key) except -1
    cdef int64_t take_leaf(self, Num value, int64_t key) except -1
    cdef int release(self, int64_t leaf) except -1
    cdef int release_leaf(self, int64_t leaf) except -1
    cdef int _set_raw(self, int64_t leaf, Num s, Num m) except -1
    cdef int propagate(self, int64_t* leaves, Py_ssize_t n) except -1
    cdef int set_leaf(self, int64_t leaf, Num value) except -1
    cdef Num total(self) noexcept
    cdef Num minimum(self) noexcept
    cdef Num leaf_sum(self, int64_t leaf) noexcept
    cdef int64_t find(self, Num prefixsum) except -2
    cdef inline int64_t find_plain(self, double prefixsum) noexcept:
        # The leaf where `prefixsum` falls, in plain float64 (the native
        # sampler's draws: not RLlib's numbers), branch-free down the
        # allocated subtree (the leaves beyond it hold nothing). A sum that
        # rounding puts past the total ends on the last leaves: the caller
        # draws again where that leaf is free.
        cdef Py_ssize_t node = 1
        cdef double left
        cdef int go
        while node < self.alloc:
            left = self.sum_v[2 * node]
            go = prefixsum >= left
            node = 2 * node + go
            prefixsum -= left * go
        return node - self.alloc
    cdef inline void find_group(self, double* prefixsums, int64_t* leaves,
                                Py_ssize_t g) noexcept:
        # find_plain() of g <= 16 sums at once: the g walks go down
        # side by side, level by level, so that their memory reads overlap
        # (one walk's reads depend on each other; a deep tree's miss the
        # cache). `prefixsums` is used up.
        cdef Py_ssize_t node[16]
        cdef Py_ssize_t j, level = self.alloc
        cdef double left
        cdef int go
        for j in range(g):
            node[j] = 1
        while level > 1:
            for j in range(g):
                left = self.sum_v[2 * node[j]]
                go = prefixsums[j] >= left
                node[j] = 2 * node[j] + go
                prefixsums[j] -= left * go
            level //= 2
        for j in range(g):
            leaves[j] = node[j] - self.alloc
    cdef inline int64_t key_of(self, int64_t leaf) noexcept:
        return self.owner[leaf] if 0 <= leaf < self.alloc else -1
