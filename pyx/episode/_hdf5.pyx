"""Minari's HDF5 files read without libhdf5.

libhdf5 spends tens of microseconds opening, reading and closing each
dataset; a Minari episode is five or more small datasets. This module reads
the structures that h5py writes with its default settings (the oldest file
format that holds the data; Minari's files) and with track_order=True
(to_minari's files), straight from a memory map of the file:

* superblock version 0 or 1 with 8-byte addresses and lengths, no user
  block and no special file driver;
* version 1 object headers, with continuation blocks, and version 2 ones
  (their checksums checked);
* groups held in a symbol table (a version 1 B-tree of symbol table nodes
  and a local heap of names), or as link messages in their header (listed
  in creation order when the group tracks it, as h5py lists them); hard
  links only. A root that keeps its links in a fractal heap is listed by
  the caller (through h5py) and handed over (use_root);
* datasets of little-endian integers, IEEE floats or h5py's bools (an
  8-bit enum FALSE/TRUE), with a simple dataspace of rank >= 1 and compact,
  contiguous or chunked storage (a version 1 B-tree of unfiltered chunks),
  every byte of the data stored;
* a group's "id_" attribute when it is a scalar UTF-8 string (in the
  global heap, as h5py writes a str).

Anything else (compression and other filters, string datasets,
variable-length data, links in a fractal heap below the root, soft links,
data never written) makes a read return None, and the caller reads that part through h5py as
before. A structure that does not add up (an address past the end of the
file, a B-tree whose levels do not step down, a header continued into
itself, a chunk stored twice, more structures than the file could hold)
raises Damaged, naming it and its place: libhdf5 is not handed such a file,
as it crashes on some of them. Every address and length is checked against
the file's end before it is used, and every walk is bounded.
"""
import mmap
import os

cimport numpy as cnp
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITE, PyBuffer_Release, PyObject_GetBuffer
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memchr, memcmp, memcpy, memset

from episode._bytes cimport le16, le32, le64
from episode._column cimport array_bytes

cdef extern from *:
    """
    #ifndef EPISODE_CHECKED
    #define EPISODE_CHECKED 0
    #endif
    """
    # 1 in the checked build: the file is read into a heap block of its exact
    # size rather than mapped, so that AddressSanitizer sees a read past its end.
    const bint CHECKED "EPISODE_CHECKED"

cnp.import_array()

cdef enum:
    MAX_RANK = 32          # dataspace ranks read (libhdf5's own limit)
    MAX_DEPTH = 32         # nested groups followed below the one read
    MAX_LEVEL = 64         # B-tree heights followed
    MAX_BLOCKS = 64        # continuation blocks of one object header
    SB_SIZE = 96           # superblock v0 with 8-byte addresses, root entry included

# Message types of version 1 object headers.
cdef enum:
    MSG_NIL = 0x00
    MSG_DATASPACE = 0x01
    MSG_DATATYPE = 0x03
    MSG_FILL_OLD = 0x04
    MSG_FILL = 0x05
    MSG_LAYOUT = 0x08
    MSG_LINK_INFO = 0x02
    MSG_LINK = 0x06
    MSG_GROUP_INFO = 0x0A
    MSG_ATTRIBUTE_INFO = 0x15
    MSG_FILTERS = 0x0B
    MSG_ATTRIBUTE = 0x0C
    MSG_COMMENT = 0x0D
    MSG_MTIME_OLD = 0x0E
    MSG_CONTINUATION = 0x10
    MSG_SYMBOL_TABLE = 0x11
    MSG_MTIME = 0x12
    MSG_BTREE_K = 0x13
    MSG_REFCOUNT = 0x16

cdef enum:
    KIND_NONE = 0
    KIND_GROUP = 1
    KIND_DATASET = 2

cdef enum:
    LAYOUT_COMPACT = 0
    LAYOUT_CONTIGUOUS = 1
    LAYOUT_CHUNKED = 2

cdef extern from *:
    """
    /* Bob Jenkins' lookup3 hashlittle, byte by byte: the checksum of
       HDF5's newer metadata (its H5_checksum_lookup3 with initval 0). */
    static uint32_t episode_lookup3(const uint8_t *k, size_t length) {
    #define EP_ROT(x, r) (((x) << (r)) | ((x) >> (32 - (r))))
        uint32_t a, b, c;
        a = b = c = 0xdeadbeefu + (uint32_t)length;
        while (length > 12) {
            a += k[0] + ((uint32_t)k[1] << 8) + ((uint32_t)k[2] << 16) + ((uint32_t)k[3] << 24);
            b += k[4] + ((uint32_t)k[5] << 8) + ((uint32_t)k[6] << 16) + ((uint32_t)k[7] << 24);
            c += k[8] + ((uint32_t)k[9] << 8) + ((uint32_t)k[10] << 16) + ((uint32_t)k[11] << 24);
            a -= c; a ^= EP_ROT(c, 4);  c += b;
            b -= a; b ^= EP_ROT(a, 6);  a += c;
            c -= b; c ^= EP_ROT(b, 8);  b += a;
            a -= c; a ^= EP_ROT(c, 16); c += b;
            b -= a; b ^= EP_ROT(a, 19); a += c;
            c -= b; c ^= EP_ROT(b, 4);  b += a;
            length -= 12;
            k += 12;
        }
        switch (length) {
        case 12: c += (uint32_t)k[11] << 24; /* fall through */
        case 11: c += (uint32_t)k[10] << 16; /* fall through */
        case 10: c += (uint32_t)k[9] << 8;   /* fall through */
        case 9:  c += k[8];                  /* fall through */
        case 8:  b += (uint32_t)k[7] << 24;  /* fall through */
        case 7:  b += (uint32_t)k[6] << 16;  /* fall through */
        case 6:  b += (uint32_t)k[5] << 8;   /* fall through */
        case 5:  b += k[4];                  /* fall through */
        case 4:  a += (uint32_t)k[3] << 24;  /* fall through */
        case 3:  a += (uint32_t)k[2] << 16;  /* fall through */
        case 2:  a += (uint32_t)k[1] << 8;   /* fall through */
        case 1:  a += k[0]; break;
        case 0:  return c;
        }
        c ^= b; c -= EP_ROT(b, 14);
        a ^= c; a -= EP_ROT(c, 11);
        b ^= a; b -= EP_ROT(a, 25);
        c ^= b; c -= EP_ROT(b, 16);
        a ^= c; a -= EP_ROT(c, 4);
        b ^= a; b -= EP_ROT(a, 14);
        c ^= b; c -= EP_ROT(b, 24);
        return c;
    #undef EP_ROT
    }
    """
    uint32_t lookup3 "episode_lookup3"(const uint8_t* k, size_t length) noexcept nogil

