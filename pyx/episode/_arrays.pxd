# Small helpers the replay modules share: a row copied, a flat array made.
cimport numpy as cnp
from libc.string cimport memcpy


cdef inline void copy_row(char* dst, const char* src, Py_ssize_t row_bytes) noexcept:
    # One row: the usual small sizes as fixed-size copies the compiler
    # inlines (a memcpy call per row costs more than the copy).
    if row_bytes == 8:
        memcpy(dst, src, 8)
    elif row_bytes == 16:
        memcpy(dst, src, 16)
    elif row_bytes == 4:
        memcpy(dst, src, 4)
    elif row_bytes == 1:
        dst[0] = src[0]
    else:
        memcpy(dst, src, row_bytes)


cdef inline cnp.ndarray flat_array(Py_ssize_t n, int type_num):
    # np.empty(n, type) without the Python call.
    cdef cnp.npy_intp dims[1]
    dims[0] = n
    return cnp.PyArray_EMPTY(1, dims, type_num, 0)
