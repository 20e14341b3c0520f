"""RLlib's prioritized-replay bookkeeping, in C, step for step.

RLlib's `PrioritizedEpisodeReplayBuffer` keeps a sum tree and a min tree as
Python lists of numbers. Which numbers they hold matters: priorities arrive
as numpy float32 (a learner's TD errors), the buffer starts from the Python
float 1.0, and each sum, comparison and power follows the types of its
operands (numpy's NEP 50 rules: a Python number adapts to a numpy scalar's
type, so a float32 node makes its ancestors float32). A draw lands on the
step the same arithmetic finds, so the trees here carry each value's type
(`Tag`) and compute in it; the same seed then gives the same steps and
weights, bit for bit.

The trees have RLlib's layout (leaf i of `size` is node size + i), and its
queue of free leaves: the step it stores next takes the leaf RLlib's would.
Only the leftmost leaves in use are allocated (RLlib's lists cover the
capacity from the start): the nodes above them hold what RLlib's would.
Where RLlib's add() runs out of free leaves (one call bringing more steps
than the trees have leaves) it fails half done; these trees double instead.
"""
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.math cimport INFINITY, pow, powf, signbit
from libc.stdint cimport INT64_MAX, int64_t
from libc.string cimport memcpy

import numpy as np

cimport numpy as cnp
from cpython.object cimport PyObject

from episode._column cimport array_bytes
from episode._pages cimport page_alloc, page_free

cdef extern from "numpy/arrayobject.h":
    object PyArray_Scalar(void* data, cnp.PyArray_Descr* descr, PyObject* base)

cnp.import_array()

cdef object F64 = np.float64
cdef object F32 = np.float32
cdef object F64_DESCR = np.dtype(np.float64)
cdef object F32_DESCR = np.dtype(np.float32)
# The most leaves: a stored step's leaf is kept as an int32.
cdef Py_ssize_t MAX_LEAVES = 1 << 31
cdef Num ZERO = Num(0.0, TAG_FLOAT)
cdef Num INF = Num(INFINITY, TAG_FLOAT)


# -- numbers ------------------------------------------------------------------------


cdef Num num(double v, int tag) noexcept:
    cdef Num x
    x.v = v
    x.tag = tag
    return x


cdef Num to_num(object x) except *:
    """A Python float or int, numpy float64 or float32 (what RLlib's
    priorities and weights are) as a Num; TypeError for anything else."""
    cdef object t = type(x)
    if t is float:
        return num(PyFloat_AS_DOUBLE(x), TAG_FLOAT)
    if t is int or t is bool:
        return num(<double>x, TAG_INT)
    if t is F64:
        return num(<double>x, TAG_F64)
    if t is F32:
        return num(<double>x, TAG_F32)
    raise TypeError(f"a priority must be a Python or numpy float32/float64 number, "
                    f"not {t.__name__}")


cdef object from_num(Num x):
    cdef double d = x.v
    cdef float f = <float>x.v
    if x.tag == TAG_FLOAT:
        return d
    if x.tag == TAG_INT:
        return int(d)
    if x.tag == TAG_F64:
        return PyArray_Scalar(&d, <cnp.PyArray_Descr*>F64_DESCR, NULL)
    return PyArray_Scalar(&f, <cnp.PyArray_Descr*>F32_DESCR, NULL)


cdef inline int promote(Num a, Num b) noexcept:
    return promote_tags(a.tag, b.tag)


cdef inline int promote_tags(int a, int b) noexcept:
    # The type of an operation's result (NEP 50: a Python number adapts to
    # a numpy one).
    if a == TAG_F64 or b == TAG_F64:
        return TAG_F64
    if a == TAG_F32 or b == TAG_F32:
        return TAG_F32
    if a == TAG_INT and b == TAG_INT:
        return TAG_INT
    return TAG_FLOAT


cdef Num add(Num a, Num b) noexcept:
    cdef int tag = promote(a, b)
    cdef float fa, fb
    if tag == TAG_F32:
        fa = <float>a.v
        fb = <float>b.v
        return num(fa + fb, tag)
    return num(a.v + b.v, tag)


cdef Num sub(Num a, Num b) noexcept:
    cdef int tag = promote(a, b)
    cdef float fa, fb
    if tag == TAG_F32:
        fa = <float>a.v
        fb = <float>b.v
        return num(fa - fb, tag)
    return num(a.v - b.v, tag)


