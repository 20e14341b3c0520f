"""Minari datasets to and from episodes.

`from_minari` reads a Minari dataset (HDF5, Arrow or Parquet backend) into
numpy'd SingleAgentEpisodes, straight from the storage files: each track's
rows are read as one array per episode and adopted by a Column, with no
per-step Python objects outside the infos. `to_minari` writes episodes in
Minari's on-disk layout, aside and then renamed into place, so that
`minari.load_dataset` opens the result and iterates the same data.

Neither needs Minari's DataCollector (which needs jax). h5py, pyarrow and
pillow are imported on first use: ``pip install "episode[minari]"``.

Layout (Minari 0.4/0.5), under ``<root>/<dataset_id>/data``:

* ``metadata.json``: ``data_format`` ("hdf5", "arrow" or "parquet"),
  ``minari_version``, ``total_episodes``, ``total_steps``, the spaces as
  JSON strings, and what the author adds (``author``, ``algorithm_name``,
  ...).
* HDF5: ``main_data.hdf5``, one group ``episode_<i>`` per episode holding
  ``observations`` (N+1 rows), ``actions``, ``rewards``, ``terminations``,
  ``truncations`` (N rows each) and ``infos`` (a dict of N+1-row arrays);
  a Dict space is a group per key, a Tuple one ``_index_<k>`` per entry.
* Arrow/Parquet: a folder ``<i>`` per episode with a ``metadata.json`` and
  one data file of N+1 rows (the N-row tracks padded by a last row); Dict
  and Tuple spaces are struct columns, Box-like ones fixed-size lists.
* Image observations (uint8 Box spaces of at least 32x32, bounds 0..255)
  are stored one compressed picture per row.

Our additions, which Minari reads past: each episode's ``id_`` (an
attribute of its HDF5 group, or a key of its Arrow/Parquet file's schema
metadata) and its extra model outputs (a group, or a struct column,
``extra_model_outputs``).
"""
from __future__ import annotations

import io
import json
import math
import mmap
import os
import pathlib
import re
import shutil
import sys
import tempfile
from collections import OrderedDict
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import gymnasium as gym
import numpy as np

from episode._column import KINDS, Column
from episode._episode import EpisodeCore, make_episode
from episode.single_agent_episode import SingleAgentEpisode

__all__ = ["from_minari", "to_minari"]

_INSTALL = 'pip install "episode[minari]"'
_FORMATS = ("hdf5", "arrow", "parquet")
_METADATA = "metadata.json"
_HDF5_FILE = "main_data.hdf5"
_NAMESPACE_METADATA = "namespace_metadata.json"
_EXTRAS = "extra_model_outputs"
# The layouts read and written here: Minari 0.4's and 0.5's (one layout).
_LAYOUT_VERSION = re.compile(r"0\.[45]\.\d+\Z")
_NEWEST_LAYOUT = "0.5.3"
# Minari's dataset ids: (namespace/)name(-vN); Minari writes only versioned ones.
_DATASET_ID = re.compile(r"^(?:[-_\w][-_\w/]*[-_\w]+/)?[-_\w]+?(?:-v\d+)?\Z")
_VERSIONED_ID = re.compile(r"^(?:[-_\w][-_\w/]*[-_\w]+/)?[-_\w]+?-v\d+\Z")
# Metadata keys that describe the data itself: to_minari writes them.
_RESERVED = frozenset({"dataset_id", "total_episodes", "total_steps", "data_format",
                       "minari_version", "dataset_size"})
_EMPTY_DICT = KINDS["empty_dict"]


# -- optional modules -----------------------------------------------------------------

def _import(name: str, why: str):
    try:
        return __import__(name, fromlist=["_"])
    except ImportError as exc:
        raise ImportError(f"{why} needs {name.split('.')[0]}: {_INSTALL}") from exc


def _h5py():
    return _import("h5py", "Minari's HDF5 datasets")


def _pyarrow():
    pa = _import("pyarrow", "Minari's Arrow datasets")
    _import("pyarrow.ipc", "Minari's Arrow datasets")
    return pa


def _parquet():
    _pyarrow()
    return _import("pyarrow.parquet", "Minari's Parquet datasets")


def _pil_image():
    return _import("PIL.Image", "Minari's image observations")


# -- spaces ---------------------------------------------------------------------------

def _space_to_json(space: gym.Space) -> Any:
    """`space` as Minari serializes it (a JSON-ready dict)."""
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "dtype": str(space.dtype), "shape": list(space.shape),
                "low": space.low.tolist(), "high": space.high.tolist()}
    if isinstance(space, gym.spaces.Discrete):
        # Minari writes "int64" for every Discrete; the space's own dtype is
        # kept (Minari reads past it).
        return {"type": "Discrete", "dtype": str(space.dtype), "start": int(space.start),
                "n": int(space.n)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "dtype": str(space.dtype),
                "nvec": space.nvec.tolist(), "start": space.start.tolist()}
    if isinstance(space, gym.spaces.MultiBinary):
        n = space.n
        return {"type": "MultiBinary", "n": int(n) if np.ndim(n) == 0 else list(map(int, n))}
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict",
                "subspaces": {k: _space_to_json(v) for k, v in space.spaces.items()}}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "subspaces": [_space_to_json(v) for v in space.spaces]}
    if isinstance(space, gym.spaces.Text):
        return {"type": "Text", "max_length": int(space.max_length),
                "min_length": int(space.min_length), "charset": space.characters}
    raise ValueError(f"Minari stores Box, Discrete, MultiDiscrete, MultiBinary, Text, Dict "
                     f"and Tuple spaces, not {space!r:.200}")


