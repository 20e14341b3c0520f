"""Episodes to and from a dataset's step files (see episode/offline/format.py).

Writing: `signature()` tells alike episodes (stored alike, track by track),
and a `GroupRows` gathers the rows of one signature's episodes into one
block per leaf, each episode padded to L + N + 1 rows, by block copies from
their Columns. Reading: a `StepFile` holds a file's leaves as Columns over
its arrays, and `episode()` builds an episode over rows of them (views for
numpy'd episodes, copies for list-mode ones, which grow in place), checked
before it is handed out.
"""
from bisect import bisect_left

cimport cython

import numpy as np

cimport numpy as cnp
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.math cimport NAN
from libc.stdint cimport INT32_MAX, int32_t, int64_t
from libc.string cimport memcmp, memcpy, memmove, memset

from episode._buffer cimport BufferCore
from episode._column cimport Column, KIND_EMPTY_DICT, KIND_OBJECT, array_bytes, empty_dicts
from episode._episode cimport (EpisodeCore, build_episode, last_added, now, own_extras,
                               steps)

from episode._episode import REWARDS_SPACE

cnp.import_array()

# The tracks of a step file, in order, after which come the extra outputs.
# (infos, the fifth lookback, are written apart: not a tree.)
DEF N_TRACKS = 3

# A leaf's rows of one episode are referred to in place (not copied into
# the group's block, but compressed from where they are as a record batch
# of their own) where they are image-like and many: copying them first was
# half of a write of Atari screens; a record batch per short episode would
# cost more than the copy.
DEF REFER_ROW_BYTES = 1024
DEF REFER_BYTES = 1 << 20

# An episode's place in an EpisodeRows: its step file (group), first row, rows,
# steps (length), t_started, then its five lookbacks (observations, infos,
# actions, rewards, extras), as int64s.
DEF PLACE = 10


# -- signatures ---------------------------------------------------------------------------


cdef object leaf_signature(Column col):
    # What decides a leaf's column and how its items come back.
    return (col.kind, <bint>col.finalized, <bint>col.row_type_open, col.descr,
            col.row_shape_tuple if col.descr is not None else ())


cdef object tree_signature(object tree):
    if type(tree) is Column:
        return leaf_signature(<Column>tree)
    if isinstance(tree, dict):
        return ("dict", tuple([(k, tree_signature(v)) for k, v in tree.items()]))
    return ("tuple", tuple([tree_signature(v) for v in tree]))


def signature(EpisodeCore episode):
    """What decides an episode's step file: each track's tree of leaves
    (kind, mode, dtype, row shape), its extra outputs' keys in order, and
    whether they are a defaultdict (as after from_state)."""
    extras = own_extras(episode)
    return (tree_signature(episode.observations._tree), tree_signature(episode.actions._tree),
            tree_signature(episode.rewards._tree),
            tuple([(k, tree_signature((<BufferCore>b)._tree)) for k, b in extras.items()]),
            type(extras) is not dict)


# -- writing: a group's rows --------------------------------------------------------------


@cython.final
cdef class Rows:
    """A growable block of fixed-size rows (one leaf of a group, or one
    numeric column of the episode table). Some rows may be referred to in
    place instead (refer()): views of an episode's storage, which the
    step file's writer compresses from where they are; the block then holds
    the other rows, in order."""
    cdef cnp.ndarray block
    cdef Py_ssize_t cap              # its rows
    cdef readonly Py_ssize_t size    # rows: the block's and those referred to
    cdef Py_ssize_t held             # the block's rows
    cdef Py_ssize_t row_bytes
    cdef list refs                   # rows referred to: (first row, view), ascending

    def __init__(self, dtype, tuple shape=()):
        self.block = np.empty((16,) + shape, dtype)
        self.size = 0
        self.held = 0
        self.row_bytes = self.block.itemsize
        for d in shape:
            self.row_bytes *= d
        self.cap = 16
        self.refs = []

    cdef inline char* reserve(self, Py_ssize_t n) except NULL:
        # Room for n (>= 0) more rows in the block: where the first goes.
        if n > self.cap - self.held:
            self.grow(n)
        return array_bytes(self.block, (self.held + n) * self.row_bytes) + \
            self.held * self.row_bytes

    cdef int grow(self, Py_ssize_t n) except -1:
        # Room for n more rows: twice the rows, or just enough if more.
        cdef cnp.ndarray grown
        cdef Py_ssize_t cap
        if n <= self.cap - self.held:
            return 0
        cap = max(2 * self.cap, self.held + n)
        grown = np.empty((cap,) + (<object>self.block).shape[1:], self.block.dtype)
        memcpy(array_bytes(grown, self.held * self.row_bytes),
               array_bytes(self.block, self.held * self.row_bytes), self.held * self.row_bytes)
        self.block = grown
        self.cap = cap
        return 0

    cdef int zeros(self, Py_ssize_t n) except -1:
        if n > 0:
            memset(self.reserve(n), 0, n * self.row_bytes)
            self.size += n
            self.held += n
        return 0

    cdef int copy(self, Column col, Py_ssize_t first, Py_ssize_t count) except -1:
        # The column's rows first .. first + count - 1, of identical layout
        # (its signature's).
        if count > 0:
            memcpy(self.reserve(count), col.row_ptr(first, count), count * self.row_bytes)
            self.size += count
            self.held += count
        return 0

    cdef int refer(self, Column col, Py_ssize_t first, Py_ssize_t count) except -1:
        # copy() of the same rows, kept as a view of the column's storage
        # (whose block outlives its views: a Column that grows moves to
        # another, and the owner copies them in before anything else may
        # write to them: own()).
        if first < 0 or count < 0 or first > col.nrows() - count:
            raise IndexError(f"rows {first}..{first + count} of {col.nrows()}")
        if count > 0:
            self.refs.append((self.size, col.rows(first, first + count)))
            self.size += count
        return 0

    cdef int cut(self, Py_ssize_t n) except -1:
        # Keeps the first n rows.
        cdef Py_ssize_t referred = 0, first
        if n >= self.size:
            return 0
        n = max(n, 0)
        while self.refs and self.refs[len(self.refs) - 1][0] >= n:
            self.refs.pop()
        if self.refs:       # (no wraparound in this build: no [-1])
            first, view = self.refs[len(self.refs) - 1]
            self.refs[len(self.refs) - 1] = (first, view[:n - first])
        for first, view in self.refs:
            referred += len(view)
        self.size = n
        self.held = n - referred
        return 0

    cdef int own(self) except -1:
        # Copies the rows referred to into the block, in place (the block's
        # rows after each move up to their places, last first).
        cdef Py_ssize_t end, held, first, count
        cdef char* data
        cdef cnp.ndarray view
        if not self.refs:
            return 0
        self.grow(self.size - self.held)
        data = array_bytes(self.block, self.size * self.row_bytes)
        end, held = self.size, self.held
        for first, view in reversed(self.refs):
            count = len(view)
            # the block's rows between this view and the next piece
            memmove(data + (first + count) * self.row_bytes,
                    data + (held - (end - first - count)) * self.row_bytes,
                    (end - first - count) * self.row_bytes)
            held -= end - first - count
            view = np.ascontiguousarray(view)
            memcpy(data + first * self.row_bytes,
                   array_bytes(view, count * self.row_bytes), count * self.row_bytes)
            end = first
        self.refs = []
        self.held = self.size
        return 0

    cdef char* row(self, Py_ssize_t pos) except NULL:
        # Row `pos` (< size) of a block that refers to no rows.
        if pos < 0 or pos >= self.size:
            raise IndexError(f"row {pos} of {self.size}")
        if self.refs:
            raise ValueError("a row referred to in place, not in the block")
        return array_bytes(self.block, self.size * self.row_bytes) + pos * self.row_bytes

    cdef int push_int(self, int64_t value) except -1:
        (<int64_t*>self.reserve(1))[0] = value
        self.size += 1
        self.held += 1
        return 0

    cdef int push_double(self, double value) except -1:
        (<double*>self.reserve(1))[0] = value
        self.size += 1
        self.held += 1
        return 0

    cdef int push_byte(self, char value) except -1:
        self.reserve(1)[0] = value
        self.size += 1
        self.held += 1
        return 0

    cdef int push_int32(self, int32_t value) except -1:
        (<int32_t*>self.reserve(1))[0] = value
        self.size += 1
        self.held += 1
        return 0

    def array(self):
        """The rows so far (a view of the block, with any rows referred to
        copied in first)."""
        self.own()
        return self.block[:self.size]

    def pieces(self):
        """The rows so far as (first row, array) in order, without copies:
        the block's runs and the views referred to."""
        cdef Py_ssize_t at = 0, pos = 0, first
        out = []
        for first, view in self.refs:
            if first > at:
                out.append((at, self.block[pos:pos + first - at]))
                pos += first - at
            out.append((first, view))
            at = first + len(view)
        if self.size > at:
            out.append((at, self.block[pos:pos + self.size - at]))
        return out

    @property
    def nbytes(self):
        return self.size * self.row_bytes