cdef Num mul(Num a, Num b) noexcept:
    cdef int tag = promote(a, b)
    cdef float fa, fb
    if tag == TAG_F32:
        fa = <float>a.v
        fb = <float>b.v
        return num(fa * fb, tag)
    return num(a.v * b.v, tag)


cdef Num div(Num a, Num b) except *:
    # Python's true division refuses zero; numpy's gives inf or nan.
    cdef int tag = promote(a, b)
    cdef float fa, fb
    if tag == TAG_F32:
        fa = <float>a.v
        fb = <float>b.v
        return num(fa / fb, tag)
    if b.v == 0.0 and (tag == TAG_FLOAT or tag == TAG_INT):
        raise ZeroDivisionError("float division by zero")
    return num(a.v / b.v, TAG_FLOAT if tag == TAG_INT else tag)


cdef Num power(Num a, Num b) except *:
    cdef int tag = promote(a, b)
    cdef float fa, fb
    if tag == TAG_F32:
        fa = <float>a.v
        fb = <float>b.v
        return num(powf(fa, fb), tag)
    if a.v == 0.0 and b.v < 0.0 and (tag == TAG_FLOAT or tag == TAG_INT):
        raise ZeroDivisionError("0.0 cannot be raised to a negative power")
    if tag == TAG_INT and b.v >= 0.0:
        return num(pow(a.v, b.v), TAG_INT)
    return num(pow(a.v, b.v), TAG_FLOAT if tag == TAG_INT else tag)


cdef bint greater(Num a, Num b) noexcept:
    """a > b, compared in the promoted type (NaN compares false)."""
    cdef float fa, fb
    if promote(a, b) == TAG_F32:
        fa = <float>a.v
        fb = <float>b.v
        return fa > fb
    return a.v > b.v


cdef Num smaller_of(Num a, Num b) noexcept:
    """Python's min(a, b): b if b < a, else a (the object itself)."""
    return b if greater(a, b) else a


# -- the trees ------------------------------------------------------------------------



# A node waiting in propagate()'s list of the next level (a bit of its sum
# tree type byte, which is clear everywhere else).
cdef unsigned char QUEUED = 0x80


cdef inline void combine(double* sum_v, unsigned char* sum_t, double* min_v,
                         unsigned char* min_t, Py_ssize_t node) noexcept:
    # RLlib's parent update, add() and smaller_of() on the two children:
    # sum = left + right, min = min(left, right) (the right one only where
    # it is smaller), each in the children's promoted type.
    cdef Py_ssize_t left = 2 * node, right = 2 * node + 1
    cdef int tag = promote_tags(sum_t[left], sum_t[right])
    cdef bint right_smaller
    if tag == TAG_F32:
        sum_v[node] = <float>sum_v[left] + <float>sum_v[right]
    else:
        sum_v[node] = sum_v[left] + sum_v[right]
    sum_t[node] = <unsigned char>tag
    if promote_tags(min_t[left], min_t[right]) == TAG_F32:
        right_smaller = <float>min_v[right] < <float>min_v[left]
    else:
        right_smaller = min_v[right] < min_v[left]
    if right_smaller:
        min_v[node] = min_v[right]
        min_t[node] = min_t[right]
    else:
        min_v[node] = min_v[left]
        min_t[node] = min_t[left]