def _space_from_json(obj: Any, where: str) -> gym.Space:
    """The space a Minari-serialized dict describes; ValueError naming `where`."""
    def bad(why):
        return ValueError(f"{where}: {why}")

    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        raise bad(f"a space is a dict with a 'type', not {obj!r:.200}")
    kind = obj["type"]

    def field(key, types):
        if key not in obj:
            raise bad(f"a {kind} space without {key!r}")
        value = obj[key]
        if not isinstance(value, types) or isinstance(value, bool):
            raise bad(f"the {kind} space's {key!r} is {value!r:.100}")
        return value

    try:
        if kind == "Dict":
            subs = field("subspaces", dict)
            return gym.spaces.Dict(OrderedDict(
                (k, _space_from_json(v, where)) for k, v in subs.items()))
        if kind == "Tuple":
            return gym.spaces.Tuple([_space_from_json(v, where)
                                     for v in field("subspaces", list)])
        if kind == "Box":
            dtype = np.dtype(field("dtype", str))
            if dtype.kind not in "biuf":
                raise bad(f"a Box of dtype {dtype}")
            shape = tuple(field("shape", list))
            if not all(type(d) is int and d >= 0 for d in shape):
                raise bad(f"a Box of shape {shape!r:.100}")
            # Minari writes the bounds in full: nothing larger than the
            # file is made from them.
            low = np.array(field("low", (list, int, float)), dtype=dtype)
            high = np.array(field("high", (list, int, float)), dtype=dtype)
            if low.shape != shape or high.shape != shape:
                raise bad(f"a Box of shape {shape} with bounds of shape {low.shape}, "
                          f"{high.shape}")
            return gym.spaces.Box(low=low, high=high, shape=shape, dtype=dtype)
        if kind == "Discrete":
            dtype = np.dtype(obj.get("dtype", "int64")) if isinstance(
                obj.get("dtype", "int64"), str) else None
            if dtype is None or dtype.kind not in "iu":
                raise bad(f"a Discrete space of dtype {obj.get('dtype')!r:.50}")
            return gym.spaces.Discrete(n=field("n", int), start=field("start", int),
                                       dtype=dtype)
        if kind == "MultiDiscrete":
            dtype = np.dtype(field("dtype", str))
            if dtype.kind not in "iu":
                raise bad(f"a MultiDiscrete space of dtype {dtype}")
            return gym.spaces.MultiDiscrete(nvec=field("nvec", list), dtype=dtype,
                                            start=field("start", list))
        if kind == "MultiBinary":
            n = field("n", (int, list))
            if not all(type(d) is int and d >= 0 for d in (n if isinstance(n, list) else [n])):
                raise bad(f"a MultiBinary space of shape {n!r:.100}")
            return gym.spaces.MultiBinary(n=n)
        if kind == "Text":
            return gym.spaces.Text(max_length=field("max_length", int),
                                   min_length=field("min_length", int),
                                   charset=field("charset", str))
    except ValueError:
        raise
    except (TypeError, AssertionError, OverflowError, KeyError) as exc:
        raise bad(f"a {kind} space that gymnasium refuses ({exc})") from None
    raise bad(f"no {kind!r} spaces in Minari's layout")


def _is_image_space(space: gym.Space) -> bool:
    # Minari's rule: such a space's rows are stored as compressed pictures.
    return (isinstance(space, gym.spaces.Box) and len(space.shape) in (2, 3)
            and space.shape[0] >= 32 and space.shape[1] >= 32 and space.dtype == np.uint8
            and bool(np.all(space.low == 0)) and bool(np.all(space.high == 255)))


class _Leaf:
    """One leaf of a space: where its rows live and what they look like."""
    __slots__ = ("path", "space", "kind", "shape", "dtype_kinds", "h5", "names", "labels")

    def __init__(self, path: tuple, space: gym.Space, pictures: bool = True):
        self.path = path            # keys (Dict) and positions (Tuple) from the root
        self.space = space
        if isinstance(space, gym.spaces.Text):
            self.kind, self.shape, self.dtype_kinds = "text", (), ""
        elif pictures and _is_image_space(space):
            self.kind, self.shape, self.dtype_kinds = "image", space.shape, "u"
        else:
            self.kind, self.shape = "numeric", tuple(space.shape)
            self.dtype_kinds = {gym.spaces.Box: "biuf", gym.spaces.Discrete: "iu",
                                gym.spaces.MultiDiscrete: "iu",
                                gym.spaces.MultiBinary: "biu"}[type(space)]
        # The leaf's HDF5 path below the track's group and its Arrow field names.
        self.h5 = "".join(f"/_index_{p}" if isinstance(p, int) else f"/{p}" for p in path)
        self.names = tuple(str(p) for p in path)
        self.labels = {track: self.describe(track) for track in ("observations", "actions")}

    def describe(self, track: str) -> str:
        return track + "".join(f"[{p!r}]" for p in self.path)


def _leaves(space: gym.Space, path: tuple = (), pictures: bool = True) -> List[_Leaf]:
    """The space's leaves (`pictures`: image spaces are stored as pictures,
    Minari's jpeg_encoding; else as arrays of numbers)."""
    if isinstance(space, gym.spaces.Dict):
        if not space.spaces:
            raise ValueError("a Dict space without keys has no rows to store")
        out = []
        for key, sub in space.spaces.items():
            if not isinstance(key, str) or key in ("", ".") or "/" in key:
                raise ValueError(f"Minari's layout names Dict keys by strings without '/' "
                                 f"(HDF5 group names), not {key!r:.100}")
            out += _leaves(sub, path + (key,), pictures)
        return out
    if isinstance(space, gym.spaces.Tuple):
        if not space.spaces:
            raise ValueError("a Tuple space without entries has no rows to store")
        return [leaf for i, sub in enumerate(space.spaces)
                for leaf in _leaves(sub, path + (i,), pictures)]
    if isinstance(space, (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete,
                          gym.spaces.MultiBinary, gym.spaces.Text)):
        return [_Leaf(path, space, pictures)]
    _space_to_json(space)   # raises the ValueError naming what Minari stores
    raise AssertionError("unreachable")


def _tree(space: gym.Space, by_path: dict, path: tuple = ()) -> Any:
    """The space's structure with each leaf replaced by by_path[its path]."""
    if isinstance(space, gym.spaces.Dict):
        return {k: _tree(v, by_path, path + (k,)) for k, v in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_tree(v, by_path, path + (i,)) for i, v in enumerate(space.spaces))
    return by_path[path]


