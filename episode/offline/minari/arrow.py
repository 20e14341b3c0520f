"""Minari's Arrow and Parquet backends: a dataset's per-episode folders
read into episodes (`_ArrowReader`) and written (`_write_arrow`)."""
from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any, Iterable, List, Optional, Tuple

import gymnasium as gym
import numpy as np

from episode.offline.minari.layout import _EXTRAS, _METADATA, _Metadata
from episode.offline.minari.libraries import _parquet, _pyarrow
from episode.offline.minari.pictures import _decode_images, _encode_images
from episode.offline.minari.rows import (_MAPPED_BYTES, _build, _check_numeric, _Damaged,
                                         _flag, _info_column, _texts)
from episode.offline.minari.spaces import _kinds, _Leaf, _leaves
from episode.single_agent_episode import SingleAgentEpisode


_IGNORED = ("_", ".", _METADATA)   # names Minari's Arrow reader skips in a folder


class _ArrowReader:
    """Episodes from the per-episode folders of an Arrow or Parquet dataset,
    through pyarrow: each file opened once and checked (full validation)
    before anything is built from it.

    An Arrow file is read from a memory map (its columns are views of the
    file's pages), or, when small, from its bytes read in one call (a read
    costs less than a map there). Episodes of one schema whose leaves are
    all numbers are joined, a few megabytes at a time, into one batch whose
    columns are checked and converted once and handed out as per-episode
    views; anything else (pictures, strings, nulls, schemas that differ, a
    check that fails on the joined batch, a mapped file) is built one
    episode at a time, from its own file's buffers."""

    def __init__(self, data_path: pathlib.Path, meta: _Metadata):
        self.pa = pa = _pyarrow()
        self.parquet = _parquet() if meta.format == "parquet" else None
        self.meta = meta
        self.root = str(data_path)
        self.file = data_path
        types = pa.types
        self.is_struct, self.is_fixed_size_list = types.is_struct, types.is_fixed_size_list
        self.numeric_types = (types.is_integer, types.is_floating)
        self.is_boolean = types.is_boolean
        self.index: Optional[int] = None
        self.bytes_read = 0
        self.joinable = all(leaf.kind == "numeric"
                            for leaf in meta.obs_leaves + meta.action_leaves)

    def close(self) -> None:
        """Nothing to close: each episode's files are closed once read (a
        mapped file stays mapped while its episode's arrays view it)."""

    def _listing(self, i: int) -> Tuple[str, List[str]]:
        """Episode i's folder and the names of its data files, in order."""
        folder = os.path.join(self.root, str(i))
        self.file = folder
        try:
            names = sorted(n for n in os.listdir(folder) if not n.startswith(_IGNORED))
        except (FileNotFoundError, NotADirectoryError):
            raise _Damaged(f"the episode is missing (no folder {i})") from None
        if not names:
            raise _Damaged("its folder holds no data file")
        return folder, names

    def _source(self, folder: str, name: str) -> Tuple[Any, bool]:
        """(a pyarrow buffer or memory map of the file, whether it is mapped)."""
        path = os.path.join(folder, name)
        self.file = path
        try:
            fd = os.open(path, os.O_RDONLY)
        except IsADirectoryError:
            raise _Damaged(f"a folder inside its folder ({name})") from None
        try:
            size = os.fstat(fd).st_size
            if size >= _MAPPED_BYTES and self.parquet is None:
                mapped = True
            else:
                mapped = False
                data = _read_all(fd, size)
        finally:
            os.close(fd)
        if mapped:
            try:
                return self.pa.memory_map(path), True
            except (OSError, self.pa.ArrowException) as exc:
                raise _Damaged(f"not a readable {self.meta.format} file ({exc})") from None
        self.bytes_read += len(data)
        return self.pa.py_buffer(data), False

    def _batch(self, folder: str, names: List[str]) -> Tuple[Any, bool]:
        """(the record batch of an episode's files, whether it views a
        mapped file)."""
        pa = self.pa
        batches = []
        mapped = False
        for name in names:
            source, in_map = self._source(folder, name)
            mapped |= in_map
            try:
                if self.parquet is not None:
                    batches += self.parquet.read_table(pa.BufferReader(source)).to_batches()
                else:
                    reader = pa.ipc.open_file(source)
                    batches += [reader.get_batch(k) for k in range(reader.num_record_batches)]
                for batch in batches:
                    batch.validate(full=True)
            except (pa.ArrowException, OSError) as exc:
                raise _Damaged(f"not a readable {self.meta.format} file ({exc})") \
                    from None
        if len(batches) == 1:
            return batches[0], mapped
        try:
            return pa.Table.from_batches(batches).combine_chunks().to_batches()[0], False
        except (pa.ArrowException, IndexError) as exc:
            raise _Damaged(f"its files hold no rows, or no common schema ({exc})") \
                from None

    def episodes(self, indices: List[int]) -> Iterable[SingleAgentEpisode]:
        """The episodes at `indices`, in order (self.index and self.file
        name the one being read)."""
        pending: list = []
        self.bytes_read = 0
        for i in indices:
            self.index = i
            try:
                batch, mapped = self._batch(*self._listing(i))   # leaves self.file at its file
            except _Damaged:
                # The episodes before this one are built first: the error
                # raised is that of the first damaged episode in order.
                file = self.file
                yield from self._chunk(pending)
                self.index, self.file = i, file
                raise
            if mapped:
                # Built alone, over the map (joining would copy it).
                file = self.file
                yield from self._chunk(pending)
                pending = []
                self.bytes_read = 0
                self.index, self.file = i, file
                yield self._from_batch(i, batch)
                continue
            pending.append((i, self.file, batch))
            if self.bytes_read >= _JOINED_BYTES:
                yield from self._chunk(pending)
                pending = []
                self.bytes_read = 0
        yield from self._chunk(pending)

    def _chunk(self, pending: list) -> Iterable[SingleAgentEpisode]:
        joined = self._joined([batch for _, _, batch in pending]) \
            if len(pending) > 1 and self.joinable else None
        if joined is None:
            for i, file, batch in pending:
                self.index, self.file = i, file
                yield self._from_batch(i, batch)
            return
        rewards, terminations, truncations, obs, actions, infos, extras = joined
        meta = self.meta
        start = 0
        for i, file, batch in pending:
            self.index, self.file = i, file
            rows = batch.num_rows
            stop = start + rows
            terminated = _flag(terminations[start:stop - 1], "terminations")
            truncated = _flag(truncations[start:stop - 1], "truncations")
            id_ = self._id(batch.schema.metadata)
            yield _build(i, id_, {p: a[start:stop] for p, a in obs.items()},
                         {p: a[start:stop - 1] for p, a in actions.items()},
                         rewards[start:stop - 1], terminated, truncated,
                         _info_column(_rows_of(infos, start, stop), rows, "infos"),
                         {k: v[start:stop - 1] for k, v in extras.items()}, meta)
            start = stop

    def _joined(self, batches: list) -> Optional[tuple]:
        """The tracks of `batches` (of one schema, each file checked) as
        arrays over all their rows, or None where they must be read one by
        one: the checks on the joined batch are those of one episode's, so
        a failure is left for the episode-by-episode path to name."""
        pa = self.pa
        # The fields' metadata must agree too (an info's row shape): the
        # joined batch has one schema. Each file's own metadata (its id_)
        # is read from its own batch.
        schema = batches[0].schema.remove_metadata()
        for batch in batches:
            if batch.num_rows == 0 or not batch.schema.remove_metadata().equals(
                    schema, check_metadata=True):
                return None
        try:
            table = pa.Table.from_batches(batches, schema)
            (batch,) = table.combine_chunks().to_batches()
            columns = self._columns(batch)
            rows = batch.num_rows
            rewards = self._vector(batch, "rewards", None, "biuf", "rewards")
            terminations = self._vector(batch, "terminations", None, "biu", "terminations")
            truncations = self._vector(batch, "truncations", None, "biu", "truncations")
            obs = {leaf.path: self._leaf(columns["observations"], leaf, rows,
                                         leaf.labels["observations"])
                   for leaf in self.meta.obs_leaves}
            actions = {leaf.path: self._leaf(columns["actions"], leaf, rows,
                                             leaf.labels["actions"])
                       for leaf in self.meta.action_leaves}
            infos = (None if columns["infos"] is None
                     else self._tree(columns["infos"], "infos", exact=True))
            extras = self._extras(columns[_EXTRAS], None)
        except (_Damaged, pa.ArrowException, ValueError):
            return None
        return rewards, terminations, truncations, obs, actions, infos, extras

    def _columns(self, batch) -> dict:
        schema = batch.schema
        columns = {}
        for name in ("observations", "actions", "infos", _EXTRAS):
            index = schema.get_field_index(name)
            columns[name] = batch.column(index) if index >= 0 else None
        if columns["observations"] is None or columns["actions"] is None:
            raise _Damaged(f"no {'observations' if columns['observations'] is None else 'actions'} column")
        return columns

    def _extras(self, column, n: Optional[int]) -> dict:
        extras: dict = {}
        if column is not None:
            what = _EXTRAS
            for key, value in self._tree(column, what).items():
                if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
                    raise _Damaged(f"{what}[{key!r}] is not rows of numbers")
                extras[key] = value if n is None else value[:n]
        return extras

    @staticmethod
    def _id(metadata: Optional[dict]) -> Optional[str]:
        id_ = (metadata or {}).get(b"id_")
        if id_ is not None:
            try:
                id_ = id_.decode("utf-8")
            except UnicodeDecodeError:
                raise _Damaged("its id_ is not UTF-8") from None
        return id_

    def _numbers(self, array, what: str) -> np.ndarray:
        t = array.type
        if self.is_boolean(t):
            return array.to_numpy(zero_copy_only=False)    # bits become bytes
        if self.numeric_types[0](t) or self.numeric_types[1](t):
            return array.to_numpy(zero_copy_only=True)     # adopted in place
        raise _Damaged(f"{what} is {t}, not numbers")

    def _rows(self, array, what: str, shape: Optional[tuple] = None) -> np.ndarray:
        """A numeric column as an array: one value per row, or rows of
        `shape` from a fixed-size list (`shape` None: one dimension, its
        list size)."""
        if array.null_count:
            raise _Damaged(f"{what} holds nulls")
        if not self.is_fixed_size_list(array.type):
            if shape:
                raise _Damaged(f"{what} is {array.type}, not rows of {shape}")
            return self._numbers(array, what)
        size = array.type.list_size
        if shape is None:
            shape = (size,)
        if math.prod(shape) != size:
            raise _Damaged(f"{what} has {size} values per row, not {shape}")
        values = array.values              # the whole child: the list's offset is ours
        if values.null_count:
            raise _Damaged(f"{what} holds nulls")
        start = array.offset * size
        flat = self._numbers(values, what)[start:start + len(array) * size]
        if len(flat) != len(array) * size:
            raise _Damaged(f"{what} holds fewer values than its rows")
        return flat.reshape((len(array),) + shape)

    def _leaf(self, array, leaf: _Leaf, rows: int, what: str) -> Any:
        for name in leaf.names:
            t = array.type
            index = t.get_field_index(name) if self.is_struct(t) else -1
            if index < 0:
                raise _Damaged(f"{what}: no field {name!r} in {t}")
            if array.null_count:
                raise _Damaged(f"{what} holds nulls")
            array = array.field(index)
        if leaf.kind == "numeric":
            arr = self._rows(array, what, leaf.shape)
            return _check_numeric(arr[:rows], rows, leaf.shape, leaf.dtype_kinds, what)
        pa = self.pa
        t = array.type
        if leaf.kind == "text":
            if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
                raise _Damaged(f"{what} is {t}, not strings")
            values = array.to_pylist()[:rows]
            if None in values:
                raise _Damaged(f"{what} holds nulls")
            return _texts(values, rows, what)
        if not (pa.types.is_binary(t) or pa.types.is_large_binary(t)) or array.null_count:
            raise _Damaged(f"{what} is {t}, not pictures")
        return _decode_images(array.to_pylist()[:rows], leaf, rows, what)

    def _vector(self, batch, name: str, rows: Optional[int], kinds: str,
                what: str) -> np.ndarray:
        index = batch.schema.get_field_index(name)
        if index < 0:
            raise _Damaged(f"{what} is missing")
        arr = self._rows(batch.column(index), what, ())
        if arr.dtype.kind not in kinds:
            raise _Damaged(f"{what} holds {arr.dtype} data, not {_kinds(kinds)}")
        return arr if rows is None else arr[:rows]

    def _tree(self, array, what: str, exact: bool = False) -> dict:
        """A struct column (infos, extras) as a nested dict of arrays; a
        fixed-size list's rows take the shape its field's metadata names.
        A leaf with nulls is a list of Python values, or, when `exact`
        (the joined batch, whose slices must be what each episode's own
        column gives), a _Damaged."""
        if not self.is_struct(array.type):
            raise _Damaged(f"{what} are {array.type}, not a struct")
        if array.null_count:
            raise _Damaged(f"{what} holds nulls")
        out = {}
        for index, field in enumerate(array.type):
            child = array.field(index)
            sub = f"{what}[{field.name!r}]"
            t = field.type
            if exact and child.null_count:
                raise _Damaged(f"{sub} holds nulls")
            if self.is_struct(t):
                out[field.name] = self._tree(child, sub, exact)
            elif self.is_fixed_size_list(t) and not child.null_count:
                shape = _field_shape(field.metadata, t.list_size, sub)
                out[field.name] = self._rows(child, sub, shape)
            elif (self.is_boolean(t) or self.numeric_types[0](t) or self.numeric_types[1](t)) \
                    and not child.null_count:
                out[field.name] = self._numbers(child, sub)
            else:
                out[field.name] = child.to_pylist()
        return out

    def _from_batch(self, i: int, batch) -> SingleAgentEpisode:
        meta = self.meta
        n = batch.num_rows - 1             # the tracks of N rows have a pad row
        if n < 0:
            raise _Damaged("its file holds no rows")
        rewards = self._vector(batch, "rewards", n, "biuf", "rewards")
        terminated = _flag(self._vector(batch, "terminations", n, "biu",
                                        "terminations"), "terminations")
        truncated = _flag(self._vector(batch, "truncations", n, "biu",
                                       "truncations"), "truncations")
        columns = self._columns(batch)
        obs = {leaf.path: self._leaf(columns["observations"], leaf, n + 1,
                                     leaf.labels["observations"])
               for leaf in meta.obs_leaves}
        actions = {leaf.path: self._leaf(columns["actions"], leaf, n,
                                         leaf.labels["actions"])
                   for leaf in meta.action_leaves}
        infos = (None if columns["infos"] is None
                 else self._tree(columns["infos"], "infos"))
        extras = self._extras(columns[_EXTRAS], n)
        return _build(i, self._id(batch.schema.metadata), obs, actions, rewards, terminated,
                      truncated, _info_column(infos, n + 1, "infos"), extras, meta)