cdef list tree_columns(object tree, list out):
    # A storage tree's Columns in its order (the signature's).
    if type(tree) is Column:
        out.append(tree)
    elif isinstance(tree, dict):
        for v in tree.values():
            tree_columns(v, out)
    else:
        for v in tree:
            tree_columns(v, out)
    return out


cdef list column_items(Column col):
    # The items of an encoded leaf (object path or object dtype), in order.
    if col.kind == KIND_OBJECT:
        return list(col.items)
    if col.kind == KIND_EMPTY_DICT:
        return [{} for _ in range(col.size)]
    if col.descr is None:
        return []
    return list(col.rows(0, col.size))


cdef bint same_layout(BufferCore buf, Column template) except -1:
    # A buffer of one Column with the leaf signature `template` has.
    cdef Column col
    if type(buf._tree) is not Column:
        return False
    col = <Column>buf._tree
    if (col.kind != template.kind or col.finalized != template.finalized
            or col.row_type_open != template.row_type_open):
        return False
    if col.descr is None or template.descr is None:
        return col.descr is None and template.descr is None
    return ((col.descr is template.descr
             or cnp.PyArray_EquivTypes(col.descr, template.descr))
            and col.row_ndim == template.row_ndim
            and (col.row_ndim == 0
                 or memcmp(col.row_shape, template.row_shape,
                           col.row_ndim * sizeof(cnp.npy_intp)) == 0))