# -- finding a dataset ----------------------------------------------------------------

def _datasets_root(root: Any = None) -> pathlib.Path:
    """Where Minari keeps datasets: `root`, else $MINARI_DATASETS_PATH, else
    ~/.minari/datasets (Minari's rule)."""
    if root is not None:
        return pathlib.Path(os.fspath(root))
    env = os.environ.get("MINARI_DATASETS_PATH")
    if env is not None:
        return pathlib.Path(env)
    return pathlib.Path.home() / ".minari" / "datasets"


def _locate(dataset: Any) -> Tuple[pathlib.Path, Optional[np.ndarray]]:
    """(the dataset's data folder, the episode indices a MinariDataset
    selects or None)."""
    minari = sys.modules.get("minari")
    if minari is not None and isinstance(dataset, minari.MinariDataset):
        return pathlib.Path(dataset.storage.data_path), np.asarray(dataset.episode_indices)
    if isinstance(dataset, os.PathLike) or (isinstance(dataset, str) and os.path.isdir(dataset)):
        path = pathlib.Path(os.fspath(dataset))
        if not path.is_dir():
            raise FileNotFoundError(f"no Minari dataset at {path}: no such folder")
        if (path / _METADATA).is_file():
            return path, None
        if (path / "data" / _METADATA).is_file():
            return path / "data", None
        raise ValueError(f"{path} is not a Minari dataset: it holds no {_METADATA} "
                         f"(nor data/{_METADATA})")
    if isinstance(dataset, str):
        if not _DATASET_ID.match(dataset):
            raise FileNotFoundError(f"{dataset!r} is neither a folder nor a Minari dataset id "
                                    f"((namespace/)name-v<version>)")
        path = _datasets_root() / dataset / "data"
        if not path.is_dir():
            raise FileNotFoundError(f"Minari dataset {dataset!r} not found locally at "
                                    f"{path.parent} (nor is it a folder)")
        if not (path / _METADATA).is_file():
            raise ValueError(f"{path} is not a Minari dataset: it holds no {_METADATA}")
        return path, None
    raise TypeError(f"a Minari dataset is a MinariDataset, a dataset id or a path, not "
                    f"{type(dataset).__name__}")


def _read_json(file: pathlib.Path) -> Any:
    try:
        with open(file, "rb") as fh:
            return json.loads(fh.read())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ValueError(f"{file}: not readable JSON ({exc})") from None


class _Metadata:
    """A dataset's checked metadata.json: the backend, counts and spaces."""

    def __init__(self, data_path: pathlib.Path):
        file = data_path / _METADATA
        raw = _read_json(file)
        if not isinstance(raw, dict):
            raise ValueError(f"{file}: Minari's metadata is a JSON object, not "
                             f"{type(raw).__name__}")
        self.file = file
        self.raw = raw
        fmt = raw.get("data_format")
        if fmt not in _FORMATS:
            raise ValueError(f"{file}: data_format {fmt!r:.50} is not one of Minari's "
                             f"backends {_FORMATS}")
        self.format = fmt
        version = raw.get("minari_version")
        if not isinstance(version, str) or not _LAYOUT_VERSION.match(version):
            raise ValueError(f"{file}: minari_version {version!r:.50}: this reader knows the "
                             f"layout of Minari 0.4 and 0.5 datasets")
        for key in ("total_episodes", "total_steps"):
            value = raw.get(key)
            if type(value) is not int or value < 0:
                raise ValueError(f"{file}: {key} is {value!r:.50}, not a count")
        self.total_episodes = raw["total_episodes"]
        self.total_steps = raw["total_steps"]
        # Minari 0.5.4's choice: image spaces stored as JPEG pictures (the
        # default) or as arrays of numbers.
        self.pictures = raw.get("jpeg_encoding", True)
        if not isinstance(self.pictures, bool):
            raise ValueError(f"{file}: jpeg_encoding is {self.pictures!r:.50}, not true or "
                             f"false")
        self.observation_space = self._space("observation_space")
        self.action_space = self._space("action_space")
        self.obs_leaves = self._leaves_of("observation_space", self.observation_space)
        self.action_leaves = self._leaves_of("action_space", self.action_space)
        self.flat_obs = self.obs_leaves[0].path == ()
        self.flat_actions = self.action_leaves[0].path == ()

    def _space(self, key: str) -> gym.Space:
        # (Minari falls back to making the env its env_spec names: reading
        # a file never runs code here, so the space must be written down.)
        text = self.raw.get(key)
        if not isinstance(text, str):
            raise ValueError(f"{self.file}: no {key} (a JSON string in Minari's layout)")
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"{self.file}: {key} is not JSON ({exc})") from None
        return _space_from_json(obj, f"{self.file}: {key}")

    def _leaves_of(self, key: str, space: gym.Space) -> List[_Leaf]:
        try:
            return _leaves(space, pictures=self.pictures)
        except ValueError as exc:
            raise ValueError(f"{self.file}: {key}: {exc}") from None


def _indices(selected: Optional[np.ndarray], episode_indices: Any, total: int,
             file: pathlib.Path) -> List[int]:
    if episode_indices is None:
        episode_indices = range(total) if selected is None else selected
    if isinstance(episode_indices, (str, bytes)) or not isinstance(episode_indices, Iterable):
        raise TypeError(f"episode_indices are a sequence of ints, not "
                        f"{type(episode_indices).__name__}")
    out = []
    for i in episode_indices:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"an episode index is an int, not {type(i).__name__}")
        if not 0 <= i < total:
            raise IndexError(f"episode {int(i)} is not in {file.parent}, which holds "
                             f"{total} episodes")
        out.append(int(i))
    return out


# -- reading: the checks every backend shares -----------------------------------------

class _Damaged(Exception):
    """A storage file that does not hold what its metadata says (raised as a
    ValueError naming the file by from_minari)."""


