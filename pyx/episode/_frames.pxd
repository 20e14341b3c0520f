# Frame-stacked observation rows stored once per frame: a FIFO pool of
# frames, and each row as the numbers of its frames.
cimport cython
cimport numpy as cnp
from libc.stdint cimport int64_t


@cython.final
cdef class FramePool:
    # A stacked row is `outer` x `stack` x `inner` bytes (the stack axis cut
    # into `stack` frames); frame j of it is the `outer` pieces of `inner`
    # bytes at (o * stack + j) * inner. Frames are numbered in the order they
    # were written and kept in chunks of 1 << chunk_shift frames.
    cdef readonly Py_ssize_t stack       # frames per row
    cdef readonly Py_ssize_t axis        # the row's stack axis (>= 0)
    cdef Py_ssize_t outer, inner         # see above
    cdef readonly Py_ssize_t frame_bytes
    cdef readonly Py_ssize_t row_bytes
    cdef object storage                  # None: chunks in memory; else their files' folder
    cdef int chunk_shift
    cdef list chunks                     # ndarray per chunk, oldest first
    cdef char** chunk_data               # each chunk's first byte
    cdef Py_ssize_t chunk_cap            # room in chunk_data
    cdef readonly int64_t first_chunk    # chunks[0]'s number
    cdef readonly int64_t tail           # the next frame's number
    cdef readonly int64_t head           # the first frame written into the held chunks
    cdef int64_t* last                   # the frame numbers of the last row written
    cdef bint has_last                   # False: the next row follows no row

    cdef char* frame(self, int64_t f) except NULL
    cdef int assemble(self, char* dst, const int64_t* refs) except -1
    cdef int assemble_rows(self, char** dsts, int64_t** refs, Py_ssize_t n) except -1
    cdef int write_row(self, int64_t* refs, const char* row) except -1
    cdef int follow(self, const int64_t* refs) noexcept
    cdef int release_before(self, int64_t f) except -1
    cdef int64_t _append(self, const char* row, Py_ssize_t j) except -1
    cdef cnp.ndarray _new_chunk(self)
    cdef int _drop_pages(self, Py_ssize_t c) except -1
