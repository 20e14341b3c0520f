"""RLlib's recorded episodes, decoded in C.

RLlib 2.60 records an episode as ``msgpack.packb(episode.get_state(),
default=msgpack_numpy.encode)``: a msgpack map whose arrays and numpy
scalars are msgpack-numpy's maps ({b"nd": True, b"type": "<f4", b"kind":
b"", b"shape": [4], b"data": <bytes>}), one map per step in a track.
``unpack_episode`` parses a packed state and copies each numeric track's
per-step arrays straight into one rows array, then builds the episode over
those rows; tracks that are not uniform numbers go through Python objects.

This is the one hand-written parser left for RLlib's formats: on vector
recordings (CartPole, 100k steps) reading them is several times faster than
with the msgpack library, which must make a Python map per step (see the
benchmarks page; encoding, generic values and the row format's packed cells
go through msgpack, lz4 and pickle, in episode.offline). It has a fuzz
target (tests/fuzz/fuzz_msgpack.py) run against the sanitizer build.

Every read is bounds-checked: corrupt bytes raise ValueError naming what is
wrong and where.
"""
from collections import defaultdict
from functools import partial

import msgpack
import numpy as np

cimport cython
cimport numpy as cnp
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.float cimport PyFloat_FromDouble
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_FromLongLong, PyLong_FromUnsignedLongLong
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport INT64_MAX, int8_t, int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

from episode._buffer cimport BufferCore, space_struct
from episode._column cimport (KIND_ARRAY, KIND_BOOL, KIND_EMPTY, KIND_EMPTY_DICT, KIND_FLOAT,
                             KIND_INT, KIND_SCALAR, Column, array_bytes, column_from_state,
                             empty_array)
from episode._episode cimport EpisodeCore

from episode._episode import REWARDS_SPACE, make_episode
from episode.lookback_buffer import InfiniteLookbackBuffer
from episode.spaces import space_from_dict, space_to_dict

cnp.import_array()

cdef extern from "numpy/arrayobject.h":
    object PyArray_Scalar(void* data, cnp.PyArray_Descr* descr, PyObject* base)


# The deepest nesting this decoder follows (C recursion: well below the C
# stack's depth).
cdef enum:
    MAX_DEPTH = 512
    MAX_NDIM = 64

cdef object ndarray_type = np.ndarray
cdef object FLOAT64 = np.dtype(np.float64)
cdef object INT64 = np.dtype(np.int64)
cdef object BOOL = np.dtype(np.bool_)


# ======================================================================================
# Reading
# ======================================================================================

cdef struct Reader:
    const unsigned char* p   # the packed bytes
    Py_ssize_t pos           # the next byte to read
    Py_ssize_t end           # len(bytes)

# What one msgpack header announces.
cdef enum HeadKind:
    H_NIL = 0
    H_BOOL = 1     # i: 0 or 1
    H_INT = 2      # i: any int64
    H_UINT = 3     # u: above INT64_MAX
    H_FLOAT = 4    # f
    H_STR = 5      # n bytes at `at`
    H_BIN = 6      # n bytes at `at`
    H_ARRAY = 7    # n items follow
    H_MAP = 8      # n pairs follow
    H_EXT = 9      # n bytes at `at`

cdef struct Head:
    int kind
    int64_t i
    uint64_t u
    double f
    Py_ssize_t n
    Py_ssize_t at


cdef inline uint64_t load_be(const unsigned char* p, int size) noexcept nogil:
    cdef uint64_t v = 0
    cdef int k
    for k in range(size):
        v = (v << 8) | p[k]
    return v


cdef inline double be_double(const unsigned char* p) noexcept nogil:
    cdef uint64_t bits = load_be(p, 8)
    cdef double d
    memcpy(&d, &bits, 8)
    return d


cdef inline float be_float(const unsigned char* p) noexcept nogil:
    cdef uint32_t bits = <uint32_t>load_be(p, 4)
    cdef float f
    memcpy(&f, &bits, 4)
    return f


cdef int truncated(Reader* r, Py_ssize_t n, str what) except -1:
    raise ValueError(f"truncated msgpack: {what} of {n} bytes at byte {r.pos} runs past "
                     f"the end ({r.end} bytes)")


cdef inline int need(Reader* r, Py_ssize_t n, str what) except -1:
    if n < 0 or n > r.end - r.pos:
        truncated(r, n, what)
    return 0


cdef int corrupt(Reader* r, str what) except -1:
    raise ValueError(f"corrupt msgpack at byte {r.pos} of {r.end}: {what}")


