"""Minari's HDF5 backend: a dataset's main_data.hdf5 read into episodes
(`_HDF5Reader`) and written (`_write_hdf5`)."""
from __future__ import annotations

import math
import mmap
import pathlib
from typing import Any, Dict, Iterable, List, Optional

import numpy as np

from episode.offline.minari.layout import _EXTRAS, _HDF5_FILE, _Metadata
from episode.offline.minari.libraries import _h5py
from episode.offline.minari.pictures import _decode_images, _encode_images
from episode.offline.minari.rows import (_MAPPED_BYTES, _build, _check_numeric, _Damaged,
                                         _flag, _info_column, _texts)
from episode.offline.minari.spaces import _kinds, _Leaf
from episode.single_agent_episode import SingleAgentEpisode


_EXTRAS_NAME = _EXTRAS.encode()


class _HDF5Reader:
    """Episodes from main_data.hdf5 through h5py's low-level API: the file
    opened once, each stored array opened and read whole by one call into
    an array allocated after its shape is checked (no per-row Python); a
    large array stored in one piece is a view of the memory-mapped file
    at the offset libhdf5 names."""

    def __init__(self, data_path: pathlib.Path, meta: _Metadata):
        h5py = _h5py()
        from h5py import h5a, h5d, h5g, h5o, h5s, h5t
        self.h5py, self.h5a, self.h5d, self.h5g, self.h5o, self.h5t = h5py, h5a, h5d, h5g, h5o, h5t
        self.all = h5s.ALL
        self.meta = meta
        self.data_path = data_path
        self.file = data_path / _HDF5_FILE
        self.index: Optional[int] = None
        self.obs = [(leaf, b"observations" + leaf.h5.encode()) for leaf in meta.obs_leaves]
        self.actions = [(leaf, b"actions" + leaf.h5.encode()) for leaf in meta.action_leaves]
        self.h5: Any = None
        self.map: Optional[mmap.mmap] = None
        try:
            self.size = self.file.stat().st_size
            if not h5py.is_hdf5(self.file):
                raise ValueError(f"{self.file}: not an HDF5 file")
            self.h5 = h5py.File(self.file, "r")
        except FileNotFoundError:
            raise ValueError(f"{self.data_path}: a Minari HDF5 dataset holds {_HDF5_FILE}") \
                from None
        except (OSError, RuntimeError) as exc:
            raise ValueError(f"{self.file}: not a readable HDF5 file ({exc})") from None
        # name -> (file type, native dtype, memory type) of the last array read
        # under that name: datasets of one name share their type, and a type
        # compare is cheaper than making the dtype again.
        self.types: Dict[bytes, tuple] = {}

    def close(self) -> None:
        if self.h5 is not None:
            self.h5.close()

    def episodes(self, indices: List[int]) -> Iterable[SingleAgentEpisode]:
        """The episodes at `indices`, in order (self.index names the one
        being read)."""
        for i in indices:
            self.index = i
            yield self.episode(i)

    def _open(self, loc, name: bytes, what: str):
        try:
            return self.h5d.open(loc, name)
        except KeyError:
            raise _Damaged(f"{what} is missing") from None

    def _dims(self, dset, what: str) -> tuple:
        dims = dset.get_space().get_simple_extent_dims()
        if not dims:
            raise _Damaged(f"{what} is a single value, not one row per step")
        return dims

    def _numbers(self, dset, name: bytes, dims: tuple, what: str) -> Optional[np.ndarray]:
        """The numeric dataset's data (native byte order), None for others."""
        tid = dset.get_type()
        known = self.types.get(name)
        if known is None or not known[0] == tid:
            dtype = dset.dtype
            if dtype.kind not in "biufc" or dtype.fields is not None or dtype.subdtype:
                return None
            native = dtype.newbyteorder("=")
            # Numbers stored as the machine holds them can be viewed in
            # place (not bools: libhdf5 reads those through their enum).
            mappable = dtype.isnative and dtype.kind in "iuf"
            known = self.types[name] = (tid, native, self.h5t.py_create(native), mappable)
        nbytes = math.prod(dims) * known[1].itemsize
        if nbytes > self.size and not self._filtered(dset, nbytes, what):
            raise _Damaged(f"{what} claims {dims} rows, more than the file holds")
        if nbytes >= _MAPPED_BYTES and known[3]:
            # A large array stored in one piece (contiguous, no filters, not
            # in an external file: libhdf5 names its offset) is a read-only
            # view of the memory-mapped file, as libhdf5 would read it.
            offset = dset.get_offset()
            if offset is not None and offset + nbytes <= self._mapped_size():
                return np.frombuffer(self.map, known[1], math.prod(dims), offset).reshape(dims)
        arr = np.empty(dims, known[1])
        if nbytes:
            dset.read(self.all, self.all, arr, known[2])
        return arr

    def _mapped_size(self) -> int:
        """The size of the file's memory map, mapped on first use (and kept
        while the episodes' arrays view it)."""
        if self.map is None:
            with open(self.file, "rb") as fh:
                self.map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        return len(self.map)

    def _filtered(self, dset, nbytes: int, what: str) -> bool:
        # Compressed data may outgrow its file, by a bounded factor.
        if dset.get_create_plist().get_nfilters() == 0:
            return False
        if nbytes > 1024 * self.size:
            raise _Damaged(f"{what} claims {nbytes} bytes of data in a file of {self.size}")
        return True

    def _vector(self, loc, name: bytes, rows: Optional[int], kinds: str, what: str) -> np.ndarray:
        """A 1-D numeric dataset (rewards, terminations, truncations) of
        `rows` rows (at most the dataset's total_steps when None)."""
        dset = self._open(loc, name, what)
        dims = self._dims(dset, what)
        if len(dims) != 1 or (dims[0] != rows if rows is not None
                              else dims[0] > self.meta.total_steps):
            raise _Damaged(f"{what} has shape {dims}, not one value per step"
                           + ("" if rows is None else f" ({rows})"))
        arr = self._numbers(dset, name, dims, what)
        if arr is None or arr.dtype.kind not in kinds:
            raise _Damaged(f"{what} holds {dset.dtype} data, not {_kinds(kinds)}")
        return arr

    def _leaf(self, loc, name: bytes, leaf: _Leaf, rows: int, what: str) -> Any:
        dset = self._open(loc, name, what)
        dims = self._dims(dset, what)
        if leaf.kind == "numeric":
            if dims != (rows,) + leaf.shape:
                raise _Damaged(f"{what} has shape {dims}, not {(rows,) + leaf.shape}")
            arr = self._numbers(dset, name, dims, what)
            if arr is None:
                raise _Damaged(f"{what} holds {dset.dtype} data, not "
                               f"{_kinds(leaf.dtype_kinds)} as its space says")
            return _check_numeric(arr, rows, leaf.shape, leaf.dtype_kinds, what)
        if dims[0] != rows:
            raise _Damaged(f"{what} has {dims[0]} rows, not {rows}")
        h5py = self.h5py
        dtype = dset.dtype
        if leaf.kind == "text":
            if len(dims) != 1 or h5py.check_string_dtype(dtype) is None:
                raise _Damaged(f"{what} holds {dims} {dtype}, not strings")
            return _texts(h5py.Dataset(dset)[()].tolist(), rows, what)
        # Pictures: one byte string per row (variable-length, or the rows of a
        # 2-D uint8 dataset when all pictures have one length).
        if len(dims) == 1 and h5py.check_vlen_dtype(dtype) == np.dtype(np.uint8):
            items = [row.tobytes() for row in h5py.Dataset(dset)[()]]
        elif len(dims) == 2 and dtype == np.uint8:
            items = list(self._numbers(dset, name, dims, what))
        else:
            raise _Damaged(f"{what} holds {dims} {dtype}, not pictures")
        return _decode_images(items, leaf, rows, what)

    def _tree(self, loc, name: bytes, rows: int, what: str) -> dict:
        """A group's datasets as a nested dict of arrays (infos, extras), each
        of `rows` or `rows - 1` rows."""
        try:
            gid = self.h5g.open(loc, name)
        except KeyError:
            raise _Damaged(f"{what} is missing") from None
        out = {}
        h5py = self.h5py
        for member in gid:
            key = member.decode("utf-8", "replace")
            sub = f"{what}[{key!r}]"
            obj = self.h5o.open(gid, member)
            if isinstance(obj, self.h5g.GroupID):
                out[key] = self._tree(gid, member, rows, sub)
                continue
            if not isinstance(obj, self.h5d.DatasetID):
                raise _Damaged(f"{sub} is neither a group nor a dataset")
            dims = self._dims(obj, sub)
            if dims[0] not in (rows, rows - 1):
                raise _Damaged(f"{sub} has {dims[0]} rows; the episode has {rows} observations")
            value = self._numbers(obj, name + b"/" + member, dims, sub)
            if value is None:
                string = h5py.check_string_dtype(obj.dtype)
                dset = h5py.Dataset(obj)
                value = (dset.asstr()[()] if string is not None and string.encoding == "utf-8"
                         else dset[()])
            out[key] = value
        return out

    def episode(self, i: int) -> SingleAgentEpisode:
        try:
            group = self.h5g.open(self.h5.id, b"episode_%d" % i)
        except KeyError:
            raise _Damaged("the episode is missing") from None
        rewards = self._vector(group, b"rewards", None, "biuf", "rewards")
        n = len(rewards)
        terminated = _flag(self._vector(group, b"terminations", n, "biu",
                                        "terminations"), "terminations")
        truncated = _flag(self._vector(group, b"truncations", n, "biu",
                                       "truncations"), "truncations")
        obs = {leaf.path: self._leaf(group, name, leaf, n + 1,
                                     leaf.labels["observations"])
               for leaf, name in self.obs}
        actions = {leaf.path: self._leaf(group, name, leaf, n,
                                         leaf.labels["actions"])
                   for leaf, name in self.actions}
        links = group.links
        infos = (self._tree(group, b"infos", n + 1, "infos")
                 if links.exists(b"infos") else None)
        extras = {}
        if links.exists(_EXTRAS_NAME):
            what = _EXTRAS
            for key, value in self._tree(group, _EXTRAS_NAME, n, what).items():
                if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf" \
                        or len(value) != n:
                    raise _Damaged(f"{what}[{key!r}] is not {n} rows of numbers")
                extras[key] = value
        id_ = None
        if self.h5a.exists(group, b"id_"):
            id_ = self.h5py.Group(group).attrs["id_"]
            if not isinstance(id_, str):
                raise _Damaged(f"its id_ is {type(id_).__name__}, not a string")
        return _build(i, id_, obs, actions, rewards, terminated, truncated,
                      _info_column(infos, n + 1, "infos"), extras, self.meta)


