# Memory the replay storage keeps: on pages of its own, mapped from the OS
# (anonymous, or a file of a folder), never from the allocator's heap.

cdef object new_array(tuple shape, object dtype, object folder)
cdef int drop_pages(object array) except -1
cdef void* page_alloc(size_t nbytes) except NULL
cdef void page_free(void* p) noexcept