def _rows_of(tree: Optional[dict], start: int, stop: int) -> Optional[dict]:
    """The rows start:stop of each leaf of a nested dict of arrays or lists."""
    if tree is None:
        return None
    return {key: _rows_of(value, start, stop) if isinstance(value, dict)
            else value[start:stop] for key, value in tree.items()}


# Episodes joined into one batch hold about this many bytes of their files:
# enough to spread each column's conversion over many episodes, few enough
# that an episode kept alone holds little of the others' memory.
_JOINED_BYTES = 1 << 24


def _read_all(fd: int, size: int) -> bytes:
    """An open file's bytes, `size` of them by fstat (os-level reads: a
    buffered file object costs more)."""
    chunks = []
    while True:
        chunk = os.read(fd, max(size, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
        if size == 0:     # all fstat counted: no read to find the end
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _field_shape(metadata: Optional[dict], size: int, what: str) -> tuple:
    """The row shape a fixed-size-list column's field metadata names
    (Minari's "shape": "2,3"; an empty one, which Minari writes for rows of
    one value, is a scalar)."""
    text = (metadata or {}).get(b"shape")
    if text is None:
        return (size,)
    if text == b"":
        shape: tuple = ()
    else:
        try:
            shape = tuple(int(d) for d in text.split(b","))
        except ValueError:
            raise _Damaged(f"{what}: shape metadata {text!r:.50}") from None
    if any(d < 0 for d in shape) or math.prod(shape) != size:
        raise _Damaged(f"{what}: shape {shape} does not hold {size} values")
    return shape


# -- writing --------------------------------------------------------------------------

def _write_arrow(data: pathlib.Path, tracks: list, obs_space: gym.Space,
                 act_space: gym.Space, fmt: str) -> None:
    pa = _pyarrow()
    pq = _parquet() if fmt == "parquet" else None

    def padded(arr: np.ndarray, pad: int) -> np.ndarray:
        if not pad:
            return arr
        return np.concatenate([arr, np.zeros((pad,) + arr.shape[1:], arr.dtype)])

    def leaf_array(leaf: _Leaf, values: Any, pad: int):
        if leaf.kind == "image":
            return pa.array(_encode_images(values) + [b""] * pad, pa.binary())
        if leaf.kind == "text":
            return pa.array(list(values) + [None] * pad, pa.string())
        arr = padded(values, pad)
        if isinstance(leaf.space, gym.spaces.Discrete):
            return pa.array(arr)
        flat = arr.reshape(len(arr), -1)
        return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])

    def space_array(space, leaves_by_path: dict, path: tuple, pad: int):
        if isinstance(space, gym.spaces.Dict):
            keys = list(space.spaces)
            return pa.StructArray.from_arrays(
                [space_array(space[k], leaves_by_path, path + (k,), pad) for k in keys],
                names=keys)
        if isinstance(space, gym.spaces.Tuple):
            return pa.StructArray.from_arrays(
                [space_array(s, leaves_by_path, path + (i,), pad)
                 for i, s in enumerate(space.spaces)],
                names=[str(i) for i in range(len(space.spaces))])
        leaf, values = leaves_by_path[path]
        return leaf_array(leaf, values, pad)

    def tree_array(tree: dict, rows: int, pad: int):
        # A dict of per-step arrays as a struct column of rows + pad rows.
        arrays, fields = [], []
        for key, value in tree.items():
            if isinstance(value, dict):
                arr = tree_array(value, rows, pad)
                field = pa.field(key, arr.type)
            elif isinstance(value, list):
                arr = pa.array(value + [None] * pad, pa.string())
                field = pa.field(key, arr.type)
            elif value.ndim == 1:
                arr = pa.array(padded(value, pad))
                field = pa.field(key, arr.type)
            else:
                flat = padded(value, pad).reshape(rows + pad, -1)
                arr = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)),
                                                        flat.shape[1])
                field = pa.field(key, arr.type, metadata={
                    "shape": ",".join(str(d) for d in value.shape[1:])})
            arrays.append(arr)
            fields.append(field)
        if not arrays:
            return pa.array([{}] * (rows + pad), pa.struct([]))
        return pa.StructArray.from_arrays(arrays, fields=fields)

    obs_leaves, act_leaves = _leaves(obs_space), _leaves(act_space)
    first = None
    for i, t in enumerate(tracks):
        n = t["n"]
        names = ["observations", "actions", "rewards", "terminations", "truncations"]
        columns = [
            space_array(obs_space, {l.path: (l, t["obs"][l.path]) for l in obs_leaves}, (), 0),
            space_array(act_space, {l.path: (l, t["actions"][l.path]) for l in act_leaves},
                        (), 1),
            pa.array(padded(t["rewards"], 1)),
            pa.array(padded(t["terminations"], 1)),
            pa.array(padded(t["truncations"], 1)),
        ]
        if t["infos"]:
            names.append("infos")
            columns.append(tree_array(t["infos"], n + 1, 0))
        if t["extras"]:
            names.append(_EXTRAS)
            columns.append(tree_array(t["extras"], n, 1))
        # The episode's id_ rides in its file's schema: read with the data.
        batch = pa.RecordBatch.from_arrays(columns, names=names).replace_schema_metadata(
            {"id_": t["id_"]} if isinstance(t["id_"], str) else None)
        if first is None:
            first = batch.schema
        elif not batch.schema.equals(first):
            # Minari reads an Arrow dataset as one table.
            differ = sorted(set(first.names) ^ set(batch.schema.names) | {
                f.name for f in batch.schema if f.name in first.names
                and not f.equals(first.field(f.name))})
            raise ValueError(f"episode {i}'s {differ} differ from episode 0's: Minari's "
                             f"{fmt} datasets hold one schema (the same info keys and "
                             f"types, the same extra model outputs, in every episode)")
        folder = data / str(i)
        folder.mkdir()
        try:
            if pq is not None:
                pq.write_table(pa.Table.from_batches([batch]), folder / "part-0.parquet")
            else:
                with pa.OSFile(str(folder / "part-0.arrow"), "wb") as sink:
                    with pa.ipc.new_file(sink, batch.schema) as writer:
                        writer.write_batch(batch)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid) as exc:
            raise ValueError(f"episode {i} has no {fmt} form ({exc})") from None
        with open(folder / _METADATA, "w") as fh:
            json.dump({"id": i, "total_steps": n}, fh)
