"""Arrow IPC files read in C, for the numeric columns Minari stores.

An Arrow IPC file (what ``pyarrow.ipc.new_file`` writes, and what Minari's
Arrow backend keeps each episode in) is a leading magic, the messages of a
stream, and a footer: a flatbuffer naming the schema and where each record
batch's message starts. A message is a flatbuffer (a RecordBatch: its
length, one node per field in pre-order and the buffers' offsets in the
body) followed by its body.

`read_file` parses those flatbuffers by hand and hands back the columns as
numpy arrays over the file's own bytes (no copy but for booleans, which
Arrow stores one bit per value). It reads only what the common case needs:
one record batch, no dictionaries, no compression, little-endian, no nulls,
and columns of numbers (ints, floats, bools), fixed-size lists of numbers
and structs of those. Anything else, and anything malformed, gives None:
the caller then reads the file with pyarrow, which reads every layout and
names what is wrong. So that None covers every damage, each position is
checked against its buffer (and its alignment) before it is read, each
count against the schema, and each array's buffer against its length
before the array is made: the flatbuffers are held to their verifier's
rules and the batch to the IPC reader's, or stricter.
"""
import numpy as np

cimport numpy as cnp
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.memoryview cimport PyMemoryView_FromObject, PyMemoryView_GET_BUFFER
from cpython.object cimport PyObject, PyTypeObject
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.ref cimport Py_INCREF
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport (INT64_MAX, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t,
                          uintptr_t)
from libc.string cimport memcmp, memcpy

from episode._bytes cimport le16, le32, le64
from episode._column cimport CHECKED, array_bytes

cnp.import_array()

cdef extern from "numpy/arrayobject.h":
    # Steals a reference to `descr`: its caller INCREFs it first.
    object PyArray_NewFromDescr(PyTypeObject* subtype, cnp.PyArray_Descr* descr, int nd,
                                cnp.npy_intp* dims, cnp.npy_intp* strides, void* data,
                                int flags, PyObject* obj)

cdef extern from "Python.h":
    int PyBuffer_IsContiguous(const Py_buffer* view, char order)
    str PyUnicode_DecodeFSDefault(const char* s)


cdef object ndarray_type = np.ndarray
# numpy's dtypes of Arrow's Int (by byte width, unsigned then signed) and
# FloatingPoint (by precision: HALF, SINGLE, DOUBLE).
cdef tuple UINTS = (None, np.dtype("<u1"), np.dtype("<u2"), None, np.dtype("<u4"),
                    None, None, None, np.dtype("<u8"))
cdef tuple INTS = (None, np.dtype("<i1"), np.dtype("<i2"), None, np.dtype("<i4"),
                   None, None, None, np.dtype("<i8"))
cdef tuple FLOATS = (np.dtype("<f2"), np.dtype("<f4"), np.dtype("<f8"))

cdef enum:
    # Arrow's Type union (Schema.fbs): the members read here.
    T_INT = 2
    T_FLOAT = 3
    T_BOOL = 6
    T_STRUCT = 13
    T_FIXED_SIZE_LIST = 16
    # MessageHeader: RecordBatch; MetadataVersion: V4 and V5.
    H_RECORD_BATCH = 3
    V4 = 3
    V5 = 4
    # Limits beyond which a file is left to pyarrow: nesting depth, fields,
    # tables visited (the flatbuffers verifier's own limits are 64 and 1M).
    MAX_DEPTH = 32
    MAX_FIELDS = 4096
    MAX_TABLES = 100000

# The leading and trailing magic; the footer's length and the magic at the end.
cdef bytes MAGIC = b"ARROW1"
DEF TAIL = 10


class _Unsupported(Exception):
    """A file this reader leaves to pyarrow (never seen by callers)."""


cdef int unsupported() except -1:
    raise _Unsupported()


# -- flatbuffers ------------------------------------------------------------------------

cdef struct FB:
    const uint8_t* p     # the flatbuffer's first byte
    Py_ssize_t n         # its size
    Py_ssize_t tables    # tables visited so far (shared by a file's flatbuffers)

