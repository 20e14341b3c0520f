"""The replay store's steps in the order they were added.

Each add() call's chunk of an episode is a run (cut where a block ends);
the runs, oldest first, are RLlib's list of sampleable steps. They live in
a ring indexed by sequence number (evicting the oldest episodes frees the
ring's front), and a Fenwick tree over the ring's slots counts each run's
live steps, so that a uniform draw finds the k-th live step in log time.
"""
cimport cython
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.string cimport memset


@cython.final
cdef class Runs:
    """The runs of a store (see the module docstring and the .pxd)."""

    def __cinit__(self):
        self.reserve(16)

    def __dealloc__(self):
        PyMem_Free(self.items)
        PyMem_Free(self.tree)

    cdef int reserve(self, Py_ssize_t n) except -1:
        """Room for n more runs: the ring doubles, the records move to their
        slots in the larger ring and the Fenwick tree is rebuilt."""
        cdef Py_ssize_t cap = self.cap if self.cap else 16
        cdef int64_t seq
        cdef Run* items
        cdef int64_t* tree
        if self.tail - self.head + n <= self.cap:
            return 0
        while cap < self.tail - self.head + n:
            cap *= 2
        items = <Run*>PyMem_Malloc(cap * sizeof(Run))
        tree = <int64_t*>PyMem_Malloc((cap + 1) * sizeof(int64_t))
        if items == NULL or tree == NULL:
            PyMem_Free(items)
            PyMem_Free(tree)
            raise MemoryError()
        memset(tree, 0, (cap + 1) * sizeof(int64_t))
        for seq in range(self.head, self.tail):
            items[seq & (cap - 1)] = self.items[seq & (self.cap - 1)]
        PyMem_Free(self.items)
        PyMem_Free(self.tree)
        self.items = items
        self.tree = tree
        self.cap = cap
        for seq in range(self.head, self.tail):
            if self.at(seq).ep >= 0 and self.at(seq).ts >= 0:
                self._tree_add(seq, self.at(seq).n)
        return 0

    cdef int64_t push(self, int64_t block, int32_t row, int32_t n, int32_t ep,
                      int32_t ts) except -1:
        """A new run at the tail (its steps live unless they are lookback);
        returns its sequence number."""
        cdef int64_t seq
        cdef Run* run
        self.reserve(1)
        seq = self.tail
        run = self.at(seq)
        run.block = block
        run.next = -1
        run.row = row
        run.n = n
        run.ep = ep
        run.ts = ts
        self.tail += 1
        if ts >= 0:
            self.add_live(seq, n)
        return seq

    cdef int add_live(self, int64_t seq, int64_t delta) noexcept:
        """Run seq's live steps change by delta."""
        self._tree_add(seq, delta)
        self.live_steps += delta
        return 0

    cdef int drop_dead(self) noexcept:
        """The dead runs at the front (their episodes evicted) leave the ring."""
        while self.head < self.tail and self.at(self.head).ep < 0:
            self.head += 1
        return 0

    cdef int _tree_add(self, int64_t seq, int64_t delta) noexcept:
        cdef Py_ssize_t i = (seq & (self.cap - 1)) + 1
        if delta == 0:
            return 0
        while i <= self.cap:
            self.tree[i] += delta
            i += i & (-i)
        return 0

    cdef int64_t before_head(self) noexcept:
        """Live steps in the ring slots before the head's (kth_from() takes
        it: the same for every draw of one sample call)."""
        cdef Py_ssize_t slots = self.head & (self.cap - 1)
        cdef int64_t total = 0
        while slots > 0:
            total += self.tree[slots]
            slots -= slots & (-slots)
        return total

    cdef int kth(self, int64_t k, int64_t* run, int32_t* off) except -1:
        """The k-th live step (0-based) in insertion order: its run and its
        offset in the run."""
        return self.kth_from(k, self.before_head(), run, off)

    cdef int kth_from(self, int64_t k, int64_t before_head, int64_t* run,
                      int32_t* off) except -1:
        """kth() given before_head()."""
        cdef Py_ssize_t head = self.head & (self.cap - 1), pos = 0, step
        cdef int64_t target, v, go
        if k < 0 or k >= self.live_steps:
            raise IndexError(f"step {k} of {self.live_steps}")
        if k < self.live_steps - before_head:
            target = before_head + k
        else:
            target = k - (self.live_steps - before_head)
        # Fenwick descent, branch-free (each comparison is a coin flip the
        # branch predictor would miss): pos stays below cap since target <
        # the total, so pos + step never passes it.
        step = self.cap
        while step:
            v = self.tree[pos + step]
            go = -<int64_t>(v <= target)        # all ones or zero
            pos += step & go
            target -= v & go
            step >>= 1
        # Ring slot `pos` holds the step; its sequence number follows from
        # where the ring starts.
        if pos >= head:
            run[0] = self.head + (pos - head)
        else:
            run[0] = self.head + (self.cap - head) + pos
        off[0] = <int32_t>target
        return 0

    cdef int kth_group(self, const int64_t* ks, int64_t* runs, int32_t* offs, Py_ssize_t g,
                       int64_t before_head) except -1:
        """kth_from() of ks[0 .. g) (g <= 16) into runs and offs, the
        descents in lockstep: their reads of each tree level overlap
        instead of each waiting for the one before."""
        cdef Py_ssize_t head = self.head & (self.cap - 1), step, k
        cdef Py_ssize_t pos[16]
        cdef int64_t target[16]
        cdef int64_t v, go, live = self.live_steps
        if not 0 <= g <= 16:
            raise SystemError(f"episode core: a group of {g} draws")
        for k in range(g):
            if ks[k] < 0 or ks[k] >= live:
                raise IndexError(f"step {ks[k]} of {live}")
            target[k] = before_head + ks[k] if ks[k] < live - before_head \
                else ks[k] - (live - before_head)
            pos[k] = 0
        step = self.cap
        while step:
            for k in range(g):
                v = self.tree[pos[k] + step]
                go = -<int64_t>(v <= target[k])
                pos[k] += step & go
                target[k] -= v & go
            step >>= 1
        for k in range(g):
            runs[k] = self.head + (pos[k] - head) if pos[k] >= head \
                else self.head + (self.cap - head) + pos[k]
            offs[k] = <int32_t>target[k]
        return 0

    # -- for the tests ------------------------------------------------------------

    def add_run(self, int64_t block, int32_t row, int32_t n, int32_t ep, int32_t ts):
        """push() (n >= 0); returns the run's sequence number."""
        if n < 0:
            raise ValueError(f"a run of {n} steps")
        return self.push(block, row, n, ep, ts)

    def kill(self, int64_t seq):
        """Run seq's episode evicted: its steps stop being live, and dead
        runs at the front leave the ring."""
        if not self.head <= seq < self.tail or self.at(seq).ep < 0:
            raise IndexError(f"no live run {seq}")
        if self.at(seq).ts >= 0:
            self.add_live(seq, -self.at(seq).n)
        self.at(seq).ep = -1
        self.drop_dead()

    def find(self, int64_t k):
        """(run, offset) of the k-th live step, by kth() and by kth_group()
        (the two must agree)."""
        cdef int64_t run
        cdef int64_t one[1]
        cdef int64_t runs[1]
        cdef int32_t off
        cdef int32_t offs[1]
        self.kth(k, &run, &off)
        one[0] = k
        self.kth_group(one, runs, offs, 1, self.before_head())
        return (run, off), (runs[0], offs[0])