cdef class PriorityTrees:
    """RLlib's sum and min segment trees of `size` leaves with their free
    queue; a leaf in use holds a stored step's key (see the module docstring)."""

    def __cinit__(self, Py_ssize_t size):
        if size < 1 or size & (size - 1):
            raise AssertionError("Capacity must be positive and a power of 2!")
        if size > MAX_LEAVES:
            raise MemoryError(f"priority trees of {size} leaves")
        self.size = size
        self.max_leaf = 0
        self._grow(0)

    def __dealloc__(self):
        page_free(self.sum_v)       # (the trees' one allocation: see _grow)
        page_free(self.queue)

    cdef int _grow(self, Py_ssize_t leaf) except -1:
        # Allocates the leaves up to `leaf` (doubling): the old subtree
        # becomes the leftmost part of the new one, the rest is neutral.
        cdef Py_ssize_t old = self.alloc, new = self.alloc if self.alloc else 1
        cdef Py_ssize_t levels = 0, width, node, j
        while new <= leaf:
            new *= 2
            levels += 1
        if new > self.size:
            raise IndexError(f"leaf {leaf} is outside a tree of {self.size} leaves")
        if old and levels == 0:
            return 0
        # One allocation for the five arrays, the widest values first: it
        # lives as long as the buffer, on pages of its own (see _pages).
        cdef double* sum_v = <double*>page_alloc(new * (2 * sizeof(double) * 2 +
                                                        sizeof(int64_t) + 2 * 2))
        cdef double* min_v = sum_v + 2 * new
        cdef int64_t* owner = <int64_t*>(min_v + 2 * new)
        cdef unsigned char* sum_t = <unsigned char*>(owner + new)
        cdef unsigned char* min_t = sum_t + 2 * new
        for j in range(2 * new):
            sum_v[j] = 0.0
            sum_t[j] = TAG_FLOAT
            min_v[j] = INFINITY
            min_t[j] = TAG_FLOAT
        for j in range(new):
            owner[j] = -1
        if old:
            # Old level e (nodes 2^e .. 2^(e+1) - 1) is level e + levels now.
            width = 1
            while width <= old:
                node = width << levels
                memcpy(sum_v + node, self.sum_v + width, width * sizeof(double))
                memcpy(sum_t + node, self.sum_t + width, width)
                memcpy(min_v + node, self.min_v + width, width * sizeof(double))
                memcpy(min_t + node, self.min_t + width, width)
                width *= 2
            memcpy(owner, self.owner, old * sizeof(int64_t))
            # The new nodes above the old root, left to right neutral.
            node = 1 << levels
            while node > 1:
                node //= 2
                combine(sum_v, sum_t, min_v, min_t, node)
        page_free(self.sum_v)
        self.sum_v = sum_v
        self.sum_t = sum_t
        self.min_v = min_v
        self.min_t = min_t
        self.owner = owner
        self.alloc = new
        return 0

    # -- leaves ------------------------------------------------------------------

    cdef int set_leaf(self, int64_t leaf, Num value) except -1:
        """Both trees' leaf = value (RLlib's `tree[idx] = value` on each)."""
        self._set(leaf, value, value)
        return 0

    cdef int _set(self, int64_t leaf, Num s, Num m) except -1:
        self._set_raw(leaf, s, m)
        self.propagate(&leaf, 1)
        return 0

    cdef Num leaf_sum(self, int64_t leaf) noexcept:
        if 0 <= leaf < self.alloc:
            return num(self.sum_v[self.alloc + leaf], self.sum_t[self.alloc + leaf])
        return ZERO

    cdef int64_t take(self, Num value, int64_t key) except -1:
        """RLlib's _get_free_node_and_assign: the next free leaf (the queue's
        front), set to `value` in both trees, standing for `key`."""
        cdef int64_t leaf = self.take_leaf(value, key)
        self.propagate(&leaf, 1)
        return leaf

    cdef int64_t take_leaf(self, Num value, int64_t key) except -1:
        # take() without updating the leaf's ancestors (propagate() does).
        cdef int64_t leaf
        if self.queue_len:
            leaf = self.queue[self.queue_head]
            self.queue_head = (self.queue_head + 1) % self.queue_cap
            self.queue_len -= 1
        else:
            if self.fresh == self.size:
                # Every leaf in use: twice the leaves, the new ones fresh
                # (the allocated subtree and its values stay as they are).
                if self.size == MAX_LEAVES:
                    raise MemoryError(f"priority trees of more than {MAX_LEAVES} leaves")
                self.size *= 2
            leaf = self.fresh
            self.fresh += 1
        if leaf > self.max_leaf:
            self.max_leaf = leaf
        self._set_raw(leaf, value, value)
        self.owner[leaf] = key
        return leaf

    cdef int release(self, int64_t leaf) except -1:
        """What RLlib does with the leaf of an evicted step: back to the
        queue's front, neutral values."""
        self.release_leaf(leaf)
        self.propagate(&leaf, 1)
        return 0

    cdef int release_leaf(self, int64_t leaf) except -1:
        # release() without updating the leaf's ancestors (propagate() does).
        if leaf < 0 or leaf >= self.alloc or self.owner[leaf] < 0:
            raise AssertionError(f"tree leaf {leaf} is not in use")
        self._reserve_queue()
        self.queue_head = (self.queue_head - 1 + self.queue_cap) % self.queue_cap
        self.queue[self.queue_head] = leaf
        self.queue_len += 1
        if self.max_leaf == leaf:
            self.max_leaf -= 1
        self._set_raw(leaf, ZERO, INF)
        self.owner[leaf] = -1
        return 0

    cdef int _set_raw(self, int64_t leaf, Num s, Num m) except -1:
        # The leaf's values alone (its ancestors are recomputed later).
        cdef Py_ssize_t node
        if leaf < 0 or leaf >= self.size:
            raise AssertionError(f"idx={leaf} capacity={self.size}")
        if leaf >= self.alloc:
            self._grow(leaf)
        node = self.alloc + leaf
        self.sum_v[node] = s.v
        self.sum_t[node] = s.tag
        self.min_v[node] = m.v
        self.min_t[node] = m.tag
        return 0

    cdef int propagate(self, int64_t* leaves, Py_ssize_t n) except -1:
        """Recomputes the ancestors of `leaves` (after take_leaf(),
        release_leaf() or _set_raw()), level by level, each node once: a
        node's values depend on its children only, so the trees end as
        RLlib's step-by-step updates leave them."""
        cdef Py_ssize_t i, m = 0, k, node
        cdef int64_t* nodes
        if self.alloc == 1:
            return 0         # the one allocated leaf is the subtree's root
        if n <= 2:
            for i in range(n):
                node = (self.alloc + leaves[i]) // 2
                while node >= 1:
                    combine(self.sum_v, self.sum_t, self.min_v, self.min_t, node)
                    node //= 2
            return 0
        nodes = <int64_t*>PyMem_Malloc(n * sizeof(int64_t))
        if nodes == NULL:
            raise MemoryError()
        # The leaves' parents, each once (QUEUED marks the listed ones); then
        # per level: each listed node from its children, and their parents.
        for i in range(n):
            node = (self.alloc + leaves[i]) // 2
            if not self.sum_t[node] & QUEUED:
                self.sum_t[node] |= QUEUED
                nodes[m] = node
                m += 1
        while m:
            for i in range(m):
                combine(self.sum_v, self.sum_t, self.min_v, self.min_t, nodes[i])
            k = 0
            for i in range(m):
                node = nodes[i] // 2
                if node >= 1 and not self.sum_t[node] & QUEUED:
                    self.sum_t[node] |= QUEUED
                    nodes[k] = node
                    k += 1
            m = k
        PyMem_Free(nodes)
        return 0

    cdef int _reserve_queue(self) except -1:
        # Room for one more queued leaf.
        cdef int64_t* grown
        cdef Py_ssize_t i, cap = 2 * self.queue_cap + 16
        if self.queue_len < self.queue_cap:
            return 0
        grown = <int64_t*>page_alloc(cap * sizeof(int64_t))
        for i in range(self.queue_len):
            grown[i] = self.queue[(self.queue_head + i) % self.queue_cap]
        page_free(self.queue)
        self.queue = grown
        self.queue_cap = cap
        self.queue_head = 0
        return 0

    # -- RLlib's reductions ----------------------------------------------------------

    cdef Num _root(self, bint of_sum) noexcept:
        # RLlib's value[1]: the allocated subtree's root, passed up through
        # the nodes above it (each op(it, neutral)).
        cdef Num r
        if of_sum:
            r = num(self.sum_v[1], self.sum_t[1])
            return add(r, ZERO) if self.alloc < self.size else r
        r = num(self.min_v[1], self.min_t[1])
        return smaller_of(r, INF) if self.alloc < self.size else r

    cdef Num total(self) noexcept:
        """RLlib's SumSegmentTree.sum(): 0.0 + value[1]."""
        return add(ZERO, self._root(True))

    cdef Num minimum(self) noexcept:
        """RLlib's MinSegmentTree.min(): min(inf, value[1])."""
        return smaller_of(INF, self._root(False))

    cdef int64_t find(self, Num prefixsum) except -2:
        """RLlib's find_prefixsum_idx, on the same numbers (the logical tree
        walked through the part that is allocated)."""
        cdef Num bound = add(self.total(), num(1e-05, TAG_FLOAT))
        cdef Num root = self._root(True), left
        cdef Py_ssize_t node = 1, local = 0, depth = 0, top = 0, width = self.alloc
        cdef int where = 0          # 0: above the subtree, 1: in it, 2: outside
        if not (not greater(num(0.0, TAG_INT), prefixsum) and not greater(prefixsum, bound)
                and prefixsum.v == prefixsum.v):
            raise AssertionError(f"prefixsum {prefixsum.v} outside [0, {bound.v}]")
        if not greater(root, prefixsum):
            prefixsum = sub(root, num(1e-05, TAG_FLOAT))
        # Levels above the allocated subtree.
        while (self.size >> top) > self.alloc:
            top += 1
        if top == 0:
            where = 1
            local = 1
        while node < self.size:
            if where == 0:
                # The left child is the allocated root (or another node
                # above it); the right child's subtree is empty.
                left = add(num(self.sum_v[1], self.sum_t[1]), ZERO) if depth + 1 < top \
                    else num(self.sum_v[1], self.sum_t[1])
            elif where == 1:
                left = num(self.sum_v[2 * local], self.sum_t[2 * local])
            else:
                left = ZERO
            if greater(left, prefixsum):
                node = 2 * node
                if where == 1:
                    local = 2 * local
                elif where == 0 and depth + 1 == top:
                    where = 1
                    local = 1
            else:
                prefixsum = sub(prefixsum, left)
                node = 2 * node + 1
                if where == 1:
                    local = 2 * local + 1
                else:
                    where = 2
            depth += 1
        return node - self.size

    # -- Python's view (the replay layer's priority updates, the tests) ----------

    @property
    def max_idx(self):
        """RLlib's _max_idx (it goes up with each leaf taken above it, and
        down by one when the leaf at it is released)."""
        return self.max_leaf

    @max_idx.setter
    def max_idx(self, value):
        self.max_leaf = value

    def assign(self, value, key):
        """take(): the next free leaf set to `value`, standing for `key`."""
        return self.take(to_num(value), key)

    def free(self, leaf):
        """release(leaf)."""
        self.release(leaf)

    def update(self, leaf, value):
        """Both trees' `leaf` = `value` (RLlib's update_priorities step)."""
        self.set_leaf(leaf, to_num(value))

    def update_many(self, leaves, values):
        """Both trees' leaves[i] = values[i] (RLlib's update_priorities
        loop), skipping a leaf of -1 (a step no longer stored). Every leaf
        and value is checked before any is set: ValueError for a leaf not in
        use or a value that is negative, NaN or infinite, TypeError for one
        that is no number of RLlib's types."""
        cdef Py_ssize_t i, m = 0, n = len(leaves)
        cdef int64_t leaf
        cdef Num* nums
        cdef int64_t* used
        if len(values) != n:
            raise ValueError(f"{len(values)} values for {n} leaves")
        nums = <Num*>PyMem_Malloc((n if n else 1) * sizeof(Num))
        used = <int64_t*>PyMem_Malloc((n if n else 1) * sizeof(int64_t))
        try:
            if nums == NULL or used == NULL:
                raise MemoryError()
            for i in range(n):
                leaf = leaves[i]
                if leaf == -1:
                    continue
                if not (0 <= leaf < self.alloc and self.owner[leaf] >= 0):
                    raise ValueError(f"tree leaf {leaf} is not in use")
                nums[m] = to_num(values[i])
                if not 0.0 <= nums[m].v < INFINITY:
                    raise ValueError(f"a priority must be finite and >= 0, not {values[i]}")
                used[m] = leaf
                m += 1
            for i in range(m):
                self._set_raw(used[i], nums[i], nums[i])
            self.propagate(used, m)
        finally:
            PyMem_Free(nums)
            PyMem_Free(used)

    def keys_of(self, leaves):
        """The key of the step at each leaf (-1: free)."""
        return [self.key_of(leaf) for leaf in leaves]

    def sum(self):
        """RLlib's SumSegmentTree.sum(), as its object."""
        return from_num(self.total())

    def min(self):
        """RLlib's MinSegmentTree.min(), as its object."""
        return from_num(self.minimum())

    def find_prefixsum_idx(self, prefixsum):
        """RLlib's SumSegmentTree.find_prefixsum_idx(prefixsum)."""
        return self.find(to_num(prefixsum))

    def key(self, Py_ssize_t leaf):
        """The key of the step at `leaf` (-1: free)."""
        return self.key_of(leaf)

    # -- state ------------------------------------------------------------------

    def sum_values(self):
        """RLlib's SumSegmentTree.get_state(): every node's value."""
        return self._values(True)

    def min_values(self):
        """RLlib's MinSegmentTree.get_state()."""
        return self._values(False)

    cdef list _values(self, bint of_sum):
        cdef list out = [0.0 if of_sum else float("inf")] * (2 * self.size)
        cdef Py_ssize_t width = 1, node, j, top = 0
        cdef Num root = self._root(of_sum)
        cdef double* v = self.sum_v if of_sum else self.min_v
        cdef unsigned char* t = self.sum_t if of_sum else self.min_t
        while (self.size >> top) > self.alloc:
            out[1 << top] = from_num(root)
            top += 1
        while width <= self.alloc:
            node = width << top
            for j in range(width):
                out[node + j] = from_num(num(v[width + j], t[width + j]))
            width *= 2
        return out

    def free_nodes(self):
        """RLlib's _free_nodes deque, as a list."""
        cdef Py_ssize_t i
        out = [self.queue[(self.queue_head + i) % self.queue_cap] for i in range(self.queue_len)]
        out.extend(range(self.fresh, self.size))
        return out

    def leaf_value(self, Py_ssize_t leaf):
        """Both trees' leaf, as RLlib's objects."""
        if leaf < 0 or leaf >= self.size:
            raise IndexError(leaf)
        if leaf >= self.alloc:
            return 0.0, float("inf")
        return (from_num(num(self.sum_v[self.alloc + leaf], self.sum_t[self.alloc + leaf])),
                from_num(num(self.min_v[self.alloc + leaf], self.min_t[self.alloc + leaf])))

    def used_leaves(self):
        """The leaves that stand for a stored step, with their keys."""
        cdef Py_ssize_t j
        return [(j, self.owner[j]) for j in range(self.alloc) if self.owner[j] >= 0]

    def restore(self, sum_values, min_values, free_nodes, max_idx, list assigned):
        """Loads RLlib's state of the trees (`assigned`: (leaf, key) for each
        stored step). Checked first: consistent or refused with ValueError,
        this object unchanged. The state may be of trees that doubled."""
        cdef Py_ssize_t n, size, j, leaf
        cdef PriorityTrees fresh
        cdef Num s, m
        if not isinstance(sum_values, list) or not isinstance(min_values, list) \
                or len(sum_values) != len(min_values):
            raise ValueError("the segment trees' states must be two lists of a length")
        n = len(sum_values)
        size = n // 2
        if n % 2 or size < self.size or size & (size - 1) or size > MAX_LEAVES:
            raise ValueError(f"the segment trees' states must be lists of {2 * self.size} "
                             f"values (or twice, four times ... as many), not {n}")
        fresh = PriorityTrees(size)
        queue = list(free_nodes)
        used = {}
        for leaf, key in assigned:
            if not 0 <= leaf < size or leaf in used:
                raise ValueError(f"tree leaf {leaf} is out of range or used twice")
            used[leaf] = key
        if any(type(x) is not int or not 0 <= x < size for x in queue) \
                or len(set(queue)) != len(queue) or set(queue) & used.keys() \
                or len(queue) + len(used) != size:
            raise ValueError("the free nodes and the stored steps' tree leaves must split "
                             "the tree's leaves between them")
        # The leaves' values; every other node is recomputed from them (as
        # RLlib's updates compute it).
        values = []
        for j in range(size):
            s = to_num(sum_values[size + j])
            m = to_num(min_values[size + j])
            if j in used:
                if s.v != m.v or s.tag != m.tag or not s.v >= 0.0:
                    raise ValueError(f"tree leaf {j} holds inconsistent priorities")
                values.append((j, s.v, s.tag))
            elif not (s.v == 0.0 and m.v == INFINITY):
                raise ValueError(f"free tree leaf {j} holds a priority")
        # A tail of the queue counting up to the last leaf stays implicit.
        tail = len(queue)
        while tail and queue[tail - 1] == size - (len(queue) - tail) - 1:
            tail -= 1
        for leaf in queue[:tail]:
            fresh._push_back(leaf)
        fresh.fresh = size - (len(queue) - tail)
        for j, v, tag in values:
            s = num(v, tag)
            fresh._set(j, s, s)
            fresh.owner[j] = used[j]
        if type(max_idx) is not int:
            raise ValueError(f"_max_idx must be an int, not {type(max_idx).__name__}")
        fresh.max_leaf = max_idx
        self._take_over(fresh)

    cdef int _push_back(self, int64_t leaf) except -1:
        # The queue's back (restoring its order).
        self._reserve_queue()
        self.queue[(self.queue_head + self.queue_len) % self.queue_cap] = leaf
        self.queue_len += 1
        return 0

    cdef int _take_over(self, PriorityTrees other) except -1:
        # Swaps storage with `other` (which then frees ours).
        self.sum_v, other.sum_v = other.sum_v, self.sum_v
        self.sum_t, other.sum_t = other.sum_t, self.sum_t
        self.min_v, other.min_v = other.min_v, self.min_v
        self.min_t, other.min_t = other.min_t, self.min_t
        self.owner, other.owner = other.owner, self.owner
        self.queue, other.queue = other.queue, self.queue
        self.alloc, other.alloc = other.alloc, self.alloc
        self.queue_cap, other.queue_cap = other.queue_cap, self.queue_cap
        self.queue_head, other.queue_head = other.queue_head, self.queue_head
        self.queue_len, other.queue_len = other.queue_len, self.queue_len
        self.fresh, other.fresh = other.fresh, self.fresh
        self.size, other.size = other.size, self.size
        self.max_leaf = other.max_leaf
        return 0


