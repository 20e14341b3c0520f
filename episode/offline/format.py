"""The native dataset format: what its files hold and how values are encoded.

A dataset is a folder. Each write of an `EpisodeWriter` (a *part*) adds

- one step file per group of alike episodes, ``<part>.steps-<g>.<ext>``:
  one row per timestep of each episode, its episodes' rows one after the
  other. A group is the episodes whose tracks are stored alike (the same
  structure, dtypes, row shapes and item kinds), so one file has one schema;
- then the part's episode table, ``<part>.episodes.<ext>``: one row per
  episode chunk (where its rows are, its id, agent and module ids, start,
  length, lookbacks, done flags, spaces, times, custom data). It is written
  last and is what makes the part exist: a step file without it is ignored.

`<ext>` is ``parquet`` or ``arrow`` (Arrow IPC files, read memory-mapped).
A step file's rows may come in several record batches: the writer makes an
image episode's rows a batch of their own (compressed from the episode's
memory, not copied first). A reader reads rows within a batch in place and
joins those across batches.

An episode chunk of N steps whose tracks keep `lb` rows of lookback has
L + N + 1 rows, L the largest lookback: row r is time r - L. Observations and
infos fill rows L - lb .. L + N; actions, rewards and extra model outputs
rows L - lb .. L + N - 1; the rows a track does not fill are zeros (nulls for
encoded values). So each observation is stored once, and a row holds the
observation, the action taken on it, its reward and outputs, and the info
that came with the observation. ``terminateds``/``truncateds`` are true on a
done episode's last step (the row RLlib's row format marks).

Columns: ``obs``, ``actions``, ``rewards`` and each extra model output by
its key; a Dict or Tuple track is a struct column of its leaves. A numeric
leaf is an Arrow number column (a fixed-shape tensor column for rows with a
shape), but rows of `WIDE_ROW_BYTES` or more (images) and other fixed-size
dtypes are fixed-size binary, a row's bytes one value; anything else (the
object path: strings, ragged rows, Python objects) and ``infos`` are
msgpack-encoded values (`pack_value`), an info only where a step has one.
Each file's schema metadata (key ``episode.format``) is JSON: the format
version and, for a step file, each track's tree of leaves with the kind of
item each leaf hands back (so list-mode episodes come back with the very
Python types they were written with).

Damage is detected before anything is built from a file. An episode table
lists, beside each of its step files, the step file's size and the CRC-32
of its every byte (``step_checksums``): the step files are written first, so
their checksums are known when the table is, and a step file cannot hold
its own checksum without being written twice. The episode table checks
itself: in Parquet by page checksums (``write_page_checksum``), in an Arrow
file by the CRC-32 of its record batch and dictionary messages, header and
body (``batches_crc32``: everything after the schema, which holds it).
Parquet step files carry page checksums too, so other Parquet readers can
check them.
"""
from __future__ import annotations

import base64
import json
import zlib
from typing import Any, Optional

import numpy as np

from episode import values

FORMAT = "episode"
VERSION = 1
METADATA_KEY = b"episode.format"
EXTENSIONS = ("parquet", "arrow")

# The step table's columns that are not tracks.
INFOS, TERMINATEDS, TRUNCATEDS = "infos", "terminateds", "truncateds"
TRACKS = ("obs", "actions", "rewards")
RESERVED = frozenset(TRACKS + (INFOS, TERMINATEDS, TRUNCATEDS))

# How a leaf's rows are stored: Arrow numbers, fixed-size binary, encoded
# values, nothing (no rows ever, or only empty dicts) or rows of zero bytes
# (nothing to store but their dtype and shape).
ARROW, BYTES, VALUE, NONE, ZERO = "arrow", "bytes", "value", "none", "zero"
STORED = (ARROW, BYTES, ZERO)

_ARROW_KINDS = "biuf"


class DatasetError(ValueError):
    """A file that is not what the format says: a foreign, damaged or newer
    file, a missing or mistyped column. The message names the file."""


# -- values (infos, ids, custom data, object-path items) ---------------------------------

def pack_value(obj: Any) -> bytes:
    """`obj` as msgpack bytes that `unpack_value` turns back into an equal
    object of the same types (tuples, sets, numpy arrays and scalars, ints
    of any size included; episode.values). TypeError for anything else."""
    return values.pack(obj)