cdef class GroupRows:
    """The rows of one signature's episodes, as its step file will hold
    them: per leaf a `Rows` block (stored bytes), a list of items (encoded
    values, None for padding) or None (no data); per row its infos (None:
    an empty dict) and done flags. `codecs` says which, leaf by leaf in
    signature order; `number` is the step file's number in its part."""
    cdef readonly object signature
    cdef readonly list leaves
    cdef list info_rows              # the rows whose infos are not empty, ascending,
    cdef list info_values            # and those infos, encoded
    cdef readonly Rows terminateds, truncateds
    cdef readonly Py_ssize_t number
    cdef readonly Py_ssize_t nrows
    cdef Py_ssize_t room             # the rows its blocks hold (as told by expect())
    cdef readonly Py_ssize_t row_bytes   # of its fixed-size leaves, per row
    cdef Py_ssize_t rewards_leaf     # the plain-number rewards leaf summed into returns, or -1
    cdef public object spec          # the writer's description of the file (format trees)
    cdef list templates              # per track a Column of its one leaf's layout (no rows),
                                     # where every track is one Column; else None
    cdef tuple extra_keys            # the extra outputs' keys, in order
    cdef bint extras_default         # the extra outputs are a defaultdict

    def __init__(self, signature, Py_ssize_t number, list codecs, list dtypes, list shapes,
                 Py_ssize_t rewards_leaf):
        self.signature = signature
        self.number = number
        self.leaves = []
        for codec, dtype, shape in zip(codecs, dtypes, shapes):
            if codec == "arrow" or codec == "bytes" or codec == "zero":
                self.leaves.append(Rows(dtype, shape))
            elif codec == "value":
                self.leaves.append([])
            else:
                self.leaves.append(None)
        self.row_bytes = sum([(<Rows>leaf).row_bytes for leaf in self.leaves
                              if type(leaf) is Rows])
        self.info_rows = []
        self.info_values = []
        self.terminateds = Rows(np.bool_)
        self.truncateds = Rows(np.bool_)
        self.nrows = 0
        self.rewards_leaf = rewards_leaf
        self.templates = None

    cdef int learn_layout(self, EpisodeCore episode) except -1:
        # The templates that fits() compares episodes with: the layout of
        # `episode`, which has this group's signature.
        cdef list tracks = [episode.observations, episode.actions, episode.rewards]
        cdef BufferCore buf
        cdef Column col, template
        extras = own_extras(episode)
        tracks.extend(extras.values())
        templates = []
        for buf in tracks:
            if type(buf._tree) is not Column:
                return 0
            col = <Column>buf._tree
            template = Column.__new__(Column)
            if col.descr is not None:
                template._set_layout(col.descr, col.row_ndim, col.row_shape)
            template.kind, template.finalized = col.kind, col.finalized
            template.row_type_open = col.row_type_open
            templates.append(template)
        self.extra_keys = tuple(extras)
        self.extras_default = type(extras) is not dict
        self.templates = templates
        return 0

    cdef bint fits(self, EpisodeCore episode, object extras) except -1:
        # Whether `episode` (`extras`: its own_extras()) has this group's
        # signature, without making it: known only for groups of one Column
        # per track (else False).
        cdef Py_ssize_t k = 0
        cdef BufferCore buf
        if self.templates is None:
            return False
        if ((type(extras) is not dict) != self.extras_default
                or len(<dict>extras) != len(self.extra_keys)
                or not same_layout(episode.observations, self.templates[0])
                or not same_layout(episode.actions, self.templates[1])
                or not same_layout(episode.rewards, self.templates[2])):
            return False
        for key, buf in (<dict>extras).items():
            if not (key is self.extra_keys[k] or key == self.extra_keys[k]) or \
                    not same_layout(buf, self.templates[N_TRACKS + k]):
                return False
            k += 1
        return True

    cdef Py_ssize_t add(self, EpisodeCore episode, object extras, Py_ssize_t rows,
                        Py_ssize_t last, Py_ssize_t length, bint skip, object encode,
                        double* episode_return) except -1:
        # Appends the episode's `rows` rows (0, or its largest lookback L +
        # its length + 1; `last` = L): each track at rows L - its lookback
        # on, zeros around; with `skip`, without its lookback rows (L = 0).
        # `encode` turns infos and encoded items into bytes. Returns the
        # episode's first row. Nothing of the episode is kept if any of it
        # fails (an item `encode` refuses).
        cdef Py_ssize_t first = self.nrows
        try:
            self._add(episode, extras, rows, last, length, skip, encode, episode_return)
        except BaseException:
            self.truncate(first)
            raise
        self.nrows += rows
        return first

    cdef int expect(self, Py_ssize_t n) except -1:
        # Room for n more rows in its blocks at once (a run's rows, told
        # before its first episode): no block copied as it grows.
        for leaf in self.leaves:
            if type(leaf) is Rows:
                (<Rows>leaf).grow(n)
        self.terminateds.grow(n)
        self.truncateds.grow(n)
        self.room = self.nrows + n
        return 0

    @property
    def nbytes(self):
        """The bytes of its fixed-size rows so far."""
        return self.nrows * self.row_bytes

    def infos(self):
        """Each row's infos, encoded (None: empty), or None where every
        row's are empty."""
        if not self.info_rows:
            return None
        out = [None] * self.nrows
        for row, value in zip(self.info_rows, self.info_values):
            out[row] = value
        return out

    def truncate(self, Py_ssize_t nrows):
        """Drops the rows from `nrows` on (what add() kept since then)."""
        if nrows < 0:
            raise ValueError(f"a negative number of rows: {nrows}")
        for leaf in self.leaves:
            if type(leaf) is Rows:
                (<Rows>leaf).cut(nrows)
            elif leaf is not None:
                del (<list>leaf)[nrows:]
        k = bisect_left(self.info_rows, nrows)
        del self.info_rows[k:]
        del self.info_values[k:]
        self.terminateds.cut(nrows)
        self.truncateds.cut(nrows)
        self.nrows = min(self.nrows, nrows)

    def own(self):
        """Copies the rows its leaves refer to in place into their blocks
        (before the episodes they belong to may change)."""
        for leaf in self.leaves:
            if type(leaf) is Rows:
                (<Rows>leaf).own()

    def batches(self):
        """Its rows in runs that no leaf's piece crosses (see Rows.pieces):
        (first row, rows, per leaf an array, a list of items or None); one
        run of no rows where it has none."""
        cdef Py_ssize_t k
        if not self.nrows:
            return [(0, 0, [leaf.array() if type(leaf) is Rows else leaf
                            for leaf in self.leaves])]
        pieces = [(<Rows>leaf).pieces() if type(leaf) is Rows else None
                  for leaf in self.leaves]
        bounds = sorted({0, self.nrows}.union(
            *[[first for first, _ in p] for p in pieces if p is not None]))
        at = [0] * len(pieces)      # per leaf: its piece holding the run
        out = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            arrays = []
            for k, leaf in enumerate(self.leaves):
                if type(leaf) is Rows:
                    p = pieces[k]
                    while p[at[k]][0] + len(p[at[k]][1]) <= a:
                        at[k] += 1
                    first, rows = p[at[k]]
                    arrays.append(rows[a - first:b - first])
                elif leaf is not None:
                    arrays.append((<list>leaf)[a:b])
                else:
                    arrays.append(None)
            out.append((a, b - a, arrays))
        return out

    cdef int reuse(self, Py_ssize_t number) except -1:
        # Empty, as step file `number` of a new part: its blocks stay, with
        # their pages (a new part's fresh blocks cost the kernel's zeroing
        # of every page: 256 MiB copied in 77 ms instead of 22 here).
        self.truncate(0)
        self.number = number
        self.room = 0
        return 0

    cdef int _add(self, EpisodeCore episode, object extras, Py_ssize_t rows, Py_ssize_t last,
                  Py_ssize_t length, bint skip, object encode,
                  double* episode_return) except -1:
        cdef Py_ssize_t k = 0, before, count, i, start = self.nrows, off
        cdef BufferCore buf
        episode_return[0] = NAN if self.rewards_leaf < 0 else 0.0
        k = self.add_track(episode.observations, k, rows, last, length, skip, episode_return)
        k = self.add_track(episode.actions, k, rows, last, length, skip, episode_return)
        k = self.add_track(episode.rewards, k, rows, last, length, skip, episode_return)
        for buf in (<dict>extras).values():
            k = self.add_track(buf, k, rows, last, length, skip, episode_return)
        buf = episode.infos
        off = buf._lookback if skip else 0
        count = buf.len_incl_lookback() - off
        before = last - buf._lookback + off if count else rows
        if before < 0 or before + count > rows:
            raise ValueError("the infos do not fit the episode's rows (an inconsistent episode)")
        if buf.flat() is None or buf.flat().kind != KIND_EMPTY_DICT:
            for i in range(off, off + count):
                item = buf.item_at(i)
                if not (type(item) is dict and not item):
                    self.info_rows.append(start + before + i - off)
                    self.info_values.append(encode(item))
        self.terminateds.zeros(rows)
        self.truncateds.zeros(rows)
        if length:
            # The flags of a done episode's last step (RLlib's row format's).
            self.terminateds.row(start + last + length - 1)[0] = bool(episode.is_terminated)
            self.truncateds.row(start + last + length - 1)[0] = bool(episode.is_truncated)
        return 0

    cdef Py_ssize_t add_track(self, BufferCore buf, Py_ssize_t k, Py_ssize_t rows,
                              Py_ssize_t last, Py_ssize_t length, bint skip,
                              double* episode_return) except -1:
        # A track's leaves (this group's leaves k on) into the episode's rows
        # (see add()); returns the number of the next track's first leaf.
        cdef Py_ssize_t off = buf._lookback if skip else 0
        cdef Py_ssize_t count = buf.first().nrows() - off
        cdef Py_ssize_t before = last - buf._lookback + off if count else rows
        cdef Column col
        if before < 0 or before + count > rows:
            raise ValueError("a track's rows do not fit the episode's (an inconsistent "
                             "episode)")
        if type(buf._tree) is Column:     # (the usual track: no list of its leaves)
            self.add_leaf(<Column>buf._tree, k, rows, before, off, count, last, length,
                          episode_return)
            return k + 1
        for col in tree_columns(buf._tree, []):
            self.add_leaf(col, k, rows, before, off, count, last, length, episode_return)
            k += 1
        return k

    cdef int add_leaf(self, Column col, Py_ssize_t k, Py_ssize_t rows, Py_ssize_t before,
                      Py_ssize_t off, Py_ssize_t count, Py_ssize_t last, Py_ssize_t length,
                      double* episode_return) except -1:
        # The column's rows off .. off + count - 1 into leaf k, `before`
        # padding rows before them and the rest of `rows` after.
        cdef Rows block
        leaf = self.leaves[k]
        if type(leaf) is Rows:
            block = <Rows>leaf
            if (before == 0 and count == rows and k != self.rewards_leaf
                    and block.row_bytes >= REFER_ROW_BYTES
                    and count * block.row_bytes >= REFER_BYTES):
                block.refer(col, off, count)
                return 0
            block.zeros(before)
            block.copy(col, off, count)
            block.zeros(rows - before - count)
            if k == self.rewards_leaf and length:
                episode_return[0] = sum_rows(block, self.nrows + last, length)
        elif leaf is not None:
            (<list>leaf).extend([None] * before)
            (<list>leaf).extend(column_items(col)[off:])
            (<list>leaf).extend([None] * (rows - before - count))
        return 0


