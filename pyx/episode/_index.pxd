# Index resolution: RLlib's index conventions turned into row positions.

# RLlib's stand-in for "before the first row" when a slice runs backwards
# out of the data; kept so that slices resolve exactly as RLlib's do.
cdef Py_ssize_t BEFORE_START

# No buffer can hold this many rows. Int indices are clamped to it, slices
# with larger fields resolve on Python ints, and a lookback may be at most
# half of it: every sum of an index, a lookback and a length stays far
# inside Py_ssize_t, and a huge index is simply out of range, as for RLlib.
cdef extern from *:
    """
    #define EPISODE_INDEX_LIMIT (((Py_ssize_t)1) << 61)
    #define EPISODE_LOOKBACK_LIMIT (((Py_ssize_t)1) << 60)
    """
    const Py_ssize_t INDEX_LIMIT "EPISODE_INDEX_LIMIT"
    const Py_ssize_t LOOKBACK_LIMIT "EPISODE_LOOKBACK_LIMIT"

cdef struct SliceSpec:
    Py_ssize_t start       # adjusted start, as RLlib passes it to list/array slicing
    Py_ssize_t stop        # adjusted stop (may be BEFORE_START)
    Py_ssize_t step
    Py_ssize_t length      # RLlib's computed slice length (decides whether data is read)
    Py_ssize_t fill_left   # fill items before the data
    Py_ssize_t fill_right  # fill items after the data

cdef Py_ssize_t clamped_index(object value) except? -1
cdef Py_ssize_t checked_lookback(object value) except -1
cdef int interpret_slice(object slice_, bint neg_index_as_lookback, Py_ssize_t lookback,
                         Py_ssize_t total, SliceSpec* spec) except -1
cdef Py_ssize_t int_position(Py_ssize_t idx, bint neg_index_as_lookback,
                             Py_ssize_t lookback, Py_ssize_t length,
                             Py_ssize_t underflow_position) noexcept
cdef Py_ssize_t slice_positions(SliceSpec* spec, Py_ssize_t total,
                                Py_ssize_t* first, Py_ssize_t* step) noexcept
