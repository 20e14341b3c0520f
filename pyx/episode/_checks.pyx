# Checks of what an env hands out, in one C pass: a sampler checks every
# step's observations against the space, and gymnasium's Box.contains costs
# more than the step's bookkeeping.

cimport numpy as cnp

from episode._column cimport array_bytes

cnp.import_array()

ctypedef fused real:
    float
    double


cdef bint all_within(const real* x, const real* low, const real* high,
                     Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        # A NaN is within no bounds.
        if not (x[i] >= low[i] and x[i] <= high[i]):
            return False
    return True


cdef bint same_shape(cnp.ndarray a, cnp.ndarray b) noexcept:
    cdef int i
    if cnp.PyArray_NDIM(a) != cnp.PyArray_NDIM(b):
        return False
    for i in range(cnp.PyArray_NDIM(a)):
        if cnp.PyArray_DIMS(a)[i] != cnp.PyArray_DIMS(b)[i]:
            return False
    return True


def in_box(x, low, high):
    """Whether every element of float array `x` lies within [low, high]
    (arrays of its shape and dtype): True or False, or None when the arrays
    are not three C-contiguous float32 or float64 arrays of one shape and
    dtype (the caller's general check then decides)."""
    if not (cnp.PyArray_CheckExact(x) and cnp.PyArray_CheckExact(low)
            and cnp.PyArray_CheckExact(high)):
        return None
    cdef cnp.ndarray a = <cnp.ndarray>x, lo = <cnp.ndarray>low, hi = <cnp.ndarray>high
    cdef int type_num = cnp.PyArray_TYPE(a)
    cdef Py_ssize_t n = cnp.PyArray_SIZE(a)
    if (type_num not in (cnp.NPY_FLOAT, cnp.NPY_DOUBLE)
            or cnp.PyArray_TYPE(lo) != type_num or cnp.PyArray_TYPE(hi) != type_num
            or not (cnp.PyArray_IS_C_CONTIGUOUS(a) and cnp.PyArray_IS_C_CONTIGUOUS(lo)
                    and cnp.PyArray_IS_C_CONTIGUOUS(hi))
            or not cnp.PyArray_ISNOTSWAPPED(a) or not cnp.PyArray_ISNOTSWAPPED(lo)
            or not cnp.PyArray_ISNOTSWAPPED(hi)
            or not (same_shape(a, lo) and same_shape(a, hi))):
        return None
    if type_num == cnp.NPY_FLOAT:
        return all_within(<const float*>array_bytes(a, n * 4),
                          <const float*>array_bytes(lo, n * 4),
                          <const float*>array_bytes(hi, n * 4), n)
    return all_within(<const double*>array_bytes(a, n * 8),
                      <const double*>array_bytes(lo, n * 8),
                      <const double*>array_bytes(hi, n * 8), n)
