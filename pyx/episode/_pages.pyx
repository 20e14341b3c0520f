"""Arrays on pages of their own, for the storage a replay buffer keeps.

glibc's malloc serves a request below its mmap threshold from its heap, and
the threshold rises to the size of the largest block freed (up to 32 MB). A
buffer filled with episodes of tens of MB each (a 1,000-step Atari episode's
observations) has that threshold raised by the first one; the buffer's
blocks and frame chunks then come from the heap among the episodes' freed
arrays, and the holes between them stay resident: about 1-2 MB per episode
added. Mapped directly, a store's memory is its own pages, untouched ones
are not resident, and freeing an array returns them. (The pages are
reported to tracemalloc, as numpy reports its arrays.)
"""
import mmap
import os
import tempfile

import numpy as np

cimport cython
from cpython.buffer cimport PyBuffer_FillInfo
from libc.stdint cimport uintptr_t
from posix.mman cimport (MAP_ANONYMOUS, MAP_FAILED, MAP_PRIVATE, PROT_READ, PROT_WRITE,
                         mmap as map_memory, munmap)

cdef extern from "Python.h":
    int PyTraceMalloc_Track(unsigned int domain, uintptr_t ptr, size_t size)
    int PyTraceMalloc_Untrack(unsigned int domain, uintptr_t ptr)

# The tracemalloc domain of the pages ("epis").
cdef unsigned int TRACE_DOMAIN = 0x65706973

# Arrays in memory of this many bytes or more are mapped: glibc's own mmap
# threshold before anything raises it. Smaller ones come from malloc (a
# mapping each would cost a system call and fresh pages for the small
# blocks a buffer of small rows grows through).
cdef Py_ssize_t PAGES_FROM = 128 << 10

# page_alloc()'s header before the memory it hands out: the mapping's length
# (a cache line, so that the memory stays as aligned as malloc's).
cdef size_t HEADER = 64


cdef object new_array(tuple shape, object dtype, object folder):
    """A zeroed, writable array of `shape` and `dtype`: in memory (`folder`
    None; mapped from PAGES_FROM bytes on), or in a file of `folder` whose name no other store has (the
    file is unlinked at once: the mapping keeps its data, and the file goes
    when the array does)."""
    if folder is None:
        # (In Python ints: a size past Py_ssize_t is an OverflowError.)
        nbytes = np.dtype(dtype).itemsize
        for n in shape:
            nbytes *= n
        if nbytes < PAGES_FROM:
            return np.zeros(shape, dtype)
        return np.ndarray(shape, dtype, buffer=Pages(nbytes))
    fd, path = tempfile.mkstemp(prefix=".scratch-", suffix=".bin", dir=folder)
    try:
        with os.fdopen(fd, "w+b") as f:
            return np.memmap(f, dtype=dtype, mode="w+", shape=shape)
    finally:
        os.unlink(path)


cdef int drop_pages(object array) except -1:
    """A file-backed array's pages out of the resident set (madvise
    MADV_DONTNEED on its shared mapping: the data stay in the file and are
    read back when touched). Anything else is left alone: dropping the pages
    of an anonymous mapping would zero them."""
    owner = array
    while owner is not None and getattr(owner, "_mmap", None) is None:
        owner = getattr(owner, "base", None)
    if owner is not None:
        owner._mmap.madvise(mmap.MADV_DONTNEED)
    return 0


cdef void* page_alloc(size_t nbytes) except NULL:
    """`nbytes` of zeroed memory on pages of their own (page_free() returns
    them): PyMem_Malloc for the arrays a store grows."""
    cdef size_t length = nbytes + HEADER
    cdef void* p
    if nbytes > (<size_t>-1) - HEADER:
        raise MemoryError()
    p = map_memory(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    if p == MAP_FAILED:
        raise MemoryError()
    (<size_t*>p)[0] = length
    PyTraceMalloc_Track(TRACE_DOMAIN, <uintptr_t>p, length)
    return <char*>p + HEADER


cdef void page_free(void* p) noexcept:
    """Returns page_alloc()'s memory (NULL: nothing)."""
    if p != NULL:
        p = <char*>p - HEADER
        PyTraceMalloc_Untrack(TRACE_DOMAIN, <uintptr_t>p)
        munmap(p, (<size_t*>p)[0])


@cython.final
cdef class Pages:
    """`nbytes` of page_alloc() memory as a writable buffer (an array's
    owner), returned when the last array on it goes."""
    cdef char* data
    cdef Py_ssize_t nbytes

    def __cinit__(self, Py_ssize_t nbytes):
        if nbytes < 0:
            raise ValueError(f"{nbytes} bytes")
        self.data = <char*>page_alloc(nbytes)
        self.nbytes = nbytes

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, self.data, self.nbytes, 0, flags)

    def __dealloc__(self):
        page_free(self.data)
