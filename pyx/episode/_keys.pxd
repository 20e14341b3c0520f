# Stored episodes found by key: an open-addressing table of (key hash, slot).
cimport cython
from libc.stdint cimport int32_t, int64_t


@cython.final
cdef class KeyTable:
    # The keys themselves are the caller's, in a list by slot (`keys`): a
    # dict would cost an entry and an int object per stored episode.
    cdef int64_t* hashes
    cdef int32_t* slots          # -1: empty, -2: deleted
    cdef Py_ssize_t cap, used    # cap: a power of two (0: none yet); used: not empty

    cdef int32_t find(self, object key, list keys) except -2
    cdef int insert(self, object key, int32_t slot, Py_ssize_t live) except -1
    cdef int remove(self, object key, list keys) except -1