_KIND_NAMES = {"b": "bool", "i": "int", "u": "uint", "f": "float", "c": "complex"}
_PYTHON_NUMBER_DTYPES = (np.dtype(np.float64), np.dtype(np.int64), np.dtype(np.bool_))
_IGNORED = ("_", ".", _METADATA)   # names Minari's Arrow reader skips in a folder


def _kinds(kinds: str) -> str:
    return "/".join(_KIND_NAMES[k] for k in kinds)


def _check_numeric(arr: np.ndarray, rows: int, shape: tuple, kinds: str,
                   what: str) -> np.ndarray:
    """`arr` if it is `rows` rows of `shape` with a dtype of `kinds`."""
    if arr.dtype.kind not in kinds:
        raise _Damaged(f"{what} holds {arr.dtype} data, not {_kinds(kinds)} as its space says")
    if arr.shape != (rows,) + shape:
        raise _Damaged(f"{what} has shape {arr.shape}, not {(rows,) + shape}")
    return arr


def _flag(arr: np.ndarray, what: str) -> bool:
    """The episode's flag from its per-step terminations or truncations (a
    checked 1-D array): only the last step may carry it."""
    if arr.dtype != np.bool_ and not ((arr == 0) | (arr == 1)).all():
        raise _Damaged(f"{what} holds values other than 0 and 1")
    if len(arr) == 0:
        return False
    last = bool(arr[-1])
    if np.count_nonzero(arr) != last:
        first = int(np.flatnonzero(arr[:-1])[0])
        raise _Damaged(f"{what} ends the episode at step {first} of {len(arr)}: an episode "
                       f"ends at its last step only")
    return last


def _decode_images(items: Sequence, leaf: _Leaf, rows: int, what: str) -> np.ndarray:
    """Rows of pictures (PNG, as to_minari writes them, or JPEG, as Minari
    does) as one uint8 array of the leaf's shape. Long runs are decoded by
    two threads (pillow decodes without the GIL)."""
    Image = _pil_image()
    if len(items) != rows:
        raise _Damaged(f"{what} has {len(items)} pictures, not {rows}")
    out = np.empty((rows,) + leaf.shape, np.uint8)
    size = (leaf.shape[1], leaf.shape[0])

    def decode(start: int, stop: int) -> None:
        for i in range(start, stop):
            try:
                with Image.open(io.BytesIO(items[i]), formats=("PNG", "JPEG")) as img:
                    # The header names the size: nothing is decoded unless it fits.
                    if img.size != size:
                        raise _Damaged(f"{what}: picture {i} is {img.size[0]}x{img.size[1]}, "
                                       f"not {size[0]}x{size[1]}")
                    pixels = np.asarray(img)
            except _Damaged:
                raise
            except Exception as exc:     # pillow raises many kinds for damaged pictures
                raise _Damaged(f"{what}: picture {i} does not decode ({exc})") from None
            if pixels.dtype != np.uint8 or pixels.size != out[i].size:
                raise _Damaged(f"{what}: picture {i} decodes to {pixels.shape} "
                               f"{pixels.dtype}, not {leaf.shape} uint8")
            out[i] = pixels.reshape(leaf.shape)

    if rows < _THREADED_PICTURES or _picture_pool() is None:
        decode(0, rows)
        return out
    half = rows // 2
    other = _picture_pool().submit(decode, half, rows)
    try:
        decode(0, half)
    finally:
        other.result()
    return out


_THREADED_PICTURES = 16
_POOL: dict = {}


def _picture_pool():
    """One helper thread for decoding pictures beside the caller (None on a
    single core). One per process: a forked child has the pool object but
    not its thread."""
    pid = os.getpid()
    if pid not in _POOL:
        from concurrent.futures import ThreadPoolExecutor
        _POOL.clear()
        _POOL[pid] = (ThreadPoolExecutor(1, thread_name_prefix="episode-pictures")
                      if (os.cpu_count() or 1) > 1 else None)
    return _POOL[pid]


def _texts(items: Sequence, rows: int, what: str) -> np.ndarray:
    """Strings as a numpy'd episode holds them: one unicode array."""
    if len(items) != rows:
        raise _Damaged(f"{what} has {len(items)} strings, not {rows}")
    out = []
    for item in items:
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError:
                raise _Damaged(f"{what} holds a string that is not UTF-8") from None
        if not isinstance(item, str):
            raise _Damaged(f"{what} holds {type(item).__name__}, not strings")
        out.append(item)
    return np.array(out, dtype=np.str_)