cdef int read_head(Reader* r, Head* h) except -1:
    """Reads one header (and skips the payload of a str, bin or ext), checked
    against the bytes left: an array or map cannot announce more items than
    bytes remain."""
    cdef unsigned char b
    cdef int size = 0
    need(r, 1, "a value")
    b = r.p[r.pos]
    r.pos += 1
    h.n = 0
    if b <= 0x7f:
        h.kind = H_INT
        h.i = b
        return 0
    if b >= 0xe0:
        h.kind = H_INT
        h.i = <int64_t>b - 256
        return 0
    if b <= 0x8f:
        h.kind = H_MAP
        h.n = b & 0x0f
    elif b <= 0x9f:
        h.kind = H_ARRAY
        h.n = b & 0x0f
    elif b <= 0xbf:
        h.kind = H_STR
        h.n = b & 0x1f
    elif b == 0xc0:
        h.kind = H_NIL
        return 0
    elif b == 0xc2 or b == 0xc3:
        h.kind = H_BOOL
        h.i = b == 0xc3
        return 0
    elif b == 0xca or b == 0xcb:
        size = 4 if b == 0xca else 8
        need(r, size, "a float")
        h.kind = H_FLOAT
        h.f = be_float(r.p + r.pos) if size == 4 else be_double(r.p + r.pos)
        r.pos += size
        return 0
    elif 0xcc <= b <= 0xcf:
        size = 1 << (b - 0xcc)
        need(r, size, "an unsigned int")
        h.u = load_be(r.p + r.pos, size)
        r.pos += size
        if h.u > <uint64_t>INT64_MAX:
            h.kind = H_UINT
        else:
            h.kind = H_INT
            h.i = <int64_t>h.u
        return 0
    elif 0xd0 <= b <= 0xd3:
        size = 1 << (b - 0xd0)
        need(r, size, "an int")
        h.u = load_be(r.p + r.pos, size)
        r.pos += size
        h.kind = H_INT
        # Sign-extend the `size`-byte two's complement value.
        if size == 1:
            h.i = <int8_t>h.u
        elif size == 2:
            h.i = <int16_t>h.u
        elif size == 4:
            h.i = <int32_t>h.u
        else:
            h.i = <int64_t>h.u
        return 0
    elif b == 0xc4 or b == 0xc5 or b == 0xc6:
        size = 1 << (b - 0xc4)
        need(r, size, "a bin length")
        h.kind = H_BIN
        h.n = <Py_ssize_t>load_be(r.p + r.pos, size)
        r.pos += size
    elif b == 0xd9 or b == 0xda or b == 0xdb:
        size = 1 << (b - 0xd9)
        need(r, size, "a str length")
        h.kind = H_STR
        h.n = <Py_ssize_t>load_be(r.p + r.pos, size)
        r.pos += size
    elif b == 0xdc or b == 0xdd:
        size = 2 if b == 0xdc else 4
        need(r, size, "an array length")
        h.kind = H_ARRAY
        h.n = <Py_ssize_t>load_be(r.p + r.pos, size)
        r.pos += size
    elif b == 0xde or b == 0xdf:
        size = 2 if b == 0xde else 4
        need(r, size, "a map length")
        h.kind = H_MAP
        h.n = <Py_ssize_t>load_be(r.p + r.pos, size)
        r.pos += size
    elif 0xd4 <= b <= 0xd8:
        h.kind = H_EXT
        h.n = 1 + (1 << (b - 0xd4))     # the type byte and the data
    elif b == 0xc7 or b == 0xc8 or b == 0xc9:
        size = 1 << (b - 0xc7)
        need(r, size, "an ext length")
        h.kind = H_EXT
        h.n = 1 + <Py_ssize_t>load_be(r.p + r.pos, size)
        r.pos += size
    else:
        r.pos -= 1
        corrupt(r, "byte 0xc1 is never used by msgpack")
    if h.kind == H_ARRAY:
        if h.n > r.end - r.pos:
            truncated(r, h.n, f"an array of {h.n} items needs at least as many bytes:")
    elif h.kind == H_MAP:
        if h.n > (r.end - r.pos) // 2:
            truncated(r, 2 * h.n, f"a map of {h.n} pairs needs at least twice as many bytes:")
    else:
        need(r, h.n, "a str" if h.kind == H_STR else "a bin" if h.kind == H_BIN else "an ext")
        h.at = r.pos
        r.pos += h.n
    return 0


cdef int skip_value(Reader* r, int depth) except -1:
    """Steps over one value (checked, nothing built)."""
    cdef Head h
    cdef Py_ssize_t k
    if depth > MAX_DEPTH:
        corrupt(r, f"nested deeper than {MAX_DEPTH} levels")
    read_head(r, &h)
    if h.kind == H_ARRAY:
        for k in range(h.n):
            skip_value(r, depth + 1)
    elif h.kind == H_MAP:
        for k in range(2 * h.n):
            skip_value(r, depth + 1)
    return 0


cdef inline int skip_contents(Reader* r, Head* h) except -1:
    # After read_head of a container: steps over its items (nothing else to do
    # for a header that is a whole value).
    cdef Py_ssize_t k
    if h.kind == H_ARRAY:
        for k in range(h.n):
            skip_value(r, 1)
    elif h.kind == H_MAP:
        for k in range(2 * h.n):
            skip_value(r, 1)
    return 0


cdef object head_scalar(Reader* r, Head* h):
    """The Python value of a header that is a whole value (not a container)."""
    if h.kind == H_NIL:
        return None
    if h.kind == H_BOOL:
        return h.i != 0
    if h.kind == H_INT:
        return PyLong_FromLongLong(h.i)
    if h.kind == H_UINT:
        return PyLong_FromUnsignedLongLong(h.u)
    if h.kind == H_FLOAT:
        return PyFloat_FromDouble(h.f)
    if h.kind == H_STR:
        # msgpack's raw=False: UTF-8, strictly (UnicodeDecodeError is a ValueError).
        return PyUnicode_DecodeUTF8(<const char*>r.p + h.at, h.n, NULL)
    if h.kind == H_BIN:
        return PyBytes_FromStringAndSize(<const char*>r.p + h.at, h.n)
    r.pos = h.at - 1
    corrupt(r, f"msgpack ext type {<signed char>r.p[h.at]} is not part of RLlib's format")


cdef object read_value(Reader* r, int depth):
    """One value as msgpack.unpackb(..., object_hook=msgpack_numpy.decode)
    gives it: lists for arrays, dicts (str or bytes keys only, msgpack's
    strict_map_key) for maps, msgpack-numpy's maps decoded."""
    cdef Head h
    cdef Py_ssize_t k, start = r.pos
    cdef list items
    cdef dict d
    cdef NdItem it
    if depth > MAX_DEPTH:
        corrupt(r, f"nested deeper than {MAX_DEPTH} levels")
    # msgpack-numpy's maps start with b"nd": read without making the dict.
    if r.end - r.pos > 5 and (r.p[r.pos] == 0x83 or r.p[r.pos] == 0x85) \
            and memcmp(r.p + r.pos + 1, b"\xc4\x02nd", 4) == 0:
        if read_nd_item(r, &it):
            found = nd_value(r, &it)
            if found is not None:
                return found
        r.pos = start
    read_head(r, &h)
    if h.kind == H_ARRAY:
        items = PyList_New(h.n)
        for k in range(h.n):
            # PyList_SET_ITEM steals a reference: give it one.
            item = read_value(r, depth + 1)
            Py_INCREF(item)
            PyList_SET_ITEM(items, k, item)
        return items
    if h.kind == H_MAP:
        d = {}
        for k in range(h.n):
            at = r.pos
            key = read_value(r, depth + 1)
            if type(key) is not str and type(key) is not bytes:
                r.pos = at
                corrupt(r, f"a map key must be str or bytes, not {type(key).__name__}")
            d[key] = read_value(r, depth + 1)
        return decode_numpy(d)
    return head_scalar(r, &h)


# -- msgpack-numpy's maps ------------------------------------------------------------
#
# msgpack_numpy.decode turns a map with a b"nd" key into an ndarray (b"nd" is
# True) or a numpy scalar (any other value), and one with b"complex" into a
# complex; a map that lacks a key those need stays a dict. Arrays of objects
# (kind b"O") are pickles: they go through the offline layer's restricted
# unpickler, never pickle.loads.

cdef dict DTYPES = {}   # msgpack-numpy type strings met so far -> dtype


