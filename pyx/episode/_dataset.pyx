"""Episodes to and from a dataset's step files (see episode/offline/format.py).

Writing: `signature()` tells alike episodes (stored alike, track by track),
and a `GroupRows` gathers the rows of one signature's episodes into one
block per leaf, each episode padded to L + N + 1 rows, by block copies from
their Columns. Reading: a `StepFile` holds a file's leaves as Columns over
its arrays, and `episode()` builds an episode over rows of them (views for
numpy'd episodes, copies for list-mode ones, which grow in place), checked
before it is handed out.
"""
import numpy as np

cimport numpy as cnp
from libc.string cimport memcpy, memset

from episode._buffer cimport BufferCore
from episode._column cimport Column, KIND_EMPTY_DICT, KIND_OBJECT, array_bytes
from episode._episode cimport EpisodeCore, own_extras

from episode._episode import make_episode

cnp.import_array()

# The tracks of a step file, in order, after which come the extra outputs.
# (infos, the fifth lookback, are written apart: not a tree.)
DEF N_TRACKS = 3


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


cdef class Rows:
    """A growable block of fixed-size rows (one leaf of a group)."""
    cdef cnp.ndarray data
    cdef readonly Py_ssize_t size
    cdef Py_ssize_t row_bytes

    def __init__(self, dtype, tuple shape):
        self.data = np.empty((16,) + shape, dtype)
        self.size = 0
        self.row_bytes = self.data.itemsize
        for d in shape:
            self.row_bytes *= d

    cdef char* reserve(self, Py_ssize_t n) except NULL:
        cdef cnp.ndarray grown
        cdef Py_ssize_t cap = self.data.shape[0]
        if self.size + n > cap:
            while cap < self.size + n:
                cap *= 2
            grown = np.empty((cap,) + (<object>self.data).shape[1:], self.data.dtype)
            memcpy(array_bytes(grown, self.size * self.row_bytes),
                   array_bytes(self.data, self.size * self.row_bytes), self.size * self.row_bytes)
            self.data = grown
        return array_bytes(self.data, (self.size + n) * self.row_bytes) + self.size * self.row_bytes

    cdef int zeros(self, Py_ssize_t n) except -1:
        if n > 0:
            memset(self.reserve(n), 0, n * self.row_bytes)
            self.size += n
        return 0

    cdef int copy(self, Column col, Py_ssize_t count) except -1:
        # The column's `count` rows of identical layout (its signature's).
        if count > 0:
            memcpy(self.reserve(count), col.row_ptr(0, count), count * self.row_bytes)
            self.size += count
        return 0

    def array(self):
        """The rows so far (a view)."""
        return self.data[:self.size]


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


cdef class GroupRows:
    """The rows of one signature's episodes, as a step file will hold them:
    per leaf a `Rows` block (stored bytes), a list of items (encoded
    values, None for padding) or None (no data), per row its infos (None:
    an empty dict). `codecs` says which, leaf by leaf in signature order."""
    cdef readonly object signature
    cdef readonly list leaves
    cdef readonly list infos
    cdef list codecs
    cdef readonly Py_ssize_t nrows

    def __init__(self, signature, list codecs, list dtypes, list shapes):
        self.signature = signature
        self.codecs = codecs
        self.leaves = []
        for codec, dtype, shape in zip(codecs, dtypes, shapes):
            if codec == "arrow" or codec == "bytes" or codec == "zero":
                self.leaves.append(Rows(dtype, shape))
            elif codec == "value":
                self.leaves.append([])
            else:
                self.leaves.append(None)
        self.infos = []
        self.nrows = 0

    def add(self, EpisodeCore episode, Py_ssize_t rows, Py_ssize_t last, object encode):
        """Appends the episode's `rows` rows (0, or its largest lookback L +
        its length + 1; `last` = L): each track at rows L - its lookback on,
        zeros around. `encode` turns infos and encoded items into bytes.
        Returns the episode's first row. Nothing of the episode is kept if
        any of it fails (an item `encode` refuses)."""
        cdef Py_ssize_t first = self.nrows
        try:
            self._add(episode, rows, last, encode)
        except BaseException:
            self.truncate(first)
            raise
        self.nrows += rows
        return first

    def truncate(self, Py_ssize_t nrows):
        """Drops the rows from `nrows` on (what add() kept since then)."""
        for leaf in self.leaves:
            if type(leaf) is Rows:
                (<Rows>leaf).size = min((<Rows>leaf).size, nrows)
            elif leaf is not None:
                del (<list>leaf)[nrows:]
        del self.infos[nrows:]
        self.nrows = min(self.nrows, nrows)

    cdef int _add(self, EpisodeCore episode, Py_ssize_t rows, Py_ssize_t last,
                  object encode) except -1:
        cdef Py_ssize_t k = 0, before, count, i
        cdef BufferCore buf
        cdef Column col
        cdef object leaf
        cdef list tracks = [episode.observations, episode.actions, episode.rewards]
        tracks.extend(own_extras(episode).values())
        for buf in tracks:
            count = buf.first().nrows()
            before = last - buf._lookback if count else rows
            if before < 0 or before + count > rows:
                raise ValueError("a track's rows do not fit the episode's (an inconsistent "
                                 "episode)")
            for col in tree_columns(buf._tree, []):
                leaf = self.leaves[k]
                if type(leaf) is Rows:
                    (<Rows>leaf).zeros(before)
                    (<Rows>leaf).copy(col, count)
                    (<Rows>leaf).zeros(rows - before - count)
                elif leaf is not None:
                    (<list>leaf).extend([None] * before)
                    (<list>leaf).extend(column_items(col))
                    (<list>leaf).extend([None] * (rows - before - count))
                k += 1
        buf = episode.infos
        count = buf.len_incl_lookback()
        before = last - buf._lookback if count else rows
        if before < 0 or before + count > rows:
            raise ValueError("the infos do not fit the episode's rows (an inconsistent episode)")
        self.infos.extend([None] * before)
        if buf._col is not None and buf._col.kind == KIND_EMPTY_DICT:
            self.infos.extend([None] * count)
        else:
            for i in range(count):
                item = buf.item_at(i)
                self.infos.append(None if type(item) is dict and not item else encode(item))
        self.infos.extend([None] * (rows - before - count))
        return 0


