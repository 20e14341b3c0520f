"""The replay store's episodes found by key: a table of (key hash, slot)
probed linearly, the keys compared in the caller's list by slot."""
cimport cython
from cpython.mem cimport PyMem_Free, PyMem_Malloc


@cython.final
cdef class KeyTable:
    """Key -> slot of the stored episodes (see the .pxd)."""

    def __dealloc__(self):
        PyMem_Free(self.hashes)
        PyMem_Free(self.slots)

    cdef int32_t find(self, object key, list keys) except -2:
        """The slot stored under `key` (keys[slot] == key), or -1."""
        cdef int64_t h
        cdef Py_ssize_t i, mask
        cdef int32_t slot
        if self.cap == 0:
            return -1
        h = hash(key)
        mask = self.cap - 1
        i = h & mask
        while True:
            slot = self.slots[i]
            if slot == -1:
                return -1
            if slot >= 0 and self.hashes[i] == h and (keys[slot] is key or keys[slot] == key):
                return slot
            i = (i + 1) & mask

    cdef int insert(self, object key, int32_t slot, Py_ssize_t live) except -1:
        """`slot` under `key` (not stored yet); `live`: the slots stored."""
        cdef int64_t h = hash(key)
        cdef Py_ssize_t i, mask, cap, j
        cdef int64_t* hashes
        cdef int32_t* slots
        if 4 * (self.used + 1) > 3 * self.cap:
            # Grow (or just sweep out the deleted entries) and re-insert.
            cap = 8
            while 4 * (live + 1) > 3 * cap:
                cap *= 2
            hashes = <int64_t*>PyMem_Malloc(cap * sizeof(int64_t))
            slots = <int32_t*>PyMem_Malloc(cap * sizeof(int32_t))
            if hashes == NULL or slots == NULL:
                PyMem_Free(hashes)
                PyMem_Free(slots)
                raise MemoryError()
            for j in range(cap):
                slots[j] = -1
            for j in range(self.cap):
                if self.slots[j] >= 0:
                    i = self.hashes[j] & (cap - 1)
                    while slots[i] != -1:
                        i = (i + 1) & (cap - 1)
                    hashes[i] = self.hashes[j]
                    slots[i] = self.slots[j]
            PyMem_Free(self.hashes)
            PyMem_Free(self.slots)
            self.hashes, self.slots, self.cap = hashes, slots, cap
            self.used = live
        mask = self.cap - 1
        i = h & mask
        while self.slots[i] >= 0:
            i = (i + 1) & mask
        if self.slots[i] == -1:
            self.used += 1
        self.hashes[i] = h
        self.slots[i] = slot
        return 0

    cdef int remove(self, object key, list keys) except -1:
        """Takes `key` (stored) out."""
        cdef int64_t h = hash(key)
        cdef Py_ssize_t i, mask = self.cap - 1
        cdef int32_t slot
        i = h & mask
        while True:
            slot = self.slots[i]
            if slot == -1:
                raise SystemError("episode core: a stored episode missing from its table")
            if slot >= 0 and self.hashes[i] == h and (keys[slot] is key or keys[slot] == key):
                self.slots[i] = -2
                return 0
            i = (i + 1) & mask