cdef object dtype_of(object text):
    """The dtype a msgpack-numpy type string names (ValueError for none)."""
    found = DTYPES.get(text) if type(text) is str else None
    if found is not None:
        return found
    if type(text) is not str:
        raise ValueError(f"a msgpack-numpy type is a str, not {type(text).__name__}")
    try:
        dtype = np.dtype(text)
    except (TypeError, ValueError, SyntaxError) as error:    # numpy parses "(2,)f4" with ast
        raise ValueError(f"a msgpack-numpy map names no dtype: {text!r:.80}") from error
    if dtype.hasobject:
        raise ValueError(f"a msgpack-numpy map of {dtype} without kind b'O'")
    if len(DTYPES) < 256:
        DTYPES[text] = dtype
    return dtype


def _structured_dtype(descr):
    # msgpack_numpy's descr of a structured dtype: [name, type, *shape] per field.
    fields = []
    for field in descr:
        if type(field) is not list or len(field) < 2:
            raise ValueError(f"a structured dtype field is [name, type, ...], not {field!r:.80}")
        name = field[0].decode() if type(field[0]) is bytes else field[0]
        sub = _structured_dtype(field[1]) if type(field[1]) is list else field[1]
        rest = tuple(tuple(x) if type(x) is list else x for x in field[2:])
        fields.append((name, sub) + rest)
    return fields


cdef Py_ssize_t checked_count(object shape, cnp.npy_intp* dims, int* ndim) except -1:
    """The number of elements of `shape` (a list of ints or an int), its dims
    into `dims` (MAX_NDIM of them at most); ValueError for anything else."""
    cdef Py_ssize_t count = 1, d, k
    if type(shape) is int:
        shape = [shape]
    if type(shape) is not list and type(shape) is not tuple:
        raise ValueError(f"a msgpack-numpy shape is a list of ints, not {type(shape).__name__}")
    if len(shape) > MAX_NDIM:
        raise ValueError(f"a msgpack-numpy shape of {len(shape)} dimensions")
    ndim[0] = len(shape)
    for k in range(ndim[0]):
        value = shape[k]
        if type(value) is not int or not 0 <= value < (1 << 48):
            raise ValueError(f"a msgpack-numpy shape holds {value!r:.40}")
        d = value
        dims[k] = d
        if d and count > (1 << 48) // d:
            raise ValueError(f"a msgpack-numpy shape of too many elements: {shape!r:.80}")
        count *= d
    return count


cdef object decode_numpy(dict d):
    cdef cnp.npy_intp dims[MAX_NDIM]
    cdef int ndim = 0
    cdef Py_ssize_t count
    cdef cnp.ndarray arr
    nd = d.get(b"nd", d)           # `d` itself: no such key
    if nd is d:
        if b"complex" in d and b"data" in d:
            text = d[b"data"]
            try:
                return complex(text.decode() if type(text) is bytes else str(text))
            except (TypeError, ValueError, UnicodeDecodeError) as error:
                raise ValueError(f"a msgpack-numpy complex of {text!r:.80}") from error
        return d
    if nd is True:
        if b"data" not in d or b"type" not in d or b"shape" not in d:
            kind = d.get(b"kind")
            if kind == b"O" and b"data" in d:
                return unpickled_array(d[b"data"])
            return d
        kind = d.get(b"kind")
        data = d[b"data"]
        if kind == b"O":
            return unpickled_array(data)
        if kind == b"V":
            if type(d[b"type"]) is not list:
                raise ValueError("a structured msgpack-numpy array's type is a list of fields")
            try:
                dtype = np.dtype(_structured_dtype(d[b"type"]))
            except (TypeError, ValueError, SyntaxError, KeyError, IndexError) as error:
                raise ValueError(f"a msgpack-numpy map names no dtype: {d[b'type']!r:.80}") \
                    from error
        else:
            dtype = dtype_of(d[b"type"])
        if type(data) is not bytes:
            raise ValueError(f"a msgpack-numpy array's data is bytes, not {type(data).__name__}")
        count = checked_count(d[b"shape"], dims, &ndim)
        if count * (<cnp.dtype>dtype).itemsize != PyBytes_GET_SIZE(data):
            raise ValueError(f"a msgpack-numpy array of shape {tuple(d[b'shape'])} and dtype "
                             f"{dtype} has {PyBytes_GET_SIZE(data)} bytes of data")
        arr = empty_array(ndim, dims, <cnp.dtype>dtype)
        memcpy(array_bytes(arr, PyBytes_GET_SIZE(data)), PyBytes_AS_STRING(data),
               PyBytes_GET_SIZE(data))
        return arr
    if b"data" not in d or b"type" not in d:
        return d
    data = d[b"data"]
    dtype = dtype_of(d[b"type"])
    if type(data) is not bytes or PyBytes_GET_SIZE(data) != (<cnp.dtype>dtype).itemsize:
        raise ValueError(f"a msgpack-numpy {dtype} scalar has {len(data)} bytes of data"
                         if type(data) is bytes else
                         f"a msgpack-numpy scalar's data is bytes, not {type(data).__name__}")
    return scalar_of(<cnp.dtype>dtype, PyBytes_AS_STRING(data))


cdef object scalar_of(cnp.dtype dtype, const char* src):
    # A numpy scalar from its bytes (copied to an aligned place first).
    cdef double aligned[8]
    cdef cnp.ndarray arr
    if dtype.itemsize <= sizeof(aligned) and dtype.kind in "biufc":
        memcpy(aligned, src, dtype.itemsize)
        return PyArray_Scalar(aligned, <cnp.PyArray_Descr*>dtype, NULL)
    arr = empty_array(0, NULL, dtype)
    memcpy(array_bytes(arr, dtype.itemsize), src, dtype.itemsize)
    return arr[()]


cdef object nd_value(Reader* r, NdItem* it):
    """The ndarray or numpy scalar of a plain msgpack-numpy map (read by
    read_nd_item), or None when its fields do not describe one."""
    dtype = plain_dtype(r, it.type_at, it.type_len)
    if dtype is None:
        return None
    if not it.nd:
        if it.data_len != (<cnp.dtype>dtype).itemsize:
            return None
        return scalar_of(<cnp.dtype>dtype, <const char*>r.p + it.data_at)
    return nd_array(r, it, <cnp.dtype>dtype)