cdef uint64_t UNDEF = 0xFFFFFFFFFFFFFFFFULL
cdef const char* SIGNATURE = b"\x89HDF\r\n\x1a\n"


class Unreadable(Exception):
    """A structure this reader does not read: h5py's turn."""


class Damaged(ValueError):
    """A structure that does not add up (libhdf5 may crash on some of these:
    a group B-tree that points back at itself), named with its place."""


cdef struct Header:
    int kind
    bint has_id_attr        # the object carries an "id_" attribute not read here
    # group: a symbol table, or links as header messages (links_group)
    uint64_t group_btree
    uint64_t group_heap
    bint links_group
    bint creation_order     # (links_group) h5py lists the links in creation order
    # dataset
    bint have_space, have_type, have_layout, filtered
    int rank
    uint64_t dims[MAX_RANK]
    int typenum
    uint64_t itemsize
    int layout
    uint64_t data_addr      # compact: the data's place in the file; contiguous: its address
    uint64_t data_size
    uint64_t chunk_btree
    int chunk_nd            # rank + 1 (the last chunk dimension is the item size)
    uint64_t chunk[MAX_RANK + 1]


cdef struct Blocks:
    # An object header's blocks: the first, then its continuations.
    int n
    uint64_t addr[MAX_BLOCKS]
    uint64_t length[MAX_BLOCKS]


cdef int add_block(Blocks* blocks, uint64_t header, uint64_t addr, uint64_t length,
                   uint64_t size) except -1:
    # (size: the file's; the block's end is computed from addr + length)
    cdef int k
    if addr > size or length > size - addr:
        damaged("a header block past the end of the file", header)
    for k in range(blocks.n):
        if blocks.addr[k] == addr:
            damaged("a header continued into itself", header)
    if addr == header and blocks.n:
        damaged("a header continued into itself", header)
    if blocks.n == MAX_BLOCKS:
        unreadable()
    blocks.addr[blocks.n] = addr
    blocks.length[blocks.n] = length
    blocks.n += 1
    return 0


def _creation_index(link):
    return link[0]


def _link_name(link):
    return link[1]


cdef inline uint64_t pad8(uint64_t n) noexcept:
    return (n + 7) // 8 * 8


cdef struct Chunks:
    # A chunked dataset's walk: where the chunks go and which were seen.
    const Header* h
    char* out
    uint64_t chunk_bytes
    uint64_t nchunks
    uint64_t seen
    uint64_t grid[MAX_RANK]     # chunks along each dimension
    uint8_t* marks              # one byte per chunk (NULL for a single chunk)


cdef int unreadable() except -1:
    raise Unreadable()


cdef int damaged(str what, uint64_t addr) except -1:
    raise Damaged(f"damaged HDF5 metadata: {what} (at byte {addr})")


cdef int mul(uint64_t a, uint64_t b, uint64_t* out) except -1:
    # a * b, refusing an overflow (such sizes are left to h5py's checks).
    if a != 0 and b > 0xFFFFFFFFFFFFFFFFULL // a:
        raise Unreadable()
    out[0] = a * b
    return 0