# -- writing --------------------------------------------------------------------------

def _write_hdf5(data: pathlib.Path, tracks: list, obs_leaves: list, action_leaves: list) -> None:
    h5py = _h5py()
    vlen = h5py.vlen_dtype(np.uint8)
    text = h5py.string_dtype("utf-8")

    def put(group, name: str, leaf: _Leaf, values: Any) -> None:
        if leaf.kind == "image":
            pics = _encode_images(values)
            arr = np.empty(len(pics), object)
            arr[:] = [np.frombuffer(p, np.uint8) for p in pics]
            group.create_dataset(name, data=arr, dtype=vlen)
        elif leaf.kind == "text":
            group.create_dataset(name, data=np.array(values, dtype=object), dtype=text)
        else:
            group.create_dataset(name, data=values)

    def put_tree(group, tree: dict) -> None:
        # Groups that keep their members' order: the info dicts read back
        # with their keys in the env's order.
        for key, value in tree.items():
            if isinstance(value, dict):
                put_tree(group.create_group(key, track_order=True), value)
            elif isinstance(value, list):
                group.create_dataset(key, data=np.array(value, dtype=object), dtype=text)
            else:
                group.create_dataset(key, data=value)

    with h5py.File(data / _HDF5_FILE, "w", track_order=True) as f:
        for i, t in enumerate(tracks):
            g = f.create_group(f"episode_{i}")
            g.attrs["id"] = np.int64(i)
            g.attrs["total_steps"] = np.int64(t["n"])
            if isinstance(t["id_"], str):
                g.attrs["id_"] = t["id_"]
            for track, rows, leaves in (("observations", t["obs"], obs_leaves),
                                        ("actions", t["actions"], action_leaves)):
                for leaf in leaves:
                    put(g, track + leaf.h5, leaf, rows[leaf.path])
            g.create_dataset("rewards", data=t["rewards"])
            g.create_dataset("terminations", data=t["terminations"])
            g.create_dataset("truncations", data=t["truncations"])
            put_tree(g.create_group("infos", track_order=True), t["infos"])
            if t["extras"]:
                put_tree(g.create_group(_EXTRAS, track_order=True), t["extras"])