cdef object nd_array(Reader* r, NdItem* it, cnp.dtype dtype):
    """The ndarray (a copy of its bytes) of an nd msgpack-numpy map of a
    plain `dtype`, or None when its size and bytes disagree."""
    cdef Py_ssize_t count = 1, nbytes
    cdef cnp.ndarray arr
    cdef int j
    for j in range(it.ndim):
        count *= it.dims[j]
        if count > (<Py_ssize_t>1 << 48):
            return None
    nbytes = count * dtype.itemsize
    if it.data_len != nbytes:
        return None
    arr = empty_array(it.ndim, it.dims, dtype)
    if nbytes:
        memcpy(array_bytes(arr, nbytes), r.p + it.data_at, nbytes)
    return arr


cdef object unpickled_array(object data):
    if type(data) is not bytes:
        raise ValueError(f"a msgpack-numpy object array's data is bytes, not {type(data).__name__}")
    from episode.offline.rllib_format import safe_loads
    arr = safe_loads(data)
    if type(arr) is not ndarray_type:
        raise ValueError(f"a msgpack-numpy object array unpickled to {type(arr).__name__}")
    return arr


# The bytes of what is read, held for the read.

cdef class _Buffer:
    """The bytes of a buffer-protocol object, held for the read."""
    cdef Py_buffer view
    cdef bint held

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)


cdef _Buffer get_bytes(object data, str what):
    cdef _Buffer b = _Buffer()
    if isinstance(data, str):
        raise TypeError(f"{what} is bytes (or a bytes-like object), not str")
    try:
        PyObject_GetBuffer(data, &b.view, PyBUF_SIMPLE)
    except (TypeError, BufferError) as error:
        raise TypeError(f"{what} is bytes (or a bytes-like object), not "
                        f"{type(data).__name__}") from error
    b.held = True
    return b



# ======================================================================================
# Episodes: decoding
# ======================================================================================
#
# The state's keys in RLlib's get_state() order; the decoder takes them in any order.

cdef enum:
    K_ID = 0
    K_AGENT_ID
    K_MODULE_ID
    K_MA_ID
    K_OBSERVATIONS
    K_ACTIONS
    K_REWARDS
    K_INFOS
    K_EXTRAS
    K_TERMINATED
    K_TRUNCATED
    K_T_STARTED
    K_T
    K_OBSERVATION_SPACE
    K_ACTION_SPACE
    K_START_TIME
    K_LAST_STEP_TIME
    K_CUSTOM_DATA
    N_KEYS

cdef tuple STATE_KEYS = (
    "id_", "agent_id", "module_id", "multi_agent_episode_id", "observations", "actions",
    "rewards", "infos", "extra_model_outputs", "is_terminated", "is_truncated", "t_started",
    "t", "_observation_space", "_action_space", "_start_time", "_last_step_time",
    "custom_data")


cdef int key_of(Reader* r, Head* h, tuple names, Py_ssize_t hint) except -2:
    # The index of the str at h among `names` (tried first: `hint`, where
    # RLlib's writer puts it), or -1.
    cdef Py_ssize_t k
    cdef bytes name
    if 0 <= hint < PyTuple_GET_SIZE(names):
        name = <bytes>PyTuple_GET_ITEM(names, hint)
        if PyBytes_GET_SIZE(name) == h.n and memcmp(PyBytes_AS_STRING(name), r.p + h.at, h.n) == 0:
            return <int>hint
    for k in range(PyTuple_GET_SIZE(names)):
        name = <bytes>PyTuple_GET_ITEM(names, k)
        if PyBytes_GET_SIZE(name) == h.n and memcmp(PyBytes_AS_STRING(name), r.p + h.at, h.n) == 0:
            return <int>k
    return -1


cdef tuple STATE_KEY_BYTES = tuple(k.encode() for k in STATE_KEYS)
cdef tuple TRACK_KEY_BYTES = (b"data", b"lookback", b"finalized", b"space")
cdef tuple ND_KEY_BYTES = (b"nd", b"type", b"kind", b"shape", b"data")


class _NotFast(Exception):
    """The state is not in the layout the fast decoder reads (a finalized
    track, an unknown key): the generic decoder and from_state take it."""


# The decoder's temporaries hold Columns, arrays and ints, never anything that
# leads back to them: out of the cyclic collector's sight, they do not add to
# the allocations that set off its collections.
@cython.no_gc
cdef class _Track:
    """One decoded lookback buffer state."""
    cdef object storage        # a Column, or a dict of them
    cdef object lookback       # the state's value (an int when valid)
    cdef bint arrays           # the data were arrays (a finalized buffer's), not a list
    cdef Py_ssize_t space_at   # the packed space's span in the state
    cdef Py_ssize_t space_len


cdef struct NdItem:
    # One msgpack-numpy map's fields, as spans of the packed bytes.
    int nd                    # 1: an ndarray, 0: a scalar
    Py_ssize_t type_at, type_len
    Py_ssize_t data_at, data_len
    int ndim
    cnp.npy_intp dims[MAX_NDIM]


cdef int read_nd_item(Reader* r, NdItem* it) except -1:
    """Reads a map that may be one of msgpack-numpy's plain ones (1: it is,
    the fields in `it`; 0: it is something else, read past)."""
    cdef Head h, v
    cdef Py_ssize_t k, j
    cdef int key, seen = 0, plain = 1
    read_head(r, &h)
    if h.kind != H_MAP:
        skip_contents(r, &h)
        return 0
    it.nd = 0
    it.ndim = 0
    for k in range(h.n):
        read_head(r, &v)
        key = key_of(r, &v, ND_KEY_BYTES, k) if v.kind == H_BIN else -1
        if key < 0 or seen & (1 << key):
            skip_contents(r, &v)
            skip_value(r, 1)
            plain = 0
            continue
        seen |= 1 << key
        read_head(r, &v)
        if key == 0:                              # nd: a bool
            if v.kind == H_BOOL:
                it.nd = <int>v.i
            else:
                plain = 0
        elif key == 1:                            # type: a str
            if v.kind == H_STR:
                it.type_at = v.at
                it.type_len = v.n
            else:
                plain = 0
        elif key == 2:                            # kind: b"" for plain arrays
            if not (v.kind == H_BIN and v.n == 0):
                plain = 0
        elif key == 3 and v.kind == H_ARRAY and v.n <= MAX_NDIM:   # shape: ints
            it.ndim = <int>v.n
            for j in range(v.n):
                read_head(r, &h)
                if h.kind == H_INT and 0 <= h.i < (<int64_t>1 << 48):
                    it.dims[j] = <cnp.npy_intp>h.i
                else:
                    skip_contents(r, &h)
                    plain = 0
            continue
        elif key == 3:
            plain = 0
        elif v.kind == H_BIN:                     # data: bin
            it.data_at = v.at
            it.data_len = v.n
        else:
            plain = 0
        skip_contents(r, &v)
    if not plain or not (seen & 1):
        return 0
    if it.nd:
        # An ndarray needs type, shape and data (kind is optional).
        return (seen & 0b11010) == 0b11010
    # A scalar needs type and data; msgpack_numpy ignores a shape or kind
    # there, and this decoder leaves such a map to the generic path.
    return (seen & 0b11110) == 0b10010


