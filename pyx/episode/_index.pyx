"""Index resolution in C.

RLlib addresses a buffer of `total` rows (the first `lookback` of them being
the lookback) with ints, lists and slices. Non-negative indices count from the
first row after the lookback; negative ones from the end, or, with
`neg_index_as_lookback`, back into the lookback. Rows asked for outside the
data become `fill` rows when a fill value is given. These functions reproduce
those rules exactly and return plain row positions.
"""
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.number cimport PyNumber_AsSsize_t, PyNumber_Index
from cpython.object cimport PyObject

cdef extern from "Python.h":
    # With exc=NULL it clamps to Py_ssize_t's range instead of raising.
    Py_ssize_t PyNumber_AsSsize_clamped "PyNumber_AsSsize_t"(object o, PyObject* exc) except? -1
from cpython.slice cimport PySlice_AdjustIndices

cdef extern from "Python.h":
    ctypedef struct PySliceObject:
        PyObject* start
        PyObject* stop
        PyObject* step

BEFORE_START = -100_000_000


class SliceStepError(ValueError, ZeroDivisionError):
    """A slice with step 0. (RLlib raises ZeroDivisionError here.)"""


cdef Py_ssize_t clamped_index(object value) except? -1:
    """An int index (anything with __index__) as a Py_ssize_t clamped to
    +-INDEX_LIMIT; TypeError for anything else."""
    cdef int overflow = 0
    cdef long long v
    if type(value) is int:
        v = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow:
            return INDEX_LIMIT if overflow > 0 else -INDEX_LIMIT
    else:
        v = PyNumber_AsSsize_clamped(value, NULL)
    if v > INDEX_LIMIT:
        return INDEX_LIMIT
    if v < -INDEX_LIMIT:
        return -INDEX_LIMIT
    return <Py_ssize_t>v


cdef Py_ssize_t checked_lookback(object value) except -1:
    """`value` as a lookback: an int in [0, LOOKBACK_LIMIT]. The C paths trust it."""
    cdef Py_ssize_t lookback
    try:
        lookback = PyNumber_AsSsize_t(value, OverflowError)
    except OverflowError:
        lookback = -1
    if lookback < 0 or lookback > LOOKBACK_LIMIT:
        raise ValueError(f"lookback must be an int from 0 to {LOOKBACK_LIMIT}, got {value!r}")
    return lookback


ctypedef fused index_t:
    Py_ssize_t
    object


cdef inline bint _small_field(object field, Py_ssize_t default, Py_ssize_t* out):
    # A slice field (None: `default`) that C arithmetic takes exactly: None
    # or a Python int within the limit. False for anything else.
    cdef int overflow = 0
    cdef long long value
    if field is None:
        out[0] = default
        return True
    if type(field) is not int:
        return False
    value = PyLong_AsLongLongAndOverflow(field, &overflow)
    if overflow or value > INDEX_LIMIT or value < -INDEX_LIMIT:
        return False
    out[0] = <Py_ssize_t>value
    return True


cdef Py_ssize_t _clamped(object x) except? -1:
    # A result of the rules on Python ints, as row arithmetic needs it:
    # beyond the limit it selects, or pads, exactly as the limit does.
    if x > INDEX_LIMIT:
        return INDEX_LIMIT
    if x < -INDEX_LIMIT:
        return -INDEX_LIMIT
    return x


cdef int interpret_slice(object slice_, bint neg_index_as_lookback, Py_ssize_t lookback,
                         Py_ssize_t total, SliceSpec* spec) except -1:
    cdef Py_ssize_t c_start, c_stop, c_step
    if type(slice_) is not slice:
        raise TypeError(f"expected a slice, got {type(slice_).__name__}")
    # The slice's fields read straight from the object: getattr costs more
    # than all the arithmetic that follows.
    cdef PySliceObject* sl = <PySliceObject*>slice_
    cdef object start = <object>sl.start
    cdef object stop = <object>sl.stop
    cdef object step = <object>sl.step
    if (_small_field(start, lookback, &c_start) and _small_field(stop, total, &c_stop)
            and _small_field(step, 1, &c_step)):
        return _slice_rules[Py_ssize_t](c_start, start is None, c_stop, stop is None, c_step,
                                        neg_index_as_lookback, lookback, total, spec)
    # Huge (or non-int) fields: the same rules on Python ints, which cannot
    # overflow. TypeError for fields that are not indices.
    return _slice_rules[object](
        lookback if start is None else PyNumber_Index(start), start is None,
        total if stop is None else PyNumber_Index(stop), stop is None,
        1 if step is None else PyNumber_Index(step), neg_index_as_lookback, lookback, total,
        spec)