cdef struct Table:
    Py_ssize_t pos       # the table's start (its vtable offset) in the flatbuffer
    Py_ssize_t vt        # its vtable's start
    Py_ssize_t slots     # the number of field slots the vtable has
    Py_ssize_t size      # the table's size in bytes


cdef inline int need(FB* fb, Py_ssize_t pos, Py_ssize_t size) except -1:
    """`size` bytes at `pos` lie in the flatbuffer, aligned to `size` (or
    to 8 for larger sizes)."""
    cdef Py_ssize_t align = size if size < 8 else 8
    if pos < 0 or size < 0 or pos > fb.n - size or pos % align:
        unsupported()
    return 0


cdef inline const uint8_t* at(FB* fb, Py_ssize_t pos, Py_ssize_t size) except NULL:
    # Every read goes through here: in the checked build, checked again.
    if CHECKED and (pos < 0 or size < 0 or pos > fb.n - size):
        raise SystemError(f"_arrowipc: read of {size} bytes at {pos} of {fb.n}")
    return fb.p + pos


cdef int table_at(FB* fb, Py_ssize_t pos, Table* t) except -1:
    cdef Py_ssize_t vt, vsize
    need(fb, pos, 4)
    vt = pos - <Py_ssize_t><int32_t>le32(at(fb, pos, 4))
    if vt < 0 or vt % 2 or vt > fb.n - 4:
        unsupported()
    vsize = le16(at(fb, vt, 2))
    t.size = le16(at(fb, vt + 2, 2))
    if vsize < 4 or vsize % 2 or vt > fb.n - vsize or t.size < 4 or pos > fb.n - t.size:
        unsupported()
    fb.tables += 1
    if fb.tables > MAX_TABLES:
        unsupported()
    t.pos, t.vt, t.slots = pos, vt, (vsize - 4) // 2
    return 0


cdef int only_fields(FB* fb, Table* t, Py_ssize_t known) except -1:
    """The table sets no field past the first `known` (a field this reader
    does not know is left to pyarrow)."""
    cdef Py_ssize_t i
    for i in range(known, t.slots):
        if le16(at(fb, t.vt + 4 + 2 * i, 2)) != 0:
            unsupported()
    return 0


cdef Py_ssize_t field_at(FB* fb, Table* t, Py_ssize_t slot, Py_ssize_t size) except -2:
    """Where field `slot` (`size` bytes) is, or -1 when it is not set."""
    cdef Py_ssize_t off
    if slot >= t.slots:
        return -1
    off = le16(at(fb, t.vt + 4 + 2 * slot, 2))
    if off == 0:
        return -1
    if off > t.size - size:
        unsupported()
    need(fb, t.pos + off, size)
    return t.pos + off


cdef int64_t get_i64(FB* fb, Table* t, Py_ssize_t slot, int64_t default) except? -1:
    cdef Py_ssize_t pos = field_at(fb, t, slot, 8)
    return default if pos < 0 else <int64_t>le64(at(fb, pos, 8))

cdef int64_t get_i32(FB* fb, Table* t, Py_ssize_t slot, int64_t default) except? -1:
    cdef Py_ssize_t pos = field_at(fb, t, slot, 4)
    return default if pos < 0 else <int32_t>le32(at(fb, pos, 4))

cdef int64_t get_i16(FB* fb, Table* t, Py_ssize_t slot, int64_t default) except? -1:
    cdef Py_ssize_t pos = field_at(fb, t, slot, 2)
    return default if pos < 0 else <int16_t>le16(at(fb, pos, 2))

cdef int64_t get_u8(FB* fb, Table* t, Py_ssize_t slot, int64_t default) except? -1:
    cdef Py_ssize_t pos = field_at(fb, t, slot, 1)
    return default if pos < 0 else at(fb, pos, 1)[0]


cdef Py_ssize_t follow(FB* fb, Py_ssize_t pos) except -2:
    """The target of the offset at `pos` (an aligned uoffset: not zero, not
    negative as a signed offset, inside the buffer)."""
    cdef uint32_t off
    need(fb, pos, 4)
    off = le32(at(fb, pos, 4))
    if off == 0 or off > 0x7FFFFFFF or pos + <Py_ssize_t>off >= fb.n:
        unsupported()
    return pos + off