# -- checkpoints: the node values and free leaves, packed -------------------------------
#
# A checkpoint holds RLlib's lists: every node value of both trees and every
# free leaf, about 4 million numbers at capacity 1M even with no step stored.
# Packed, a list keeps only the values that are not the tree's neutral one
# (with their types) and the free leaves as runs of consecutive ones. The
# length a list unpacks to is kept twice: one damaged copy (a flipped byte
# in a pickle) is refused before a list of that length is made.

# The longest list unpacked: two nodes per leaf of the largest trees.
cdef Py_ssize_t MAX_NODES = 2 * MAX_LEAVES


cdef inline bint is_neutral(object x, double neutral) noexcept:
    # The Python float `neutral` itself (0.0 but not -0.0; inf).
    cdef double v
    if type(x) is not float:
        return False
    v = PyFloat_AS_DOUBLE(x)
    return v == neutral and (v != 0.0 or not signbit(v))


def pack_values(object node_values, double neutral):
    """(positions, values, tags) of the entries of `node_values` (a list of
    a segment tree's node values) that are not the Python float `neutral`:
    int64 positions, their float64 values and their types (uint8 `Tag`s);
    None where an entry is no number of RLlib's types (a Python float or
    int, numpy float64 or float32) or an int a float64 cannot hold."""
    if not isinstance(node_values, list):
        raise TypeError(f"node values are a list, not {type(node_values).__name__}")
    cdef list values = <list>node_values     # (a list subclass's items too)
    cdef Py_ssize_t i, k = 0, n = len(values)
    cdef object x, t
    for i in range(n):
        if not is_neutral(values[i], neutral):
            k += 1
    cdef cnp.ndarray positions = np.empty(k, np.int64)
    cdef cnp.ndarray numbers = np.empty(k, np.float64)
    cdef cnp.ndarray tags = np.empty(k, np.uint8)
    cdef int64_t* pp = <int64_t*>array_bytes(positions, k * sizeof(int64_t))
    cdef double* vp = <double*>array_bytes(numbers, k * sizeof(double))
    cdef unsigned char* tp = <unsigned char*>array_bytes(tags, k)
    cdef Num value
    k = 0
    for i in range(n):
        x = values[i]
        if is_neutral(x, neutral):
            continue
        t = type(x)
        if t is bool:
            return None
        if t is int and not -(1 << 53) <= x <= (1 << 53):
            return None
        try:
            value = to_num(x)
        except TypeError:
            return None
        if k >= positions.shape[0]:
            return None          # (the list grew while it was read)
        pp[k] = i
        vp[k] = value.v
        tp[k] = <unsigned char>value.tag
        k += 1
    if k != positions.shape[0]:
        return None
    return positions, numbers, tags