def unpack_value(blob: bytes) -> Any:
    """The object `pack_value` stored (ValueError for bytes that are not one)."""
    return values.unpack(blob)


def unpack_values(blobs: list) -> list:
    """unpack_value of each blob (None: None), at once (ValueError if any
    is not one value)."""
    return values.unpack_each(blobs)


# -- leaves: how a Column's rows become an Arrow column and back --------------------------


def dtype_text(dtype: np.dtype) -> Any:
    """A dtype as JSON (numpy's .npy header form: structured dtypes too)."""
    return np.lib.format.dtype_to_descr(dtype)


def leaf_dtype(leaf: dict) -> Optional[np.dtype]:
    """A leaf's dtype (None: it stores no bytes)."""
    return None if leaf["dtype"] is None else np.lib.format.descr_to_dtype(_descr(leaf["dtype"]))


def _descr(text: Any) -> Any:
    # dtype_text's form after JSON, which turned its tuples into lists.
    if isinstance(text, str):
        return text
    if not isinstance(text, list):
        raise TypeError(f"not a dtype: {text!r:.80}")
    return [tuple([field[0], _descr(field[1])] + [tuple(field[2])] * (len(field) > 2))
            for field in text]


# Rows of this many bytes or more (images) are stored as one fixed-size
# binary value each: Parquet writes a tensor column's every number as a
# nested value with its own repetition and definition levels, 30-100x slower
# to write and read for an 84x84 frame than one value of its bytes.
WIDE_ROW_BYTES = 256


def leaf_codec(dtype: Optional[np.dtype], shape: tuple) -> str:
    """How rows of `dtype` and row `shape` are stored (None: no rows ever)."""
    if dtype is None:
        return NONE
    if dtype.hasobject:
        return VALUE
    size = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    if dtype.kind in _ARROW_KINDS and dtype.isnative and dtype.itemsize in (1, 2, 4, 8) \
            and (dtype.kind != "f" or dtype.itemsize >= 2) and 0 < size < WIDE_ROW_BYTES:
        return ARROW
    return BYTES if size > 0 else ZERO


def arrow_type(leaf: dict):
    """The Arrow type of a leaf's column."""
    import pyarrow as pa

    codec, shape = leaf["codec"], tuple(leaf["shape"])
    if codec in (NONE, ZERO):
        return pa.null()
    if codec == VALUE:
        return pa.binary()
    dtype = leaf_dtype(leaf)
    if codec == BYTES:
        return pa.binary(dtype.itemsize * int(np.prod(shape, dtype=np.int64)))
    value_type = pa.from_numpy_dtype(dtype)
    return pa.fixed_shape_tensor(value_type, list(shape)) if shape else value_type


def leaf_array(leaf: dict, rows: Any, nrows: int):
    """An Arrow array of a leaf's `nrows` rows: an ndarray for stored bytes
    (no copy for numbers), a list of values (None: padding) to encode."""
    import pyarrow as pa

    codec = leaf["codec"]
    if codec in (NONE, ZERO):
        return pa.nulls(nrows)
    if codec == VALUE:
        return binaries([None if v is None else pack_value(v) for v in rows])
    if codec == BYTES:
        flat = np.ascontiguousarray(rows).view(np.uint8).reshape(nrows, -1)
        return pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(flat.shape[1]), nrows, [None, pa.py_buffer(flat)])
    if leaf["shape"]:
        values = numbers(np.ascontiguousarray(rows).reshape(-1))
        storage = pa.FixedSizeListArray.from_arrays(values, int(np.prod(leaf["shape"])))
        return pa.ExtensionArray.from_storage(arrow_type(leaf), storage)
    return numbers(rows)


def binaries(values: list, type_=None):
    """An Arrow binary (or string) array of `values` (bytes or str, None:
    null), built from its buffers: pyarrow's general conversion imports
    pandas, seconds of a recording's first write. All nulls: a null-typed
    column (it stores nothing)."""
    import pyarrow as pa

    type_ = pa.binary() if type_ is None else type_
    if type_ == pa.binary() and values.count(None) == len(values):
        return pa.nulls(len(values))     # (no offsets to store: a column of nothing)
    valid = np.fromiter((v is not None for v in values), np.bool_, len(values))
    data = [v.encode() if isinstance(v, str) else v for v in values if v is not None]
    lengths = np.zeros(len(values), np.int64)
    lengths[valid] = [len(v) for v in data]
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 1 << 31:
        raise ValueError("more than 2 GiB of encoded values in one column; write smaller parts "
                         "(rows_per_file)")
    bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(type_, len(values), [
        bitmap, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(data))])