cdef int typenum_of(const uint8_t* d, uint64_t n, int* typenum, uint64_t* itemsize) except -1:
    """The numpy type of a datatype message (d, n bytes), as h5py maps it."""
    cdef uint32_t bits, size
    cdef int cls, version, nmembers, i
    cdef uint64_t pos, k, name_len
    cdef const uint8_t* name
    cdef int base_type
    cdef uint64_t base_size
    cdef bint ok
    cdef const void* end
    if n < 8:
        unreadable()
    cls = d[0] & 0x0F
    version = d[0] >> 4
    bits = <uint32_t>d[1] | (<uint32_t>d[2] << 8) | (<uint32_t>d[3] << 16)
    size = le32(d + 4)
    if version < 1 or version > 3:
        unreadable()
    if cls == 0:                                  # fixed-point
        if n < 12 or (bits & ~<uint32_t>0x08) != 0:   # little-endian, zero padding
            unreadable()
        if le16(d + 8) != 0 or le16(d + 10) != 8 * size:
            unreadable()
        typenum[0] = -1
        if size == 1:
            typenum[0] = cnp.NPY_INT8 if bits & 0x08 else cnp.NPY_UINT8
        elif size == 2:
            typenum[0] = cnp.NPY_INT16 if bits & 0x08 else cnp.NPY_UINT16
        elif size == 4:
            typenum[0] = cnp.NPY_INT32 if bits & 0x08 else cnp.NPY_UINT32
        elif size == 8:
            typenum[0] = cnp.NPY_INT64 if bits & 0x08 else cnp.NPY_UINT64
        if typenum[0] < 0:
            unreadable()
        itemsize[0] = size
        return 0
    if cls == 1:                                  # floating point
        # IEEE 754 binary16/32/64, little-endian, implied mantissa bit, no padding.
        if n < 20:
            unreadable()
        if size == 2:
            typenum[0] = cnp.NPY_FLOAT16
            ok = bits == (0x20 | (15 << 8)) and d[12] == 10 and d[13] == 5 and d[14] == 0 \
                and d[15] == 10 and le32(d + 16) == 15
        elif size == 4:
            typenum[0] = cnp.NPY_FLOAT32
            ok = bits == (0x20 | (31 << 8)) and d[12] == 23 and d[13] == 8 and d[14] == 0 \
                and d[15] == 23 and le32(d + 16) == 127
        elif size == 8:
            typenum[0] = cnp.NPY_FLOAT64
            ok = bits == (0x20 | (63 << 8)) and d[12] == 52 and d[13] == 11 and d[14] == 0 \
                and d[15] == 52 and le32(d + 16) == 1023
        else:
            ok = False
        if not ok or le16(d + 8) != 0 or le16(d + 10) != 8 * size:
            unreadable()
        itemsize[0] = size
        return 0
    if cls == 8:                                  # enum: h5py's bool only
        nmembers = bits & 0xFFFF
        if size != 1 or nmembers != 2 or (bits >> 16) != 0:
            unreadable()
        typenum_of(d + 8, n - 8, &base_type, &base_size)
        if base_type != cnp.NPY_INT8 or n < 20:
            unreadable()
        # The base type's message is 12 bytes (fixed-point); names follow,
        # NUL-terminated (padded to 8 bytes before version 3), then values.
        pos = 20
        for i in range(2):
            if pos >= n:
                unreadable()
            name = d + pos
            end = memchr(name, 0, n - pos)
            if end == NULL:
                unreadable()
            name_len = <uint64_t>(<const uint8_t*>end - name)
            if i == 0 and not (name_len == 5 and memcmp(name, b"FALSE", 5) == 0):
                unreadable()
            if i == 1 and not (name_len == 4 and memcmp(name, b"TRUE", 4) == 0):
                unreadable()
            k = name_len + 1
            if version < 3:
                k = (k + 7) // 8 * 8
            pos += k
        if pos > n or n - pos < 2 or d[pos] != 0 or d[pos + 1] != 1:
            unreadable()
        typenum[0] = cnp.NPY_BOOL
        itemsize[0] = 1
        return 0
    unreadable()