cdef dict PLAIN_DTYPES = {}   # type string bytes -> dtype (plain native numbers), or None


cdef object plain_dtype(Reader* r, Py_ssize_t at, Py_ssize_t n):
    """The native, plain numeric dtype a type string names, or None."""
    return plain_dtype_of(PyBytes_FromStringAndSize(<const char*>r.p + at, n))


cdef object plain_dtype_of(bytes text):
    # msgpack_numpy's type strings and pickled dtypes' texts alike, parsed once.
    found = PLAIN_DTYPES.get(text, False)
    if found is not False:
        return found
    try:
        dtype = np.dtype(text.decode("ascii"))
    except (TypeError, ValueError, SyntaxError):
        dtype = None
    if dtype is not None and not (dtype.kind in "biufc" and dtype.isnative):
        dtype = None
    if len(PLAIN_DTYPES) < 256:
        PLAIN_DTYPES[text] = dtype
    return dtype


@cython.no_gc
cdef class _Node:
    """The layout of a track's items, read from the first one: a leaf of
    uniform numbers (its rows array, filled item by item), or a dict of
    such nodes (Dict-space items, keys in the first item's order)."""
    cdef int kind                  # a Kind of Column for a leaf; -1 for a dict
    cdef tuple keys                # a dict: its packed keys (bytes) ...
    cdef tuple names               # ... as str
    cdef tuple children            # ... and their nodes
    cdef cnp.ndarray rows          # a leaf: one row per item
    cdef char* dst
    cdef Py_ssize_t row_bytes
    cdef NdItem first              # a msgpack-numpy leaf: its first map's fields ...
    cdef Py_ssize_t start          # ... where that map starts in the packed bytes ...
    cdef Py_ssize_t prefix         # ... and its bytes before the data (0: do not compare)


cdef int leaf_number(Reader* r, _Node node, Py_ssize_t k) except -1:
    """Item k of a leaf of Python numbers (1), or 0 if it is none."""
    cdef Head h
    cdef unsigned char b = r.p[r.pos] if r.pos < r.end else 0xc1
    # The usual items first: a float64, a fixint.
    if node.kind == KIND_FLOAT and b == 0xcb and r.end - r.pos >= 9:
        (<double*>node.dst)[k] = be_double(r.p + r.pos + 1)
        r.pos += 9
        return 1
    if node.kind == KIND_INT and b <= 0x7f:
        (<int64_t*>node.dst)[k] = b
        r.pos += 1
        return 1
    read_head(r, &h)
    if node.kind == KIND_FLOAT and h.kind == H_FLOAT:
        (<double*>node.dst)[k] = h.f
    elif node.kind == KIND_INT and h.kind == H_INT:
        (<int64_t*>node.dst)[k] = h.i
    elif node.kind == KIND_BOOL and h.kind == H_BOOL:
        (<uint8_t*>node.dst)[k] = <uint8_t>h.i
    else:
        return 0
    return 1


cdef int node_first(Reader* r, _Node node, Py_ssize_t n, int depth) except -1:
    """Reads item 0 of `n` into a new layout: 1, or 0 when it starts no
    uniform track (the reader then is anywhere in it)."""
    cdef Head h
    cdef Py_ssize_t k, count, m
    cdef unsigned char b
    cdef cnp.npy_intp dims[MAX_NDIM + 1]
    cdef _Node child
    cdef int j
    if r.pos >= r.end or depth > 32:
        return 0
    b = r.p[r.pos]
    dims[0] = n
    if b == 0xca or b == 0xcb or b <= 0x7f or b >= 0xe0 or 0xcc <= b <= 0xd3 \
            or b == 0xc2 or b == 0xc3:
        node.kind = KIND_FLOAT if b == 0xca or b == 0xcb else \
            KIND_BOOL if b == 0xc2 or b == 0xc3 else KIND_INT
        node.rows = empty_array(1, dims, FLOAT64 if node.kind == KIND_FLOAT else
                                INT64 if node.kind == KIND_INT else BOOL)
        node.row_bytes = (<cnp.dtype>node.rows.dtype).itemsize
        node.dst = array_bytes(node.rows, n * node.row_bytes)
        return leaf_number(r, node, 0)
    if not (0x81 <= b <= 0x8f or b == 0xde):
        return 0
    if r.end - r.pos > 5 and memcmp(r.p + r.pos + 1, b"\xc4\x02nd", 4) == 0:
        # One of msgpack-numpy's maps.
        node.start = r.pos
        if not read_nd_item(r, &node.first):
            return 0
        dtype = plain_dtype(r, node.first.type_at, node.first.type_len)
        if dtype is None:
            return 0
        count = 1
        for j in range(node.first.ndim if node.first.nd else 0):
            count *= node.first.dims[j]
            dims[j + 1] = node.first.dims[j]
            if count > (<Py_ssize_t>1 << 48):
                return 0
        node.row_bytes = count * (<cnp.dtype>dtype).itemsize
        if node.first.data_len != node.row_bytes \
                or n > (<Py_ssize_t>1 << 48) // (node.row_bytes if node.row_bytes else 1):
            return 0
        node.kind = KIND_ARRAY if node.first.nd else KIND_SCALAR
        node.rows = empty_array(1 + (node.first.ndim if node.first.nd else 0), dims,
                                <cnp.dtype>dtype)
        node.dst = array_bytes(node.rows, n * node.row_bytes) if n * node.row_bytes else NULL
        if node.row_bytes:
            memcpy(node.dst, r.p + node.first.data_at, node.row_bytes)
        # The maps msgpack_numpy writes for one track differ only in their
        # data, which comes last: a map whose bytes up to its data are the
        # first one's is read with one compare.
        node.prefix = node.first.data_at - node.start \
            if node.first.data_at + node.row_bytes == r.pos else 0
        return 1
    # A dict item: str keys, each value a node of its own.
    read_head(r, &h)
    m = h.n
    keys, names, children = [], [], []
    for k in range(m):
        if r.pos >= r.end:
            return 0
        b = r.p[r.pos]
        if not (0xa0 <= b <= 0xbf or b == 0xd9 or b == 0xda):
            return 0
        read_head(r, &h)
        key = PyBytes_FromStringAndSize(<const char*>r.p + h.at, h.n)
        if key in keys:
            return 0
        names.append(PyUnicode_DecodeUTF8(<const char*>r.p + h.at, h.n, NULL))
        keys.append(key)
        child = _Node()
        if not node_first(r, child, n, depth + 1):
            return 0
        children.append(child)
    if not keys:
        return 0
    node.kind = -1
    node.keys = tuple(keys)
    node.names = tuple(names)
    node.children = tuple(children)
    return 1