def numbers(values: np.ndarray):
    """A 1-d array of numbers or bools as an Arrow array over its memory
    (bools packed to bits), without pyarrow's general conversion (which
    imports pandas)."""
    import pyarrow as pa

    values = np.ascontiguousarray(values)
    if values.dtype == np.bool_:
        data = np.packbits(values, bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(data)])
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values),
                                 [None, pa.py_buffer(values)])


def leaf_rows(leaf: dict, column, where: str) -> Any:
    """A leaf column's rows back: an ndarray (read-only, no copy where the
    file's memory allows), or for encoded values the Arrow binary array
    itself (decoded per episode). A column of several chunks (stored bytes
    only) comes back as a list of its chunks' rows."""
    import pyarrow as pa

    codec = leaf["codec"]
    n = len(column)
    if codec in (NONE, ZERO):
        if column.type != pa.null():
            raise DatasetError(f"{where}: expected an all-null column, got {column.type}")
        return None if codec == NONE else np.empty((n,) + tuple(leaf["shape"]),
                                                   leaf_dtype(leaf))
    if codec == VALUE:
        if column.type == pa.null():
            column = pa.array([None] * n, pa.binary()) if n else pa.array([], pa.binary())
        if column.type != pa.binary():
            raise DatasetError(f"{where}: expected a binary column, got {column.type}")
        return column
    want = arrow_type(leaf)
    got = column.type
    if got != want and not (codec == ARROW and leaf["shape"] and isinstance(
            got, pa.FixedSizeListType) and got == want.storage_type):
        raise DatasetError(f"{where}: expected {want}, got {got}")
    if column.null_count:
        raise DatasetError(f"{where}: a column of numbers holds nulls")
    dtype, shape = leaf_dtype(leaf), tuple(leaf["shape"])
    if isinstance(column, pa.ChunkedArray):
        return [_stored_rows(chunk, codec, dtype, shape, where) for chunk in column.chunks]
    return _stored_rows(column, codec, dtype, shape, where)


def _stored_rows(column, codec: str, dtype: np.dtype, shape: tuple, where: str) -> Any:
    # leaf_rows() of an array of stored bytes, of the leaf's checked type.
    import pyarrow as pa

    n = len(column)
    if codec == BYTES:
        width = column.type.byte_width
        raw = np.frombuffer(column.buffers()[1], np.uint8)
        start = column.offset * width
        return raw[start:start + n * width].view(dtype).reshape((n,) + shape)
    if shape:
        storage = column.storage if isinstance(column, pa.ExtensionArray) else column
        size = storage.type.list_size       # (flatten() imports pyarrow.compute: 25 ms)
        values = storage.values.slice(storage.offset * size, n * size)
        return array_numbers(values, dtype, where).reshape((n,) + shape)
    return array_numbers(column, dtype, where)


def array_numbers(array, dtype: np.dtype, where: str) -> np.ndarray:
    """A fixed-width Arrow array without nulls as an ndarray of `dtype`: a
    read-only view of its data buffer (bools unpacked from their bits).
    Read from the buffers, as pyarrow's to_numpy() imports pandas (0.2 s,
    on the first read of a process)."""
    n, offset = len(array), array.offset
    data = array.buffers()[1]
    size = 0 if data is None else data.size
    if not n:
        out = np.empty(0, dtype)
    elif dtype.kind == "b":
        if size * 8 < offset + n:
            raise DatasetError(f"{where}: a column of {n} bools holds {size} bytes")
        bits = np.frombuffer(data, np.uint8)
        out = np.unpackbits(bits, count=offset + n, bitorder="little")[offset:].view(np.bool_)
    elif array.type.bit_width != 8 * dtype.itemsize or size < (offset + n) * dtype.itemsize:
        raise DatasetError(f"{where}: a column of {n} {dtype} numbers holds {size} bytes "
                           f"of {array.type}")
    else:
        out = np.frombuffer(data, dtype, count=n, offset=offset * dtype.itemsize)
    out.flags.writeable = False     # (a memory map's pages may be read-only)
    return out


# -- trees: a track's structure of leaves ---------------------------------------------