cdef double sum_rows(Rows block, Py_ssize_t first, Py_ssize_t count) except? -1:
    # The sum of plain-number rows first .. first + count - 1, in float64
    # (added in order; the usual reward dtypes here, numpy's for the rest).
    cdef int type_num = cnp.PyArray_TYPE(block.block)
    cdef char* data = block.row(first) if count else NULL
    cdef double total = 0.0
    cdef Py_ssize_t i
    if first + count > block.size:
        raise IndexError("rows past the block")
    if type_num == cnp.NPY_DOUBLE:
        for i in range(count):
            total += (<double*>data)[i]
    elif type_num == cnp.NPY_FLOAT:
        for i in range(count):
            total += (<float*>data)[i]
    elif type_num == cnp.NPY_INT64:
        for i in range(count):
            total += (<int64_t*>data)[i]
    else:
        return float(np.add.reduce(block.block[first:first + count], dtype=np.float64))
    return total


cdef object numpy_bool = np.bool_


cdef int flag_type(object terminated, object truncated) noexcept:
    # 0: both done flags Python bools, 1: both numpy bools (a vector env's),
    # -1: anything else (kept among the episode's details).
    if type(terminated) is bool and type(truncated) is bool:
        return 0
    if type(terminated) is numpy_bool and type(truncated) is numpy_bool:
        return 1
    return -1