def _step_values(values: Any) -> list:
    """One info leaf's values, one per row: Python numbers for float64,
    int64 and bool arrays (what Python's numbers are stored as), numpy
    scalars for other dtypes, array rows, and strings or objects as they are."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind == "O":
            return [v.decode("utf-8") if isinstance(v, bytes) else v for v in values.tolist()]
        if values.ndim == 1 and values.dtype in _PYTHON_NUMBER_DTYPES:
            return values.tolist()
        return list(values)
    return list(values)


def _info_column(tree: Optional[dict], rows: int, what: str) -> Column:
    """The infos Column (`rows` dicts) of a dict of per-row leaves. A leaf
    with one row less than the observations has no value at the reset
    (older datasets did not record the reset's info)."""
    if not tree:
        return Column.from_rows(rows, _EMPTY_DICT)
    steps = [{} for _ in range(rows)]
    _fill_infos(steps, tree, rows, what)
    return Column.from_list(steps)


def _fill_infos(steps: list, tree: dict, rows: int, what: str) -> None:
    for key, value in tree.items():
        if isinstance(value, dict):
            subs = [{} for _ in range(rows)]
            _fill_infos(subs, value, rows, f"{what}[{key!r}]")
            for step, sub in zip(steps, subs):
                step[key] = sub
            continue
        values = _step_values(value)
        first = rows - len(values)
        if first not in (0, 1):
            raise _Damaged(f"{what}[{key!r}] has {len(values)} rows; the episode has "
                           f"{rows} observations")
        for step, v in zip(steps[first:], values):
            step[key] = v


def _build(index: int, id_: Optional[str], obs: dict, actions: dict, rewards: np.ndarray,
           terminated: bool, truncated: bool, infos: Column, extras: dict,
           meta: _Metadata) -> SingleAgentEpisode:
    """The episode over checked arrays: one Column per leaf, no copies."""
    obs_space, action_space = meta.observation_space, meta.action_space
    col = Column.from_array
    if meta.flat_obs:
        obs_tree = col(obs[()])
    else:
        obs_tree = _tree(obs_space, {p: col(a) for p, a in obs.items()})
    if meta.flat_actions:
        action_tree = col(actions[()])
    else:
        action_tree = _tree(action_space, {p: col(a) for p, a in actions.items()})
    return make_episode(SingleAgentEpisode, str(index) if id_ is None else id_, obs_tree,
                        infos, action_tree, Column.from_array(rewards),
                        {k: Column.from_array(v) for k, v in extras.items()},
                        (0, 0, 0, 0, 0), terminated, truncated, 0, obs_space, action_space)


# -- reading HDF5 ---------------------------------------------------------------------

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


# -- reading Arrow and Parquet --------------------------------------------------------

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


# Arrow files and HDF5 arrays of at least this size are memory-mapped
# (their arrays view the file's pages); smaller ones are read, which costs
# less than a map.
_MAPPED_BYTES = 1 << 16


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


# Rewards are checked as a leaf of this space is.
_SCALAR_REWARD = _Leaf((), gym.spaces.Box(-np.inf, np.inf, (), np.float64))
_EXTRAS_NAME = _EXTRAS.encode()


# -- from_minari ----------------------------------------------------------------------

def from_minari(dataset: Any, *, episode_indices: Optional[Iterable[int]] = None
                ) -> List[SingleAgentEpisode]:
    """The episodes of a Minari dataset, as numpy'd SingleAgentEpisodes.

    Args:
        dataset: a ``minari.MinariDataset`` (its selected episodes), a
            dataset id (found as ``minari.load_dataset`` finds it: under
            $MINARI_DATASETS_PATH, else ~/.minari/datasets), or the path of
            a dataset's folder (or of its ``data`` folder).
        episode_indices: the stored episodes to read, in this order (all of
            them, or the MinariDataset's, by default).

    Each episode holds the stored observations (N+1 rows), actions, rewards
    and infos (one dict per observation, as the env gave them), ends
    terminated/truncated as its last step does, and keeps the id it was
    written with by `to_minari` (else the episode's index, as a string).
    The tracks are arrays read from the storage files in one piece (Box-like
    rows, Discrete values, each leaf of a Dict/Tuple space), pictures are
    decoded, spaces come from the dataset's metadata.

    Raises:
        FileNotFoundError: no such dataset.
        ValueError: a folder that is not a Minari dataset, a version or
            backend whose layout is unknown, or a storage file that is
            damaged or does not match the dataset's spaces (the error names
            the file and the episode).
        ImportError: h5py/pyarrow/pillow missing (``pip install "episode[minari]"``).
    """
    data_path, selected = _locate(dataset)
    meta = _Metadata(data_path)
    indices = _indices(selected, episode_indices, meta.total_episodes, meta.file)
    reader = (_HDF5Reader if meta.format == "hdf5" else _ArrowReader)(data_path, meta)
    episodes = []
    try:
        episodes.extend(reader.episodes(indices))
    except _Damaged as exc:
        raise ValueError(f"{reader.file}: episode {reader.index}: {exc}") from None
    except (ValueError, TypeError, AssertionError, KeyError, OSError, RuntimeError) as exc:
        # h5py and the episode's own checks: the file does not hold a
        # well-formed episode.
        raise ValueError(f"{reader.file}: episode {reader.index}: {type(exc).__name__}: "
                         f"{exc}") from None
    finally:
        reader.close()
    if episode_indices is None and selected is None:
        steps = sum(len(e) for e in episodes)
        if steps != meta.total_steps:
            raise ValueError(f"{meta.file}: total_steps is {meta.total_steps}, but the "
                             f"episodes hold {steps} steps")
    return episodes


# -- writing --------------------------------------------------------------------------

def _as_ours(episode: Any, k: int) -> EpisodeCore:
    if isinstance(episode, EpisodeCore):
        return episode
    if hasattr(episode, "agent_episodes"):
        raise ValueError(f"episode {k} is a multi-agent episode: Minari's datasets are "
                         f"single-agent")
    if hasattr(episode, "get_state") and hasattr(episode, "extra_model_outputs"):
        return SingleAgentEpisode.from_state(episode.get_state())
    raise TypeError(f"episode {k} is a {type(episode).__name__}, not a SingleAgentEpisode")


def _track_rows(storage: Any, space: gym.Space, leaves: Dict[tuple, _Leaf], rows: int,
                what: str) -> dict:
    """{leaf path: its rows} of one track: its storage (a tree of Columns
    shaped like the space, or a Column of whole items) checked against the
    space, leaf by leaf (an array of the leaf's rows, or strings)."""
    out: dict = {}

    def label(path: tuple) -> str:
        return what + "".join(f"[{p!r}]" for p in path)

    def keys_of(space: gym.Space) -> list:
        return (list(space.spaces) if isinstance(space, gym.spaces.Dict)
                else list(range(len(space.spaces))))

    def fits(node: Any, space: gym.Space) -> bool:
        if isinstance(space, gym.spaces.Dict):
            return isinstance(node, dict) and set(node) == set(space.spaces)
        return isinstance(node, tuple) and len(node) == len(space.spaces)

    def walk(node: Any, space: gym.Space, path: tuple) -> None:
        if not isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
            if not isinstance(node, Column):
                raise ValueError(f"{label(path)} holds a Dict/Tuple; its space is {space}")
            out[path] = _column_rows(node, leaves[path], rows, label(path))
        elif isinstance(node, Column):
            walk_items(node.to_list(), space, path)
        elif fits(node, space):
            for key in keys_of(space):
                walk(node[key], space[key], path + (key,))
        else:
            raise ValueError(f"{label(path)} does not have the structure of its space {space}")

    def walk_items(items: list, space: gym.Space, path: tuple) -> None:
        # Whole items per step (an object-path Column): split them leaf by leaf.
        if not isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
            out[path] = _stacked(items, leaves[path], rows, label(path))
            return
        for item in items:
            if not fits(item, space):
                raise ValueError(f"{label(path)} holds an item without the structure of its "
                                 f"space {space}: {item!r:.100}")
        for key in keys_of(space):
            walk_items([item[key] for item in items], space[key], path + (key,))

    walk(storage, space, ())
    return out


def _column_rows(col: Column, leaf: _Leaf, rows: int, what: str) -> Any:
    if len(col) != rows:
        raise ValueError(f"{what} holds {len(col)} rows, not {rows}")
    if leaf.kind != "text" and col.is_typed:
        arr = col.view()
        if arr is not None:
            return _checked_rows(arr, leaf, rows, what)
    return _stacked(col.to_list(), leaf, rows, what)


def _stacked(values: list, leaf: _Leaf, rows: int, what: str) -> Any:
    """Per-step values of a leaf as its rows (strings for a Text space)."""
    if len(values) != rows:
        raise ValueError(f"{what} holds {len(values)} rows, not {rows}")
    if leaf.kind == "text":
        if not all(isinstance(v, str) for v in values):
            raise ValueError(f"{what} holds other values than strings (its space is "
                             f"{leaf.space})")
        return list(values)
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError, OverflowError):
        arr = None
    if arr is None or arr.dtype.kind == "O":
        raise ValueError(f"{what} holds values that are not rows of shape {leaf.shape}")
    return _checked_rows(arr, leaf, rows, what)