def unpack_values(Py_ssize_t n, Py_ssize_t n_again, double neutral, positions, numbers,
                  tags):
    """pack_values()' list of `n` entries back, each number of its type.
    Checked first (ValueError): n == n_again, in 0 .. 2**32, positions
    increasing within it, a known type per value and a value that type can
    hold."""
    cdef cnp.ndarray p = _packed_array(positions, "iu", np.int64)
    cdef cnp.ndarray v = _packed_array(numbers, "f", np.float64)
    cdef cnp.ndarray t = _packed_array(tags, "u", np.uint8)
    cdef Py_ssize_t i, k
    cdef int64_t last = -1
    cdef const int64_t* pp
    cdef const double* vp
    cdef const unsigned char* tp
    if n != n_again or not 0 <= n <= MAX_NODES:
        raise ValueError(f"a packed tree of {n} (or {n_again}) nodes (at most {MAX_NODES})")
    if p.ndim != 1 or v.ndim != 1 or t.ndim != 1 or not \
            p.shape[0] == v.shape[0] == t.shape[0]:
        raise ValueError("a packed tree's positions, values and types must be 1-d arrays of "
                         "one length")
    k = p.shape[0]
    pp = <const int64_t*>array_bytes(p, k * sizeof(int64_t))
    vp = <const double*>array_bytes(v, k * sizeof(double))
    tp = <const unsigned char*>array_bytes(t, k)
    for i in range(k):
        if not last < pp[i] < n:
            raise ValueError(f"a packed tree's position {pp[i]} is out of order or range")
        last = pp[i]
        if tp[i] > TAG_F32 or (tp[i] == TAG_F32 and <double><float>vp[i] != vp[i]
                               and vp[i] == vp[i]) \
                or (tp[i] == TAG_INT and not (-9007199254740992.0 <= vp[i]
                                              <= 9007199254740992.0
                                              and vp[i] == <double><int64_t>vp[i])):
            raise ValueError(f"a packed tree's value {vp[i]} of type {tp[i]} at {pp[i]}")
    cdef list out = [neutral] * n
    for i in range(k):
        out[pp[i]] = from_num(num(vp[i], tp[i]))
    return out