cdef int _slice_rules(index_t start, bint start_is_none, index_t stop, bint stop_is_none,
                      index_t step, bint neg_index_as_lookback, Py_ssize_t lookback,
                      Py_ssize_t total, SliceSpec* spec) except -1:
    """RLlib's slice rules: the slice's fields in buffer rows, the fill on
    either side, and the length RLlib computes. (With fields within the
    limit, every value here stays within +-5 * 2**60: no overflow.)"""
    cdef index_t fill_left = 0, fill_right = 0, length
    if step == 0:
        raise SliceStepError("slice step cannot be zero")
    if not start_is_none:
        if start < 0:
            start = (lookback if neg_index_as_lookback else total) + start
        else:
            start = lookback + start
    if not stop_is_none:
        if stop < 0:
            stop = (lookback if neg_index_as_lookback else total) + stop
        else:
            stop = lookback + stop

    if start < 0 and stop < 0:
        fill_left = start - stop if start > stop else stop - start
        start = stop = 0
    elif start >= total and stop >= total:
        fill_right = start - stop if start > stop else stop - start
        start = stop = total
    elif start < 0:
        fill_left = -start
        start = 0
    elif stop >= total:
        fill_right = stop - total
        stop = total
    elif stop < 0:
        if start >= total:
            fill_left = start - total + 1
            start = total - 1
        fill_right = -stop - 1
        stop = BEFORE_START

    # Floor division, as Python's (C's truncates).
    length = stop - start + (step - (1 if step > 0 else -1))
    if index_t is object:
        length = length // step
        spec.start, spec.stop, spec.step = _clamped(start), _clamped(stop), _clamped(step)
        spec.length = _clamped(length) if length > 0 else 0
        spec.fill_left, spec.fill_right = _clamped(fill_left), _clamped(fill_right)
    else:
        length = length // step - ((length % step != 0) and ((length < 0) != (step < 0)))
        spec.start, spec.stop, spec.step = start, stop, step
        spec.length = length if length > 0 else 0
        spec.fill_left, spec.fill_right = fill_left, fill_right
    return 0


cdef Py_ssize_t slice_positions(SliceSpec* spec, Py_ssize_t total,
                                Py_ssize_t* first, Py_ssize_t* step) noexcept:
    """Rows that `rows[start:stop:step]` selects: count, first row and step."""
    cdef Py_ssize_t start = spec.start, stop = spec.stop
    step[0] = spec.step
    cdef Py_ssize_t n = PySlice_AdjustIndices(total, &start, &stop, spec.step)
    first[0] = start
    return n


cdef Py_ssize_t int_position(Py_ssize_t idx, bint neg_index_as_lookback,
                             Py_ssize_t lookback, Py_ssize_t length,
                             Py_ssize_t underflow_position) noexcept:
    """Row of int index `idx` in `length` rows, or -1 when it is out of range.

    `underflow_position` is where RLlib points an index that runs back past
    the start of the lookback (len(buffer) + lookback): one past the end.
    """
    cdef Py_ssize_t pos = idx
    if idx >= 0 or neg_index_as_lookback:
        pos = lookback + idx
    if neg_index_as_lookback and pos < 0:
        pos = underflow_position
    if pos < 0:
        pos += length
    if pos < 0 or pos >= length:
        return -1
    return pos


def resolve_slice(slice_, bint neg_index_as_lookback, lookback, Py_ssize_t total):
    """Python view of the slice rules: (start, stop, step, length, fill_left, fill_right)."""
    cdef SliceSpec s
    interpret_slice(slice_, neg_index_as_lookback, checked_lookback(lookback), total, &s)
    return s.start, s.stop, s.step, s.length, s.fill_left, s.fill_right


def resolve_int(idx, bint neg_index_as_lookback, lookback, Py_ssize_t length,
                Py_ssize_t underflow_position):
    """Python view of `int_position`: the row, or -1 when out of range (a
    huge `idx` included)."""
    return int_position(clamped_index(idx), neg_index_as_lookback, checked_lookback(lookback),
                        length, underflow_position)


class IndexTypeError(TypeError, IndexError, AssertionError):
    """An index that is not an int, a list of ints, a slice or None.

    RLlib raises AssertionError (its type assertion), TypeError (list mode) or
    IndexError (numpy, after finalize) for these, so this is each of them.
    """
