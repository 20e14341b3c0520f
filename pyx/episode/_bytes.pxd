# Little-endian unsigned integers read from any byte address of a file's
# bytes (msgpack, lz4 frames, pickles). Shifts, not a cast of the
# pointer: no alignment is assumed, the host's byte order does not matter,
# and compilers still turn each into one load.

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t


cdef inline uint16_t le16(const uint8_t* p) noexcept nogil:
    return <uint16_t>p[0] | (<uint16_t>p[1] << 8)


cdef inline uint32_t le32(const uint8_t* p) noexcept nogil:
    return <uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline uint64_t le64(const uint8_t* p) noexcept nogil:
    return <uint64_t>le32(p) | (<uint64_t>le32(p + 4) << 32)