cdef class Recording:
    """What an EpisodeWriter keeps until it writes a part: its episodes'
    rows by group (GroupRows, in the order made) and the episode table's
    rows, numbers in typed columns. `new_group(signature, number)` makes a
    group (the writer's: it knows the format); `pack` encodes a value;
    `details(episode)` says what is unusual about an episode (called only
    where the quick checks here find something); `space_text` describes a
    space; `ends` (the writer's, kept across parts) where the chunks written
    so far end, by episode id: a chunk that continues one of them is kept
    without its lookback rows (the reader joins it to that one, whose rows
    they are)."""
    cdef readonly dict groups
    cdef GroupRows last_group
    cdef object new_group, pack, details, space_text
    cdef readonly dict numbers       # column -> Rows
    cdef readonly dict packed        # column -> list of bytes (or None)
    cdef list table_rows, table_packed  # the same Rows and lists, in their columns' order
    cdef dict ends                   # id -> where the written chunk ends (not done ones)
    cdef dict spares                 # signature -> a written part's group, to reuse
    cdef dict space_index            # id(space) -> (space, its number)
    cdef readonly list spaces        # the spaces' texts, by number
    cdef readonly Py_ssize_t n       # episode table rows
    cdef readonly Py_ssize_t steps   # step file rows, all groups
    cdef Py_ssize_t expected         # the rows add_run() still expects (0: outside one)
    cdef Py_ssize_t byte_limit       # and the most bytes it lets the groups hold
    cdef Py_ssize_t largest          # and its largest episode's rows, about

    def __init__(self, new_group, pack, details, space_text, dict ends, Recording last=None):
        self.new_group = new_group
        # The groups of the writer's last part (written): reused for the
        # same signatures, blocks and all.
        self.spares = {} if last is None else dict(last.groups)
        self.ends = ends
        self.pack = pack
        self.details = details
        self.space_text = space_text
        self.groups = {}
        self.last_group = None
        self.numbers = {name: Rows(dtype, shape) for name, dtype, shape in TABLE_NUMBERS}
        self.packed = {name: [] for name in TABLE_PACKED}
        self.table_rows = list(self.numbers.values())
        self.table_packed = list(self.packed.values())
        self.space_index = {}
        self.spaces = []
        self.n = 0
        self.steps = 0

    @property
    def nbytes(self):
        """The bytes of its step files' fixed-size rows so far."""
        return self.fixed_bytes()

    cdef Py_ssize_t fixed_bytes(self) except -1:
        cdef GroupRows group
        cdef Py_ssize_t total = 0
        for group in self.groups.values():
            total += group.nrows * group.row_bytes
        return total

    def own(self):
        """Copies the rows its groups refer to in place into their blocks:
        what the caller hands back to its user may change after."""
        for group in self.groups.values():
            group.own()

    def mark(self):
        """Where the recording is (see rollback)."""
        return (self.n, [(<GroupRows>g).nrows for g in self.groups.values()])

    def add_run(self, list episodes, Py_ssize_t start, Py_ssize_t max_steps,
                Py_ssize_t max_bytes, double deadline):
        """add() of episodes[start], episodes[start + 1], ... (single-agent
        episodes of ours) in one loop, until one that is not, or until the
        recording holds `max_steps` step rows or `max_bytes` bytes, or the
        clock (time.monotonic()) reaches `deadline`. Returns the index after
        the last one added. A bad episode raises, and leaves the recording as
        it was before it (the ones before it are kept)."""
        cdef Py_ssize_t i = start, end = start, rows = 0, largest = 0, n
        cdef Rows column
        # The run's rows, about (its observations'), so that each block is
        # sized once instead of copied as it doubles (see add_one).
        while end < len(episodes) and isinstance(episodes[end], EpisodeCore):
            n = (<EpisodeCore>episodes[end]).observations.len_incl_lookback()
            rows += n
            largest = max(largest, n)
            end += 1
        for column in self.table_rows:
            column.grow(end - start)
        self.expected = max(0, min(rows, max_steps - self.steps))
        self.byte_limit = max_bytes
        self.largest = largest
        try:
            while i < end:
                self.add_one(<EpisodeCore>episodes[i], -1)
                i += 1
                if (self.steps >= max_steps or self.fixed_bytes() >= max_bytes
                        or now() >= deadline):
                    break
        finally:
            self.expected = 0
        return i

    def rollback(self, tuple mark):
        """Back to `mark` (of mark()): what was added since is dropped."""
        cdef list nrows = mark[1]
        cdef Py_ssize_t n = mark[0]
        if not 0 <= n <= self.n or len(nrows) > len(self.groups) or any(
                not 0 <= count <= (<GroupRows>g).nrows
                for g, count in zip(self.groups.values(), nrows)):
            raise ValueError(f"not a mark of this recording: {mark!r:.200}")
        for group, count in zip(self.groups.values(), nrows):
            (<GroupRows>group).truncate(count)
        self.restore(n, len(nrows))

    cdef int restore(self, Py_ssize_t n, Py_ssize_t ngroups) except -1:
        # Back to `n` episode table rows and the first `ngroups` groups (whose
        # rows the caller has truncated).
        cdef Rows rows
        for rows in self.table_rows:
            rows.cut(n)
        for values in self.table_packed:
            del (<list>values)[n:]
        if len(self.groups) > ngroups:
            self.groups = dict(list(self.groups.items())[:ngroups])
        self.last_group = None
        self.n = n
        self.steps = sum([(<GroupRows>g).nrows for g in self.groups.values()])
        return 0

    cdef int make_room(self, GroupRows group, Py_ssize_t rows) except -1:
        # Room in `group` for the rows the run is still expected to bring,
        # within the part's byte limit, which the episode that reaches it
        # passes (room for the run's largest: else that episode doubles a
        # block of a part's bytes, and the next part reuses none of it).
        # Blocks are allocated, not touched: room not used costs address
        # space only.
        cdef Py_ssize_t n = max(self.expected, rows)
        if group.row_bytes:
            n = min(n, max(0, self.byte_limit - self.fixed_bytes()) // group.row_bytes
                    + max(rows, self.largest))
        return group.expect(n)

    cdef GroupRows group_of(self, EpisodeCore episode, object extras):
        cdef GroupRows group
        if self.last_group is not None and self.last_group.fits(episode, extras):
            return self.last_group
        sig = signature(episode)
        group = self.groups.get(sig)
        if group is None:
            group = self.spares.pop(sig, None)
            if group is not None:
                group.reuse(len(self.groups))
            else:
                group = self.new_group(sig, len(self.groups))
                group.learn_layout(episode)
            self.groups[sig] = group
        self.last_group = group
        return group

    cdef object pack_id(self, object value):
        # msgpack of a str made here (the usual id: a fixstr or str8 header,
        # then its UTF-8), anything else by `pack`.
        cdef const char* text
        cdef Py_ssize_t n, head
        cdef bytes out
        cdef char* data
        if value is None:
            return None
        if type(value) is not str:
            return self.pack(value)
        text = PyUnicode_AsUTF8AndSize(value, &n)
        if n >= 256:
            return self.pack(value)
        head = 1 if n < 32 else 2
        out = PyBytes_FromStringAndSize(NULL, head + n)
        data = PyBytes_AS_STRING(out)
        if n < 32:
            data[0] = <char>(0xa0 | n)
        else:
            data[0] = <char>0xd9
            data[1] = <char>n
        memcpy(data + head, text, n)
        return out

    cdef int32_t space_number(self, object space) except -2:
        cdef tuple known
        if space is None:
            return -1
        known = self.space_index.get(id(space))
        if known is not None and known[0] is space:
            return known[1]
        text = self.space_text(space)
        try:
            number = self.spaces.index(text)
        except ValueError:
            number = len(self.spaces)
            self.spaces.append(text)
        if len(self.space_index) > 256:
            self.space_index.clear()
        self.space_index[id(space)] = (space, number)
        return number

    cdef bint usual(self, EpisodeCore episode, object extras) except -1:
        # Nothing for `details`: plain bool done flags, the last added
        # observation and infos the last rows, the buffers' spaces the
        # episode's own (`extras`: its own_extras()).
        if flag_type(episode.is_terminated, episode.is_truncated) < 0:
            return False
        if last_added(episode) is not True:
            return False
        if (episode.observations._space is not episode._observation_space
                or episode.actions._space is not episode._action_space
                or episode.rewards._space is not REWARDS_SPACE
                or episode.infos._space is not None):
            return False
        for buf in extras.values():
            if (<BufferCore>buf)._space is not None:
                return False
        return True

    def add(self, EpisodeCore episode, int64_t parent=-1):
        """Keeps a single-agent episode (checked first; nothing of it is kept
        if it fails part-way)."""
        self.add_one(episode, parent)

    cdef int add_one(self, EpisodeCore episode, int64_t parent) except -1:
        # Keeps the episode whole, or (it raises) nothing of it.
        cdef Py_ssize_t n = self.n, ngroups = len(self.groups), first = -1
        cdef GroupRows group = None
        cdef Py_ssize_t rows, last = 0, length, lb_extras, k
        cdef Py_ssize_t lookbacks[5]
        cdef int32_t observation_space, action_space
        cdef bint skip
        cdef double episode_return
        cdef BufferCore buf
        try:
            episode.validate()
            extras = own_extras(episode)
            lb_extras = episode.actions._lookback
            k = 0
            for buf in extras.values():
                if k == 0:
                    lb_extras = buf._lookback
                elif buf._lookback != lb_extras:
                    raise ValueError("the extra model outputs have different lookbacks")
                k += 1
            length = steps(episode)
            skip = parent < 0 and self.ends.get(episode.id_) == episode.t_started
            if skip:
                lookbacks[:] = [0, 0, 0, 0, 0]
            else:
                lookbacks[:] = [episode.observations._lookback, episode.infos._lookback,
                                episode.actions._lookback, episode.rewards._lookback,
                                lb_extras]
            for k in range(5):
                last = max(last, lookbacks[k])
            rows = last + length + 1 if episode.observations.len_incl_lookback() else 0
            # Everything that can refuse the episode runs before its rows are kept.
            group = self.group_of(episode, extras)
            if self.expected and group.nrows + rows > group.room:
                self.make_room(group, rows)
            values = (self.pack_id(episode.id_), self.pack_id(episode.agent_id),
                      self.pack_id(episode.module_id),
                      self.pack_id(episode.multi_agent_episode_id),
                      self.pack(episode.custom_data_) if episode.custom_data_ else None,
                      None if self.usual(episode, extras)
                      else self.pack(self.details(episode)), None)
            observation_space = self.space_number(episode._observation_space)
            action_space = self.space_number(episode._action_space)
            first = group.add(episode, extras, rows, last, length, skip, self.pack,
                              &episode_return)
            self.push_row(SINGLE, parent, group.number, first, rows, length, episode.t_started,
                          episode.is_terminated, episode.is_truncated, episode.start_time,
                          episode.last_step_time, episode_return, lookbacks, observation_space,
                          action_space, values)
            self.steps += rows
            self.expected = max(0, self.expected - rows)
            if parent < 0:
                if episode.is_terminated or episode.is_truncated:
                    self.ends.pop(episode.id_, None)
                else:
                    if len(self.ends) >= 1 << 20:
                        self.ends.clear()      # a bound: only fewer lookbacks are skipped
                    self.ends[episode.id_] = episode.t
        except BaseException:
            if first >= 0:
                group.truncate(first)
            self.restore(n, ngroups)
            raise
        return 0

    def add_multi(self, object episode, bytes state):
        """Keeps the row of a multi-agent episode (its own fields packed in
        `state`; its agents' episodes go in with add(.., parent=)); returns
        its row number."""
        cdef Py_ssize_t lookbacks[5]
        lookbacks[:] = [0, 0, 0, 0, 0]
        start = episode._start_time
        last = episode._last_step_time
        self.push_row(MULTI, -1, -1, 0, 0, len(episode), episode.env_t_started,
                      episode.is_terminated, episode.is_truncated,
                      NAN if start is None else start, NAN if last is None else last, NAN,
                      lookbacks, -1, -1,
                      (self.pack_id(episode.id_), None, None, None, None, None, state))
        return self.n - 1

    cdef int push_row(self, char kind, int64_t parent, int64_t group, int64_t first,
                      int64_t rows, int64_t length, int64_t t_started, object terminated,
                      object truncated, double start_time, double last_step_time,
                      double episode_return, Py_ssize_t* lookbacks,
                      int32_t observation_space, int32_t action_space,
                      tuple values) except -1:
        # The columns by position, in TABLE_NUMBERS' and TABLE_PACKED's order.
        cdef list c = self.table_rows
        cdef list p = self.table_packed
        cdef Py_ssize_t k
        (<Rows>c[0]).push_byte(kind)
        (<Rows>c[1]).push_int(parent)
        (<Rows>c[2]).push_int32(<int32_t>group)
        (<Rows>c[3]).push_int(first)
        (<Rows>c[4]).push_int(rows)
        (<Rows>c[5]).push_int(length)
        (<Rows>c[6]).push_int(t_started)
        (<Rows>c[7]).push_byte(bool(terminated))
        (<Rows>c[8]).push_byte(bool(truncated))
        (<Rows>c[9]).push_byte(flag_type(terminated, truncated) == 1)
        (<Rows>c[10]).push_double(start_time)
        (<Rows>c[11]).push_double(last_step_time)
        (<Rows>c[12]).push_double(episode_return)
        for k in range(5):
            if lookbacks[k] > INT32_MAX:
                raise OverflowError(f"a lookback of {lookbacks[k]} rows (at most {INT32_MAX})")
            (<Rows>c[13 + k]).push_int32(<int32_t>lookbacks[k])
        (<Rows>c[18]).push_int32(observation_space)
        (<Rows>c[19]).push_int32(action_space)
        for k in range(7):
            (<list>p[k]).append(values[k])
        self.n += 1
        return 0