cdef int node_next(Reader* r, _Node node, Py_ssize_t k) except -1:
    """Reads item k into the layout: 1, or 0 when it does not fit it."""
    cdef NdItem it
    cdef Head h
    cdef Py_ssize_t c
    cdef int j
    cdef bytes key
    if node.kind == KIND_FLOAT or node.kind == KIND_INT or node.kind == KIND_BOOL:
        return leaf_number(r, node, k)
    if node.kind == KIND_ARRAY or node.kind == KIND_SCALAR:
        if node.prefix and node.prefix + node.row_bytes <= r.end - r.pos \
                and memcmp(r.p + r.pos, r.p + node.start, node.prefix) == 0:
            if node.row_bytes:
                memcpy(node.dst + k * node.row_bytes, r.p + r.pos + node.prefix, node.row_bytes)
            r.pos += node.prefix + node.row_bytes
            return 1
        if not read_nd_item(r, &it) or it.nd != node.first.nd \
                or it.type_len != node.first.type_len \
                or memcmp(r.p + it.type_at, r.p + node.first.type_at, it.type_len) != 0 \
                or it.data_len != node.row_bytes:
            return 0
        if it.nd:
            if it.ndim != node.first.ndim:
                return 0
            for j in range(it.ndim):
                if it.dims[j] != node.first.dims[j]:
                    return 0
        if node.row_bytes:
            memcpy(node.dst + k * node.row_bytes, r.p + it.data_at, node.row_bytes)
        return 1
    read_head(r, &h)
    if h.kind != H_MAP or h.n != PyTuple_GET_SIZE(node.keys):
        return 0
    for c in range(h.n):
        read_head(r, &h)
        key = <bytes>PyTuple_GET_ITEM(node.keys, c)
        if h.kind != H_STR or h.n != PyBytes_GET_SIZE(key) \
                or memcmp(r.p + h.at, PyBytes_AS_STRING(key), h.n) != 0:
            return 0
        if not node_next(r, <_Node>PyTuple_GET_ITEM(node.children, c), k):
            return 0
    return 1


cdef object node_storage(_Node node):
    # The layout's Column (a leaf) or dict of them (a dict).
    if node.kind >= 0:
        return column_from_state(node.kind, False, False, node.rows)
    return {name: node_storage(<_Node>child) for name, child in zip(node.names, node.children)}


cdef object read_rows(Reader* r, Py_ssize_t n, bint tree):
    """The storage of a list-mode track's `n` items when they are uniform:
    Python floats, ints or bools, msgpack-numpy scalars of one dtype or
    msgpack-numpy arrays of one dtype and shape, each copied straight into
    one rows array (one Column), or, with `tree`, dicts of such leaves with
    the same keys (a dict of Columns); all empty maps (infos) are counted.
    None (the reader anywhere in the items) for anything else."""
    cdef Py_ssize_t k
    cdef _Node root = _Node()
    if n == 0:
        return column_from_state(KIND_EMPTY, False, False, 0)
    if r.p[r.pos] == 0x80:
        for k in range(n):
            if r.pos >= r.end or r.p[r.pos] != 0x80:
                return None
            r.pos += 1
        return column_from_state(KIND_EMPTY_DICT, False, False, n)
    if not node_first(r, root, n, 0) or (root.kind < 0 and not tree):
        return None
    for k in range(1, n):
        if not node_next(r, root, k):
            return None
    return node_storage(root)


cdef object read_array_leaf(Reader* r):
    """A finalized track's leaf: one msgpack-numpy ndarray of a plain native
    dtype with at least one row, as a finalized Column over a copy of its
    bytes (what from_state() makes of the array msgpack_numpy gives); None
    (the reader anywhere in it) for anything else."""
    cdef NdItem it
    if not read_nd_item(r, &it) or not it.nd or it.ndim < 1 or it.dims[0] == 0:
        return None
    dtype = plain_dtype(r, it.type_at, it.type_len)
    if dtype is None:
        return None
    arr = nd_array(r, &it, <cnp.dtype>dtype)
    return None if arr is None else Column.from_array(arr)


cdef object read_arrays(Reader* r, bint tree, int depth):
    """A finalized track's data: an ndarray (one Column) or, with `tree`, a
    dict of them keyed by str (a dict of Columns, nested as the items);
    None (the reader anywhere in it) for any other value, which the
    general path then reads (empty arrays, whose row type from_state()
    decides by the space; lists; objects)."""
    cdef Head h
    cdef Py_ssize_t k, m
    cdef unsigned char b
    cdef dict out
    if r.pos >= r.end or depth > 32:
        return None
    b = r.p[r.pos]
    if not (0x81 <= b <= 0x8f or b == 0xde):
        return None
    if r.end - r.pos > 5 and memcmp(r.p + r.pos + 1, b"\xc4\x02nd", 4) == 0:
        return read_array_leaf(r)
    if not tree:
        return None
    read_head(r, &h)
    m = h.n
    out = {}
    for k in range(m):
        if r.pos >= r.end:
            return None
        b = r.p[r.pos]
        if not (0xa0 <= b <= 0xbf or b == 0xd9 or b == 0xda):
            return None
        read_head(r, &h)
        name = PyUnicode_DecodeUTF8(<const char*>r.p + h.at, h.n, NULL)
        if name in out:
            return None
        child = read_arrays(r, True, depth + 1)
        if child is None:
            return None
        out[name] = child
    return out


