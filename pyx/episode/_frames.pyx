"""Frame-stacked observations stored once per frame.

A frame-stacked observation (gymnasium's FrameStackObservation, RLlib's
Atari FrameStack) holds its last `stack` frames along one axis, so
consecutive observations of an episode share all but one frame. A
FramePool keeps each frame once, in the order frames were written, and a
row as the numbers of its `stack` frames: writing a row reuses a frame
whose bytes equal one the previous row of the episode holds (shifted by
one, or in place) or the row's own frame before it, and stores the others
anew. Every decision is an exact byte comparison: rows that do not
overlap as a stack does (a reset, a frame that changed) cost memory,
never data. Reading a row copies its frames back into the row's layout.

Frames are freed in the order they were written (the Store evicts its
oldest episodes first): release_before(f) drops the chunks whose frames
all come before frame f.
"""
import numpy as np

cimport cython
cimport numpy as cnp
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport int64_t
from libc.string cimport memmove

from episode._column cimport CHECKED, array_bytes
from episode._pages cimport drop_pages, new_array

cnp.import_array()

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    /* Bytes ahead of the loads that the interleave loops ask memory for:
       four frames read side by side are more streams than the hardware
       prefetcher follows on every CPU (on an EPYC it made the loop ~15%
       faster). */
    #define EPISODE_READ_AHEAD 1024

    #if defined(__SSE2__)
    #include <emmintrin.h>
    #elif defined(__ARM_NEON)
    #include <arm_neon.h>
    #endif

    #if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    #define EPISODE_AVX2_DISPATCH 1
    #include <immintrin.h>
    /* 32 pieces at a time with AVX2 (checked at run time: not every x86-64
       has it). Each 128-bit lane interleaves as the SSE2 loop does; the
       lanes are put back in order as they are stored. The stores stream
       (past the cache) from the row's first 32-byte boundary on: a row is
       written whole, so its lines need not be read first, which is what
       makes this as fast as a copy. Returns the pieces done. */
    __attribute__((target("avx2")))
    static Py_ssize_t episode_interleave4_u8_avx2(uint8_t* d, const uint8_t* a,
                                                  const uint8_t* b, const uint8_t* c,
                                                  const uint8_t* e, Py_ssize_t outer) {
        Py_ssize_t o = 0;
        int aligned;
        for (; o < outer && ((uintptr_t)(d + 4 * o) & 31) != 0; o++) {
            d[4 * o] = a[o];
            d[4 * o + 1] = b[o];
            d[4 * o + 2] = c[o];
            d[4 * o + 3] = e[o];
        }
        aligned = ((uintptr_t)(d + 4 * o) & 31) == 0;   /* (not where d is odd) */
        for (; o + 32 <= outer; o += 32) {
            __m256i va, vb, vc, ve;
            if ((o & 63) == 0) {
                _mm_prefetch((const char*)(a + o + EPISODE_READ_AHEAD), _MM_HINT_T0);
                _mm_prefetch((const char*)(b + o + EPISODE_READ_AHEAD), _MM_HINT_T0);
                _mm_prefetch((const char*)(c + o + EPISODE_READ_AHEAD), _MM_HINT_T0);
                _mm_prefetch((const char*)(e + o + EPISODE_READ_AHEAD), _MM_HINT_T0);
            }
            va = _mm256_loadu_si256((const __m256i*)(a + o));
            vb = _mm256_loadu_si256((const __m256i*)(b + o));
            vc = _mm256_loadu_si256((const __m256i*)(c + o));
            ve = _mm256_loadu_si256((const __m256i*)(e + o));
            __m256i ab_lo = _mm256_unpacklo_epi8(va, vb), ab_hi = _mm256_unpackhi_epi8(va, vb);
            __m256i ce_lo = _mm256_unpacklo_epi8(vc, ve), ce_hi = _mm256_unpackhi_epi8(vc, ve);
            __m256i q0 = _mm256_unpacklo_epi16(ab_lo, ce_lo);   /* pieces 0-3 | 16-19 */
            __m256i q1 = _mm256_unpackhi_epi16(ab_lo, ce_lo);   /* 4-7 | 20-23 */
            __m256i q2 = _mm256_unpacklo_epi16(ab_hi, ce_hi);   /* 8-11 | 24-27 */
            __m256i q3 = _mm256_unpackhi_epi16(ab_hi, ce_hi);   /* 12-15 | 28-31 */
            __m256i r0 = _mm256_permute2x128_si256(q0, q1, 0x20);
            __m256i r1 = _mm256_permute2x128_si256(q2, q3, 0x20);
            __m256i r2 = _mm256_permute2x128_si256(q0, q1, 0x31);
            __m256i r3 = _mm256_permute2x128_si256(q2, q3, 0x31);
            __m256i* out = (__m256i*)(d + 4 * o);
            if (aligned) {
                _mm256_stream_si256(out, r0);
                _mm256_stream_si256(out + 1, r1);
                _mm256_stream_si256(out + 2, r2);
                _mm256_stream_si256(out + 3, r3);
            } else {
                _mm256_storeu_si256(out, r0);
                _mm256_storeu_si256(out + 1, r1);
                _mm256_storeu_si256(out + 2, r2);
                _mm256_storeu_si256(out + 3, r3);
            }
        }
        _mm_sfence();   /* (the streamed stores done before anyone reads them) */
        return o;
    }
    static int episode_has_avx2 = -1;
    #endif

    /* Turns the AVX2 loop off (0) or back to what the CPU has (1), for the
       tests of the SSE2 and plain loops; returns whether it was in use. */
    static int episode_use_avx2(int on) {
    #if defined(EPISODE_AVX2_DISPATCH)
        int was = episode_has_avx2 > 0;
        __builtin_cpu_init();
        episode_has_avx2 = on ? __builtin_cpu_supports("avx2") != 0 : 0;
        return was;
    #else
        (void)on;
        return 0;
    #endif
    }

    /* Four byte frames interleaved, 16 pieces at a time where the CPU has
       vectors (x86-64 always has SSE2, often AVX2; aarch64 NEON): about as
       fast as a copy. */
    static void episode_interleave4_u8(uint8_t* d, const uint8_t* a, const uint8_t* b,
                                       const uint8_t* c, const uint8_t* e,
                                       Py_ssize_t outer) {
        Py_ssize_t o = 0;
    #if defined(EPISODE_AVX2_DISPATCH)
        if (episode_has_avx2 < 0) {
            __builtin_cpu_init();
            episode_has_avx2 = __builtin_cpu_supports("avx2") != 0;
        }
        if (episode_has_avx2) o = episode_interleave4_u8_avx2(d, a, b, c, e, outer);
    #endif
    #if defined(__SSE2__)
        for (; o + 16 <= outer; o += 16) {
            if ((o & 63) == 0) {
                _mm_prefetch((const char*)(a + o + EPISODE_READ_AHEAD), _MM_HINT_T0);
                _mm_prefetch((const char*)(b + o + EPISODE_READ_AHEAD), _MM_HINT_T0);
                _mm_prefetch((const char*)(c + o + EPISODE_READ_AHEAD), _MM_HINT_T0);
                _mm_prefetch((const char*)(e + o + EPISODE_READ_AHEAD), _MM_HINT_T0);
            }
            __m128i va = _mm_loadu_si128((const __m128i*)(a + o));
            __m128i vb = _mm_loadu_si128((const __m128i*)(b + o));
            __m128i vc = _mm_loadu_si128((const __m128i*)(c + o));
            __m128i ve = _mm_loadu_si128((const __m128i*)(e + o));
            __m128i ab_lo = _mm_unpacklo_epi8(va, vb), ab_hi = _mm_unpackhi_epi8(va, vb);
            __m128i ce_lo = _mm_unpacklo_epi8(vc, ve), ce_hi = _mm_unpackhi_epi8(vc, ve);
            _mm_storeu_si128((__m128i*)(d + 4 * o), _mm_unpacklo_epi16(ab_lo, ce_lo));
            _mm_storeu_si128((__m128i*)(d + 4 * o + 16), _mm_unpackhi_epi16(ab_lo, ce_lo));
            _mm_storeu_si128((__m128i*)(d + 4 * o + 32), _mm_unpacklo_epi16(ab_hi, ce_hi));
            _mm_storeu_si128((__m128i*)(d + 4 * o + 48), _mm_unpackhi_epi16(ab_hi, ce_hi));
        }
    #elif defined(__ARM_NEON)
        for (; o + 16 <= outer; o += 16) {
            uint8x16x4_t v;
            v.val[0] = vld1q_u8(a + o);
            v.val[1] = vld1q_u8(b + o);
            v.val[2] = vld1q_u8(c + o);
            v.val[3] = vld1q_u8(e + o);
            vst4q_u8(d + 4 * o, v);
        }
    #endif
        for (; o < outer; o++) {
            d[4 * o] = a[o];
            d[4 * o + 1] = b[o];
            d[4 * o + 2] = c[o];
            d[4 * o + 3] = e[o];
        }
    }
    /* A row of k frames: piece o (of `inner` bytes) of frame j goes to
       (o * k + j) * inner. The common stacks as loops a compiler unrolls
       or vectorizes: the stack axis first (outer == 1: one copy a frame),
       and the last axis of single-channel frames (inner == the dtype's
       size). */
    static void episode_interleave(char* dst, char* const* frames, Py_ssize_t k,
                                   Py_ssize_t outer, Py_ssize_t inner) {
        Py_ssize_t o, j;
        if (outer == 1) {
            for (j = 0; j < k; j++) memcpy(dst + j * inner, frames[j], (size_t)inner);
            return;
        }
        if (inner == 1 && k == 4) {
            episode_interleave4_u8((uint8_t*)dst, (const uint8_t*)frames[0],
                                   (const uint8_t*)frames[1], (const uint8_t*)frames[2],
                                   (const uint8_t*)frames[3], outer);
            return;
        }
        if (inner == 1) {
            for (j = 0; j < k; j++) {
                const uint8_t* s = (const uint8_t*)frames[j];
                uint8_t* d = (uint8_t*)dst + j;
                for (o = 0; o < outer; o++) d[o * k] = s[o];
            }
            return;
        }
        for (j = 0; j < k; j++)
            for (o = 0; o < outer; o++)
                memcpy(dst + (o * k + j) * inner, frames[j] + o * inner, (size_t)inner);
    }

    #if defined(__GNUC__) || defined(__clang__)
    #define episode_prefetch(p) __builtin_prefetch(p)
    #else
    #define episode_prefetch(p) ((void)(p))
    #endif

    /* Frame j of a row (as above) into `frame`. */
    static void episode_extract(char* frame, const char* row, Py_ssize_t j, Py_ssize_t k,
                                Py_ssize_t outer, Py_ssize_t inner) {
        Py_ssize_t o;
        if (outer == 1) {
            memcpy(frame, row + j * inner, (size_t)inner);
        } else if (inner == 1) {
            for (o = 0; o < outer; o++) frame[o] = row[o * k + j];
        } else {
            for (o = 0; o < outer; o++)
                memcpy(frame + o * inner, row + (o * k + j) * inner, (size_t)inner);
        }
    }

    /* Whether frame j of a row has the bytes of `frame`. */
    static int episode_frame_equal(const char* row, Py_ssize_t j, const char* frame,
                                   Py_ssize_t k, Py_ssize_t outer, Py_ssize_t inner) {
        Py_ssize_t o;
        if (outer == 1) return memcmp(row + j * inner, frame, (size_t)inner) == 0;
        if (inner == 1) {
            for (o = 0; o < outer; o++)
                if (row[o * k + j] != frame[o]) return 0;
            return 1;
        }
        for (o = 0; o < outer; o++)
            if (memcmp(row + (o * k + j) * inner, frame + o * inner, (size_t)inner)) return 0;
        return 1;
    }
    """
    void interleave "episode_interleave"(char* dst, char** frames, Py_ssize_t k,
                                         Py_ssize_t outer, Py_ssize_t inner) noexcept
    void extract "episode_extract"(char* frame, const char* row, Py_ssize_t j, Py_ssize_t k,
                                   Py_ssize_t outer, Py_ssize_t inner) noexcept
    void prefetch "episode_prefetch"(const void* p) noexcept
    int use_avx2 "episode_use_avx2"(int on) noexcept
    bint frame_equal "episode_frame_equal"(const char* row, Py_ssize_t j, const char* frame,
                                           Py_ssize_t k, Py_ssize_t outer,
                                           Py_ssize_t inner) noexcept

# A chunk of frames spans at most this many bytes (one allocation, or one file).
cdef Py_ssize_t MAX_CHUNK_BYTES = 16 << 20
# Frames a row may stack at most.
MAX_STACK = 1024


def _use_avx2(bint on):
    """Whether the frame interleave used AVX2; then on (where the CPU has
    it) or off: the tests run the other loops this way."""
    return bool(use_avx2(on))


def stack_layout(tuple row_shape, Py_ssize_t stack, Py_ssize_t axis):
    """Whether rows of `row_shape` stack `stack` frames along `axis`
    (normalized, or None): the axis's length is a positive multiple of
    `stack` and a frame has bytes."""
    if not 0 <= axis < len(row_shape):
        return False
    length = row_shape[axis]
    return length > 0 and length % stack == 0 and all(d > 0 for d in row_shape)


@cython.final
cdef class FramePool:
    """The frames of one observation leaf's stacked rows (see the module
    docstring). `row_shape` and `dtype` are a row's, `stack` frames lie
    along `axis`; `max_frames` (the buffer's capacity) bounds a chunk;
    `storage`, a folder, keeps the chunks in files there."""

    def __cinit__(self, tuple row_shape, dtype, Py_ssize_t stack, Py_ssize_t axis,
                  Py_ssize_t max_frames, storage=None):
        cdef Py_ssize_t itemsize = np.dtype(dtype).itemsize, d, k
        cdef Py_ssize_t frames
        if not 2 <= stack <= MAX_STACK:
            raise ValueError(f"a frame stack holds 2 to {MAX_STACK} frames, not {stack}")
        if axis < 0:
            axis += len(row_shape)
        if not stack_layout(row_shape, stack, axis):
            raise ValueError(f"rows of shape {row_shape} do not stack {stack} frames along "
                             f"axis {axis}")
        self.stack = stack
        self.axis = axis
        self.outer = 1
        for k in range(axis):
            self.outer *= row_shape[k]
        self.inner = row_shape[axis] // stack * itemsize
        for k in range(axis + 1, len(row_shape)):
            self.inner *= row_shape[k]
        self.frame_bytes = self.outer * self.inner
        self.row_bytes = self.frame_bytes * stack
        # Chunks: a power of two of frames, at most MAX_CHUNK_BYTES and a
        # sixteenth of the capacity (small buffers take small chunks).
        frames = max(1, min(MAX_CHUNK_BYTES // self.frame_bytes, max(64, max_frames // 16)))
        self.chunk_shift = 0
        while (<Py_ssize_t>1 << (self.chunk_shift + 1)) <= frames:
            self.chunk_shift += 1
        self.chunks = []
        self.storage = storage
        self.last = <int64_t*>PyMem_Malloc(stack * sizeof(int64_t))
        if self.last == NULL:
            raise MemoryError()
        self.has_last = False

    def __dealloc__(self):
        PyMem_Free(self.chunk_data)
        PyMem_Free(self.last)

    cdef char* frame(self, int64_t f) except NULL:
        cdef int64_t c = (f >> self.chunk_shift) - self.first_chunk
        if CHECKED and not (0 <= c < len(self.chunks) and f < self.tail):
            raise SystemError(f"episode core: frame {f} is not in the pool")
        return self.chunk_data[c] + (f & ((<int64_t>1 << self.chunk_shift) - 1)) \
            * self.frame_bytes

    cdef int assemble(self, char* dst, const int64_t* refs) except -1:
        """The row of frames `refs` into `dst` (row_bytes)."""
        cdef char* ptrs[16]
        cdef char** frames = ptrs
        cdef Py_ssize_t j
        if self.stack > 16:
            frames = <char**>PyMem_Malloc(self.stack * sizeof(char*))
            if frames == NULL:
                raise MemoryError()
        try:
            for j in range(self.stack):
                frames[j] = self.frame(refs[j])
            interleave(dst, frames, self.stack, self.outer, self.inner)
        finally:
            if frames != ptrs:
                PyMem_Free(frames)
        return 0

    cdef int assemble_rows(self, char** dsts, int64_t** refs, Py_ssize_t n) except -1:
        """Rows i < n of frames refs[i] into dsts[i]: each row's frame
        numbers and first bytes asked for from memory a row or two ahead,
        so that their reads overlap the copies before them."""
        cdef Py_ssize_t i, j
        for i in range(min(n, 2)):
            prefetch(refs[i])
        for i in range(n):
            if i + 2 < n:
                prefetch(refs[i + 2])
            if i + 1 < n:
                for j in range(self.stack):
                    prefetch(self.frame(refs[i + 1][j]))
            self.assemble(dsts[i], refs[i])
        return 0

    cdef int write_row(self, int64_t* refs, const char* row) except -1:
        """Stores `row` (row_bytes in its own layout) as the frame numbers
        `refs`: each frame is one the previous row holds (shifted by one,
        or at the same place), the row's own frame before it, or a new
        one. The row becomes the previous row."""
        cdef Py_ssize_t j, k = self.stack
        cdef int64_t ref
        for j in range(k):
            ref = -1
            if self.has_last:
                if j + 1 < k and frame_equal(row, j, self.frame(self.last[j + 1]), k,
                                             self.outer, self.inner):
                    ref = self.last[j + 1]
                elif frame_equal(row, j, self.frame(self.last[j]), k, self.outer,
                                 self.inner):
                    ref = self.last[j]
            if ref < 0 and j > 0 and frame_equal(row, j, self.frame(refs[j - 1]), k,
                                                 self.outer, self.inner):
                ref = refs[j - 1]
            if ref < 0:
                ref = self._append(row, j)
            refs[j] = ref
        self.follow(refs)
        return 0

    cdef int follow(self, const int64_t* refs) noexcept:
        # The next row written follows the row of frames `refs`.
        cdef Py_ssize_t j
        for j in range(self.stack):
            self.last[j] = refs[j]
        self.has_last = True
        return 0

    cdef int64_t _append(self, const char* row, Py_ssize_t j) except -1:
        # Frame j of `row` as a new frame: its number.
        cdef int64_t f = self.tail
        cdef Py_ssize_t c
        cdef char** table
        if not self.chunks:
            self.first_chunk = f >> self.chunk_shift
            self.head = f
        c = <Py_ssize_t>((f >> self.chunk_shift) - self.first_chunk)
        if c == len(self.chunks):
            if c + 1 > self.chunk_cap:
                table = <char**>PyMem_Realloc(self.chunk_data,
                                              (2 * self.chunk_cap + 8) * sizeof(char*))
                if table == NULL:
                    raise MemoryError()
                self.chunk_data = table
                self.chunk_cap = 2 * self.chunk_cap + 8
            if self.storage is not None and self.chunks:
                self._drop_pages(len(self.chunks) - 1)   # full: back to its file
            chunk = self._new_chunk()
            self.chunk_data[c] = array_bytes(chunk, cnp.PyArray_NBYTES(chunk))
            self.chunks.append(chunk)
        extract(self.chunk_data[c] + (f & ((<int64_t>1 << self.chunk_shift) - 1))
                * self.frame_bytes, row, j, self.stack, self.outer, self.inner)
        self.tail += 1
        return f

    cdef cnp.ndarray _new_chunk(self):
        return new_array((1 << self.chunk_shift, self.frame_bytes), np.uint8, self.storage)

    cdef int _drop_pages(self, Py_ssize_t c) except -1:
        # A file-backed chunk's pages out of the resident set (its data stay
        # in its file, read back when touched).
        return drop_pages(self.chunks[c])

    def release_pages(self):
        """With file-backed chunks: drops the pages of every full chunk from
        this process's memory (see Store.release_pages). Does nothing for
        chunks in memory."""
        cdef Py_ssize_t c
        if self.storage is None:
            return
        for c in range(len(self.chunks) - 1):
            self._drop_pages(c)

    cdef int release_before(self, int64_t f) except -1:
        """Frees the chunks whose frames all come before frame `f` (no
        stored row refers to one)."""
        cdef Py_ssize_t drop = 0, n = len(self.chunks)
        while drop < n and (self.first_chunk + drop + 1) << self.chunk_shift <= f:
            drop += 1
        if drop:
            del self.chunks[:drop]
            memmove(self.chunk_data, self.chunk_data + drop, (n - drop) * sizeof(char*))
            self.first_chunk += drop
            self.head = max(self.head, self.first_chunk << self.chunk_shift)
        return 0

    # -- kept in a folder (episode.replay.kept) ---------------------------------------

    def export(self):
        """(numbering, chunks): the pool's numbering as a dict of ints
        (`stack`, `axis`, `frame_bytes`, `chunk_shift`, `first_chunk`,
        `head`, `tail`) and its chunks, oldest first: uint8 arrays of
        (1 << chunk_shift, frame_bytes). Frames [head, tail) of the held
        chunks were written; the rest of a chunk's bytes mean nothing."""
        return ({"stack": self.stack, "axis": self.axis, "frame_bytes": self.frame_bytes,
                 "chunk_shift": self.chunk_shift, "first_chunk": self.first_chunk,
                 "head": self.head, "tail": self.tail}, list(self.chunks))

    def adopt(self, dict numbering, list chunks):
        """Takes export()'s numbering and chunks into this new, empty pool
        (made with the same row layout and capacity): the chunks are read in
        place (read-only ones stay so); the last one, if frames are still to
        be written into it, is copied into memory of the pool's own.
        ValueError, with the pool left empty, for anything that does not
        fit. Returns (lo, hi): the frames a stored row may refer to."""
        cdef Py_ssize_t c, n = len(chunks)
        cdef int64_t first_chunk, head, tail, size = <int64_t>1 << self.chunk_shift
        cdef char** table
        if self.chunks or self.tail:
            raise RuntimeError("adopt() fills a new pool")
        for key, mine in (("stack", self.stack), ("axis", self.axis),
                          ("frame_bytes", self.frame_bytes), ("chunk_shift", self.chunk_shift)):
            if numbering.get(key) != mine or type(numbering.get(key)) is not int:
                raise ValueError(f"the frames' {key} is {numbering.get(key)!r}, this "
                                 f"pool's {mine}")
        values = [numbering.get(key) for key in ("first_chunk", "head", "tail")]
        if not all(type(v) is int and 0 <= v < (1 << 48) for v in values):
            raise ValueError(f"the frames' numbers are {values!r}")
        # (Compared as Python ints: no C arithmetic on the saved numbers.)
        fc, hd, tl = values
        if not (fc * size <= hd <= tl and
                (n == 0 or (tl > fc * size and fc + n - 1 == (tl - 1) >> self.chunk_shift))):
            raise ValueError(f"{n} chunks from chunk {fc} do not hold frames {hd} to {tl}")
        first_chunk, head, tail = fc, hd, tl
        for chunk in chunks:
            if not (type(chunk) is np.ndarray or isinstance(chunk, np.memmap)) or \
                    chunk.dtype != np.uint8 or chunk.shape != (size, self.frame_bytes) or \
                    not chunk.flags.c_contiguous:
                raise ValueError(f"a chunk of frames is not {size} frames of "
                                 f"{self.frame_bytes} bytes")
        chunks = list(chunks)
        if n and tail & (size - 1):
            # (Frames go on into the last chunk: a copy of the pool's own, in
            # memory, so that a pool adopted from a folder it cannot write
            # needs nothing there until its next chunk.)
            last = new_array((size, self.frame_bytes), np.uint8, None)
            last[...] = chunks[n - 1]
            chunks[n - 1] = last
        table = <char**>PyMem_Malloc(max(1, n) * sizeof(char*))
        if table == NULL:
            raise MemoryError()
        for c in range(n):
            table[c] = array_bytes(<cnp.ndarray>chunks[c], cnp.PyArray_NBYTES(chunks[c]))
        PyMem_Free(self.chunk_data)
        self.chunk_data, self.chunk_cap = table, max(1, n)
        self.chunks = chunks
        self.first_chunk, self.head, self.tail = first_chunk, head, tail
        self.has_last = False
        return self.held()

    def held(self):
        """(lo, hi): the frames a stored row may refer to (written, in a
        held chunk)."""
        if not self.chunks:
            return (self.tail, self.tail)
        return (max(self.head, self.first_chunk << self.chunk_shift), self.tail)

    def stats(self):
        """{"frames": frames written, "chunks": chunks held, "bytes": their
        bytes, "frame_bytes": a frame's bytes}."""
        return {"frames": self.tail, "chunks": len(self.chunks),
                "bytes": len(self.chunks) * (self.frame_bytes << self.chunk_shift),
                "frame_bytes": self.frame_bytes}