# The episode table's kinds of rows: a single-agent episode (an agent's of a
# multi-agent one where its parent is not -1), a multi-agent episode.
SINGLE, MULTI = 0, 1
LOOKBACK_COLUMNS = ("lookback_obs", "lookback_infos", "lookback_actions", "lookback_rewards",
                    "lookback_extras")
TABLE_NUMBERS = (("kind", np.int8, ()), ("parent", np.int64, ()), ("group", np.int32, ()),
                 ("row", np.int64, ()), ("rows", np.int64, ()), ("length", np.int64, ()),
                 ("t_started", np.int64, ()), ("terminated", np.bool_, ()),
                 ("truncated", np.bool_, ()), ("numpy_flags", np.bool_, ()),
                 ("start_time", np.float64, ()),
                 ("last_step_time", np.float64, ()), ("return", np.float64, ())) + tuple(
                    (name, np.int32, ()) for name in LOOKBACK_COLUMNS) + (
                 ("observation_space", np.int32, ()), ("action_space", np.int32, ()))
TABLE_PACKED = ("id", "agent_id", "module_id", "multi_agent_episode_id", "custom_data",
                "details", "multi_state")


# -- reading: a step file's episodes -------------------------------------------------------


cdef class Encoded:
    """An Arrow binary column's values by row, without a Python object per
    row until one is read: its offsets, bytes and validity as arrays."""
    cdef cnp.ndarray offsets     # int32, rows + 1
    cdef bytes payload
    cdef cnp.ndarray valid       # bool per row, or None: all valid
    cdef Py_ssize_t n
    cdef object decode

    def __init__(self, column, decode):
        cdef Py_ssize_t n = len(column)
        buffers = column.buffers()
        offsets = np.frombuffer(buffers[1], np.int32)[column.offset:column.offset + n + 1] \
            if buffers[1] is not None else np.zeros(0, np.int32)
        if len(offsets) != n + 1 or (n and (offsets[0] < 0 or np.any(np.diff(offsets) < 0))):
            raise ValueError("malformed binary column offsets")
        self.offsets = np.ascontiguousarray(offsets)
        self.payload = buffers[2].to_pybytes() if buffers[2] is not None else b""
        if n and self.offsets[n] > len(self.payload):
            raise ValueError("a binary column's offsets run past its data")
        self.valid = None
        if column.null_count:
            self.valid = np.ascontiguousarray(np.asarray(column.is_valid()), np.bool_)
        self.n = n
        self.decode = decode

    cdef object value(self, Py_ssize_t row, object missing):
        # The decoded value at `row`, `missing` for a null.
        cdef int* offs = <int*>array_bytes(self.offsets, (self.n + 1) * sizeof(int))
        if row < 0 or row >= self.n:
            raise IndexError(f"row {row} of {self.n}")
        if self.valid is not None and not (<cnp.npy_bool*>array_bytes(self.valid, self.n))[row]:
            return missing
        return self.decode(self.payload[offs[row]:offs[row + 1]])


@cython.final
cdef class Chunks:
    """A leaf's rows in several arrays, one after another (a step file of
    several record batches): rows within one are read from it in place,
    rows across several are joined (a copy)."""
    cdef list columns           # per array, a finalized Column over it
    cdef cnp.ndarray _starts    # int64: each array's first row, then the rows
    cdef int64_t* starts
    cdef Py_ssize_t n

    def __init__(self, list arrays):
        if not arrays:
            raise ValueError("a leaf of no chunks")
        self.columns = [Column.from_array(arr) for arr in arrays]
        self._starts = np.zeros(len(arrays) + 1, np.int64)
        np.cumsum([len(arr) for arr in arrays], out=self._starts[1:])
        self.starts = <int64_t*>array_bytes(self._starts, (len(arrays) + 1) * sizeof(int64_t))
        self.n = len(arrays)

    cdef Column rows_of(self, Py_ssize_t start, Py_ssize_t count, Py_ssize_t* first):
        # The Column holding rows [start, start + count) from its row
        # `first[0]` on: a chunk's, or a new one of those rows joined.
        cdef Py_ssize_t lo = 0, hi = self.n, mid
        if start < 0 or count < 0 or start > self.starts[self.n] - count:
            raise ValueError(f"rows {start}..{start + count} are not in the leaf's "
                             f"{self.starts[self.n]}")
        while hi - lo > 1:              # the last chunk starting at or before `start`
            mid = (lo + hi) // 2
            if self.starts[mid] <= start:
                lo = mid
            else:
                hi = mid
        if start + count <= self.starts[lo + 1]:
            first[0] = start - self.starts[lo]
            return self.columns[lo]
        first[0] = 0
        return Column.from_array(np.concatenate(self.joined(start, count)))

    cdef list joined(self, Py_ssize_t start, Py_ssize_t count):
        # The chunks' views of rows [start, start + count), in order.
        cdef Py_ssize_t k, a, b
        out = []
        for k in range(self.n):
            a = max(start, self.starts[k])
            b = min(start + count, self.starts[k + 1])
            if a < b:
                out.append((<Column>self.columns[k]).rows(a - self.starts[k],
                                                          b - self.starts[k]))
        return out