cdef class File:
    """One HDF5 file's structure, read from a memory map of it.

    Raises Unreadable when the file is not one this reader walks (another
    superblock, a user block, a file driver, a truncated file): h5py then
    reads it all; Damaged when its root group does not add up. A root group
    this reader does not list (one that keeps its links' creation order, as
    a file h5py creates with track_order=True) leaves `root` None: the
    caller lists it with h5py and hands the addresses to use_root()."""
    cdef object fh
    cdef object mm
    cdef Py_buffer buf              # the map's bytes, held while open
    cdef uint8_t* copy              # the checked build's copy of the file instead
    cdef const uint8_t* base
    cdef uint64_t size              # the usable bytes: min(file size, stored end of file)
    cdef Py_ssize_t budget          # structures a read may still visit
    cdef readonly dict root         # name (bytes) -> object header address
    cdef bint open
    cdef list links                 # the last header's link messages
    cdef object id_value            # the last header's "id_" string, or None

    def __init__(self, path):
        cdef uint64_t eof
        cdef const uint8_t* p
        cdef Header h
        self.fh = open(os.fspath(path), "rb")
        if CHECKED:
            self.read_whole()
        else:
            self.map()
        self.open = True
        try:
            self.base = <const uint8_t*>self.buf.buf
            self.size = <uint64_t>self.buf.len
            if self.size < SB_SIZE or memcmp(self.base, SIGNATURE, 8) != 0:
                unreadable()
            p = self.base
            # versions: superblock 0/1, free space 0, root symbol table entry 0,
            # shared header 0; 8-byte addresses and lengths.
            if p[8] > 1 or p[9] != 0 or p[10] != 0 or p[12] != 0 or p[13] != 8 or p[14] != 8:
                unreadable()
            if p[8] == 1:
                p = p + 4                   # the indexed storage K and its padding
                if self.size < SB_SIZE + 4:
                    unreadable()
            # base address, free space, end of file, driver information
            if le64(p + 24) != 0 or le64(p + 48) != UNDEF:
                unreadable()
            eof = le64(p + 40)
            if eof > self.size:             # truncated: libhdf5 refuses it too
                unreadable()
            self.size = eof
            self.budget = self.size // 8 + 64
            try:
                self.header(le64(p + 56 + 8), &h)
            except Unreadable:              # a newer root group: see use_root
                h.kind = KIND_NONE
            if h.kind == KIND_GROUP and h.links_group:
                self.root = {}
                for corder, name, addr in self.links:
                    if name in self.root:
                        damaged(f"a second member named {name!r:.60}", addr)
                    self.root[name] = addr
            elif h.kind == KIND_GROUP:
                self.root = {}
                self.members(h.group_btree, h.group_heap, self.root, True)
        except BaseException:
            self.close()
            raise

    cdef int map(self) except -1:
        try:
            self.mm = mmap.mmap(self.fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:                  # an empty file
            self.fh.close()
            raise Unreadable() from None
        except BaseException:
            self.fh.close()
            raise
        try:
            PyObject_GetBuffer(self.mm, &self.buf, PyBUF_SIMPLE)
        except BaseException:
            self.mm.close()
            self.fh.close()
            raise
        return 0

    cdef int read_whole(self) except -1:
        cdef Py_ssize_t size
        try:
            size = os.fstat(self.fh.fileno()).st_size
            self.copy = <uint8_t*>PyMem_Malloc(size if size else 1)
            if self.copy == NULL:
                raise MemoryError()
            view = PyMemoryView_FromMemory(<char*>self.copy, size, PyBUF_WRITE)
            if self.fh.readinto(view) != size:
                raise OSError(f"{self.fh.name}: changed while read")
            if size == 0:
                raise Unreadable()
        except BaseException:
            PyMem_Free(self.copy)
            self.copy = NULL
            self.fh.close()
            raise
        self.buf.buf = self.copy
        self.buf.len = size
        return 0

    def close(self):
        """Unmap and close the file (arrays already read stay valid: they
        are copies)."""
        if self.open:
            self.open = False
            self.base = NULL
            self.size = 0
            if self.copy != NULL:
                PyMem_Free(self.copy)
                self.copy = NULL
            else:
                PyBuffer_Release(&self.buf)
                self.mm.close()
            self.fh.close()

    def __dealloc__(self):
        # (the map and the file close themselves once released)
        if self.copy != NULL:
            PyMem_Free(self.copy)
        elif self.open:
            PyBuffer_Release(&self.buf)

    def use_root(self, dict members):
        """Take the root group's members (name -> object header address, as
        h5py lists them); each address is checked when it is read."""
        self.root = {bytes(k): int(v) for k, v in members.items()}

    def group(self, bytes name):
        """The root member `name` as (members, id_): a dict of its members
        (str keys, in the order h5py lists them) holding a numpy array per
        dataset and such a dict per group, and its "id_" attribute (a str,
        or None without one). None when it is missing, not a group, or
        holds anything this reader does not read."""
        cdef Header h
        if not self.open:
            raise ValueError("the file is closed")
        if self.root is None:
            raise ValueError("the root group is not listed (see use_root)")
        addr = self.root.get(name)
        if addr is None:
            return None
        self.budget = self.size // 8 + 64
        try:
            self.header(addr, &h)
            if h.kind != KIND_GROUP or h.has_id_attr:
                return None
            id_ = self.id_value
            return self.tree(&h, 0), id_
        except Unreadable:
            return None
        # (Damaged propagates: the caller names the file and the episode.)

    # -- structures --------------------------------------------------------------------

    cdef inline const uint8_t* at(self, uint64_t addr, uint64_t n) except NULL:
        """The file's bytes [addr, addr + n), checked."""
        if addr > self.size or n > self.size - addr:
            damaged(f"{n} bytes past the end of the file ({self.size} bytes)", addr)
        return self.base + addr

    cdef int spend(self, uint64_t addr) except -1:
        # More structures than the file can hold: nodes reached many times.
        self.budget -= 1
        if self.budget < 0:
            damaged("a structure reached more often than the file could hold", addr)
        return 0

    cdef int header(self, uint64_t addr, Header* h) except -1:
        """Parse the object header at `addr` into h (its links, if it is a
        group that holds them as messages, into self.links; its "id_"
        attribute, when it is a string read here, into self.id_value)."""
        cdef const uint8_t* p
        cdef Blocks blocks
        self.spend(addr)
        memset(h, 0, sizeof(Header))
        self.links = []
        self.id_value = None
        blocks.n = 0
        p = self.at(addr, 16)
        if memcmp(p, b"OHDR", 4) == 0:
            self.header_v2(addr, h, &blocks)
        elif p[0] == 1 and p[1] == 0:
            self.header_v1(addr, h, &blocks)
        else:
            damaged("not an object header", addr)
        if h.have_space or h.have_type or h.have_layout or h.filtered:
            if h.kind != KIND_NONE or not (h.have_space and h.have_type and h.have_layout) \
                    or h.filtered:
                unreadable()
            h.kind = KIND_DATASET
        return 0

    cdef int header_v1(self, uint64_t addr, Header* h, Blocks* blocks) except -1:
        cdef const uint8_t* p = self.at(addr, 16)
        cdef const uint8_t* block
        cdef uint64_t nmessages = le16(p + 2), seen = 0, off, size, length
        cdef int b = 0
        add_block(blocks, addr, addr + 16, le32(p + 8), self.size)
        while b < blocks.n:
            length = blocks.length[b]
            block = self.at(blocks.addr[b], length)
            off = 0
            while length - off >= 8:
                size = le16(block + off + 2)
                if size > length - off - 8:
                    damaged("a header message longer than its block", blocks.addr[b] + off)
                seen += 1
                if seen > nmessages:
                    damaged("more header messages than the header counts", addr)
                self.message(le16(block + off), block[off + 4], block + off + 8, size, addr, h,
                             blocks)
                off += 8 + size
            b += 1
        if seen != nmessages:
            damaged("fewer header messages than the header counts", addr)
        return 0

    cdef int header_v2(self, uint64_t addr, Header* h, Blocks* blocks) except -1:
        # "OHDR", version 2, flags, [times], [attribute storage limits],
        # the first block's size (1-8 bytes), its messages, a checksum.
        cdef const uint8_t* p = self.at(addr, 6)
        cdef uint8_t flags = p[5]
        cdef uint64_t pos = 6, length = 0, off, size, start, end
        cdef int k, b = 0, head = 4
        if p[4] != 2:
            damaged("an object header of no known version", addr)
        if flags & 0x20:
            pos += 16
        if flags & 0x10:
            pos += 4
        if flags & 0x04:                    # messages carry a creation index
            head = 6
        p = self.at(addr, pos + (1 << (flags & 3)))
        for k in range(1 << (flags & 3)):
            length |= <uint64_t>p[pos + k] << (8 * k)
        pos += 1 << (flags & 3)
        add_block(blocks, addr, addr + pos, length, self.size)
        while b < blocks.n:
            # the first block's checksum covers the prefix; a continuation
            # block is "OCHK", messages, checksum
            if b == 0:
                start, end = addr, addr + pos + length
            else:
                start, end = blocks.addr[b], blocks.addr[b] + blocks.length[b]
                if blocks.length[b] < 8 or memcmp(self.at(start, 4), b"OCHK", 4) != 0:
                    damaged("not an object header continuation block", start)
                end -= 4
            p = self.at(start, end - start + 4)
            if lookup3(p, end - start) != le32(p + (end - start)):
                damaged("an object header whose checksum does not match", start)
            off = blocks.addr[b] + (0 if b == 0 else 4) - start
            while (end - start) - off >= <uint64_t>head:
                size = le16(p + off + 1)
                if size > (end - start) - off - head:
                    damaged("a header message longer than its block", start + off)
                self.message(p[off], p[off + 3], p + off + head, size, addr, h, blocks)
                off += head + size
            b += 1
        return 0

    cdef int message(self, uint16_t mtype, uint8_t flags, const uint8_t* d, uint64_t size,
                     uint64_t addr, Header* h, Blocks* blocks) except -1:
        if mtype == MSG_NIL or mtype == MSG_FILL_OLD or mtype == MSG_FILL \
                or mtype == MSG_COMMENT or mtype == MSG_MTIME_OLD or mtype == MSG_MTIME \
                or mtype == MSG_BTREE_K or mtype == MSG_REFCOUNT or mtype == MSG_GROUP_INFO:
            return 0
        if flags & 0x02:                    # shared: stored elsewhere
            unreadable()
        if mtype == MSG_CONTINUATION:
            if size < 16:
                damaged("a short continuation message", addr)
            add_block(blocks, addr, le64(d), le64(d + 8), self.size)
        elif mtype == MSG_SYMBOL_TABLE:
            if size < 16:
                damaged("a short symbol table message", addr)
            if h.kind != KIND_NONE:
                unreadable()
            h.kind = KIND_GROUP
            h.group_btree = le64(d)
            h.group_heap = le64(d + 8)
        elif mtype == MSG_LINK_INFO:
            if h.kind != KIND_NONE:
                unreadable()
            link_info(d, size, h)
            h.kind = KIND_GROUP
            h.links_group = True
        elif mtype == MSG_LINK:
            self.links.append(link(d, size))
        elif mtype == MSG_ATTRIBUTE_INFO:
            # attributes kept in a fractal heap: an "id_" could be among them
            if size < 2 or size < <uint64_t>(18 + (2 if d[1] & 0x01 else 0)):
                damaged("a short attribute info message", addr)
            if le64(d + 2 + (2 if d[1] & 0x01 else 0)) != UNDEF:
                unreadable()
        elif mtype == MSG_ATTRIBUTE:
            self.attribute(d, size, h)
        elif mtype == MSG_DATASPACE:
            if h.have_space:
                unreadable()
            dataspace(d, size, h)
            h.have_space = True
        elif mtype == MSG_DATATYPE:
            if h.have_type:
                unreadable()
            typenum_of(d, size, &h.typenum, &h.itemsize)
            h.have_type = True
        elif mtype == MSG_LAYOUT:
            if h.have_layout:
                unreadable()
            layout(d, size, <uint64_t>(d - self.base), h)
            h.have_layout = True
        elif mtype == MSG_FILTERS:
            h.filtered = True
        else:
            unreadable()
        return 0

    cdef int attribute(self, const uint8_t* d, uint64_t n, Header* h) except -1:
        """Note an attribute named "id_": its value when it is a scalar
        UTF-8 string (as h5py writes a str), else h.has_id_attr."""
        cdef uint64_t name_at, name_size, type_size, space_size, pos, length
        cdef const uint8_t* t
        cdef const uint8_t* sp
        cdef int version
        if n < 8:
            damaged("a short attribute message", 0)
        version = d[0]
        if version == 1 or version == 2:
            name_at = 8
        elif version == 3:
            name_at = 9
        else:
            unreadable()
        name_size = le16(d + 2)              # with its NUL
        type_size = le16(d + 4)
        space_size = le16(d + 6)
        if name_at > n or name_size == 0 or name_size > n - name_at:
            damaged("an attribute name longer than its message", 0)
        if not (name_size == 4 and memcmp(d + name_at, b"id_\0", 4) == 0):
            return 0
        h.has_id_attr = True
        if version > 1 and d[1] & 0x03:     # shared datatype or dataspace
            return 0
        pos = name_at + (pad8(name_size) if version == 1 else name_size)
        if pos > n or type_size > n - pos:
            return 0
        t = d + pos
        pos += pad8(type_size) if version == 1 else type_size
        if pos > n or space_size > n - pos:
            return 0
        sp = d + pos
        pos += pad8(space_size) if version == 1 else space_size
        # a variable-length UTF-8 string (class 9, type 1, charset 1), scalar
        if type_size < 8 or (t[0] & 0x0F) != 9 or (t[1] & 0x0F) != 1 or (t[2] & 0x0F) != 1:
            return 0
        if space_size < 2 or not ((sp[0] == 1 and sp[1] == 0) or
                                  (sp[0] == 2 and sp[1] == 0 and space_size >= 4 and sp[3] == 0)):
            return 0
        if pos > n or n - pos < 16:
            return 0
        length = le32(d + pos)
        value = self.global_object(le64(d + pos + 4), le32(d + pos + 12), length)
        if value is not None:
            self.id_value = value
            h.has_id_attr = False
        return 0

    cdef object global_object(self, uint64_t collection, uint32_t index, uint64_t length):
        """The first `length` bytes of object `index` of a global heap
        collection, decoded as UTF-8 (None when not UTF-8: h5py's path then
        reads the attribute)."""
        cdef const uint8_t* p = self.at(collection, 16)
        cdef uint64_t size, pos = 16, object_size
        if memcmp(p, b"GCOL", 4) != 0 or p[4] != 1:
            damaged("not a global heap collection", collection)
        size = le64(p + 8)
        p = self.at(collection, size)
        if size < 16:
            damaged("a global heap collection shorter than its header", collection)
        while size - pos >= 16:
            object_size = le64(p + pos + 8)
            if le16(p + pos) == 0:           # the free space: the end
                break
            if object_size > size - pos - 16:
                damaged("a global heap object longer than its collection", collection + pos)
            if le16(p + pos) == index:
                if length > object_size:
                    damaged("a string longer than its global heap object", collection + pos)
                try:
                    return PyUnicode_DecodeUTF8(<const char*>p + pos + 16, length, NULL)
                except UnicodeDecodeError:
                    return None
            pos += 16 + pad8(object_size)
        # (libhdf5 loops forever on some such collections)
        damaged(f"no object {index} in the global heap collection", collection)

    cdef int members(self, uint64_t btree, uint64_t heap, dict out, bint as_bytes) except -1:
        """A symbol-table group's members, name -> object header address,
        in stored order."""
        cdef const uint8_t* p = self.at(heap, 32)
        cdef const uint8_t* names
        cdef uint64_t names_size
        if memcmp(p, b"HEAP", 4) != 0 or p[4] != 0:
            damaged("not a local heap", heap)
        names_size = le64(p + 8)
        names = self.at(le64(p + 24), names_size)
        self.group_node(btree, -1, names, names_size, out, as_bytes)
        return 0

    cdef int btree_node(self, uint64_t addr, int level, int node_type,
                        uint64_t* entries) except -1:
        """A version 1 B-tree node's header (node_type 0: a group's, 1: a
        dataset's chunks), checked: its level and, in entries, its entry count."""
        cdef const uint8_t* p = self.at(addr, 24)
        cdef int node_level
        self.spend(addr)
        if memcmp(p, b"TREE", 4) != 0 or p[4] != node_type:
            damaged("not a chunk B-tree node" if node_type else "not a group B-tree node", addr)
        node_level = p[5]
        if (level >= 0 and node_level != level) or node_level > MAX_LEVEL:
            damaged("a B-tree node out of its level", addr)
        entries[0] = le16(p + 6)
        return node_level

    cdef int group_node(self, uint64_t addr, int level, const uint8_t* names,
                        uint64_t names_size, dict out, bint as_bytes) except -1:
        cdef uint64_t entries, i
        cdef int node_level = self.btree_node(addr, level, 0, &entries)
        cdef const uint8_t* p
        # keys (heap offsets) and children interleaved: key0 child0 ... key_n
        p = self.at(addr + 24, entries * 16 + 8)
        for i in range(entries):
            if node_level > 0:
                self.group_node(le64(p + 16 * i + 8), node_level - 1, names, names_size, out,
                                as_bytes)
            else:
                self.symbols(le64(p + 16 * i + 8), names, names_size, out, as_bytes)
        return 0

    cdef int symbols(self, uint64_t addr, const uint8_t* names, uint64_t names_size, dict out,
                     bint as_bytes) except -1:
        cdef const uint8_t* p = self.at(addr, 8)
        cdef const uint8_t* e
        cdef const uint8_t* name
        cdef const void* end
        cdef uint64_t count, i, offset
        self.spend(addr)
        if memcmp(p, b"SNOD", 4) != 0 or p[4] != 1:
            damaged("not a symbol table node", addr)
        count = le16(p + 6)
        p = self.at(addr + 8, count * 40)
        for i in range(count):
            self.spend(addr)
            e = p + 40 * i
            offset = le64(e)
            if le32(e + 16) == 2:            # a soft link
                unreadable()
            if offset >= names_size or le32(e + 16) > 2:
                damaged("a symbol table entry out of its heap", addr + 8 + 40 * i)
            name = names + offset
            end = memchr(name, 0, names_size - offset)
            if end == NULL:
                damaged("a name without its end", addr + 8 + 40 * i)
            if as_bytes:
                key = (<const char*>name)[:<const uint8_t*>end - name]
            else:
                try:
                    key = PyUnicode_DecodeUTF8(<const char*>name, <const uint8_t*>end - name,
                                               NULL)
                except UnicodeDecodeError:  # h5py's path shows such names replaced
                    unreadable()
            if key in out:
                damaged(f"a second member named {key!r:.60}", addr + 8 + 40 * i)
            out[key] = le64(e + 8)
        return 0

    cdef object tree(self, const Header* group, int depth):
        cdef Header h
        cdef dict members = {}
        cdef dict out = {}
        cdef list links
        if group.links_group:
            links = self.links
            links.sort(key=_creation_index if group.creation_order else _link_name)
            for corder, name, addr in links:
                try:
                    key = name.decode("utf-8")
                except UnicodeDecodeError:  # h5py's path shows such names replaced
                    unreadable()
                if key in members:
                    damaged(f"a second member named {key!r:.60}", addr)
                members[key] = addr
        else:
            self.members(group.group_btree, group.group_heap, members, False)
        for key, addr in members.items():
            self.header(addr, &h)
            if h.kind == KIND_GROUP:
                if depth >= MAX_DEPTH:
                    unreadable()
                out[key] = self.tree(&h, depth + 1)
            elif h.kind == KIND_DATASET:
                out[key] = self.dataset(&h)
            else:
                unreadable()
        return out

    # -- data ----------------------------------------------------------------------------

    cdef object dataset(self, Header* h):
        cdef cnp.npy_intp shape[MAX_RANK]
        cdef uint64_t nbytes = h.itemsize
        cdef int i
        cdef cnp.ndarray arr
        for i in range(h.rank):
            if h.dims[i] > self.size:       # (only an empty array could be so long)
                unreadable()
            mul(nbytes, h.dims[i], &nbytes)
            shape[i] = <cnp.npy_intp>h.dims[i]
        # every byte is stored in the file (else h5py's path tells)
        if nbytes > self.size:
            unreadable()
        if h.layout == LAYOUT_COMPACT and h.data_size != nbytes:
            damaged("compact data of another size than its dataspace's", h.data_addr)
        arr = cnp.PyArray_EMPTY(h.rank, shape, h.typenum, 0)
        if h.layout == LAYOUT_COMPACT or h.layout == LAYOUT_CONTIGUOUS:
            if nbytes == 0:
                return arr
            if h.data_size != nbytes or h.data_addr == UNDEF:
                unreadable()
            memcpy(array_bytes(arr, nbytes), self.at(h.data_addr, nbytes), nbytes)
            return arr
        self.chunked(h, array_bytes(arr, nbytes), nbytes)
        return arr

    cdef int chunked(self, const Header* h, char* out, uint64_t nbytes) except -1:
        cdef Chunks c
        cdef int i
        if h.chunk_nd != h.rank + 1 or h.chunk[h.rank] != h.itemsize:
            damaged("chunks of another rank or item size than the dataset's", h.chunk_btree)
        c.h = h
        c.out = out
        c.chunk_bytes = h.itemsize
        c.nchunks = 1
        c.seen = 0
        c.marks = NULL
        for i in range(h.rank):
            if h.chunk[i] == 0:
                damaged("an empty chunk shape", h.chunk_btree)
            mul(c.chunk_bytes, h.chunk[i], &c.chunk_bytes)
            c.grid[i] = (h.dims[i] + h.chunk[i] - 1) // h.chunk[i]
            mul(c.nchunks, c.grid[i], &c.nchunks)
        if nbytes == 0:
            return 0
        if h.chunk_btree == UNDEF:         # no chunk written: h5py gives the fill value
            unreadable()
        if c.chunk_bytes > self.size:
            damaged("chunks larger than the file", h.chunk_btree)
        if c.nchunks > 1:
            c.marks = <uint8_t*>PyMem_Malloc(c.nchunks)
            if c.marks == NULL:
                raise MemoryError()
            memset(c.marks, 0, c.nchunks)
        try:
            self.chunk_node(h.chunk_btree, -1, &c)
        finally:
            PyMem_Free(c.marks)
        if c.seen != c.nchunks:             # a chunk never written: libhdf5 fills it
            unreadable()
        return 0

    cdef int chunk_node(self, uint64_t addr, int level, Chunks* c) except -1:
        cdef const Header* h = c.h
        cdef uint64_t key_size = 8 + 8 * <uint64_t>h.chunk_nd
        cdef const uint8_t* p
        cdef const uint8_t* key
        cdef uint64_t entries, i, index, offset, child
        cdef int k
        cdef int node_level = self.btree_node(addr, level, 1, &entries)
        p = self.at(addr + 24, entries * (key_size + 8) + key_size)
        for i in range(entries):
            key = p + i * (key_size + 8)
            child = le64(key + key_size)
            if node_level > 0:
                self.chunk_node(child, node_level - 1, c)
                continue
            self.spend(addr)
            # (no filters: each chunk is stored whole, as it is)
            if le32(key) != c.chunk_bytes or le32(key + 4) != 0 or le64(key + 8 * h.chunk_nd) != 0:
                damaged("a chunk of another size, filtered or misplaced", child)
            index = 0
            for k in range(h.rank):
                offset = le64(key + 8 + 8 * k)
                if offset % h.chunk[k] != 0:
                    damaged("a chunk off the chunk grid", child)
                if offset >= h.dims[k]:     # past the data (a shrunk dataset)
                    unreadable()
                index = index * c.grid[k] + offset // h.chunk[k]
            if c.marks != NULL:
                if c.marks[index]:
                    damaged("a chunk stored twice", child)
                c.marks[index] = 1
            elif c.seen:
                damaged("a chunk stored twice", child)
            c.seen += 1
            place(c, key + 8, self.at(child, c.chunk_bytes))
        return 0


cdef void place(Chunks* c, const uint8_t* key, const uint8_t* chunk) noexcept:
    """Copy the part of a chunk (whose offsets are at key) that lies inside
    the dataset into its place."""
    cdef const Header* h = c.h
    cdef int r = h.rank, i, k
    cdef uint64_t s = h.itemsize
    cdef uint64_t extent[MAX_RANK]
    cdef uint64_t origin[MAX_RANK]
    cdef uint64_t idx[MAX_RANK]
    cdef uint64_t src_stride[MAX_RANK]
    cdef uint64_t dst_stride[MAX_RANK]
    cdef uint64_t src, dst, run
    cdef bint full = True
    for i in range(r):
        origin[i] = le64(key + 8 * i)
        extent[i] = h.dims[i] - origin[i]
        if extent[i] > h.chunk[i]:
            extent[i] = h.chunk[i]
    src_stride[r - 1] = s
    dst_stride[r - 1] = s
    for i in range(r - 2, -1, -1):
        src_stride[i] = src_stride[i + 1] * h.chunk[i + 1]
        dst_stride[i] = dst_stride[i + 1] * h.dims[i + 1]
    for i in range(1, r):
        if h.chunk[i] != h.dims[i]:
            full = False
    if full:                                # whole rows: one block
        memcpy(c.out + origin[0] * dst_stride[0], chunk, extent[0] * dst_stride[0])
        return
    # one copy per run along the last dimension
    run = extent[r - 1] * s
    for i in range(r):
        idx[i] = 0
    while True:
        src = 0
        dst = origin[r - 1] * s
        for i in range(r - 1):
            src += idx[i] * src_stride[i]
            dst += (origin[i] + idx[i]) * dst_stride[i]
        memcpy(c.out + dst, chunk + src, run)
        k = r - 2
        while k >= 0:
            idx[k] += 1
            if idx[k] < extent[k]:
                break
            idx[k] = 0
            k -= 1
        if k < 0:
            return


cdef int link_info(const uint8_t* d, uint64_t n, Header* h) except -1:
    # version 0, flags, [maximum creation index], fractal heap, name index,
    # [creation order index]
    cdef uint64_t pos = 2
    if n < 2 or d[0] != 0:
        unreadable()
    if d[1] & 0x01:
        h.creation_order = True
        pos += 8
    if n < pos + 16:
        damaged("a short link info message", 0)
    if le64(d + pos) != UNDEF:             # links in a fractal heap ("dense")
        unreadable()
    return 0


cdef object link(const uint8_t* d, uint64_t n):
    """(creation index, name, object header address) of a hard link
    message."""
    cdef uint8_t flags
    cdef uint64_t pos = 2, name_size = 0, corder = 0
    cdef int k, kind = 0
    if n < 2 or d[0] != 1:
        damaged("a link message of no known version", 0)
    flags = d[1]
    if flags & 0x08:
        if n < pos + 1:
            damaged("a short link message", 0)
        kind = d[pos]
        pos += 1
    if flags & 0x04:
        if n < pos + 8:
            damaged("a short link message", 0)
        corder = le64(d + pos)
        pos += 8
    if flags & 0x10:
        pos += 1
    if n < pos + (1 << (flags & 3)):
        damaged("a short link message", 0)
    for k in range(1 << (flags & 3)):
        name_size |= <uint64_t>d[pos + k] << (8 * k)
    pos += 1 << (flags & 3)
    if name_size == 0 or name_size > n - pos:
        damaged("a link name longer than its message", 0)
    if kind != 0:                           # soft or external
        unreadable()
    if n - pos - name_size < 8:
        damaged("a short link message", 0)
    return (corder, (<const char*>d + pos)[:name_size], le64(d + pos + name_size))


cdef int dataspace(const uint8_t* d, uint64_t n, Header* h) except -1:
    cdef int version, flags, i
    cdef uint64_t start, need
    if n < 4:
        unreadable()
    version = d[0]
    h.rank = d[1]
    flags = d[2]
    if version == 1:
        start = 8
        if flags & 0x02:                    # permutation indices: never written
            unreadable()
    elif version == 2:
        start = 4
        if d[3] != 1:                       # scalar or null
            unreadable()
    else:
        unreadable()
    if h.rank < 1 or h.rank > MAX_RANK:     # scalars: h5py's path says so
        unreadable()
    need = start + 8 * <uint64_t>h.rank * (2 if flags & 0x01 else 1)
    if need > n:
        damaged("a dataspace longer than its message", 0)
    for i in range(h.rank):
        h.dims[i] = le64(d + start + 8 * i)
    return 0


cdef int layout(const uint8_t* d, uint64_t n, uint64_t at, Header* h) except -1:
    # (at: the message's place in the file, where compact data lives)
    cdef int i
    if n < 2 or d[0] != 3:
        unreadable()
    h.layout = d[1]
    if h.layout == LAYOUT_COMPACT:
        if n < 4 or le16(d + 2) > n - 4:
            damaged("compact data longer than its message", at)
        h.data_size = le16(d + 2)
        h.data_addr = at + 4
        return 0
    if h.layout == LAYOUT_CONTIGUOUS:
        if n < 18:
            damaged("a short layout message", at)
        h.data_addr = le64(d + 2)
        h.data_size = le64(d + 10)
        return 0
    if h.layout == LAYOUT_CHUNKED:
        if n < 11:
            damaged("a short layout message", at)
        h.chunk_nd = d[2]
        if h.chunk_nd < 2 or h.chunk_nd > MAX_RANK + 1 or n < 11 + 4 * <uint64_t>h.chunk_nd:
            damaged("a chunk shape longer than its message or of no rank", at)
        h.chunk_btree = le64(d + 3)
        for i in range(h.chunk_nd):
            h.chunk[i] = le32(d + 11 + 4 * i)
        return 0
    damaged("a storage layout of no known class", at)