def key_to_json(key: Any) -> list:
    """A dict key (a track's or an extra output's) as JSON."""
    if type(key) is str:
        return ["s", key]
    return ["v", base64.b64encode(pack_value(key)).decode("ascii")]


def key_from_json(item: Any, where: str) -> Any:
    """key_to_json's key back (DatasetError for a malformed one)."""
    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], str)):
        raise DatasetError(f"{where}: a malformed key in the metadata")
    if item[0] == "s":
        return item[1]
    try:
        return unpack_value(base64.b64decode(item[1]))
    except (ValueError, TypeError) as error:
        raise DatasetError(f"{where}: a malformed key in the metadata ({error})") from None


def tree_to_json(tree: Any) -> Any:
    """A track's tree of leaves (dict/tuple nesting, leaf dicts) as JSON."""
    if isinstance(tree, dict) and "codec" in tree:
        return {"leaf": tree}
    if isinstance(tree, tuple) and tree and tree[0] == "dict":
        return {"dict": [[key_to_json(k), tree_to_json(v)] for k, v in tree[1]]}
    return {"tuple": [tree_to_json(v) for v in tree[1]]}


def tree_from_json(obj: Any, where: str) -> Any:
    """tree_to_json's JSON back, checked: ("dict", ((key, sub), ...)),
    ("tuple", (sub, ...)) or a leaf dict."""
    if not isinstance(obj, dict) or len(obj) != 1:
        raise DatasetError(f"{where}: malformed track metadata")
    (kind, body), = obj.items()
    if kind == "leaf":
        return _checked_leaf(body, where)
    if kind == "dict" and isinstance(body, list):
        return ("dict", tuple((key_from_json(pair[0], where), tree_from_json(pair[1], where))
                              for pair in body if _is_pair(pair, where)))
    if kind == "tuple" and isinstance(body, list):
        return ("tuple", tuple(tree_from_json(sub, where) for sub in body))
    raise DatasetError(f"{where}: malformed track metadata")


def _is_pair(pair: Any, where: str) -> bool:
    if not (isinstance(pair, list) and len(pair) == 2):
        raise DatasetError(f"{where}: malformed track metadata")
    return True


def _checked_leaf(leaf: Any, where: str) -> dict:
    if not (isinstance(leaf, dict) and leaf.get("codec") in (ARROW, BYTES, VALUE, NONE, ZERO)
            and type(leaf.get("kind")) is int and type(leaf.get("finalized")) is bool
            and type(leaf.get("open")) is bool and isinstance(leaf.get("shape"), list)
            and all(type(d) is int and d >= 0 for d in leaf["shape"])
            and len(leaf["shape"]) <= 64):
        raise DatasetError(f"{where}: malformed leaf metadata {leaf!r:.200}")
    if leaf["codec"] in STORED:
        try:
            dtype = leaf_dtype(leaf)
        except (TypeError, ValueError, IndexError, KeyError):
            raise DatasetError(f"{where}: a leaf of unknown dtype {leaf.get('dtype')!r:.80}") \
                from None
        if dtype.hasobject or leaf_codec(dtype, tuple(leaf["shape"])) != leaf["codec"]:
            raise DatasetError(f"{where}: a leaf of dtype {dtype} cannot be stored as "
                               f"{leaf['codec']}")
    return leaf


def tree_leaves(tree: Any) -> list:
    """A tree's leaf dicts, depth first in its order."""
    if isinstance(tree, dict):
        return [tree]
    return [leaf for sub in tree[1] for leaf in tree_leaves(sub[1] if tree[0] == "dict" else sub)]


# -- checksums ------------------------------------------------------------------------------

# What pyarrow's Parquet writer and reader are given: every page (data and
# dictionary) carries the CRC-32 of its bytes, checked as it is decoded.
PARQUET_WRITE = {"write_page_checksum": True}

_READ_CHUNK = 1 << 20


def file_checksum(path: str) -> list:
    """[size, CRC-32] of a file's every byte, read in chunks (not mapped, so
    that the pages read are not held in the process's resident memory)."""
    crc = size = 0
    chunk = bytearray(_READ_CHUNK)
    view = memoryview(chunk)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(chunk)
            if not n:
                return [size, crc]
            crc = zlib.crc32(view[:n], crc)
            size += n