def _checked_rows(arr: np.ndarray, leaf: _Leaf, rows: int, what: str) -> np.ndarray:
    if arr.shape != (rows,) + leaf.shape:
        raise ValueError(f"{what} has rows of shape {arr.shape[1:]}, but its space "
                         f"{leaf.space} has {leaf.shape}")
    if arr.dtype.kind not in leaf.dtype_kinds or arr.dtype.fields:
        raise ValueError(f"{what} holds {arr.dtype} values; its space {leaf.space} holds "
                         f"{_kinds(leaf.dtype_kinds)} values")
    return np.ascontiguousarray(arr)


def _extra_rows(buf: Any, n: int, what: str) -> np.ndarray:
    """An extra model output's rows: numbers, any row shape."""
    tree = buf._tree
    if not isinstance(tree, Column):
        raise ValueError(f"{what} is a Dict/Tuple: Minari's layout keeps arrays of numbers")
    arr = tree.view() if tree.is_typed else None
    if arr is None:
        try:
            arr = np.asarray(tree.to_list())
        except (ValueError, TypeError, OverflowError):
            arr = None
    if arr is None or arr.dtype.kind not in "biuf" or len(arr) != n:
        raise ValueError(f"{what} is not {n} rows of numbers")
    return np.ascontiguousarray(arr)


def _episode_tracks(ep: EpisodeCore, k: int, obs_space: gym.Space, action_space: gym.Space,
                    obs_leaves: Dict[tuple, _Leaf], action_leaves: Dict[tuple, _Leaf]) -> dict:
    """An episode's data as Minari stores it, checked against the spaces:
    leaf arrays, rewards and per-step flags, the infos as one array per
    leaf, the extras."""
    where = f"episode {k}"
    if ep.t_started != 0:
        raise ValueError(f"{where} starts at t={ep.t_started}: Minari keeps whole episodes "
                         f"from their reset (t_started == 0)")
    bufs = [ep.observations, ep.infos, ep.actions, ep.rewards,
            *ep.extra_model_outputs.values()]
    if any(b.lookback for b in bufs):
        raise ValueError(f"{where} has lookback rows: Minari has no place for them (give "
                         f"the episode from its reset, without lookback)")
    n = len(ep)
    if len(ep.observations) != n + 1:
        raise ValueError(f"{where} has no reset observation: Minari keeps episodes from "
                         f"their reset")
    if n == 0:
        raise ValueError(f"{where} has no steps: Minari's readers need one step or more per "
                         f"episode")
    obs = _track_rows(ep.observations._tree, obs_space, obs_leaves, n + 1,
                      f"{where}: observations")
    actions = _track_rows(ep.actions._tree, action_space, action_leaves, n,
                          f"{where}: actions")
    if isinstance(ep.rewards._tree, Column):
        rewards = _column_rows(ep.rewards._tree, _SCALAR_REWARD, n, f"{where}: rewards")
    else:
        raise ValueError(f"{where}: rewards are numbers, one per step")
    terminations, truncations = np.zeros(n, np.bool_), np.zeros(n, np.bool_)
    if n:
        terminations[-1], truncations[-1] = bool(ep.is_terminated), bool(ep.is_truncated)
    extras = {}
    for key, buf in ep.extra_model_outputs.items():
        what = f"{where}: {_EXTRAS}[{key!r}]"
        if not isinstance(key, str) or key in ("", ".") or "/" in key:
            raise ValueError(f"{what}: Minari's layout names them by strings without '/' "
                             f"(HDF5 names)")
        extras[key] = _extra_rows(buf, n, what)
    return {"obs": obs, "actions": actions, "rewards": rewards, "terminations": terminations,
            "truncations": truncations, "infos": _infos_tree(ep.get_infos(), f"{where}: infos"),
            "extras": extras, "n": n, "id_": ep.id_}


def _infos_tree(infos: list, what: str) -> dict:
    """The per-step info dicts as one array per leaf (Minari's form). Every
    step's info has one structure, as Minari keeps it."""
    first = infos[0]
    if not isinstance(first, dict):
        raise ValueError(f"{what}: an info is a dict, not {type(first).__name__}")
    return _info_leaves(infos, what)