cdef Py_ssize_t get_ref(FB* fb, Table* t, Py_ssize_t slot) except -2:
    """The target of offset field `slot`, or -1 when it is not set."""
    cdef Py_ssize_t pos = field_at(fb, t, slot, 4)
    return -1 if pos < 0 else follow(fb, pos)


cdef bint get_table(FB* fb, Table* t, Py_ssize_t slot, Table* out) except -1:
    cdef Py_ssize_t pos = get_ref(fb, t, slot)
    if pos < 0:
        return False
    table_at(fb, pos, out)
    return True


cdef Py_ssize_t vector_at(FB* fb, Py_ssize_t pos, Py_ssize_t elem, Py_ssize_t* count) except -2:
    """The first element of the vector at `pos` (its count, a uint32, comes
    first) of `count` elements of `elem` bytes, each aligned as one."""
    cdef Py_ssize_t n
    need(fb, pos, 4)
    n = le32(at(fb, pos, 4))
    if n > (fb.n - pos - 4) // elem:
        unsupported()
    if n:
        need(fb, pos + 4, elem)
    count[0] = n
    return pos + 4


cdef Py_ssize_t get_vector(FB* fb, Table* t, Py_ssize_t slot, Py_ssize_t elem,
                           Py_ssize_t* count) except -2:
    """The vector field `slot` (see vector_at), or -1 and a count of 0."""
    cdef Py_ssize_t pos = get_ref(fb, t, slot)
    count[0] = 0
    return -1 if pos < 0 else vector_at(fb, pos, elem, count)


cdef bytes string_at(FB* fb, Py_ssize_t pos):
    """The string at `pos`: its length, its bytes and a terminating zero."""
    cdef Py_ssize_t n, first
    need(fb, pos, 4)
    n = le32(at(fb, pos, 4))
    first = pos + 4
    if n > fb.n - first - 1 or at(fb, first + n, 1)[0] != 0:
        unsupported()
    return PyBytes_FromStringAndSize(<const char*>at(fb, first, n), n)


cdef object key_values(FB* fb, Table* t, Py_ssize_t slot):
    """A custom_metadata field: a dict of bytes (None when unset or empty)."""
    cdef Py_ssize_t count, i, first = get_vector(fb, t, slot, 4, &count)
    cdef Table kv
    cdef Py_ssize_t kpos, vpos
    if count == 0:
        return None
    out = {}
    for i in range(count):
        table_at(fb, follow(fb, first + 4 * i), &kv)
        only_fields(fb, &kv, 2)
        kpos, vpos = get_ref(fb, &kv, 0), get_ref(fb, &kv, 1)
        if kpos < 0 or vpos < 0:
            unsupported()
        key = string_at(fb, kpos)
        if key in out:               # pyarrow's dict of them would keep one
            unsupported()
        out[key] = string_at(fb, vpos)
    return out


# -- the schema ----------------------------------------------------------------------------

cdef enum Kind:
    K_NUMBER = 0     # ints and floats: a validity and a data buffer
    K_BOOL = 1       # one bit per value: a validity and a data buffer
    K_LIST = 2       # a fixed-size list: a validity buffer, one child
    K_STRUCT = 3     # a validity buffer, its children

cdef struct FieldInfo:
    int kind
    int64_t list_size        # K_LIST: values per row
    Py_ssize_t children      # K_STRUCT and K_LIST: direct children