cdef cnp.ndarray _packed_array(object x, str kinds, object dtype):
    # A packed checkpoint's array, of the kind packing makes (ValueError
    # for another: a float array is not cut to ints), contiguous in `dtype`.
    cdef cnp.ndarray a = np.asarray(x)
    if a.dtype.kind not in kinds or (a.dtype.kind == "u" and a.size and a.max() > INT64_MAX):
        raise ValueError(f"a packed checkpoint's array of {a.dtype}, not of kind {kinds!r}")
    return np.ascontiguousarray(a, dtype=dtype)


def pack_runs(items):
    """Free leaves (ints) as runs of consecutive ones: (starts, lengths),
    int64 arrays; None where an entry is no int of int64's range."""
    cdef list starts = [], lengths = []
    cdef object x
    cdef int64_t value, start = 0, length = 0
    for x in items:
        if type(x) is not int or not -(1 << 63) <= x < (1 << 63):
            return None
        value = x
        if length and value == start + length and start + length > start:
            length += 1
            continue
        if length:
            starts.append(start)
            lengths.append(length)
        start, length = value, 1
    if length:
        starts.append(start)
        lengths.append(length)
    return np.array(starts, np.int64), np.array(lengths, np.int64)


def unpack_runs(Py_ssize_t n, Py_ssize_t n_again, starts, lengths):
    """pack_runs()' list of `n` leaves back. Checked first (ValueError):
    n == n_again, 1-d arrays of a length, lengths >= 1 adding up to n (at
    most 2**32), no run past int64."""
    cdef cnp.ndarray s = _packed_array(starts, "iu", np.int64)
    cdef cnp.ndarray l = _packed_array(lengths, "iu", np.int64)
    cdef Py_ssize_t i, k, total = 0
    cdef const int64_t* sp
    cdef const int64_t* lp
    if n != n_again or not 0 <= n <= MAX_NODES:
        raise ValueError(f"{n} (or {n_again}) packed free leaves (at most {MAX_NODES})")
    if s.ndim != 1 or l.ndim != 1 or s.shape[0] != l.shape[0]:
        raise ValueError("packed free leaves' starts and lengths must be 1-d arrays of one "
                         "length")
    k = s.shape[0]
    sp = <const int64_t*>array_bytes(s, k * sizeof(int64_t))
    lp = <const int64_t*>array_bytes(l, k * sizeof(int64_t))
    for i in range(k):
        if not 1 <= lp[i] <= n - total or sp[i] > INT64_MAX - lp[i]:
            raise ValueError(f"a packed run of {lp[i]} free leaves from {sp[i]}")
        total += lp[i]
    if total != n:
        raise ValueError(f"packed runs of {total} free leaves, not {n}")
    cdef list out = []
    for i in range(k):
        out.extend(range(sp[i], sp[i] + lp[i]))
    return out