def arrow_batches_crc(buffer) -> int:
    """The CRC-32 of an Arrow IPC file's messages after its schema (record
    batches and dictionaries, each message's header and body), walked by
    pyarrow's message reader over `buffer` (the file's bytes, mapped). The
    messages do not depend on where they lie in the file, so the CRC is
    computed before the file is written, and then kept in its schema."""
    import pyarrow as pa

    stream = pa.BufferReader(buffer)
    stream.seek(8)            # the file's magic and its padding
    crc = 0
    for message in pa.ipc.MessageReader.open_stream(stream):
        if message.type != "schema":
            crc = zlib.crc32(message.body, zlib.crc32(message.metadata, crc))
    return crc


def read_table(path: str, columns: Optional[list] = None, *, verify: bool = False):
    """A data file's table (`columns` of it; a .arrow file memory-mapped),
    checked whole by Arrow before any of it is used, and with `verify` a
    Parquet file's page checksums too: DatasetError naming the file for a
    damaged or foreign one."""
    import pyarrow as pa

    try:
        if path.endswith(".arrow"):
            source = pa.memory_map(path)
            reader = pa.ipc.open_file(source)
            if reader.num_record_batches > 1:
                # Arrow inflates a batch's buffers on its pool: a cost per
                # batch that a file of a batch per image episode pays more
                # than it gains (Pong screens, 3 files: 0.119 s instead of
                # 0.097 on one thread).
                reader = pa.ipc.open_file(source, options=pa.ipc.IpcReadOptions(
                    use_threads=False))
            table = reader.read_all()
            if columns is not None:
                table = table.select(columns)
        else:
            import pyarrow.parquet as pq

            # (ParquetFile, not read_table(), which imports pyarrow.dataset
            # and with it pandas: 0.2 s on a process's first read.)
            with pq.ParquetFile(path, memory_map=True,
                                page_checksum_verification=verify) as file:
                missing = set(columns or ()) - set(file.schema_arrow.names)
                if missing:
                    raise KeyError(f"no column {sorted(missing)[0]!r}")
                table = file.read(columns=columns)
        table.validate(full=True)
        return table
    except (OSError, pa.ArrowException, KeyError) as error:
        raise DatasetError(f"{path}: {_damage(error)}not a readable "
                           f"{path.rpartition('.')[2]} file ({error})") from None


def _damage(error: BaseException) -> str:
    return "damaged, " if "checksum" in str(error).lower() else ""


def read_episode_table(path: str, *, verify: bool) -> tuple:
    """(table, metadata) of an episode table, with `verify` checked against
    its own checksums (see the module's docstring) before it is used."""
    import pyarrow as pa

    if not (verify and path.endswith(".arrow")):
        table = read_table(path, verify=verify)
        meta = read_metadata(table.schema, path, "episodes")
        if verify:
            _has_checksums(meta, path)
        return table, meta
    # An Arrow file's CRC-32 is checked on its messages as stored, before
    # anything is decoded (a damaged compressed buffer would fail to inflate).
    try:
        buffer = pa.memory_map(path).read_buffer()
        meta = read_metadata(pa.ipc.open_file(buffer).schema, path, "episodes")
        _has_checksums(meta, path)
        crc = arrow_batches_crc(buffer)
    except (OSError, pa.ArrowException) as error:
        raise DatasetError(f"{path}: not a readable arrow file ({error})") from None
    if crc != meta.get("batches_crc32"):
        raise DatasetError(f"{path}: damaged: the CRC-32 of its contents ({crc:08x}) is "
                           f"not the one written with it")
    return read_table(path, verify=verify), meta


def _has_checksums(meta: dict, path: str) -> None:
    if not isinstance(meta.get("step_checksums"), list):
        raise DatasetError(f"{path}: holds no checksums (written by an earlier version of "
                           f"episode): read_episodes(..., verify=False) reads it unchecked")


def check_file(path: str, want: Any, table_path: str) -> None:
    """DatasetError unless the step file `path` has the [size, CRC-32]
    `want` its episode table `table_path` recorded."""
    if not (isinstance(want, list) and len(want) == 2
            and all(type(x) is int and x >= 0 for x in want)):
        raise DatasetError(f"{table_path}: a malformed checksum for {path}")
    try:
        size, crc = file_checksum(path)
    except OSError as error:
        raise DatasetError(f"{path}: cannot read it ({error.strerror or error})") from None
    if size != want[0]:
        raise DatasetError(f"{path}: damaged: {size:,} bytes, where its episode table "
                           f"{table_path} recorded {want[0]:,} (cut short or replaced?)")
    if crc != want[1]:
        raise DatasetError(f"{path}: damaged: its CRC-32 ({crc:08x}) is not the one its "
                           f"episode table {table_path} recorded ({want[1]:08x})")