cdef class _Schema:
    """A schema's fields in pre-order (the order of a batch's nodes)."""
    cdef FieldInfo* info
    cdef Py_ssize_t n, capacity
    cdef list names          # str, per field
    cdef list dtypes         # np.dtype per K_NUMBER field, else None
    cdef list metadata       # dict or None, per field
    cdef Py_ssize_t n_buffers

    def __cinit__(self):
        self.info = NULL
        self.n = self.capacity = self.n_buffers = 0
        self.names, self.dtypes, self.metadata = [], [], []

    def __dealloc__(self):
        PyMem_Free(self.info)

    cdef Py_ssize_t add(self) except -1:
        """A new field's index."""
        cdef FieldInfo* grown
        if self.n == self.capacity:
            if self.n >= MAX_FIELDS:
                unsupported()
            grown = <FieldInfo*>PyMem_Realloc(self.info,
                                              (2 * self.capacity + 8) * sizeof(FieldInfo))
            if grown == NULL:
                raise MemoryError()
            self.info = grown
            self.capacity = 2 * self.capacity + 8
        self.info[self.n].kind = K_NUMBER
        self.info[self.n].list_size = 0
        self.info[self.n].children = 0
        self.n += 1
        return self.n - 1


cdef int add_fields(FB* fb, Table* parent, Py_ssize_t slot, _Schema s, int depth,
                    Py_ssize_t* count) except -1:
    """The fields of vector `slot` of `parent` (a Schema's or a Field's),
    each and its children, in pre-order; count: how many."""
    cdef Py_ssize_t first = get_vector(fb, parent, slot, 4, count)
    cdef Py_ssize_t i, pos, n_children, i_field
    cdef Table f, tt
    cdef int type_id, kind = -1
    cdef int64_t width, list_size
    if depth > MAX_DEPTH:
        unsupported()
    seen = set()
    for i in range(count[0]):
        table_at(fb, follow(fb, first + 4 * i), &f)
        # name, nullable, type_type, type, dictionary, children, custom_metadata
        only_fields(fb, &f, 7)
        if field_at(fb, &f, 4, 4) >= 0:      # dictionary encoded
            unsupported()
        pos = get_ref(fb, &f, 0)
        if pos < 0:
            unsupported()
        raw = string_at(fb, pos)
        try:
            name = PyUnicode_DecodeUTF8(raw, len(raw), NULL)
        except UnicodeDecodeError:
            unsupported()
        if name in seen:                     # pyarrow finds no field of a repeated name
            unsupported()
        seen.add(name)
        get_u8(fb, &f, 1, 0)                 # nullable: checked in place, not used
        type_id = <int>get_u8(fb, &f, 2, 0)
        if not get_table(fb, &f, 3, &tt):
            unsupported()
        dtype = None
        list_size = 0
        if type_id == T_INT:
            only_fields(fb, &tt, 2)
            width = get_i32(fb, &tt, 0, 0)
            if width != 8 and width != 16 and width != 32 and width != 64:
                unsupported()
            dtype = (INTS if get_u8(fb, &tt, 1, 0) else UINTS)[width // 8]
            kind = K_NUMBER
        elif type_id == T_FLOAT:
            only_fields(fb, &tt, 1)
            width = get_i16(fb, &tt, 0, 0)
            if not 0 <= width <= 2:
                unsupported()
            dtype = FLOATS[width]
            kind = K_NUMBER
        elif type_id == T_BOOL:
            only_fields(fb, &tt, 0)
            kind = K_BOOL
        elif type_id == T_FIXED_SIZE_LIST:
            only_fields(fb, &tt, 1)
            list_size = get_i32(fb, &tt, 0, 0)
            if list_size <= 0:
                unsupported()
            kind = K_LIST
        elif type_id == T_STRUCT:
            only_fields(fb, &tt, 0)
            kind = K_STRUCT
        else:
            unsupported()
        i_field = s.add()
        s.info[i_field].kind = kind
        s.info[i_field].list_size = list_size
        s.names.append(name)
        s.dtypes.append(dtype)
        s.metadata.append(key_values(fb, &f, 6))
        s.n_buffers += 2 if kind == K_NUMBER or kind == K_BOOL else 1
        add_fields(fb, &f, 5, s, depth + 1, &n_children)
        s.info[i_field].children = n_children
        if kind == K_LIST:
            # One child of numbers: lists of lists and of structs are left to pyarrow.
            if n_children != 1 or s.info[i_field + 1].kind > K_BOOL:
                unsupported()
        elif kind != K_STRUCT and n_children:
            unsupported()
    return 0


# -- the record batch ----------------------------------------------------------------------

cdef struct Body:
    const uint8_t* p          # the body's first byte
    int64_t n                 # its size
    const uint8_t* nodes      # the batch's FieldNodes: (length, null_count) int64 pairs
    const uint8_t* buffers    # its Buffers: (offset, length) int64 pairs
    Py_ssize_t node, n_nodes        # the next node, and how many there are
    Py_ssize_t buffer, n_buffers    # the next buffer, and how many there are


cdef int64_t take_node(Body* b, int64_t length) except -1:
    """The next node: `length` values and no nulls."""
    cdef const uint8_t* node
    if b.node >= b.n_nodes:
        unsupported()
    node = b.nodes + 16 * b.node
    b.node += 1
    if <int64_t>le64(node) != length or <int64_t>le64(node + 8) != 0:
        unsupported()
    return 0


cdef const uint8_t* take_buffer(Body* b, int64_t need_bytes) except NULL:
    """The next buffer (at an 8-aligned offset inside the body, at least
    `need_bytes` long)."""
    cdef const uint8_t* buf
    cdef int64_t offset, length
    if b.buffer >= b.n_buffers:
        unsupported()
    buf = b.buffers + 16 * b.buffer
    offset, length = <int64_t>le64(buf), <int64_t>le64(buf + 8)
    b.buffer += 1
    if (offset < 0 or offset % 8 or length < need_bytes or offset > b.n
            or length > b.n - offset):
        unsupported()
    return b.p + offset


cdef object numbers(Body* b, cnp.dtype dtype, int64_t length, int64_t size, object base):
    """A K_NUMBER field's data, `length` values, as an array over the body
    (`size` values per row when `size` > 0: rows of a fixed-size list)."""
    cdef int64_t width = dtype.itemsize
    cdef cnp.npy_intp dims[2]
    cdef const uint8_t* data
    if length > INT64_MAX // width:
        unsupported()
    data = take_buffer(b, length * width)
    if <uintptr_t>data % width:
        unsupported()
    if size:
        dims[0], dims[1] = length // size, size
    else:
        dims[0] = length
    Py_INCREF(dtype)
    arr = PyArray_NewFromDescr(<PyTypeObject*>ndarray_type, <cnp.PyArray_Descr*>dtype,
                               2 if size else 1, dims, NULL, <void*>data, 0, NULL)
    cnp.set_array_base(<cnp.ndarray>arr, base)
    return arr


cdef object bools(Body* b, int64_t length, int64_t size):
    """A K_BOOL field's bits as a new bool array (rows of `size` when > 0)."""
    cdef const uint8_t* bits
    cdef cnp.npy_intp dims[2]
    cdef uint8_t* out
    cdef int64_t i
    if length > INT64_MAX - 7:
        unsupported()
    bits = take_buffer(b, (length + 7) // 8)
    if size:
        dims[0], dims[1] = length // size, size
    else:
        dims[0] = length
    arr = cnp.PyArray_EMPTY(2 if size else 1, dims, cnp.NPY_BOOL, 0)
    out = <uint8_t*>array_bytes(<cnp.ndarray>arr, length)
    for i in range(length):
        out[i] = (bits[i >> 3] >> (i & 7)) & 1
    return arr


cdef object read_field(Body* b, _Schema s, Py_ssize_t* f, int64_t length, tuple path,
                       dict field_meta, object base):
    """Field f[0]'s values (`length` rows) and its children's; f[0] moves
    past them. A struct is a dict of its fields, a fixed-size list of
    numbers a 2-D array, numbers a 1-D array."""
    cdef Py_ssize_t i = f[0], child, k
    cdef int64_t size
    cdef int kind = s.info[i].kind
    path = path + (s.names[i],)
    if s.metadata[i] is not None:
        field_meta[path] = s.metadata[i]
    f[0] += 1
    take_node(b, length)
    take_buffer(b, 0)                        # validity: not read (no nulls)
    if kind == K_NUMBER:
        return numbers(b, s.dtypes[i], length, 0, base)
    if kind == K_BOOL:
        return bools(b, length, 0)
    if kind == K_LIST:
        size = s.info[i].list_size
        if length > INT64_MAX // size:
            unsupported()
        child = f[0]
        f[0] += 1
        if s.metadata[child] is not None:
            field_meta[path + (s.names[child],)] = s.metadata[child]
        take_node(b, length * size)
        take_buffer(b, 0)
        if s.info[child].kind == K_BOOL:
            return bools(b, length * size, size)
        return numbers(b, s.dtypes[child], length * size, size, base)
    out = {}
    for k in range(s.info[i].children):
        name = s.names[f[0]]
        out[name] = read_field(b, s, f, length, path, field_meta, base)
    return out


# -- an episode's folder ------------------------------------------------------------------

cdef extern from *:
    """
    #include <errno.h>
    #include <stdint.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #ifndef _WIN32
    #include <dirent.h>
    #include <fcntl.h>
    #include <unistd.h>
    #endif
    #if defined(__linux__)
    #include <sys/syscall.h>
    #endif

    /* A data file's name as Minari's Arrow reader sees one: not "_..", not
       ".." (nor "." and ".."), not metadata.json (nor a name it begins). */
    static int episode_is_data_name(const char* name) {
        return name[0] != '_' && name[0] != '.'
               && strncmp(name, "metadata.json", 13) != 0;
    }

    /* Opens folder `index` under the directory `root` and finds its one
       data file: 1 with the folder's fd in *folder and the name in `name`
       (`cap` bytes), 0 when there are none or several (or the name does not
       fit), -1 on any error. Linux lists with getdents64 (one call less
       than opendir's fstat); elsewhere readdir on a dup of the fd. */
    static int episode_one_data_file(int root, long long index, int* folder,
                                     char* name, size_t cap) {
    #ifdef _WIN32
        return -1;
    #else
        char dir[32];
        int fd, found = 0;
        snprintf(dir, sizeof dir, "%lld", index);
        fd = openat(root, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) return -1;
    #if defined(__linux__) && defined(SYS_getdents64)
        {
            /* struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name */
            char buf[4096] __attribute__((aligned(8)));
            for (;;) {
                long n = syscall(SYS_getdents64, fd, buf, sizeof buf), pos = 0;
                if (n < 0) { close(fd); return -1; }
                if (n == 0) break;
                while (pos + 19 < n) {
                    unsigned short reclen;
                    const char* entry = buf + pos;
                    memcpy(&reclen, entry + 16, 2);
                    if (reclen <= 19 || reclen > n - pos) { close(fd); return -1; }
                    if (episode_is_data_name(entry + 19)) {
                        size_t len = strnlen(entry + 19, reclen - 19);
                        if (++found > 1 || len >= cap) { close(fd); return 0; }
                        memcpy(name, entry + 19, len);
                        name[len] = 0;
                    }
                    pos += reclen;
                }
            }
        }
    #else
        {
            int listing = dup(fd);
            DIR* d;
            struct dirent* e;
            if (listing < 0) { close(fd); return -1; }
            d = fdopendir(listing);
            if (d == NULL) { close(listing); close(fd); return -1; }
            errno = 0;
            while ((e = readdir(d)) != NULL) {
                if (episode_is_data_name(e->d_name)) {
                    size_t len = strlen(e->d_name);
                    if (++found > 1 || len >= cap) { closedir(d); close(fd); return 0; }
                    memcpy(name, e->d_name, len + 1);
                }
            }
            if (errno) { closedir(d); close(fd); return -1; }
            closedir(d);
        }
    #endif
        if (found != 1) { close(fd); return 0; }
        *folder = fd;
        return 1;
    #endif
    }

    /* File `name` in the directory `folder`, read into `buf` (`cap`
       bytes): 1 with its size in *size when the whole file fits (the end
       seen), 0 when it holds more, -1 on any error. */
    static int episode_read_file(int folder, const char* name, char* buf, size_t cap,
                                 Py_ssize_t* size) {
    #ifdef _WIN32
        return -1;
    #else
        size_t used = 0;
        int fd = openat(folder, name, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return -1;
        for (;;) {
            ssize_t n = read(fd, buf + used, cap - used);
            if (n < 0) {
                if (errno == EINTR) continue;
                close(fd);
                return -1;
            }
            if (n == 0) {
                close(fd);
                *size = (Py_ssize_t)used;
                return 1;
            }
            used += (size_t)n;
            if (used == cap) {
                close(fd);
                return 0;
            }
        }
    #endif
    }

    static void episode_close(int fd) {
    #ifndef _WIN32
        close(fd);
    #endif
    }
    """
    int episode_one_data_file(int root, long long index, int* folder, char* name,
                              size_t cap) nogil
    int episode_read_file(int folder, const char* name, char* buf, size_t cap,
                          Py_ssize_t* size) nogil
    void episode_close(int fd) nogil
    void* malloc(size_t size) nogil
    void free(void* p) nogil


# Files up to this size are read here, larger ones by the caller (which
# reads a file at once, at the size the file system gives).
DEF SMALL_FILE = 1 << 16


def read_episode_file(int root, long long index):
    """The one data file of an episode's folder, read whole if it is small.

    Args:
        root: an open file descriptor of the dataset's data folder.
        index: the episode's index: its folder's name.

    Returns:
        (name, data): the file's name (str, decoded as os.fsdecode does)
        and its bytes, or None for bytes when the file holds more than
        64 KiB (the caller reads it). None when the folder holds no data
        file or several (names beginning with "_", "." or "metadata.json"
        are not data), or when anything fails: the caller then lists the
        folder itself, and raises what it finds.
    """
    cdef char name[256]
    cdef int folder, found, read = -1
    cdef char* buf = <char*>malloc(SMALL_FILE)
    cdef Py_ssize_t size = 0
    if buf == NULL:
        raise MemoryError()
    try:
        with nogil:
            found = episode_one_data_file(root, index, &folder, name, sizeof(name))
            if found == 1:
                read = episode_read_file(folder, name, buf, SMALL_FILE, &size)
                episode_close(folder)
        if found != 1 or read < 0:
            return None
        return (PyUnicode_DecodeFSDefault(name),
                PyBytes_FromStringAndSize(buf, size) if read == 1 else None)
    finally:
        free(buf)


# -- the file -------------------------------------------------------------------------------

def read_file(data):
    """The columns of an Arrow IPC file, or None where pyarrow must read it.

    Args:
        data: the whole file (bytes, or any contiguous buffer, such as an
            mmap): the arrays returned are views of it and keep it alive.

    Returns:
        (rows, columns, metadata, field_metadata): the record batch's row
        count; its columns by name (a dict in schema order): a 1-D array
        per column of numbers, a 2-D array (rows, list size) per
        fixed-size list, a dict of the same per struct; the schema's
        custom metadata (a dict of bytes, or None); each field's custom
        metadata by the path of names that leads to it. None when the file
        holds more or other than one batch of such columns without nulls
        (see the module's docstring), or is damaged in any way.
    """
    cdef const uint8_t* p
    cdef Py_ssize_t n
    cdef Py_buffer* view
    if type(data) is bytes:
        p = <const uint8_t*>PyBytes_AS_STRING(data)
        n = PyBytes_GET_SIZE(data)
        base = data
    else:
        base = PyMemoryView_FromObject(data)
        view = PyMemoryView_GET_BUFFER(base)
        if not PyBuffer_IsContiguous(view, b'C'):
            return None
        p, n = <const uint8_t*>view.buf, view.len
    try:
        return parse(p, n, base)
    except _Unsupported:
        return None


cdef object parse(const uint8_t* p, Py_ssize_t n, object base):
    cdef FB whole, footer, message
    cdef Table t_footer, t_schema, t_message, t_batch
    cdef Py_ssize_t footer_size, footer_start, count, first, n_fields
    cdef Py_ssize_t f = 0
    cdef const uint8_t* block
    cdef int64_t offset, meta_size, body_size, rows
    cdef int version
    cdef _Schema s = _Schema()
    cdef Body b
    whole.p, whole.n, whole.tables = p, n, 0
    if (n < 8 + TAIL or memcmp(at(&whole, 0, 6), <const char*>MAGIC, 6)
            or memcmp(at(&whole, n - 6, 6), <const char*>MAGIC, 6)):
        unsupported()
    footer_size = <int32_t>le32(at(&whole, n - TAIL, 4))
    if footer_size <= 0 or footer_size > n - 8 - TAIL:
        unsupported()
    footer_start = n - TAIL - footer_size
    footer.p, footer.n, footer.tables = at(&whole, footer_start, footer_size), footer_size, 0

    # Footer: version, schema, dictionaries, recordBatches, custom_metadata.
    table_at(&footer, follow(&footer, 0), &t_footer)
    only_fields(&footer, &t_footer, 5)
    version = <int>get_i16(&footer, &t_footer, 0, 0)
    if version != V4 and version != V5:
        unsupported()
    get_vector(&footer, &t_footer, 2, 24, &count)
    if count:
        unsupported()
    key_values(&footer, &t_footer, 4)            # checked, not used
    first = get_vector(&footer, &t_footer, 3, 24, &count)
    if count != 1:
        unsupported()
    block = at(&footer, first, 24)
    offset, meta_size, body_size = <int64_t>le64(block), <int32_t>le32(block + 8), <int64_t>le64(block + 16)

    # Schema: endianness, fields, custom_metadata, features.
    if not get_table(&footer, &t_footer, 1, &t_schema):
        unsupported()
    only_fields(&footer, &t_schema, 4)
    if get_i16(&footer, &t_schema, 0, 0) != 0:   # big-endian
        unsupported()
    get_vector(&footer, &t_schema, 3, 8, &count)
    if count:
        unsupported()
    metadata = key_values(&footer, &t_schema, 2)
    add_fields(&footer, &t_schema, 1, s, 0, &n_fields)

    # The batch's message: a continuation marker, the flatbuffer's size, the
    # flatbuffer (padded to the block's metadata size), then the body.
    if (offset < 8 or offset % 8 or meta_size < 8 or meta_size % 8 or body_size < 0
            or offset > footer_start or meta_size > footer_start - offset
            or body_size > footer_start - offset - meta_size):
        unsupported()
    if (le32(at(&whole, offset, 4)) != 0xFFFFFFFF
            or <int32_t>le32(at(&whole, offset + 4, 4)) != meta_size - 8):
        unsupported()
    message.p, message.n = at(&whole, offset + 8, meta_size - 8), meta_size - 8
    message.tables = footer.tables
    # Message: version, header_type, header, bodyLength (custom_metadata: not read).
    table_at(&message, follow(&message, 0), &t_message)
    only_fields(&message, &t_message, 4)
    version = <int>get_i16(&message, &t_message, 0, 0)     # pyarrow's V4 files: a V5 footer
    if ((version != V4 and version != V5)
            or get_u8(&message, &t_message, 1, 0) != H_RECORD_BATCH
            or get_i64(&message, &t_message, 3, 0) != body_size
            or not get_table(&message, &t_message, 2, &t_batch)):
        unsupported()
    # RecordBatch: length, nodes, buffers (compression, variadicBufferCounts: not read).
    only_fields(&message, &t_batch, 3)
    rows = get_i64(&message, &t_batch, 0, 0)
    first = get_vector(&message, &t_batch, 1, 16, &count)
    if count != s.n or rows < 0:
        unsupported()
    b.nodes = at(&message, first, 16 * count) if count else NULL
    b.n_nodes, b.node = count, 0
    first = get_vector(&message, &t_batch, 2, 16, &count)
    if count != s.n_buffers:
        unsupported()
    b.buffers = at(&message, first, 16 * count) if count else NULL
    b.n_buffers, b.buffer = count, 0
    b.p, b.n = at(&whole, offset + meta_size, body_size), body_size

    columns = {}
    field_meta = {}
    for _ in range(n_fields):
        name = s.names[f]
        columns[name] = read_field(&b, s, &f, rows, (), field_meta, base)
    return rows, columns, metadata, field_meta