def _info_leaves(values: list, what: str) -> dict:
    keys = list(values[0])
    out = {}
    for step, info in enumerate(values):
        if not isinstance(info, dict) or list(info) != keys:
            raise ValueError(f"{what}: step {step}'s info has keys "
                             f"{list(info) if isinstance(info, dict) else type(info).__name__}"
                             f", the reset's {keys}: Minari keeps one structure per episode")
    for key in keys:
        sub = f"{what}[{key!r}]"
        if not isinstance(key, str) or key in ("", ".") or "/" in key:
            raise ValueError(f"{sub}: Minari's layout names info keys by strings without '/' "
                             f"(HDF5 names)")
        column = [info[key] for info in values]
        head = column[0]
        if isinstance(head, dict):
            out[key] = _info_leaves(column, sub)
            continue
        kind = type(head)
        if any(type(v) is not kind for v in column):
            raise ValueError(f"{sub} changes type between steps: Minari stores one array "
                             f"per info key")
        if kind is str:
            out[key] = column
            continue
        if not (kind in (bool, int, float) or isinstance(head, (np.generic, np.ndarray))):
            raise ValueError(f"{sub} is a {kind.__name__}: Minari stores numbers, numpy "
                             f"arrays, strings and dicts of them")
        try:
            arr = np.asarray(column)
        except (ValueError, OverflowError):
            arr = None
        if arr is None or arr.dtype.kind not in "biuf" or arr.ndim < 1 or (
                isinstance(head, np.ndarray) and any(
                    v.dtype != head.dtype or v.shape != head.shape for v in column)) or (
                isinstance(head, np.generic) and any(v.dtype != head.dtype for v in column)):
            raise ValueError(f"{sub} does not stack into one array of numbers (a dtype or "
                             f"shape that changes between steps?)")
        out[key] = arr
    return out


def _check_spaces(episodes: list, metadata: dict) -> Tuple[gym.Space, gym.Space]:
    """The dataset's spaces: given as keywords, else the episodes' (one
    each), else the env_spec's env's."""
    spaces = []
    for key in ("observation_space", "action_space"):
        space = metadata.pop(key, None)
        if space is None:
            found = [getattr(ep, key) for ep in episodes if getattr(ep, key) is not None]
            if any(s != found[0] for s in found):
                raise ValueError(f"the episodes have different {key}s: give {key}=")
            space = found[0] if found else None
        if space is None and metadata.get("env_spec") is not None:
            with gym.make(_env_spec(metadata["env_spec"])) as env:
                space = getattr(env, key)
        if space is None:
            raise ValueError(f"Minari datasets name their {key}: give {key}= (the episodes "
                             f"have none)")
        if not isinstance(space, gym.Space):
            raise TypeError(f"{key} is a gymnasium space, not {type(space).__name__}")
        spaces.append(space)
    return spaces[0], spaces[1]


def _env_spec(value: Any) -> gym.envs.registration.EnvSpec:
    if isinstance(value, gym.envs.registration.EnvSpec):
        return value
    if isinstance(value, gym.Env):
        if value.spec is None:
            raise ValueError("an env without a spec names no env")
        return value.spec
    if isinstance(value, str):
        if value.lstrip().startswith("{"):
            return gym.envs.registration.EnvSpec.from_json(value)
        return gym.spec(value)
    raise TypeError(f"an env spec is an EnvSpec, an env or an env id, not "
                    f"{type(value).__name__}")


def _dataset_metadata(dataset_id: str, fmt: str, obs_space: gym.Space, act_space: gym.Space,
                      tracks: list, metadata: dict) -> dict:
    """metadata.json's content, in the order Minari writes it."""
    out: Dict[str, Any] = {
        "total_episodes": len(tracks),
        "total_steps": int(sum(t["n"] for t in tracks)),
        "data_format": fmt,
        "observation_space": json.dumps(_space_to_json(obs_space)),
        "action_space": json.dumps(_space_to_json(act_space)),
    }
    extra = dict(metadata)
    for key in ("env_spec", "eval_env_spec"):
        if extra.get(key) is not None:
            out[key] = _env_spec(extra.pop(key)).to_json()
        else:
            extra.pop(key, None)
    out["dataset_id"] = dataset_id
    for key in ("author", "author_email"):
        value = extra.get(key)
        if value is None:
            extra.pop(key, None)
        elif isinstance(value, str):
            extra[key] = [value]
        elif isinstance(value, (set, frozenset, list, tuple)) and all(
                isinstance(v, str) for v in value):
            extra[key] = sorted(value) if isinstance(value, (set, frozenset)) else list(value)
        else:
            raise TypeError(f"{key} is a string or a set of strings, not {value!r:.100}")
    for key in ("algorithm_name", "code_permalink", "description"):
        if key in extra and extra[key] is not None and not isinstance(extra[key], str):
            raise TypeError(f"{key} is a string, not {type(extra[key]).__name__}")
    for key, value in extra.items():
        if value is None:
            continue
        try:
            json.dumps(value, allow_nan=True)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"metadata {key!r} is not JSON-serializable ({exc})") from None
        out[key] = value
    out["minari_version"] = _written_version()
    return out


def _written_version() -> str:
    """The minari_version written: the installed Minari's when its layout is
    the one written here (it then opens the dataset), else the newest such."""
    try:
        import importlib.metadata
        version = importlib.metadata.version("minari")
    except Exception:
        return _NEWEST_LAYOUT
    return version if _LAYOUT_VERSION.match(version) else _NEWEST_LAYOUT


def _encode_images(arr: np.ndarray) -> List[bytes]:
    """Each frame as a PNG picture (a one-channel frame as a grey one)."""
    Image = _pil_image()
    out = []
    for frame in arr:
        if frame.ndim == 3 and frame.shape[2] == 1:
            frame = frame[:, :, 0]
        try:
            img = Image.fromarray(frame)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"pictures of shape {frame.shape} have no PNG form ({exc})") \
                from None
        buf = io.BytesIO()
        # PNG, not Minari's JPEG: the pictures read back exactly.
        img.save(buf, format="PNG", compress_level=1)
        out.append(buf.getvalue())
    return out


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