# -- reading: a step file's episodes -------------------------------------------------------


cdef class Encoded:
    """An Arrow binary column's values by row, without a Python object per
    row until one is read: its offsets, bytes and validity as arrays."""
    cdef cnp.ndarray offsets     # int32, rows + 1
    cdef bytes data
    cdef cnp.ndarray valid       # bool per row, or None: all valid
    cdef object decode

    def __init__(self, column, decode):
        cdef Py_ssize_t n = len(column)
        buffers = column.buffers()
        offsets = np.frombuffer(buffers[1], np.int32)[column.offset:column.offset + n + 1]
        if len(offsets) != n + 1 or (n and (offsets[0] < 0 or np.any(np.diff(offsets) < 0))):
            raise ValueError("malformed binary column offsets")
        self.offsets = np.ascontiguousarray(offsets)
        self.data = buffers[2].to_pybytes() if buffers[2] is not None else b""
        if n and self.offsets[n] > len(self.data):
            raise ValueError("a binary column's offsets run past its data")
        self.valid = None
        if column.null_count:
            self.valid = np.asarray(column.is_valid()).astype(np.bool_)
        self.decode = decode

    cdef object value(self, Py_ssize_t row, object missing):
        # The decoded value at `row` (checked by the caller), `missing` for a null.
        cdef int* offs = <int*>cnp.PyArray_DATA(self.offsets)
        if self.valid is not None and not (<cnp.npy_bool*>cnp.PyArray_DATA(self.valid))[row]:
            return missing
        return self.decode(self.data[offs[row]:offs[row + 1]])


cdef class StepFile:
    """A step file's columns, ready to build episodes over: per leaf a
    finalized Column over the file's rows (read in place; list-mode
    episodes copy theirs), an `Encoded` column, or None (no data)."""
    cdef list leaves        # per leaf: Column, Encoded or None
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
        """`leaves`: per leaf an ndarray of all the file's rows, an Encoded
        column or None; the rest as the file's metadata says (checked by
        the caller)."""
        self.leaves = []
        for arr in leaves:
            self.leaves.append(Column.from_array(arr) if isinstance(arr, np.ndarray) else arr)
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
            return Column.from_rows(count, KIND_EMPTY_DICT)
        if count:
            raise ValueError("a leaf without data holds rows")
        return Column.with_open_row_type() if numpy else Column()

    cdef object track(self, object tree, Py_ssize_t start, Py_ssize_t count):
        if type(tree) is int:
            return self.leaf_rows(tree, start, count)
        if type(tree) is dict:
            return {key: self.track(sub, start, count) for key, sub in (<dict>tree).items()}
        return tuple([self.track(sub, start, count) for sub in tree])

    def episode(self, cls, Py_ssize_t row, Py_ssize_t rows, Py_ssize_t length,
                tuple lookbacks, dict fields):
        """The episode at rows [row, row + rows) (0 rows: not reset), of
        `length` steps, with `lookbacks` (observations, infos, actions,
        rewards, extras) and the other constructor fields in `fields`."""
        cdef Py_ssize_t last = max(lookbacks), i, start, count
        cdef Py_ssize_t lb
        cdef list tracks = []
        cdef Column infos
        if row < 0 or rows < 0 or row > self.nrows - rows or length < 0:
            raise ValueError(f"rows {row}..{row + rows} are not in the file's {self.nrows}")
        if rows and rows != last + length + 1:
            raise ValueError(f"{rows} rows for an episode of {length} steps and lookback "
                             f"{last}")
        for i in range(len(self.trees)):
            lb = lookbacks[0] if i == 0 else lookbacks[2] if i == 1 else \
                lookbacks[3] if i == 2 else lookbacks[4]
            count = (lb + length + (1 if i == 0 else 0)) if rows else 0
            start = row + last - lb
            tracks.append(self.track(self.trees[i], start, count))
        lb = lookbacks[1]
        count = lb + length + 1 if rows else 0
        start = row + last - lb
        if self.infos is None:
            infos = Column.from_rows(count, KIND_EMPTY_DICT)
        else:
            items = [self.infos.value(start + i, EMPTY) for i in range(count)]
            if all(item is EMPTY for item in items):
                infos = Column.from_rows(count, KIND_EMPTY_DICT)
            else:
                infos = Column.__new__(Column)
                infos.kind = KIND_OBJECT
                infos.items = [{} if item is EMPTY else item for item in items]
                infos._refs_changed()
        extras = dict(zip(self.extra_keys, tracks[N_TRACKS:]))
        return make_episode(cls, fields["id_"], tracks[0], infos, tracks[1], tracks[2],
                            extras, lookbacks, fields["terminated"], fields["truncated"],
                            fields["t_started"], fields["observation_space"],
                            fields["action_space"], fields["agent_id"], fields["module_id"],
                            fields["multi_agent_episode_id"], fields["start_time"],
                            fields["last_step_time"], fields["custom_data"],
                            self.extras_default, fields["last_added"])


# A null in an infos column: an empty dict (each episode gets its own).
cdef object EMPTY = object()
