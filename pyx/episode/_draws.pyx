"""Random draws as a numpy Generator makes them: integers(low, high) and
random() from the Generator's own bit generator, the same numbers from the
same bits, without a Python call per draw (RLlib's buffers draw through a
Generator; ours must land on the same steps)."""
import numpy as np

cimport cython
from cpython.pycapsule cimport PyCapsule_GetPointer
from libc.stdint cimport uint32_t, uint64_t

cdef extern from *:
    """
    #if defined(__SIZEOF_INT128__)
    static inline uint64_t episode_mulhi64(uint64_t a, uint64_t b, uint64_t* lo) {
        __uint128_t m = (__uint128_t)a * b;
        *lo = (uint64_t)m;
        return (uint64_t)(m >> 64);
    }
    #else
    static inline uint64_t episode_mulhi64(uint64_t a, uint64_t b, uint64_t* lo) {
        uint64_t a_lo = (uint32_t)a, a_hi = a >> 32, b_lo = (uint32_t)b, b_hi = b >> 32;
        uint64_t p0 = a_lo * b_lo, p1 = a_lo * b_hi, p2 = a_hi * b_lo, p3 = a_hi * b_hi;
        uint64_t mid = (p0 >> 32) + (uint32_t)p1 + (uint32_t)p2;
        *lo = (mid << 32) | (uint32_t)p0;
        return p3 + (p1 >> 32) + (p2 >> 32) + (mid >> 32);
    }
    #endif
    """
    uint64_t mulhi64 "episode_mulhi64"(uint64_t a, uint64_t b, uint64_t* lo) noexcept

cdef object Generator = np.random.Generator
# (Typed: a literal this large would be a Python int, and every comparison
# with it a Python call.)
cdef uint64_t U32_MAX = 0xFFFFFFFFu
cdef uint64_t U64_MAX = 0xFFFFFFFFFFFFFFFFu


@cython.final
cdef class Draws:
    """Draws from `rng` (a numpy Generator) as its integers(low, high) and
    random() do: the same values from the same bits."""

    def __cinit__(self, rng):
        if not isinstance(rng, Generator):
            raise TypeError(f"the buffer's rng must be a numpy Generator "
                            f"(np.random.default_rng()), not {type(rng).__name__}")
        self.bit_generator = rng.bit_generator
        self.lock = self.bit_generator.lock
        self.state = <bitgen_t*>PyCapsule_GetPointer(self.bit_generator.capsule, "BitGenerator")

    def __enter__(self):
        self.lock.acquire()
        return self

    def __exit__(self, *exc):
        self.lock.release()

    cdef int64_t integers(self, int64_t low, int64_t high) except? -1:
        """Generator.integers(low, high): numpy's Lemire draw on [low, high)."""
        cdef uint64_t rng, m, threshold, lo
        cdef uint32_t rng32, excl32, leftover32
        cdef uint64_t m32
        if high <= low:
            raise ValueError("low >= high" if low else "high <= 0")
        rng = <uint64_t>(high - 1) - <uint64_t>low
        if rng == 0:
            return low
        if rng <= U32_MAX:
            if rng == U32_MAX:
                return <int64_t>(<uint64_t>low + self.state.next_uint32(self.state.state))
            rng32 = <uint32_t>rng
            excl32 = rng32 + 1
            m32 = <uint64_t>self.state.next_uint32(self.state.state) * excl32
            leftover32 = <uint32_t>m32
            if leftover32 < excl32:
                threshold = (U32_MAX - rng32) % excl32
                while leftover32 < threshold:
                    m32 = <uint64_t>self.state.next_uint32(self.state.state) * excl32
                    leftover32 = <uint32_t>m32
            return <int64_t>(<uint64_t>low + (m32 >> 32))
        if rng == U64_MAX:
            return <int64_t>(<uint64_t>low + self.state.next_uint64(self.state.state))
        m = mulhi64(self.state.next_uint64(self.state.state), rng + 1, &lo)
        if lo < rng + 1:
            threshold = (U64_MAX - rng) % (rng + 1)
            while lo < threshold:
                m = mulhi64(self.state.next_uint64(self.state.state), rng + 1, &lo)
        return <int64_t>(<uint64_t>low + m)   # (unsigned: numpy's wrap-around)

    def draw_integers(self, int64_t low, int64_t high):
        """integers(low, high), for the tests."""
        with self:
            return self.integers(low, high)

    def draw_random(self):
        """random(), for the tests."""
        with self:
            return self.random()