def _folder_size_mb(path: pathlib.Path) -> float:
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return round(size / 1e6, 1)


def to_minari(episodes: Iterable[Any], dataset_id: str, *, data_format: str = "hdf5",
              root: Union[str, os.PathLike, None] = None, **metadata: Any) -> pathlib.Path:
    """Writes `episodes` as the Minari dataset `dataset_id` and returns its
    folder (``<root>/<dataset_id>``, which ``minari.load_dataset(dataset_id)``
    opens when `root` is Minari's datasets folder).

    Args:
        episodes: single-agent episodes (ours or RLlib's, list-mode or
            numpy'd), each whole from its reset (``t_started == 0``, no
            lookback rows) to its end (terminated or truncated).
        dataset_id: Minari's ``(namespace/)name-v<N>``; the dataset must not
            exist yet.
        data_format: "hdf5" (Minari's default), "arrow" or "parquet".
        root: the datasets folder (default: $MINARI_DATASETS_PATH, else
            ~/.minari/datasets, as Minari finds it).
        **metadata: what Minari's ``create_dataset_from_buffers`` takes and
            keeps: ``author``, ``author_email``, ``algorithm_name``,
            ``code_permalink``, ``description``, ``requirements``,
            ``env_spec``/``eval_env_spec`` (an EnvSpec, env or env id),
            ``ref_min_score``, ``ref_max_score``, ... (any JSON-serializable
            value); and ``observation_space``/``action_space`` when the
            episodes have none.

    Each episode's observations (N+1 rows), actions, rewards, infos (every
    step's info of one structure: numbers, numpy arrays, strings or dicts of
    them) and its end (terminations/truncations, set at the last step only)
    are stored as Minari stores them; its ``id_`` and extra model outputs
    too, where Minari reads past them. Pictures (image spaces) are stored as
    PNG, which Minari opens, so they read back exactly.

    The dataset is written in a hidden folder beside its place and renamed
    into it at the end: a write that fails leaves nothing behind.

    Raises:
        ValueError: a multi-agent episode, one that does not start at its
            reset or has lookback rows, one still running (not done), data that does not match the spaces,
            infos whose structure changes between steps, a malformed id or
            an existing dataset.
        TypeError: something other than episodes or a metadata value of the
            wrong type.
    """
    if not isinstance(dataset_id, str) or not _VERSIONED_ID.match(dataset_id):
        raise ValueError(f"a Minari dataset id is (namespace/)name-v<version>, not "
                         f"{dataset_id!r:.100}")
    if data_format not in _FORMATS:
        raise ValueError(f"data_format is one of {_FORMATS}, not {data_format!r:.50}")
    reserved = _RESERVED.intersection(metadata)
    if reserved:
        raise ValueError(f"to_minari writes {sorted(reserved)} itself")
    if isinstance(episodes, (EpisodeCore, str, bytes)) or not isinstance(episodes, Iterable):
        raise TypeError(f"episodes are an iterable of episodes, not "
                        f"{type(episodes).__name__}")
    episodes = [_as_ours(ep, k) for k, ep in enumerate(episodes)]
    obs_space, act_space = _check_spaces(episodes, metadata)
    obs_leaves, action_leaves = _leaves(obs_space), _leaves(act_space)
    by_path = ({leaf.path: leaf for leaf in obs_leaves},
               {leaf.path: leaf for leaf in action_leaves})
    tracks = [_episode_tracks(ep, k, obs_space, act_space, *by_path)
              for k, ep in enumerate(episodes)]
    _same_dtypes(tracks, obs_leaves, action_leaves)
    content = _dataset_metadata(dataset_id, data_format, obs_space, act_space, tracks, metadata)
    for k, ep in enumerate(episodes):
        if not (ep.is_terminated or ep.is_truncated):
            raise ValueError(f"episode {k} is still running (neither terminated nor "
                             f"truncated): to_minari writes complete episodes; finish it, or "
                             f"mark it cut off with episode.is_truncated = True")

    base = _datasets_root(root)
    target = base / dataset_id
    if os.path.lexists(target):
        raise ValueError(f"a Minari dataset {dataset_id!r} already exists at {target}")
    base.mkdir(parents=True, exist_ok=True)
    aside = pathlib.Path(tempfile.mkdtemp(prefix=".episode-minari-", dir=base))
    try:
        data = aside / "data"
        data.mkdir()
        if data_format == "hdf5":
            _write_hdf5(data, tracks, obs_leaves, action_leaves)
        else:
            _write_arrow(data, tracks, obs_space, act_space, data_format)
        content["dataset_size"] = _folder_size_mb(data)
        with open(data / _METADATA, "w") as fh:
            json.dump(content, fh)
        _make_namespaces(base, dataset_id)
        if os.path.lexists(target):
            raise ValueError(f"a Minari dataset {dataset_id!r} appeared at {target} while "
                             f"this one was written")
        os.rename(aside, target)
    except BaseException:
        shutil.rmtree(aside, ignore_errors=True)
        raise
    return target


def _make_namespaces(base: pathlib.Path, dataset_id: str) -> None:
    """The namespace folders of `dataset_id`, each with the (empty) metadata
    file Minari's namespaces have."""
    parts = dataset_id.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        folder = base.joinpath(*parts[:depth])
        folder.mkdir(exist_ok=True)
        meta = folder / _NAMESPACE_METADATA
        if not meta.exists():
            with open(meta, "w") as fh:
                json.dump({}, fh)


def _same_dtypes(tracks: list, obs_leaves: list, action_leaves: list) -> None:
    """Every episode stores a leaf in one dtype: a dataset has one schema."""
    for key, leaves in (("obs", obs_leaves), ("actions", action_leaves)):
        for leaf in leaves:
            if leaf.kind == "text":
                continue
            dtypes = {t[key][leaf.path].dtype for t in tracks}
            if len(dtypes) > 1:
                raise ValueError(f"{leaf.describe(key)} is stored as "
                                 f"{sorted(map(str, dtypes))} in different episodes: a "
                                 f"dataset has one dtype per leaf")