cdef class StepFile:
    """A step file's columns, ready to build episodes over: per leaf a
    finalized Column over the file's rows (read in place; list-mode
    episodes copy theirs), an `Encoded` column, or None (no data)."""
    cdef list leaves        # per leaf: Column, Chunks, Encoded or None
    cdef list kinds         # per leaf: the kind its items come back as
    cdef list finalized     # per leaf: numpy'd (views) or list mode (copies)
    cdef list opens         # per leaf: a finalized leaf whose first rows set its row type
    cdef list trees         # per track (obs, actions, rewards, extras...): leaf numbers in
                            # the track's nesting
    cdef list extra_keys
    cdef bint extras_default
    cdef Encoded infos
    cdef readonly Py_ssize_t nrows

    def __init__(self, list leaves, list kinds, list finalized, list opens, list trees,
                 list extra_keys, bint extras_default, Encoded infos, Py_ssize_t nrows):
        """`leaves`: per leaf an ndarray of all the file's rows (or a list
        of ndarrays: its record batches' rows, in order), an Encoded column
        or None; the rest as the file's metadata says (checked by
        the caller)."""
        self.leaves = []
        for arr in leaves:
            self.leaves.append(Column.from_array(arr) if isinstance(arr, np.ndarray)
                               else Chunks(arr) if type(arr) is list else arr)
        self.kinds = kinds
        self.finalized = finalized
        self.opens = opens
        self.trees = trees
        self.extra_keys = extra_keys
        self.extras_default = extras_default
        self.infos = infos
        self.nrows = nrows

    cdef object leaf_rows(self, Py_ssize_t k, Py_ssize_t start, Py_ssize_t count):
        cdef object leaf = self.leaves[k]
        cdef int kind = self.kinds[k]
        cdef bint numpy = self.finalized[k]
        cdef Column col
        if type(leaf) is Chunks:
            leaf = (<Chunks>leaf).rows_of(start, count, &start)
        if self.opens[k]:
            if count:
                raise ValueError("a leaf of no row type holds rows")
            return Column.with_open_row_type()
        if type(leaf) is Column:
            if numpy:
                col = (<Column>leaf).view_rows(start, start + count)
            else:
                col = (<Column>leaf).copy_rows(start, start + count)
            col.kind = kind         # checked against the rows when the file was opened
            return col
        if type(leaf) is Encoded:
            items = [(<Encoded>leaf).value(start + i, None) for i in range(count)]
            if numpy:
                rows = np.empty(count, dtype=object)
                rows[:] = items
                return Column.from_array(rows)
            col = Column.__new__(Column)
            col.kind = KIND_OBJECT
            col.items = items
            col._refs_changed()
            return col
        if kind == KIND_EMPTY_DICT:
            return empty_dicts(count)
        if count:
            raise ValueError("a leaf without data holds rows")
        return Column.with_open_row_type() if numpy else Column()

    cdef object track(self, object tree, Py_ssize_t start, Py_ssize_t count):
        if type(tree) is int:
            return self.leaf_rows(tree, start, count)
        if type(tree) is dict:
            return {key: self.track(sub, start, count) for key, sub in (<dict>tree).items()}
        return tuple([self.track(sub, start, count) for sub in tree])

    def batches(self):
        """The first row of each record batch its stored leaves were read
        in, then its rows (one batch: [0, nrows])."""
        for leaf in self.leaves:
            if type(leaf) is Chunks:
                return (<Chunks>leaf)._starts.tolist()
        return [0, self.nrows]

    def block_tracks(self, Py_ssize_t start=0, stop=None):
        """Each track's leaves in dm-tree (sorted-key) order, as a replay
        store's add_block() takes them, for rows [start, stop) (default:
        all): a stored leaf's rows as an array (read in place, within one
        record batch), a list of the decoded items of an encoded one (None
        for padding). None where a leaf holds no rows at all."""
        cdef Py_ssize_t end = self.nrows if stop is None else stop
        cdef Py_ssize_t first
        cdef Column col
        if not 0 <= start <= end <= self.nrows:
            raise IndexError(f"rows {start}..{end} of {self.nrows}")
        names = [("obs", None), ("actions", None), ("rewards", None)] + [
            ("extras", key) for key in self.extra_keys]
        out = {}
        for name, tree in zip(names, self.trees):
            leaves = []
            for k in sorted_leaves(tree, []):
                leaf = self.leaves[k]
                if type(leaf) is Column:
                    (<Column>leaf).check_range(start, end)
                    leaves.append((<Column>leaf).rows(start, end))
                elif type(leaf) is Chunks:
                    col = (<Chunks>leaf).rows_of(start, end - start, &first)
                    leaves.append(col.rows(first, first + end - start))
                elif type(leaf) is Encoded:
                    leaves.append([(<Encoded>leaf).value(i, None) for i in range(start, end)])
                else:
                    return None
            out[name] = leaves
        return out

    def infos_by_row(self, Py_ssize_t start=0, stop=None):
        """The infos that are not empty of rows [start, stop) (default:
        all), by row from `start`."""
        cdef Py_ssize_t i, end = self.nrows if stop is None else stop
        if not 0 <= start <= end <= self.nrows:
            raise IndexError(f"rows {start}..{end} of {self.nrows}")
        if self.infos is None:
            return {}
        out = {}
        for i in range(start, end):
            item = self.infos.value(i, EMPTY)
            if item is not EMPTY:
                out[i - start] = item
        return out

    cdef object tree_rows(self, object tree, Py_ssize_t start, Py_ssize_t count):
        if type(tree) is int:
            return self.leaf_rows(<Py_ssize_t>tree, start, count)
        return self.track(tree, start, count)

    def episode(self, type cls, EpisodeRows table, Py_ssize_t i):
        """Episode `i` of `table` (an episode table's, whose episode lies in
        this file): an episode of `cls` over its rows [row, row + rows) (0
        rows: not reset), checked (ValueError/TypeError/AssertionError)."""
        if not issubclass(cls, EpisodeCore):
            raise TypeError(f"cannot make an episode of {cls!r:.100}")
        if not 0 <= i < table.n:
            raise IndexError(f"episode {i} of a table of {table.n}")
        return self.build(cls, table, i)

    def episodes(self, type cls, EpisodeRows table, cnp.ndarray numbers, on_error):
        """An iterator of the episodes `numbers` (int64) of `table` that lie
        in this file, as episode() builds them, one per next(). A failed
        build raises what on_error(number, error) returns."""
        if not issubclass(cls, EpisodeCore):
            raise TypeError(f"cannot make an episode of {cls!r:.100}")
        numbers = np.ascontiguousarray(numbers, np.int64)
        if len(numbers) and not (0 <= numbers.min() and numbers.max() < table.n):
            raise IndexError(f"episodes {numbers.min()}..{numbers.max()} of a table of "
                             f"{table.n}")
        return new_run(self, table, cls, numbers, on_error)

    cdef EpisodeCore build(self, type cls, EpisodeRows table, Py_ssize_t i):
        # episode() of a checked class and episode number.
        cdef Py_ssize_t row, rows, length, last, k, lb, start, count
        cdef int64_t* place
        cdef int64_t* lookbacks
        cdef Column infos
        cdef dict extras = {}
        place = &table.numbers[PLACE * i]
        row, rows, length = place[1], place[2], place[3]
        lookbacks = place + 5
        last = max(lookbacks[0], lookbacks[1], lookbacks[2], lookbacks[3], lookbacks[4])
        if row < 0 or rows < 0 or row > self.nrows - rows or length < 0:
            raise ValueError(f"rows {row}..{row + rows} are not in the file's {self.nrows}")
        if rows and rows != last + length + 1:
            raise ValueError(f"{rows} rows for an episode of {length} steps and lookback "
                             f"{last}")
        if len(self.trees) != N_TRACKS + len(self.extra_keys):
            raise ValueError("a step file's trees and extra outputs do not match")
        # Each track's rows end where the episode's last row is (the
        # observations') or one before it; they start `lookback` rows
        # before step 0, which is `last` rows into the episode's rows.
        start, count = row + last - lookbacks[0], (lookbacks[0] + length + 1 if rows else 0)
        observations = self.tree_rows(self.trees[0], start, count)
        start, count = row + last - lookbacks[2], (lookbacks[2] + length if rows else 0)
        actions = self.tree_rows(self.trees[1], start, count)
        start, count = row + last - lookbacks[3], (lookbacks[3] + length if rows else 0)
        rewards = self.tree_rows(self.trees[2], start, count)
        start, count = row + last - lookbacks[4], (lookbacks[4] + length if rows else 0)
        for k in range(len(self.extra_keys)):
            extras[self.extra_keys[k]] = self.tree_rows(self.trees[N_TRACKS + k], start, count)
        start, count = row + last - lookbacks[1], (lookbacks[1] + length + 1 if rows else 0)
        infos = self.infos_rows(start, count)
        return build_episode(cls, table.ids[i], observations, infos, actions, rewards, extras,
                             lookbacks[0], lookbacks[1], lookbacks[2], lookbacks[3],
                             lookbacks[4], table.terminated[i], table.truncated[i],
                             place[4], table.observation_spaces[i],
                             table.action_spaces[i], table.agent_ids[i], table.module_ids[i],
                             table.multi_agent_episode_ids[i], table.start_times[i],
                             table.last_step_times[i], table.custom_data[i],
                             self.extras_default, table.last_added[i])

    cdef Column infos_rows(self, Py_ssize_t start, Py_ssize_t count):
        # The infos of rows [start, start + count): empty dicts as a count
        # (the usual infos), the decoded items otherwise.
        cdef Column infos
        cdef Py_ssize_t j
        if self.infos is not None:
            items = [self.infos.value(start + j, EMPTY) for j in range(count)]
            if not all(item is EMPTY for item in items):
                infos = Column.__new__(Column)
                infos.kind = KIND_OBJECT
                infos.items = [{} if item is EMPTY else item for item in items]
                infos._refs_changed()
                return infos
        return empty_dicts(count)