cdef int read_track(Reader* r, _Track t, bint tree) except -1:
    """A lookback buffer's state {data, lookback, finalized, space} into `t`:
    a list of items (list mode) as one Column, or with `tree` a dict of
    them for dict items; arrays (finalized) as Columns over copies of them.
    _NotFast for any other layout."""
    cdef Head h, v
    cdef Py_ssize_t k, m, start
    cdef int key, seen = 0, finalized = 0
    read_head(r, &h)
    if h.kind != H_MAP:
        raise _NotFast()
    m = h.n
    for k in range(m):
        read_head(r, &h)
        key = key_of(r, &h, TRACK_KEY_BYTES, k) if h.kind == H_STR else -1
        if key < 0 or seen & (1 << key):
            raise _NotFast()
        seen |= 1 << key
        if key == 0:
            start = r.pos
            if r.pos < r.end and (0x80 <= r.p[r.pos] <= 0x8f or r.p[r.pos] == 0xde):
                t.storage = read_arrays(r, tree, 0)
                if t.storage is None:
                    raise _NotFast()
                t.arrays = True
                continue
            read_head(r, &v)
            if v.kind != H_ARRAY:
                raise _NotFast()
            t.storage = read_rows(r, v.n, tree)
            if t.storage is None:
                # Not uniform numbers: the items as Python objects.
                r.pos = start
                t.storage = Column.from_list(read_value(r, 1))
        elif key == 1:
            t.lookback = read_value(r, 1)
        elif key == 2:
            read_head(r, &v)
            if v.kind != H_BOOL:
                raise _NotFast()
            finalized = <int>v.i
        else:
            t.space_at = r.pos
            skip_value(r, 1)
            t.space_len = r.pos - t.space_at
    if seen != 0b1111 or finalized != t.arrays:
        raise _NotFast()
    return 0


cdef class _Decoder:
    """Decodes packed episode states; one per call over many, so that the
    spaces (packed identically in every episode of a recording) are built
    once: the episodes of one call share their space objects."""
    cdef dict spaces            # packed bytes of a space -> the space (or None)
    cdef type cls
    cdef dict factories         # lookback -> the extra_model_outputs default factory

    def __init__(self, cls):
        self.spaces = {}
        self.cls = cls
        self.factories = {}

    cdef object space_at(self, Reader* r, Py_ssize_t at, Py_ssize_t n):
        cdef Reader sub
        cdef bytes key = PyBytes_FromStringAndSize(<const char*>r.p + at, n)
        found = self.spaces.get(key, self)
        if found is not self:
            return found
        sub.p = r.p
        sub.pos = at
        sub.end = at + n
        d = read_value(&sub, 1)
        # RLlib: gym_space_from_dict(d) if d else None
        space = space_of(d) if d else None
        if len(self.spaces) < 1024:
            self.spaces[key] = space
        return space

    cdef object decode(self, const unsigned char* p, Py_ssize_t n):
        cdef Reader r
        r.p = p
        r.pos = 0
        r.end = n
        try:
            return self.decode_fast(&r)
        except _NotFast:
            pass
        r.pos = 0
        state = read_value(&r, 0)
        if r.pos != r.end:
            corrupt(&r, f"{r.end - r.pos} bytes after the episode state")
        if type(state) is not dict:
            raise ValueError(f"an episode state is a map, not {type(state).__name__}")
        for name in STATE_KEYS[:K_CUSTOM_DATA]:
            if name not in state:
                raise ValueError(f"the episode state has no {name!r}")
        try:
            return self.cls.from_state(state)
        except (ValueError, TypeError, AssertionError, MemoryError):
            raise       # (AssertionError: RLlib's, for tracks of inconsistent lengths)
        except KeyError as error:
            raise ValueError(f"a part of the episode state has no {error}") from error
        except Exception as error:
            # A packed space's arrays are zlib streams, and so on: corrupt parts
            # fail in their own ways.
            raise ValueError(f"a corrupt episode state ({type(error).__name__}: {error})") \
                from error

    cdef object decode_fast(self, Reader* r):
        cdef Head h
        cdef Py_ssize_t k, m
        cdef Py_ssize_t span_at[N_KEYS]
        cdef Py_ssize_t span_len[N_KEYS]
        cdef int key, seen = 0
        cdef _Track obs = _Track(), act = _Track(), rew = _Track(), inf = _Track(), ext
        cdef dict extras = {}
        cdef list extra_tracks = []
        cdef list values = [None] * N_KEYS
        read_head(r, &h)
        if h.kind != H_MAP:
            raise ValueError(f"an episode state is a map, not a msgpack "
                             f"{['nil', 'bool', 'int', 'int', 'float', 'str', 'bin', 'array', 'map', 'ext'][h.kind]}")
        m = h.n
        for k in range(m):
            read_head(r, &h)
            key = key_of(r, &h, STATE_KEY_BYTES, k) if h.kind == H_STR else -1
            if key < 0 or seen & (1 << key):
                raise _NotFast()
            seen |= 1 << key
            if key == K_OBSERVATIONS:
                read_track(r, obs, True)
            elif key == K_ACTIONS:
                read_track(r, act, True)
            elif key == K_REWARDS:
                read_track(r, rew, True)
            elif key == K_INFOS:
                read_track(r, inf, False)
            elif key == K_EXTRAS:
                read_head(r, &h)
                if h.kind == H_MAP:
                    for _ in range(h.n):
                        at = r.pos
                        name = read_value(r, 1)
                        if type(name) is not str and type(name) is not bytes:
                            r.pos = at
                            corrupt(r, f"a map key must be str or bytes, not "
                                       f"{type(name).__name__}")
                        ext = _Track()
                        read_track(r, ext, True)
                        extra_tracks.append((name, ext))
                elif h.kind != H_NIL:
                    raise _NotFast()
            elif key == K_OBSERVATION_SPACE or key == K_ACTION_SPACE:
                span_at[key] = r.pos
                skip_value(r, 1)
                span_len[key] = r.pos - span_at[key]
            else:
                values[key] = read_value(r, 1)
        if r.pos != r.end:
            corrupt(r, f"{r.end - r.pos} bytes after the episode state")
        for k in range(K_CUSTOM_DATA):
            if not seen & (1 << k):
                raise ValueError(f"the episode state has no {STATE_KEYS[k]!r}")
        # The checks make_episode does not do, where RLlib's from_state takes
        # what the state says: those states go the general way.
        t_started = values[K_T_STARTED]
        t = values[K_T]
        if type(t_started) is not int or type(t) is not int:
            raise _NotFast()
        lookbacks = (obs.lookback, inf.lookback, act.lookback, rew.lookback,
                     (<_Track>extra_tracks[0][1]).lookback if extra_tracks else 0)
        for lookback in lookbacks:
            if type(lookback) is not int:
                raise _NotFast()
        for name, ext in extra_tracks:
            if ext.lookback != lookbacks[4]:
                raise _NotFast()
            extras[name] = ext.storage
        if t != t_started + len(rew.storage) - rew.lookback:
            raise _NotFast()
        observation_space = self.space_at(r, span_at[K_OBSERVATION_SPACE],
                                          span_len[K_OBSERVATION_SPACE])
        action_space = self.space_at(r, span_at[K_ACTION_SPACE], span_len[K_ACTION_SPACE])
        episode = make_episode(
            self.cls, values[K_ID], obs.storage, inf.storage, act.storage, rew.storage, extras,
            lookbacks, values[K_TERMINATED], values[K_TRUNCATED], t_started,
            observation_space, action_space, values[K_AGENT_ID], values[K_MODULE_ID],
            values[K_MA_ID], values[K_START_TIME], values[K_LAST_STEP_TIME],
            values[K_CUSTOM_DATA] if seen & (1 << K_CUSTOM_DATA) else {})
        # Each buffer's own space, where it is not the one make_episode gives.
        self.set_space(r, (<EpisodeCore>episode).observations, obs,
                       span_at[K_OBSERVATION_SPACE], span_len[K_OBSERVATION_SPACE])
        self.set_space(r, (<EpisodeCore>episode).actions, act,
                       span_at[K_ACTION_SPACE], span_len[K_ACTION_SPACE])
        self.set_space(r, (<EpisodeCore>episode).rewards, rew, -1, 0)
        self.set_space(r, (<EpisodeCore>episode).infos, inf, -2, 0)
        extra_buffers = (<EpisodeCore>episode)._extras
        for name, ext in extra_tracks:
            self.set_space(r, extra_buffers[name], ext, -2, 0)
        # RLlib's from_state gives a defaultdict of buffers with the
        # observations' lookback.
        factory = self.factories.get(lookbacks[0])
        if factory is None:
            factory = partial(InfiniteLookbackBuffer, lookback=lookbacks[0])
            self.factories[lookbacks[0]] = factory
        (<EpisodeCore>episode)._extras = defaultdict(factory, extra_buffers)
        return episode

    cdef int set_space(self, Reader* r, BufferCore buf, _Track t, Py_ssize_t expect_at,
                       Py_ssize_t expect_len) except -1:
        # expect_at: the span of the space make_episode gave the buffer, or
        # -1 for the rewards' space, -2 for none.
        cdef bytes rewards_packed
        if expect_at >= 0:
            if t.space_len == expect_len and memcmp(r.p + t.space_at, r.p + expect_at,
                                                    expect_len) == 0:
                return 0
        elif expect_at == -1:
            rewards_packed = rewards_space_packed()
            if t.space_len == PyBytes_GET_SIZE(rewards_packed) and memcmp(
                    r.p + t.space_at, PyBytes_AS_STRING(rewards_packed), t.space_len) == 0:
                return 0
        elif t.space_len == 1 and r.p[t.space_at] == 0xc0:
            return 0
        space = self.space_at(r, t.space_at, t.space_len)
        buf._space = space
        buf._space_struct = space_struct(space)
        return 0


