# Draws from a numpy Generator's bit generator, as Generator.integers() and
# Generator.random() draw: same numbers, same bits consumed.
cimport cython
from libc.stdint cimport int64_t
from numpy.random cimport bitgen_t


@cython.final
cdef class Draws:
    cdef object bit_generator
    cdef object lock
    cdef bitgen_t* state
    cdef int64_t integers(self, int64_t low, int64_t high) except? -1

    cdef inline double random(self) noexcept:
        # Generator.random() (inline: the draw loops call it per draw).
        return self.state.next_double(self.state.state)