cdef class EpisodeRun:
    """StepFile.episodes(): the episodes of a run of table rows, built one
    per next() without Python between them."""
    cdef StepFile file
    cdef EpisodeRows table
    cdef type cls
    cdef object on_error
    cdef cnp.ndarray _numbers
    cdef int64_t* numbers
    cdef Py_ssize_t n, pos

    def __iter__(self):
        return self

    def __next__(self):
        cdef Py_ssize_t i
        if self.pos >= self.n:
            raise StopIteration
        i = self.numbers[self.pos]
        self.pos += 1
        try:
            return self.file.build(self.cls, self.table, i)
        except (ValueError, TypeError, AssertionError, KeyError) as error:
            raise self.on_error(i, error) from None


cdef EpisodeRun new_run(StepFile file, EpisodeRows table, type cls, cnp.ndarray numbers,
                        object on_error):
    # StepFile.episodes()' iterator (`numbers`: int64, C-contiguous, checked).
    cdef EpisodeRun run = EpisodeRun.__new__(EpisodeRun)
    run.file, run.table, run.cls, run.on_error = file, table, cls, on_error
    run._numbers = numbers
    run.numbers = <int64_t*>array_bytes(numbers, len(numbers) * sizeof(int64_t))
    run.n = len(numbers)
    run.pos = 0
    return run


cdef class EpisodeRows:
    """An episode table's single-agent episodes as StepFile.episode() reads
    them: where each one's rows are (int64 arrays) and its constructor
    fields (lists), by episode number. Checked whole when made."""
    cdef readonly Py_ssize_t n
    cdef cnp.ndarray _numbers       # (n, PLACE) int64: an episode's place (see PLACE)
    cdef int64_t* numbers
    cdef cnp.ndarray _times         # (2, n) float64: start and last step times (NaN: None)
    cdef double* start_times
    cdef double* last_step_times
    cdef list ids, agent_ids, module_ids, multi_agent_episode_ids, custom_data
    cdef list terminated, truncated, observation_spaces, action_spaces, last_added

    def __init__(self, group, row, rows, length, t_started, lookbacks, start_times,
                 last_step_times, list ids, list agent_ids, list module_ids,
                 list multi_agent_episode_ids, list custom_data, list terminated,
                 list truncated, list observation_spaces, list action_spaces,
                 list last_added):
        """The columns of n episodes: numbers as arrays of n (`lookbacks`
        n x 5), the rest lists of n."""
        cdef Py_ssize_t n = len(ids)
        numbers = np.empty((n, PLACE), np.int64)
        for k, column in enumerate((group, row, rows, length, t_started)):
            numbers[:, k] = np.asarray(column).reshape(n)
        numbers[:, 5:] = np.asarray(lookbacks).reshape(n, 5)
        # Bounded so that no sum of them that build() makes can overflow.
        if n and (numbers[:, 1:4].min() < 0 or numbers[:, 5:].min() < 0
                  or numbers[:, 1:].max() >= 1 << 60):
            raise ValueError("rows, lengths or lookbacks out of range")
        times = np.empty((2, n), np.float64)
        times[0] = np.asarray(start_times).reshape(n)
        times[1] = np.asarray(last_step_times).reshape(n)
        lists = (agent_ids, module_ids, multi_agent_episode_ids, custom_data, terminated,
                 truncated, observation_spaces, action_spaces, last_added)
        if any(len(column) != n for column in lists):
            raise ValueError("columns of different lengths")
        self.n = n
        self._numbers = np.ascontiguousarray(numbers)
        self._times = np.ascontiguousarray(times)
        self.numbers = <int64_t*>array_bytes(self._numbers, n * PLACE * sizeof(int64_t))
        cdef double* times_base = <double*>array_bytes(self._times, 2 * n * sizeof(double))
        self.start_times, self.last_step_times = times_base, times_base + n
        self.ids, self.agent_ids, self.module_ids = ids, agent_ids, module_ids
        self.multi_agent_episode_ids, self.custom_data = multi_agent_episode_ids, custom_data
        self.terminated, self.truncated = terminated, truncated
        self.observation_spaces, self.action_spaces = observation_spaces, action_spaces
        self.last_added = last_added

    def group(self, Py_ssize_t i):
        """The step file (its number) episode `i` lies in."""
        if not 0 <= i < self.n:
            raise IndexError(f"episode {i} of a table of {self.n}")
        return self.numbers[PLACE * i]


cdef list sorted_leaves(object tree, list out):
    # A StepFile tree's leaf numbers in dm-tree order (dict keys sorted).
    if type(tree) is int:
        out.append(tree)
    elif type(tree) is dict:
        for key in sorted(tree):
            sorted_leaves(tree[key], out)
    else:
        for sub in tree:
            sorted_leaves(sub, out)
    return out


# A null in an infos column: an empty dict (each episode gets its own).
cdef object EMPTY = object()