cdef object space_of(object d):
    # The space a packed space dict describes; ValueError for a corrupt one
    # (its arrays are base64 of zlib of np.save: zlib, numpy and gymnasium
    # each have errors of their own).
    try:
        return space_from_dict(d)
    except MemoryError:
        raise
    except Exception as error:
        raise ValueError(f"a packed space that describes none ({type(error).__name__}: "
                         f"{error}): {d!r:.200}") from error


cdef bytes REWARDS_PACKED = None


cdef bytes rewards_space_packed():
    # The rewards buffer's space as get_state() packs it (our own constant).
    global REWARDS_PACKED
    if REWARDS_PACKED is None:
        # (A space's description holds no arrays: plain msgpack packs it
        # as msgpack_numpy's encoder does.)
        REWARDS_PACKED = msgpack.packb(space_to_dict(REWARDS_SPACE))
    return REWARDS_PACKED


def unpack_episode(data, cls):
    """The episode of class `cls` (SingleAgentEpisode) that the packed
    state `data` (bytes-like) describes, as
    ``cls.from_state(msgpack.unpackb(data, object_hook=msgpack_numpy.decode))``
    builds it. ValueError for corrupt or truncated bytes."""
    cdef _Buffer b = get_bytes(data, "a packed episode")
    return _Decoder(cls).decode(<const unsigned char*>b.view.buf, b.view.len)


cdef int raise_at(object error, Py_ssize_t i) except -1:
    # The error of packed episode i, of its class (ValueError for a
    # UnicodeDecodeError), saying which one it was.
    cls = AssertionError if isinstance(error, AssertionError) else \
        TypeError if isinstance(error, TypeError) else ValueError
    raise cls(f"packed episode {i}: {error}") from error


def unpack_episodes(blobs, cls):
    """unpack_episode of each item of `blobs` (bytes-like objects), sharing
    the spaces. An item that fails raises its error with its position."""
    cdef _Decoder decoder = _Decoder(cls)
    cdef _Buffer b
    cdef list out = []
    for i, blob in enumerate(blobs):
        b = get_bytes(blob, f"packed episode {i}")
        try:
            out.append(decoder.decode(<const unsigned char*>b.view.buf, b.view.len))
        except (ValueError, TypeError, AssertionError) as error:
            raise_at(error, i)
    return out


def unpack_episodes_arrow(data, cnp.ndarray offsets, cls):
    """unpack_episode of each value of an Arrow binary array, read in place:
    `data` its data buffer, `offsets` its len + 1 value offsets (int32 or
    int64, already shifted by the array's offset), checked first."""
    cdef _Decoder decoder = _Decoder(cls)
    cdef _Buffer b = get_bytes(data, "an Arrow data buffer")
    cdef Py_ssize_t n, i, lo, hi
    cdef cnp.ndarray offs
    cdef const int64_t* o
    cdef list out = []
    if offsets.ndim != 1 or offsets.shape[0] < 1:
        raise ValueError("Arrow offsets are a 1-d array of len + 1 values")
    offs = np.ascontiguousarray(offsets, dtype=np.int64)
    o = <const int64_t*>array_bytes(offs, offs.shape[0] * 8)
    n = offs.shape[0] - 1
    for i in range(n + 1):
        if o[i] < 0 or o[i] > b.view.len or (i and o[i] < o[i - 1]):
            raise ValueError(f"corrupt Arrow offsets: value {i} is {o[i]} (data of "
                             f"{b.view.len} bytes)")
    for i in range(n):
        lo = o[i]
        hi = o[i + 1]
        try:
            out.append(decoder.decode(<const unsigned char*>b.view.buf + lo, hi - lo))
        except (ValueError, TypeError, AssertionError) as error:
            raise_at(error, i)
    return out