# -- metadata ------------------------------------------------------------------------------


def metadata(kind: str, **fields: Any) -> dict:
    """A file's schema metadata."""
    body = {"format": FORMAT, "version": VERSION, "kind": kind, **fields}
    return {METADATA_KEY: json.dumps(body, separators=(",", ":")).encode()}


def read_metadata(schema, where: str, kind: str) -> dict:
    """A file's format metadata, checked: DatasetError for a file of another
    tool, of another kind, or of a newer format version."""
    raw = (schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise DatasetError(f"{where}: not a file of an episode dataset (no "
                           f"{METADATA_KEY.decode()} metadata)")
    try:
        body = json.loads(raw)
    except ValueError:
        raise DatasetError(f"{where}: its {METADATA_KEY.decode()} metadata is not JSON") \
            from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise DatasetError(f"{where}: not a file of an episode dataset")
    version = body.get("version")
    if type(version) is not int or version > VERSION or version < 1:
        raise DatasetError(f"{where}: format version {version!r}; this version of episode "
                           f"reads versions 1 to {VERSION}")
    if body.get("kind") != kind:
        raise DatasetError(f"{where}: a {body.get('kind')!r} file where a {kind!r} file was "
                           f"expected")
    return body


# The texts of the spaces met last (episodes of one env share their space
# objects): id -> (the space, its text), the space kept so its id stays its.
_SPACE_TEXTS: dict = {}


def space_text(space: Any) -> Optional[str]:
    """A space as the JSON text of its RLlib dict (None: no space)."""
    from episode.spaces import space_to_dict

    if space is None:
        return None
    known = _SPACE_TEXTS.get(id(space))
    if known is not None and known[0] is space:
        return known[1]
    text = json.dumps(space_to_dict(space), separators=(",", ":"))
    if len(_SPACE_TEXTS) >= 64:
        _SPACE_TEXTS.clear()
    _SPACE_TEXTS[id(space)] = (space, text)
    return text


def space_of(text: Optional[str], where: str) -> Any:
    """space_text's space back (DatasetError for a malformed one)."""
    from episode.spaces import space_from_dict

    if text is None:
        return None
    try:
        return space_from_dict(json.loads(text))
    except Exception as error:     # whatever a malformed description makes the constructors raise
        raise DatasetError(f"{where}: a malformed space ({type(error).__name__}: "
                           f"{error})") from None


# -- multi-agent episodes: what their agents' rows do not hold -----------------------------

def multi_state(episode) -> bytes:
    """A MultiAgentEpisode's own fields (not its agents' episodes) as bytes
    (MultiAgentEpisode._data_state, its spaces as text)."""
    state = episode._data_state()
    state["spaces"] = [_multi_space(space) for space in state["spaces"]]
    return pack_value(state)


def _multi_space(space: Any) -> Any:
    if isinstance(space, dict):
        return {agent_id: space_text(s) for agent_id, s in space.items()}
    return space_text(space)


def multi_episode(id_: Any, blob: bytes, agent_episodes: dict, where: str):
    """multi_state's episode back, with id `id_`, over its agents' episodes
    (read from their rows): checked as MultiAgentEpisode.from_state checks
    a state (DatasetError)."""
    from episode.multi_agent_episode import MultiAgentEpisode

    try:
        state = unpack_value(blob)
        if not isinstance(state, dict) or not isinstance(state.get("spaces"), list) or \
                len(state["spaces"]) != 2:
            raise ValueError("not a dict of its fields")
        state["spaces"] = [_multi_space_of(s, where) for s in state["spaces"]]
        return MultiAgentEpisode._from_data_state(id_, state, agent_episodes)
    except (ValueError, TypeError, KeyError, AttributeError, AssertionError) as error:
        raise DatasetError(f"{where}: a malformed multi-agent episode ({type(error).__name__}: "
                           f"{error})") from None


def _multi_space_of(value: Any, where: str) -> Any:
    if isinstance(value, dict):
        return {agent_id: space_of(text, where) for agent_id, text in value.items()}
    return space_of(value, where) if value is not None else None
