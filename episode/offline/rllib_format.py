"""RLlib 2.60's recorded formats, read and written by the engine.

RLlib records experience in one of two layouts (``config.offline_data(
output=..., output_write_episodes=...)``):

* episodes (the default): one row per episode, a binary column ``item``
  holding ``msgpack.packb(episode.get_state(), default=msgpack_numpy.encode)``.
  :func:`pack_episode` and :func:`unpack_episode` write and read it byte for
  byte with msgpack (msgpack_numpy's maps made and read here);
* rows: one row per timestep with RLlib's column names (``eps_id``,
  ``agent_id``, ``module_id``, ``obs``, ``actions``, ``rewards``, ``new_obs``,
  ``terminateds``, ``truncateds``, then each extra model output), the columns
  in ``output_compress_columns`` "packed" (``ray.rllib.utils.compression.
  pack``: base64 of an lz4 frame of a pickle). :func:`episode_rows` writes
  it, :func:`rows_to_episodes` and :func:`sample_batches_to_episodes` read
  it (and the old stack's SampleBatch rows).

Packed values are unpickled by a restricted unpickler that knows only what a
pickled numpy array or scalar needs: a dataset never runs code. pyarrow
and lz4 are imported on first use.
"""
from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import gc
import io
import json
import math
import pickle
import pickletools
import re
import sys
import uuid
from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from episode._column import KINDS, Column
from episode._episode import REWARDS_SPACE, make_episode
from episode.single_agent_episode import SingleAgentEpisode
from episode.spaces import space_from_dict, space_to_dict

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

__all__ = [
    "EPISODES_FORMAT", "ROWS_FORMAT", "SCHEMA", "detect_format", "episode_rows", "pack_episode",
    "pack_episodes", "pack_value", "rows_to_episodes", "safe_loads", "sample_batches_to_episodes",
    "to_numpy_batch", "unpack_episode", "unpack_episodes", "unpack_value",
]

#: What :func:`detect_format` calls RLlib's episode format and its row format.
EPISODES_FORMAT = "rllib_episodes"
ROWS_FORMAT = "rllib_rows"

#: RLlib's default input schema (``ray.rllib.offline.offline_prelearner.SCHEMA``):
#: its column names, each mapped to the dataset's column. A ``schema`` argument
#: (RLlib's ``input_read_schema``) overrides some of them.
SCHEMA = {
    "eps_id": "eps_id", "agent_id": "agent_id", "module_id": "module_id", "obs": "obs",
    "actions": "actions", "rewards": "rewards", "infos": "infos", "new_obs": "new_obs",
    "terminateds": "terminateds", "truncateds": "truncateds", "t": "t",
    "agent_index": "agent_index", "dones": "dones", "unroll_id": "unroll_id",
}

# Columns RLlib's readers never take as extra model outputs, besides the schema's.
_NOT_EXTRAS = ("dones", "agent_index", "type")

# Ray Data's tensor column types (``ArrowTensorTypeV2`` and its predecessor):
# storage is a list of each row's flattened elements, the row shape is JSON.
_TENSOR_TYPES = ("ray.data.arrow_tensor_v2", "ray.data.arrow_tensor")
_RAGGED_TENSOR_TYPE = "ray.data.arrow_variable_shaped_tensor"
# Ray Data's column of pickled Python objects (what it makes of values Arrow
# has no type for: RLlib's recorder writes Tuple observations so).
_PICKLED_TYPE = "ray.data.arrow_pickled_object"


@contextlib.contextmanager
def no_collections():
    """Building thousands of episodes allocates containers that all stay
    alive: the cyclic collector would walk them (and everything older) over
    and over while none of them can be garbage. It is off for the call."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _lz4_frame():
    try:
        import lz4.frame
    except ImportError as error:  # pragma: no cover - ray[rllib] depends on lz4
        raise ImportError("reading or writing RLlib's packed columns needs the lz4 package "
                          "(pip install lz4; ray[rllib] depends on it)") from error
    return lz4.frame


# -- the episode format ----------------------------------------------------------------


def pack_episode(episode: SingleAgentEpisode) -> bytes:
    """The episode as RLlib's recording packs it: the very bytes of
    ``msgpack.packb(episode.get_state(), default=msgpack_numpy.encode)`` for
    RLlib's episode with the same data.

    Unlike RLlib's ``get_state()``, an extra model output that holds only
    lookback rows (a ``cut()`` successor's) is packed as its state; RLlib
    hands msgpack the buffer object itself, which cannot be packed.
    """
    return packb(episode.get_state())


def pack_episodes(episodes: Iterable[SingleAgentEpisode]) -> list[bytes]:
    """:func:`pack_episode` of each episode (a column's worth of ``item`` values)."""
    packer = msgpack.Packer(default=_encode)
    return [packer.pack(episode.get_state()) for episode in episodes]


def unpack_episode(blob: Any) -> SingleAgentEpisode:
    """The episode a packed state (bytes-like) describes: what
    ``SingleAgentEpisode.from_state(msgpack.unpackb(blob,
    object_hook=msgpack_numpy.decode))`` gives, item by item and type by type.

    A numeric track's per-step arrays are joined into one rows array. Raises
    ValueError for truncated or corrupt bytes and AssertionError, as RLlib
    does, for tracks of inconsistent lengths.
    """
    return _Decoder(SingleAgentEpisode).decode(blob)


def unpack_episodes(blobs: Any) -> list[SingleAgentEpisode]:
    """:func:`unpack_episode` of each value of `blobs`: a list (or numpy
    object array, as Ray Data hands a batch) of bytes, or a pyarrow binary
    array or chunked array, read in place. The episodes share their space
    objects (as the episodes of one env runner share its env's)."""
    with no_collections():
        return _unpack_episodes(blobs)


def _unpack_episodes(blobs: Any) -> list[SingleAgentEpisode]:
    pa = sys.modules.get("pyarrow")
    if pa is not None and isinstance(blobs, pa.ChunkedArray):
        out: list = []
        for chunk in blobs.chunks:
            out.extend(_unpack_episodes(chunk))
        return out
    if pa is not None and isinstance(blobs, pa.Array):
        t = blobs.type
        if not (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
            raise TypeError(f"packed episodes are an Arrow binary array, not {t}")
        if blobs.null_count:
            row = blobs.is_null().to_numpy(zero_copy_only=False).argmax()
            raise ValueError(f"packed episode {row} is null")
        _, offsets, data = blobs.buffers()
        width = np.int64 if pa.types.is_large_binary(t) else np.int32
        n = len(blobs)
        if offsets is None or offsets.size < (blobs.offset + n + 1) * np.dtype(width).itemsize:
            raise ValueError("corrupt Arrow binary array: its offsets are missing or short")
        offs = np.frombuffer(offsets, width)[blobs.offset:blobs.offset + n + 1]
        return _arrow_episodes(b"" if data is None else data, offs)
    return _decoded_episodes(blobs)


# msgpack's C unpacker makes each step's msgpack-numpy map (no object hook);
# a track whose maps all describe arrays of one dtype and shape (or numbers,
# or empty infos) then becomes one rows array by a join of their data bytes,
# checked by C-level passes over the maps (``map`` of ``itemgetter``, ``set``),
# no Python code run per step. Anything else is decoded item by item, as
# msgpack_numpy's object hook would, and goes through ``from_state``.

# The keys of RLlib's get_state(), in its order; all but custom_data are required.
_STATE_KEYS = ("id_", "agent_id", "module_id", "multi_agent_episode_id", "observations",
              "actions", "rewards", "infos", "extra_model_outputs", "is_terminated",
              "is_truncated", "t_started", "t", "_observation_space", "_action_space",
              "_start_time", "_last_step_time", "custom_data")
_REQUIRED = _STATE_KEYS[:-1]
_KNOWN = frozenset(_STATE_KEYS)
_TRACK_KEYS = {"data", "lookback", "finalized", "space"}
_MAX_DEPTH = 32

_ND = itemgetter(b"nd")
_FLOAT, _INT, _BOOL, _SCALAR, _ARRAY, _EMPTY_DICT = (
    KINDS[k] for k in ("float", "int", "bool", "scalar", "array", "empty_dict"))
_ND_FIELDS = itemgetter(b"nd", b"type", b"kind", b"shape")
_SCALAR_FIELDS = itemgetter(b"nd", b"type")
_DATA = itemgetter(b"data")
_MAX_NESTING = 512      # (Python recursion: msgpack itself unpacks 1,024 levels)


def _decoded(value: Any, depth: int = 0) -> Any:
    # What the object hook would have made of a value unpacked without it
    # (maps inside out, as msgpack calls it).
    if depth > _MAX_NESTING:
        raise ValueError(f"a packed value nested deeper than {_MAX_NESTING} levels")
    t = type(value)
    if t is list:
        return [_decoded(v, depth + 1) for v in value]
    if t is dict:
        return _decode({k: _decoded(v, depth + 1) for k, v in value.items()})
    return value


class _NotFast(Exception):
    """A state in a layout the track reader does not take: from_state does."""


def _rows(items: list, tree: bool, depth: int = 0) -> Any:
    """The storage of a list-mode track's items when they are uniform (one
    Column over one rows array, or with `tree` a dict of them for dict
    items); None for anything else."""
    n = len(items)
    if n == 0:
        return Column.from_list([])
    types = set(map(type, items))
    if len(types) != 1:
        return None
    t = types.pop()
    if t is float:
        return Column.from_rows(np.array(items, dtype=np.float64), _FLOAT)
    if t is bool:
        return Column.from_rows(np.array(items, dtype=np.bool_), _BOOL)
    if t is int:
        try:
            return Column.from_rows(np.array(items, dtype=np.int64), _INT)
        except OverflowError:
            return None
    if t is not dict:
        return None
    if not any(items):
        return Column.from_rows(n, _EMPTY_DICT)
    first = items[0]
    if b"nd" in first:
        return _nd_rows(items, first)
    if not tree or depth >= _MAX_DEPTH:
        return None
    keys = tuple(first)
    if not all(type(k) is str for k in keys) or set(map(tuple, items)) != {keys}:
        return None
    out = {}
    for key in keys:
        child = _rows(list(map(itemgetter(key), items)), True, depth + 1)
        if child is None:
            return None
        out[key] = child
    return out


def _nd_rows(items: list, first: dict) -> Any:
    # msgpack-numpy maps of one plain dtype (and shape): their data joined.
    n = len(items)
    nd = first[b"nd"]
    try:
        if nd is True and len(first) == 5:
            head = _ND_FIELDS(first)
            if list(map(_ND_FIELDS, items)).count(head) != n or set(map(len, items)) != {5} \
                    or head[2] != b"" or type(head[3]) is not list:
                return None
            shape = _shape(head[3])
        elif nd is False and len(first) == 3:
            head = _SCALAR_FIELDS(first)
            if list(map(_SCALAR_FIELDS, items)).count(head) != n or set(map(len, items)) != {3}:
                return None
            shape = ()
        else:
            return None
        if set(map(type, map(_ND, items))) != {bool}:     # (1 == True in the counts above)
            return None
        dtype = _dtype(head[1])
        datas = list(map(_DATA, items))
        joined = b"".join(datas)      # (TypeError for data that are not bytes)
    except (KeyError, TypeError, ValueError):
        return None
    row_bytes = math.prod(shape) * dtype.itemsize
    if dtype.kind not in "biufc" or not dtype.isnative or set(map(len, datas)) != {row_bytes}:
        return None
    rows = np.frombuffer(joined, dtype).reshape((n,) + shape)
    return Column.from_rows(rows, _ARRAY if nd else _SCALAR)


def _arrays(data: Any, tree: bool, depth: int = 0) -> Any:
    """A finalized track's data: one msgpack-numpy array of a plain dtype
    and at least one row (a Column over a copy), or with `tree` a dict of
    them; None for anything else."""
    if type(data) is not dict or depth > _MAX_DEPTH:
        return None
    if b"nd" in data:
        if data[b"nd"] is not True or data.get(b"kind") != b"" or len(data) != 5:
            return None
        try:
            arr = _decode(data)
        except ValueError:
            return None
        if type(arr) is not np.ndarray or arr.ndim < 1 or arr.shape[0] == 0 or arr.dtype.kind not in "biufc" \
                or not arr.dtype.isnative:
            return None
        return Column.from_array(arr)
    if not tree or not data or not all(type(k) is str for k in data):
        return None
    out = {}
    for key, value in data.items():
        child = _arrays(value, True, depth + 1)
        if child is None:
            return None
        out[key] = child
    return out


def _track_state(state: Any, tree: bool) -> tuple:
    """(storage, lookback, space description) of a buffer's state
    {data, lookback, finalized, space}; _NotFast for another layout."""
    if type(state) is not dict or state.keys() != _TRACK_KEYS:
        raise _NotFast()
    data, finalized, lookback = state["data"], state["finalized"], state["lookback"]
    if type(finalized) is not bool or type(lookback) is not int:
        raise _NotFast()
    if finalized:
        storage = _arrays(data, tree)
        if storage is None:
            raise _NotFast()
    elif type(data) is list:
        storage = _rows(data, tree)
        if storage is None:
            storage = Column.from_list(_decoded(data))
    else:
        raise _NotFast()
    return storage, lookback, state["space"]


class _Decoder:
    """Builds episodes of class `cls` from packed states; the spaces, alike
    in every episode of a recording, are built once per call."""

    def __init__(self, cls: type):
        self.cls = cls
        self.spaces: dict = {}
        self.rewards_space = _unpackb(packb(space_to_dict(REWARDS_SPACE)), None)

    def space(self, described: Any) -> Any:
        """The space a state's description (as unpacked, without the object
        hook) names, or None."""
        if not described:
            return None     # (RLlib: gym_space_from_dict(d) if d else None)
        key = repr(described)
        found = self.spaces.get(key, self)
        if found is not self:
            return found
        described = _decoded(described)
        try:
            space = space_from_dict(described)
        except MemoryError:
            raise
        except Exception as error:     # noqa: BLE001 - zlib, numpy, gymnasium errors
            raise ValueError(f"a packed space that describes none ({type(error).__name__}: "
                             f"{error}): {described!r:.200}") from error
        if len(self.spaces) < 1024:
            self.spaces[key] = space
        return space

    def decode(self, blob: Any) -> Any:
        state = _unpackb(blob, None)
        if type(state) is not dict:
            raise ValueError(f"an episode state is a map, not {type(state).__name__}")
        try:
            return self.fast(state)
        except _NotFast:
            pass
        state = _decoded(state)
        for name in _REQUIRED:
            if name not in state:
                raise ValueError(f"the episode state has no {name!r}")
        try:
            return self.cls.from_state(state)
        except (ValueError, TypeError, AssertionError, MemoryError):
            raise       # (AssertionError: RLlib's, for tracks of inconsistent lengths)
        except KeyError as error:
            raise ValueError(f"a part of the episode state has no {error}") from error
        except Exception as error:     # noqa: BLE001 - corrupt parts fail in their own ways
            raise ValueError(f"a corrupt episode state ({type(error).__name__}: {error})") \
                from error

    def fast(self, state: dict) -> Any:
        if not state.keys() <= _KNOWN:
            raise _NotFast()
        for name in _REQUIRED:
            if name not in state:
                raise ValueError(f"the episode state has no {name!r}")
        obs, act, rew, inf = (_track_state(state["observations"], True),
                              _track_state(state["actions"], True),
                              _track_state(state["rewards"], True),
                              _track_state(state["infos"], False))
        extras_state = state["extra_model_outputs"]
        if extras_state is None:
            extras_state = {}
        elif type(extras_state) is not dict:
            raise _NotFast()
        extras = {}
        for name, value in extras_state.items():
            if type(name) is not str and type(name) is not bytes:
                raise ValueError(f"a map key must be str or bytes, not {type(name).__name__}")
            extras[name] = _track_state(value, True)
        t_started, t = state["t_started"], state["t"]
        if type(t_started) is not int or type(t) is not int:
            raise _NotFast()
        lookbacks = {e[1] for e in extras.values()}
        if len(lookbacks) > 1 or t != t_started + len(rew[0]) - rew[1]:
            raise _NotFast()
        value = _values(state)
        obs_described, act_described = state["_observation_space"], state["_action_space"]
        episode = make_episode(
            self.cls, value("id_"), obs[0], inf[0], act[0], rew[0],
            {name: e[0] for name, e in extras.items()},
            (obs[1], inf[1], act[1], rew[1], lookbacks.pop() if lookbacks else 0),
            value("is_terminated"), value("is_truncated"), t_started,
            self.space(obs_described), self.space(act_described), value("agent_id"),
            value("module_id"), value("multi_agent_episode_id"), value("_start_time"),
            value("_last_step_time"), value("custom_data") or {}, defaultdict_extras=True)
        # Each buffer's own space, where it is not the one make_episode gave it.
        for buf, track, given in ((episode.observations, obs, obs_described),
                                  (episode.actions, act, act_described),
                                  (episode.rewards, rew, self.rewards_space),
                                  (episode.infos, inf, None),
                                  *((episode.extra_model_outputs[name], e, None)
                                    for name, e in extras.items())):
            if not _same_description(track[2], given):
                buf.space = self.space(track[2])
        return episode


def _values(state: dict) -> Any:
    # A state's plain values, decoded as the object hook would (maps, lists).
    def value(key: str) -> Any:
        v = state.get(key)
        return _decoded(v) if type(v) is dict or type(v) is list else v
    return value


def _same_description(a: Any, b: Any) -> bool:
    # (Descriptions as unpacked: plain values, whose == does not raise.)
    return type(a) is type(b) and a == b


def _raise_at(error: Exception, i: int) -> None:
    cls = AssertionError if isinstance(error, AssertionError) else \
        TypeError if isinstance(error, TypeError) else ValueError
    raise cls(f"packed episode {i}: {error}") from error


def _decoded_episodes(blobs: Iterable[Any]) -> list:
    # Each packed episode, sharing the spaces; an item that fails raises its
    # error with its position.
    decoder = _Decoder(SingleAgentEpisode)
    out = []
    for i, blob in enumerate(blobs):
        try:
            out.append(decoder.decode(blob))
        except (ValueError, TypeError, AssertionError) as error:
            _raise_at(error, i)
    return out


def _arrow_episodes(data: Any, offsets: np.ndarray) -> list:
    # The packed episodes of an Arrow binary array, read in place: `data` its
    # data buffer, `offsets` its len + 1 value offsets (already shifted by
    # the array's offset), checked first.
    offs = np.asarray(offsets, dtype=np.int64)
    view = memoryview(data).cast("B")
    if offs.ndim != 1 or len(offs) < 1:
        raise ValueError("Arrow offsets are a 1-d array of len + 1 values")
    bad = (offs < 0) | (offs > len(view))
    bad[1:] |= offs[1:] < offs[:-1]
    if bad.any():
        i = int(bad.argmax())
        raise ValueError(f"corrupt Arrow offsets: value {i} is {offs[i]} (data of "
                         f"{len(view)} bytes)")
    edges = offs.tolist()
    return _decoded_episodes(map(view.__getitem__, map(slice, edges[:-1], edges[1:])))


# -- packed values (RLlib's compression.pack) --------------------------------------------

# A pickled ndarray, numpy scalar or dtype names numpy functions and hands
# numpy's own __setstate__ methods whatever state the bytes hold; numpy
# trusts those states (a corrupt dtype state can crash the interpreter). The
# restricted unpickler therefore gives the pickle stand-ins instead: they
# take the same arguments and states, check them, and only then build the
# arrays with numpy's public constructors (np.dtype of a type string,
# np.frombuffer of bytes of the right length).

_PLAIN_KINDS = "biufcUSO"     # the dtype kinds read: numbers, bool, str, bytes, objects


class _Dtype:
    """Stands in for numpy.dtype(type, align, copy) and its __setstate__."""

    __slots__ = ("dtype",)
    dtype: Any

    def __new__(cls, *args: Any) -> "_Dtype":
        self = object.__new__(cls)
        self.dtype = None
        if args:
            text = args[0]
            if type(text) is not str or len(text) > 16:
                raise ValueError(f"a pickled dtype of type {text!r:.40}")
            try:
                dtype = np.dtype(text)
            except (TypeError, ValueError, SyntaxError) as error:   # ("(2,)f4": ast)
                raise ValueError(f"a pickled dtype {text!r}: {error}") from error
            if dtype.kind not in _PLAIN_KINDS or dtype.fields is not None or dtype.subdtype:
                raise ValueError(f"a pickled dtype of kind {dtype.kind!r} ({text!r}) is not read")
            self.dtype = dtype
        return self

    def __setstate__(self, state: Any) -> None:
        if self.dtype is None:
            raise ValueError("a pickled dtype state without its type")
        if type(state) is not tuple or len(state) not in (8, 9) or state[0] not in (3, 4):
            raise ValueError(f"a pickled dtype state {state!r:.80}")
        endian, subarray, names, fields, elsize, alignment, flags = state[1:8]
        if endian not in ("<", ">", "|", "=") or subarray is not None or names is not None \
                or fields is not None or (len(state) == 9 and state[8] is not None) \
                or type(elsize) is not int or type(alignment) is not int or type(flags) is not int:
            raise ValueError(f"a pickled dtype state {state!r:.80}")
        if elsize not in (-1, self.dtype.itemsize):
            raise ValueError(f"a pickled {self.dtype} of {elsize} bytes")
        if endian != "|" and self.dtype.byteorder != "|":
            self.dtype = self.dtype.newbyteorder(endian)


def _dtype_of(value: Any) -> np.dtype:
    if type(value) is not _Dtype or value.dtype is None:
        raise ValueError(f"a pickled array's dtype is {type(value).__name__}")
    return value.dtype


def _checked_shape(shape: Any) -> tuple:
    if type(shape) is not tuple or len(shape) > 64 or not all(
            type(d) is int and 0 <= d < 1 << 48 for d in shape):
        raise ValueError(f"a pickled array of shape {shape!r:.80}")
    return shape


def _array_of(data: Any, dtype: np.dtype, shape: tuple, order: Any) -> np.ndarray:
    # The array numpy would rebuild, from data checked to hold exactly it.
    if dtype.kind == "O":
        if type(data) is not list or len(data) != math.prod(shape):
            raise ValueError("a pickled object array without a list of its items")
        out = np.empty(len(data), dtype=object)
        for i, item in enumerate(data):
            out[i] = _materialized(item)
        return out.reshape(shape, order=order)
    if not isinstance(data, (bytes, bytearray)):
        raise ValueError(f"a pickled array's data is {type(data).__name__}")
    if len(data) != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"a pickled {dtype} array of shape {shape} holds {len(data)} bytes")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order=order).copy(order="K")


def _frombuffer(data: Any, dtype: Any, shape: Any, order: Any) -> np.ndarray:
    """Stands in for numpy._core.numeric._frombuffer (protocol 5's arrays)."""
    if order not in ("C", "F"):
        raise ValueError(f"a pickled array of order {order!r:.20}")
    return _array_of(data, _dtype_of(dtype), _checked_shape(shape), order)


class _Ndarray:
    """Stands in for numpy.ndarray as _reconstruct's first argument."""


class _Reconstructed:
    """Stands in for _reconstruct(ndarray, (0,), b"b") and the array's
    __setstate__ (protocols 2 to 4, and arrays that are not contiguous)."""

    __slots__ = ("array",)
    array: Any

    def __new__(cls) -> "_Reconstructed":
        self = object.__new__(cls)
        self.array = None
        return self

    def __setstate__(self, state: Any) -> None:
        if type(state) is not tuple or len(state) != 5 or state[0] != 1 \
                or type(state[3]) is not bool:
            raise ValueError(f"a pickled array state {state!r:.80}")
        _, shape, dtype, fortran, data = state
        self.array = _array_of(data, _dtype_of(dtype), _checked_shape(shape),
                               "F" if fortran else "C")


def _reconstruct(cls: Any, shape: Any, typecode: Any) -> _Reconstructed:
    if cls is not _Ndarray:
        raise ValueError("_reconstruct of anything but an ndarray")
    return _Reconstructed()


def _scalar(dtype: Any, data: Any = None) -> Any:
    """Stands in for numpy._core.multiarray.scalar (numpy scalars)."""
    dtype = _dtype_of(dtype)
    if dtype.kind == "O":
        return _materialized(data)
    if not isinstance(data, (bytes, bytearray)) or len(data) != dtype.itemsize:
        raise ValueError(f"a pickled {dtype} scalar of {type(data).__name__}")
    return np.frombuffer(data, dtype=dtype)[0]


def _codecs_encode(text: Any, encoding: Any = "utf-8") -> bytes:
    # Protocol 2 writes bytes as _codecs.encode(str, "latin1").
    if type(text) is not str or encoding not in ("latin1", "latin-1"):
        raise ValueError("_codecs.encode of anything but latin-1 text")
    return text.encode("latin1")


def _empty_bytes(*args: Any) -> bytes:
    # Protocol 2 writes b"" as bytes().
    if args:
        raise ValueError("bytes() with arguments in a pickle")
    return b""


def _materialized(value: Any) -> Any:
    # What a stand-in stands for (inside plain containers, too).
    t = type(value)
    if t is _Reconstructed:
        if value.array is None:
            raise ValueError("a pickled array without its state")
        return value.array
    if t is _Dtype:
        return _dtype_of(value)
    if t is list:
        return [_materialized(v) for v in value]
    if t is tuple:
        return tuple(_materialized(v) for v in value)
    if t is dict:
        return {_materialized(k): _materialized(v) for k, v in value.items()}
    if t is _Ndarray or t is type:
        raise ValueError("a pickle of a class")
    return value


# What a pickled ndarray, numpy scalar or dtype names (numpy 2's modules and
# numpy 1.x's), and the stand-in each gets.
_STAND_INS = {
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "scalar"): _scalar,
    ("numpy.core.multiarray", "scalar"): _scalar,
    ("numpy", "ndarray"): _Ndarray,
    ("numpy", "dtype"): _Dtype,
    ("_codecs", "encode"): _codecs_encode,
    ("builtins", "bytes"): _empty_bytes,
    ("__builtin__", "bytes"): _empty_bytes,
}


class _NumpyUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays, scalars and dtypes (and plain containers of
    them) through checked stand-ins; any other global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        found = _STAND_INS.get((module, name))
        if found is None:
            raise ValueError(f"the pickle names {module}.{name}: only numpy arrays and scalars "
                             "are read from a dataset (no pickle may run code)")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise ValueError("the pickle refers to a persistent object")


_MEMO_PUTS = ("PUT", "BINPUT", "LONG_BINPUT")


def safe_loads(data: Any) -> Any:
    """``pickle.loads(data)`` for pickles of numpy arrays, scalars and
    dtypes (and lists, tuples, dicts and plain values holding them): numpy
    only ever sees checked type strings and buffers of the right size. A
    pickle that names any other global, or a corrupt one, raises ValueError
    before any code of its choosing could run."""
    try:
        # A walk over the opcodes first: a length field longer than the data,
        # or a memo index beyond any object count (corrupt ones), would
        # otherwise have the unpickler allocate that much.
        for op, arg, _ in pickletools.genops(data):
            if op.name in _MEMO_PUTS and isinstance(arg, int) and arg > len(data):
                raise ValueError(f"a memo index of {arg} in {len(data)} bytes")
    except Exception as error:
        raise ValueError(f"corrupt pickle in a packed value: {error}") from error
    try:
        return _materialized(_NumpyUnpickler(io.BytesIO(data)).load())
    except ValueError:
        raise
    except Exception as error:
        # A corrupt pickle fails wherever its bytes lead (the unpickler's own
        # errors, a stand-in called with the wrong arguments).
        raise ValueError(f"corrupt pickle in a packed value: {type(error).__name__}: "
                         f"{error}") from error


def pack_value(value: Any) -> str:
    """``ray.rllib.utils.compression.pack(value)``: base64 (ASCII str) of an
    lz4 frame of the pickle. For ndarrays the bytes are RLlib's own (the
    standard pickler writes what cloudpickle writes for them)."""
    data = pickle.dumps(value, protocol=5)
    return base64.b64encode(_lz4_frame().compress(data)).decode("ascii")


def unpack_value(packed: Any) -> Any:
    """``ray.rllib.utils.compression.unpack(packed)`` (a str or bytes) with the
    restricted unpickler: ValueError for anything but base64 of an lz4 frame
    of a numpy pickle."""
    if not isinstance(packed, (str, bytes)):
        raise TypeError(f"a packed value is a str, not {type(packed).__name__}")
    try:
        raw = base64.b64decode(packed)
    except (binascii.Error, ValueError) as error:
        raise ValueError(f"a packed value is not base64: {error}") from error
    try:
        raw = _lz4_frame().decompress(raw)
    except RuntimeError as error:
        raise ValueError(f"a packed value is not an lz4 frame: {error}") from error
    return safe_loads(raw)


def _unpack_if_needed(value: Any) -> Any:
    # compression.unpack_if_needed: strings and bytes are packed values.
    return unpack_value(value) if isinstance(value, (str, bytes)) else value


# How every packed value begins: the base64 of an lz4 frame's magic number.
_PACKED_PREFIX = "BCJNG"


def _is_packed(values: Any, listed: bool) -> bool:
    """Whether a column holds packed values: cells of str or bytes (the
    first that is not None decides) in a column named packed (RLlib's
    ``input_compress_columns``), or, in any column, ones that begin as every
    packed value does (RLlib's recorder packs what its
    ``output_compress_columns`` named, which a reader may not know)."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        return False
    for value in values:
        if value is None:
            continue
        if isinstance(value, bytes):
            value = value[:len(_PACKED_PREFIX)].decode("ascii", "replace")
        if not isinstance(value, str):
            return False
        return listed or value.startswith(_PACKED_PREFIX)
    return False


# The opcodes that hold a pickled array's data in place, and their bytes
# before it (the opcode and its length field).
_DATA_OPS = {"SHORT_BINBYTES": 2, "BINBYTES": 5, "BINBYTES8": 9, "BYTEARRAY8": 9}


def _unpack_cells(values: Any) -> np.ndarray | None:
    """The arrays of a packed column, stacked into one (n, *shape) array,
    when every cell is the pickle of an array of one plain dtype and shape
    (one column of RLlib's recording); None otherwise (the caller then
    unpacks cell by cell and names the failing one).

    Whole-column steps: base64 and lz4 of each cell by C functions mapped
    over the column, the first pickle through the restricted unpickler, and
    the others compared with it as one byte table: pickles of such arrays
    differ only in their data bytes, which are then the rows."""
    cells = values.tolist() if isinstance(values, np.ndarray) else list(values)
    if not set(map(type, cells)) <= {str, bytes}:
        return None
    try:
        pickles = list(map(_lz4_frame().decompress, map(binascii.a2b_base64, cells)))
    except (binascii.Error, ValueError, RuntimeError):
        return None
    size = len(pickles[0])
    if set(map(len, pickles)) != {size}:
        return None
    try:
        first = safe_loads(pickles[0])
    except ValueError:
        return None
    if type(first) is not np.ndarray or first.dtype.kind not in "biufc" \
            or not first.dtype.isnative or first.nbytes == 0:
        return None
    data = first.tobytes()
    starts = [pos + _DATA_OPS[op.name] for op, arg, pos in pickletools.genops(pickles[0])
              if op.name in _DATA_OPS and arg == data]
    if len(starts) != 1:
        return None
    start, end = starts[0], starts[0] + len(data)
    if not first.flags.c_contiguous or pickles[0][start:end] != data:
        return None       # (a Fortran-ordered array's bytes are in another order)
    table = np.frombuffer(b"".join(pickles), np.uint8).reshape(len(pickles), size)
    if not ((table[:, :start] == table[0, :start]).all()
            and (table[:, end:] == table[0, end:]).all()):
        return None
    return table[:, start:end].copy().view(first.dtype).reshape((len(pickles),) + first.shape)


def _unpack_column(values: Any, name: str) -> Any:
    """A packed column's values: one (n, *shape) array when they are arrays
    of one dtype and shape, else a list of the unpacked values."""
    if len(values):
        rows = _unpack_cells(values)
        if rows is not None:
            return rows
    out = []
    for i, value in enumerate(values):
        try:
            out.append(_unpack_if_needed(value))
        except ValueError as error:
            raise ValueError(f"column {name!r}, row {i}: {error}") from error
    return _stacked(out)


def _stacked(items: list) -> Any:
    # Arrays of one dtype and shape as one array; anything else stays a list.
    if items and all(type(x) is np.ndarray for x in items):
        first = items[0]
        if all(x.dtype == first.dtype and x.shape == first.shape for x in items):
            if first.dtype.kind in "biufc":
                return np.stack(items)
    return items


# -- Arrow tables as Ray Data hands them to RLlib ---------------------------------------


def _tensor_info(field: Any) -> tuple[str, Any] | None:
    """(extension name, serialized params) of a Ray tensor column, whether
    pyarrow knows Ray's extension types (Ray imported) or not."""
    import pyarrow as pa

    t = field.type
    if isinstance(t, pa.ExtensionType):
        return t.extension_name, t.__arrow_ext_serialize__()
    meta = field.metadata or {}
    name = meta.get(b"ARROW:extension:name")
    if name is None:
        return None
    return name.decode(errors="replace"), meta.get(b"ARROW:extension:metadata", b"")


def _tensor_column(column: Any, info: tuple, name: str) -> np.ndarray:
    """The (n, *shape) array (or object array of arrays, for ragged tensors)
    of a Ray tensor column, checked against its declared shape."""
    import pyarrow as pa

    kind, params = info
    storage = column.storage if isinstance(column, pa.ExtensionArray) else column
    if storage.null_count:
        raise ValueError(f"column {name!r}: a tensor column with nulls")
    if kind == _RAGGED_TENSOR_TYPE:
        data, shapes = storage.field("data"), storage.field("shape")
        out = np.empty(len(storage), dtype=object)
        for i, (row, shape) in enumerate(zip(data.to_pylist(), shapes.to_pylist())):
            out[i] = np.asarray(row, dtype=data.type.value_type.to_pandas_dtype()).reshape(shape)
        return out
    try:
        shape = tuple(json.loads(params))
        if not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(shape)
    except (ValueError, TypeError) as error:
        raise ValueError(f"column {name!r}: a tensor type of shape {params!r:.80}") from error
    if not (pa.types.is_list(storage.type) or pa.types.is_large_list(storage.type)):
        raise ValueError(f"column {name!r}: tensor storage of type {storage.type}")
    size = int(np.prod(shape, dtype=np.int64))
    lengths = storage.value_lengths().to_numpy(zero_copy_only=False)
    if len(lengths) and not (lengths == size).all():
        raise ValueError(f"column {name!r}: tensor rows of {sorted(set(lengths.tolist()))[:5]} "
                         f"elements in a column of shape {shape}")
    values = storage.flatten()
    if values.null_count:
        raise ValueError(f"column {name!r}: tensor elements that are null")
    flat = values.to_numpy(zero_copy_only=False)
    return flat.reshape((len(storage),) + shape)


def _pickled_column(column: Any, name: str) -> np.ndarray:
    """The objects of a Ray pickled-object column, unpickled by the
    restricted unpickler (Ray Data unpickles them with pickle itself, and
    only when told the files are trusted)."""
    import pyarrow as pa

    storage = column.storage if isinstance(column, pa.ExtensionArray) else column
    if not (pa.types.is_binary(storage.type) or pa.types.is_large_binary(storage.type)):
        raise ValueError(f"column {name!r}: pickled objects stored as {storage.type}")
    out = np.empty(len(storage), dtype=object)
    for i, blob in enumerate(storage.to_pylist()):
        if blob is not None:
            try:
                out[i] = safe_loads(blob)
            except ValueError as error:
                raise ValueError(f"column {name!r}, row {i}: {error}") from None
    return out


def to_numpy_batch(table: Any) -> dict[str, np.ndarray]:
    """A pyarrow Table (or RecordBatch) as Ray Data's ``batch_format="numpy"``
    hands it to RLlib's ``map_batches``: each column a numpy array (tensor
    columns as (n, *shape) arrays, all-null columns as float32 NaN, strings,
    binaries and structs as object arrays, pickled objects as object arrays
    of what the restricted unpickler makes of them)."""
    import pyarrow as pa

    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    if not isinstance(table, pa.Table):
        raise TypeError(f"expected a pyarrow Table, not {type(table).__name__}")
    out = {}
    for field, column in zip(table.schema, table.columns):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        info = _tensor_info(field)
        if pa.types.is_null(field.type):
            out[field.name] = np.full(len(column), np.nan, dtype=np.float32)
        elif info is not None and (info[0] in _TENSOR_TYPES or info[0] == _RAGGED_TENSOR_TYPE):
            out[field.name] = _tensor_column(column, info, field.name)
        elif info is not None and info[0] == _PICKLED_TYPE:
            out[field.name] = _pickled_column(column, field.name)
        else:
            if isinstance(column, pa.ExtensionArray):
                column = column.storage
            out[field.name] = column.to_numpy(zero_copy_only=False)
    return out


def _as_batch(batch: Any) -> dict[str, Any]:
    if isinstance(batch, Mapping):
        return dict(batch)
    pa = sys.modules.get("pyarrow")
    if pa is not None and isinstance(batch, (pa.Table, pa.RecordBatch)):
        return to_numpy_batch(with_kept_infos(batch))
    raise TypeError(f"a batch is a pyarrow Table or a dict of columns, not {type(batch).__name__}")


# Where our rows keep their infos: the file's schema metadata, which Ray
# Data does not hand RLlib's reader (a column would reach it, as the
# episodes' infos or, under another name, as an extra model output).
INFOS_KEY = b"episode.infos"


def with_kept_infos(table: Any, where: str = "the rows") -> Any:
    """`table` with the infos `episode_rows` kept in its schema metadata as
    an ``infos`` column (msgpack bytes per row), where it has them and no
    such column; ValueError for kept infos that do not fit its rows."""
    import pyarrow as pa

    meta = table.schema.metadata or {}
    kept = meta.get(INFOS_KEY)
    if kept is None or "infos" in table.column_names:
        return table
    try:
        rows = unpackb(kept)
    except Exception as error:     # noqa: BLE001 - damaged bytes fail in many ways
        raise ValueError(f"{where}: its kept infos are not msgpack: {error}") from None
    if not isinstance(rows, list) or len(rows) != table.num_rows or \
            not all(type(r) is bytes for r in rows):
        raise ValueError(f"{where}: its kept infos are not one per row")
    column = pa.array(rows, type=pa.binary())
    if isinstance(table, pa.RecordBatch):
        return pa.RecordBatch.from_arrays(table.columns + [column],
                                          names=table.column_names + ["infos"])
    return table.append_column("infos", column)


def infos_apart(table: Any) -> Any:
    """`table` with its ``infos`` column (msgpack bytes per row) moved into
    its schema metadata, as `episode_rows` keeps them: the inverse of
    `with_kept_infos` (which a table's rows are sliced and joined in)."""
    if "infos" not in table.column_names:
        return table
    rows = table.column("infos").to_pylist()
    table = table.drop_columns(["infos"])
    return table.replace_schema_metadata(
        {**(table.schema.metadata or {}), INFOS_KEY: packb(rows)})


def detect_format(schema: Any) -> str | None:
    """Which of RLlib's recorded formats a pyarrow schema holds:
    ``"rllib_episodes"`` (a binary column ``item``), ``"rllib_rows"`` (the
    columns ``obs``, ``actions`` and ``rewards``, and ``new_obs`` or
    ``eps_id``), or None."""
    import pyarrow as pa

    if not isinstance(schema, pa.Schema):
        raise TypeError(f"expected a pyarrow Schema, not {type(schema).__name__}")
    names = set(schema.names)
    if "item" in names:
        t = schema.field("item").type
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            return EPISODES_FORMAT
    if {"obs", "actions", "rewards"} <= names and names & {"new_obs", "eps_id"}:
        return ROWS_FORMAT
    return None


# -- msgpack-numpy, on the msgpack library ---------------------------------------------
#
# RLlib's episode format and our rows' infos: msgpack with msgpack_numpy's
# maps for arrays and numpy scalars ({b"nd": True, b"type": "<f4", b"kind":
# b"", b"shape": [4], b"data": <bytes>}).

_MAX_NDIM = 64      # (numpy's own limit)


def _encode(obj: Any) -> Any:
    # msgpack_numpy.encode's maps (its bytes, so that RLlib reads ours).
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "VO":
            kind, descr = obj.dtype.kind.encode("ascii"), obj.dtype.descr
        else:
            kind, descr = b"", obj.dtype.str
        if obj.dtype == object:
            data = obj.dumps()
        else:
            data = memoryview(obj.data) if obj.flags.c_contiguous else obj.tobytes()
        return {b"nd": True, b"type": descr, b"kind": kind, b"shape": obj.shape, b"data": data}
    if isinstance(obj, (np.bool_, np.number)):
        return {b"nd": False, b"type": obj.dtype.str, b"data": memoryview(obj.data)}
    if isinstance(obj, complex):
        return {b"complex": True, b"data": repr(obj)}
    return obj      # (msgpack then raises its own error for it, as with msgpack_numpy)


def packb(obj: Any) -> bytes:
    """``msgpack.packb(obj, default=msgpack_numpy.encode)``, byte for byte
    (TypeError for what it cannot pack, OverflowError for ints outside
    int64/uint64, ValueError past msgpack's nesting limit)."""
    return msgpack.packb(obj, default=_encode)


_DTYPES: dict = {}


def _dtype(text: Any) -> np.dtype:
    found = _DTYPES.get(text) if type(text) is str else None
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
    if len(_DTYPES) < 256:
        _DTYPES[text] = dtype
    return dtype


def _structured(descr: Any) -> list:
    # msgpack_numpy's descr of a structured dtype: [name, type, *shape] per field.
    fields = []
    for field in descr:
        if type(field) is not list or len(field) < 2:
            raise ValueError(f"a structured dtype field is [name, type, ...], not {field!r:.80}")
        name = field[0].decode() if type(field[0]) is bytes else field[0]
        sub = _structured(field[1]) if type(field[1]) is list else field[1]
        rest = tuple(tuple(x) if type(x) is list else x for x in field[2:])
        fields.append((name, sub) + rest)
    return fields


def _shape(shape: Any) -> tuple:
    if type(shape) is int:
        shape = [shape]
    if type(shape) is not list and type(shape) is not tuple:
        raise ValueError(f"a msgpack-numpy shape is a list of ints, not {type(shape).__name__}")
    if len(shape) > _MAX_NDIM:
        raise ValueError(f"a msgpack-numpy shape of {len(shape)} dimensions")
    count = 1
    for d in shape:
        if type(d) is not int or not 0 <= d < 1 << 48:
            raise ValueError(f"a msgpack-numpy shape holds {d!r:.40}")
        count *= d
        if count > 1 << 48:
            raise ValueError(f"a msgpack-numpy shape of too many elements: {shape!r:.80}")
    return tuple(shape)


def _unpickled_array(data: Any) -> np.ndarray:
    if type(data) is not bytes:
        raise ValueError(f"a msgpack-numpy object array's data is bytes, not "
                         f"{type(data).__name__}")
    arr = safe_loads(data)
    if type(arr) is not np.ndarray:
        raise ValueError(f"a msgpack-numpy object array unpickled to {type(arr).__name__}")
    return arr


def _decode(d: dict) -> Any:
    """msgpack_numpy.decode: the array, numpy scalar or complex a map
    describes (copies, writable), or the map; ValueError where its fields
    do not describe one."""
    nd = d.get(b"nd", d)
    if nd is d:
        if b"complex" in d and b"data" in d:
            text = d[b"data"]
            try:
                return complex(text.decode() if type(text) is bytes else str(text))
            except (TypeError, ValueError, UnicodeDecodeError) as error:
                raise ValueError(f"a msgpack-numpy complex of {text!r:.80}") from error
        return d
    if nd is True:
        kind = d.get(b"kind")
        if kind == b"O" and b"data" in d:
            return _unpickled_array(d[b"data"])
        if b"data" not in d or b"type" not in d or b"shape" not in d:
            return d
        data = d[b"data"]
        if kind == b"V":
            if type(d[b"type"]) is not list:
                raise ValueError("a structured msgpack-numpy array's type is a list of fields")
            try:
                dtype = np.dtype(_structured(d[b"type"]))
            except (TypeError, ValueError, SyntaxError, KeyError, IndexError) as error:
                raise ValueError(f"a msgpack-numpy map names no dtype: {d[b'type']!r:.80}") \
                    from error
        else:
            dtype = _dtype(d[b"type"])
        if type(data) is not bytes:
            raise ValueError(f"a msgpack-numpy array's data is bytes, not {type(data).__name__}")
        shape = _shape(d[b"shape"])
        if math.prod(shape) * dtype.itemsize != len(data):
            raise ValueError(f"a msgpack-numpy array of shape {shape} and dtype {dtype} has "
                             f"{len(data)} bytes of data")
        return np.frombuffer(data, dtype).reshape(shape).copy()
    if b"data" not in d or b"type" not in d:
        return d
    data = d[b"data"]
    dtype = _dtype(d[b"type"])
    if type(data) is not bytes:
        raise ValueError(f"a msgpack-numpy scalar's data is bytes, not {type(data).__name__}")
    if len(data) != dtype.itemsize:
        raise ValueError(f"a msgpack-numpy {dtype} scalar has {len(data)} bytes of data")
    return np.frombuffer(data, dtype)[0]


def _no_extension(code: int, data: bytes) -> Any:
    raise ValueError(f"a msgpack extension value (type {code}): RLlib's format has none")


def _unpackb(data: Any, hook: Any = _decode) -> Any:
    if isinstance(data, str):
        raise TypeError("packed data is bytes (or a bytes-like object), not str")
    try:
        return msgpack.unpackb(data, object_hook=hook, ext_hook=_no_extension, raw=False,
                               strict_map_key=False)
    except msgpack.ExtraData as error:
        raise ValueError(f"{len(error.extra)} bytes after the packed value") from None
    except ValueError as error:
        if "incomplete input" in str(error):
            raise ValueError("truncated msgpack: the bytes end inside a value") from None
        raise
    except (TypeError, MemoryError, RecursionError):
        raise
    except Exception as error:     # noqa: BLE001 - msgpack's OutOfData and kin
        raise ValueError(f"corrupt msgpack: {type(error).__name__}: {error}") from None


def unpackb(data: Any) -> Any:
    """``msgpack.unpackb(data, object_hook=msgpack_numpy.decode)``, with
    object arrays unpickled by the restricted unpickler. ValueError for
    corrupt or truncated bytes, or bytes left over."""
    return _unpackb(data)


# -- a recording's files into episodes ------------------------------------------------


def file_order(path: str) -> tuple:
    """The sort key that puts a recording's files in the order they were
    written: RLlib names them ``run-<worker>-<sample call>/<...>_<block>``,
    numbers compared as numbers (call 100000 comes after call 99999)."""
    parts = re.split(r"(\d+)", path)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def recording_episodes(files: Sequence[tuple[str, "pa.Table"]], kind: str
                       ) -> list[SingleAgentEpisode]:
    """The episodes of a recording of RLlib's: `files` its (path, table)
    pairs in the order they were written (see :func:`file_order`), all of
    `kind` (:data:`EPISODES_FORMAT` or :data:`ROWS_FORMAT`).

    Each write of RLlib's recorder is one folder. Without
    ``output_max_rows_per_file`` RLlib never empties what it keeps, so each
    folder begins with everything the one before holds: that is read once.
    Rows become whole episodes: the rows of one ``eps_id`` (from any file,
    in written order) that continue each other, packed cells unpacked. The
    chunks of one episode (a sample() call ends mid-episode) join, episodes
    as rows. ValueError, naming the file, for what cannot be read."""
    import pyarrow as pa

    column = "item" if kind == EPISODES_FORMAT else None
    if kind == ROWS_FORMAT:
        files = [(path, with_kept_infos(table, path)) for path, table in files]
    writes: list = []        # (folder, [paths], table)
    for path, table in files:
        folder = path.rpartition("/")[0]
        if writes and writes[-1][0] == folder:
            writes[-1][1].append(path)
            writes[-1][2].append(table)
        else:
            writes.append((folder, [path], [table]))
    parts: list = []         # (path, table) with repeated rows dropped
    previous = None
    for folder, paths, tables in writes:
        whole = _concat(tables, paths)
        repeated = _repeats(previous, whole, column)
        previous = whole
        for path, table in zip(paths, tables):
            if repeated >= table.num_rows:
                repeated -= table.num_rows
                continue
            parts.append((path, table.slice(repeated)))
            repeated = 0
    if kind == EPISODES_FORMAT:
        chunks = []
        for path, table in parts:
            try:
                chunks += unpack_episodes(table.column("item"))
            except (ValueError, TypeError, AssertionError) as error:
                raise ValueError(f"{path}: {error}") from None
        return _joined_chunks(chunks)
    if not parts:
        return []
    table = _concat([t for _, t in parts], [p for p, _ in parts])
    return _recorded_rows(table, pa, parts[0][0] if len(parts) == 1 else
                          f"{parts[0][0]} .. {parts[-1][0]}")


def _concat(tables: list, paths: list) -> "pa.Table":
    import pyarrow as pa

    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as error:
        raise ValueError(f"{paths[0]} .. {paths[-1]}: files whose columns do not go "
                         f"together ({error})") from None


def _repeats(previous: Any, table: "pa.Table", column: str | None) -> int:
    """How many first rows of `table` are the whole of `previous` again (0
    if they are not): RLlib's recorder writes what it wrote before again."""
    n = 0 if previous is None else previous.num_rows
    if not n or table.num_rows < n:
        return 0
    names = [column] if column else previous.column_names
    if not set(names) <= set(table.column_names):
        return 0
    head = table.select(names).slice(0, n)
    try:
        head = head.cast(previous.select(names).schema)
    except Exception:       # pyarrow's cast errors: other types, other rows
        return 0
    return n if head.equals(previous.select(names)) else 0


def _joined_chunks(chunks: list) -> list[SingleAgentEpisode]:
    """Episodes of chunks in written order: a chunk that continues an
    earlier one of the same id (it starts where that one ends, and that one
    is not done) is concatenated to it."""
    out: list = []
    open_by_id: dict = {}
    for chunk in chunks:
        earlier = open_by_id.get(chunk.id_)
        if earlier is not None and earlier.t == chunk.t_started and not earlier.is_done:
            earlier.concat_episode(chunk)
        else:
            out.append(chunk)
            open_by_id[chunk.id_] = chunk
    return out


def _recorded_rows(table: "pa.Table", pa: Any, where: str) -> list[SingleAgentEpisode]:
    # The rows of each eps_id together (stable: in written order), then
    # whole episodes of them with the agent and module ids the rows name.
    ids = None
    if "eps_id" in table.column_names and table.column("eps_id").null_count < table.num_rows:
        ids = np.array([str(i) for i in table.column("eps_id").to_pylist()], dtype=object)
        _, first, inverse = np.unique(ids.astype(str), return_index=True, return_inverse=True)
        order = np.argsort(first[inverse], kind="stable")
        if (order != np.arange(len(order))).any():
            table = table.take(pa.array(order))
            ids = ids[order]
    try:
        episodes = rows_to_episodes(table)
    except (ValueError, TypeError, KeyError, AssertionError) as error:
        raise ValueError(f"{where}: {error}") from None
    named = {}
    for key in ("agent_id", "module_id"):
        if ids is not None and key in table.column_names and table.column(key).null_count \
                < table.num_rows:
            named[key] = dict(zip(ids.tolist(), table.column(key).to_pylist()))
    for key, by_id in named.items():
        for episode in episodes:
            value = by_id.get(episode.id_)
            if value is not None:
                setattr(episode, key, value)
    return episodes


# -- rows into episodes ------------------------------------------------------------------


def _column(columns: dict, schema: dict, key: str) -> Any:
    name = schema[key]
    if name not in columns:
        raise ValueError(f"the batch has no column {name!r} ({key})")
    return columns[name]


def _extra_names(columns: dict, schema: dict) -> list:
    values = set(schema.values())
    return [k for k in columns if k not in schema and k not in values and k not in _NOT_EXTRAS]


def _done_column(columns: dict, schema: dict) -> Any:
    if schema["terminateds"] in columns:
        return columns[schema["terminateds"]]
    if "dones" in columns:
        return columns["dones"]
    raise ValueError(f"the batch has no column {schema['terminateds']!r} (terminateds) "
                     "nor 'dones'")


_EMPTY_MAP = b"\x80"     # msgpack's {}


def _info(value: Any) -> Any:
    # Our `infos` column holds each info packed as msgpack (RLlib's row
    # format has none; others may hold dicts).
    if isinstance(value, (bytes, bytearray, memoryview)):
        return unpackb(value)
    return value


def _zeros_like(x: Any) -> Any:
    # tree.map_structure(np.zeros_like, copy.deepcopy(x)), as RLlib's
    # ignore_final_observation does (dm-tree maps lists too).
    if isinstance(x, dict):
        return {k: _zeros_like(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_zeros_like(v) for v in x)
    return np.zeros_like(copy.deepcopy(x))


def rows_to_episodes(batch: Any, *, schema: Mapping[str, str] | None = None,
                     compress_columns: Sequence[str] = (), ignore_final_observation: bool = False,
                     whole_episodes: bool = True) -> list[SingleAgentEpisode]:
    """Episodes from RLlib's row format: a pyarrow Table, or a dict of
    columns as Ray Data's ``map_batches`` hands them (numpy arrays).

    `schema` is RLlib's ``input_read_schema`` (its column names to the
    dataset's), `compress_columns` its ``input_compress_columns`` (``"obs"``
    there unpacks ``obs`` and ``new_obs``), `ignore_final_observation` its
    option of that name (the next observation replaced by zeros).

    With ``whole_episodes=False`` the result is RLlib's
    ``OfflinePreLearner._map_to_episodes``: one one-step episode per row,
    items of the same types. With True (the default) consecutive rows of one
    ``eps_id`` that continue each other (a row's ``obs`` is the previous row's
    ``new_obs``, and the previous row is not done) form one episode: its
    observations are the rows' ``obs`` and the last row's ``new_obs``, its
    infos an empty reset info and the ``infos`` column's values where there
    is one (ours writes it), its flags the last row's.
    """
    columns = _as_batch(batch)
    schema = SCHEMA | dict(schema or {})
    compress = set(compress_columns or ())
    with no_collections():
        if whole_episodes:
            return _whole_episodes(columns, schema, compress, ignore_final_observation)
        return _one_step_episodes(columns, schema, compress, ignore_final_observation)


def _one_step_episodes(columns: dict, schema: dict, compress: set,
                       ignore_final: bool) -> list[SingleAgentEpisode]:
    # Packed columns are unpacked whole first (RLlib unpacks cell by cell:
    # the same values, strings and bytes unpacked, anything else kept).
    def column(key: str, listed: bool) -> Any:
        values = _column(columns, schema, key)
        return _unpack_column(values, schema[key]) if _is_packed(values, listed) else values

    obs_column = column("obs", "obs" in compress)
    next_column = None if ignore_final else column("new_obs", "obs" in compress)
    actions = column("actions", "actions" in compress)
    rewards = _column(columns, schema, "rewards")
    dones = _done_column(columns, schema)
    truncs = columns.get(schema["truncateds"])
    ids = columns.get(schema["eps_id"])
    infos = columns.get(schema["infos"])
    extras = {k: _unpack_column(columns[k], k) if _is_packed(columns[k], k in compress)
              else columns[k] for k in _extra_names(columns, schema)}
    episodes = []
    for i, obs in enumerate(obs_column):
        episodes.append(SingleAgentEpisode(
            id_=str(ids[i]) if ids is not None else uuid.uuid4().hex,
            agent_id=None,
            observations=[obs, _zeros_like(obs) if next_column is None else next_column[i]],
            infos=[{}, _info(infos[i]) if infos is not None else {}],
            actions=[actions[i]],
            rewards=[rewards[i]],
            terminated=dones[i],
            truncated=truncs[i] if truncs is not None else False,
            extra_model_outputs={k: [v[i]] for k, v in extras.items()},
            len_lookback_buffer=0,
        ))
    return episodes


def _track(values: Any, name: str, packed: bool) -> Any:
    """A column as an array of rows (numeric) or a list of items."""
    if packed:
        return _unpack_column(values, name)
    if isinstance(values, np.ndarray) and values.dtype.kind in "biufc" and values.ndim >= 1:
        return values
    return list(values)


def _same(a: Any, b: Any) -> bool:
    # One observation stored twice (a row's new_obs, the next row's obs).
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b) or (a != a and b != b)
    except (TypeError, ValueError):
        return False


def _continues(obs: Any, nxt: Any, obs_raw: Any, next_raw: Any, packed: bool) -> np.ndarray:
    """continues[i]: row i + 1's obs is row i's new_obs."""
    n = len(obs)
    if n < 2:
        return np.zeros(0, dtype=bool)
    if packed:
        # One observation packs to one string: equal strings are the usual case.
        same = np.asarray(np.asarray(next_raw, dtype=object)[:-1]
                          == np.asarray(obs_raw, dtype=object)[1:], dtype=bool)
        breaks = np.flatnonzero(~same).tolist()
        nxt.fetch(breaks)
        for i in breaks:
            same[i] = _same(nxt[i], obs[i + 1])
        return same
    if isinstance(obs, np.ndarray) and isinstance(nxt, np.ndarray) and obs.dtype == nxt.dtype \
            and obs.shape == nxt.shape:
        a = np.ascontiguousarray(nxt[:-1]).reshape(n - 1, -1).view(np.uint8)
        b = np.ascontiguousarray(obs[1:]).reshape(n - 1, -1).view(np.uint8)
        return (a == b).all(axis=1)
    return np.fromiter((_same(nxt[i], obs[i + 1]) for i in range(n - 1)), bool, n - 1)


def _split(track: Any, bounds: np.ndarray, finals: list | None = None) -> list:
    """One Column per episode of a track (rows bounds[g]:bounds[g + 1], then
    finals[g] if given), with the item types RLlib's readers get from a
    numpy batch: ndarray rows, numpy scalars, or the objects themselves."""
    if isinstance(track, np.ndarray):
        if finals is None:
            return _split_rows(track, bounds)
        if all(type(x) is np.ndarray and x.dtype == track.dtype and x.shape == track.shape[1:]
               for x in finals) or (track.ndim == 1 and all(
                   isinstance(x, np.generic) and x.dtype == track.dtype for x in finals)):
            return _split_rows(track, bounds, np.array(finals, dtype=track.dtype))
    edges = bounds.tolist()
    return [Column.from_list(list(track[a:b]) + ([] if finals is None else [finals[g]]))
            for g, (a, b) in enumerate(zip(edges[:-1], edges[1:]))]


def _split_rows(rows: np.ndarray, bounds: np.ndarray, finals: Any = None) -> list:
    """One list-mode Column per episode of a numeric row column: rows
    bounds[g]:bounds[g + 1], then finals[g] where given (rows of the same
    dtype and shape). Rows of an (n,) array are numpy scalars (as Ray Data's
    batches index them), of an (n, ...) array ndarrays."""
    kind = KINDS["array"] if rows.ndim > 1 else KINDS["scalar"]
    edges = bounds.tolist()
    if finals is None:
        return [Column.from_rows(rows[a:b], kind) for a, b in zip(edges[:-1], edges[1:])]
    # The finals put in after each episode's rows: episode g's rows then
    # run from bounds[g] + g to bounds[g + 1] + g + 1.
    rows = np.insert(rows, bounds[1:], np.asarray(finals, dtype=rows.dtype), axis=0)
    return [Column.from_rows(rows[a + g:b + g + 1], kind)
            for g, (a, b) in enumerate(zip(edges[:-1], edges[1:]))]


def _assembled(ids: list, observations: list, infos: list, actions: list, rewards: list,
               extras: dict, dones: Any, truncs: Any) -> list[SingleAgentEpisode]:
    # One episode per group of Columns: no lookback, no spaces (as RLlib's
    # row readers build them).
    lookbacks = (0, 0, 0, 0, 0)
    return [make_episode(SingleAgentEpisode, ids[g], observations[g], infos[g], actions[g],
                         rewards[g], {name: columns[g] for name, columns in extras.items()},
                         lookbacks, dones[g], False if truncs is None else truncs[g], 0,
                         None, None)
            for g in range(len(ids))]


def _whole_episodes(columns: dict, schema: dict, compress: set,
                    ignore_final: bool) -> list[SingleAgentEpisode]:
    obs_raw = _column(columns, schema, "obs")
    n = len(obs_raw)
    packed_obs = _is_packed(obs_raw, "obs" in compress)
    obs = _track(obs_raw, "obs", packed_obs)
    next_raw = None if ignore_final else _column(columns, schema, "new_obs")
    if next_raw is not None and _is_packed(next_raw, "obs" in compress) != packed_obs:
        # (RLlib packs both or neither: a row's new_obs is the next row's obs.)
        raise ValueError("column 'obs' is packed and 'new_obs' not, or the other way")
    actions_raw = _column(columns, schema, "actions")
    actions = _track(actions_raw, "actions", _is_packed(actions_raw, "actions" in compress))
    rewards = _track(_column(columns, schema, "rewards"), "rewards", False)
    dones = np.asarray(_done_column(columns, schema))
    truncs = columns.get(schema["truncateds"])
    ids = columns.get(schema["eps_id"])
    if isinstance(ids, np.ndarray) and ids.dtype.kind == "f" and np.isnan(ids).all():
        ids = None      # an all-null column, as Ray Data hands it: no ids
    infos = columns.get(schema["infos"])
    extras = {k: _track(columns[k], k, _is_packed(columns[k], k in compress))
              for k in _extra_names(columns, schema)}
    for name, track in [("actions", actions), ("rewards", rewards), (schema["terminateds"], dones),
                        *extras.items(), *([("new_obs", next_raw)] if next_raw is not None else []),
                        *([("truncateds", truncs)] if truncs is not None else []),
                        *([("eps_id", ids)] if ids is not None else []),
                        *([("infos", infos)] if infos is not None else [])]:
        if len(track) != n:
            raise ValueError(f"column {name!r} has {len(track)} rows, 'obs' has {n}")
    if n == 0:
        return []

    # Where episodes start: a new id, a done row before, or an observation
    # that does not continue the previous row's new_obs.
    done = np.asarray(dones, dtype=bool)
    if truncs is not None:
        done = done | np.asarray(truncs, dtype=bool)
    starts = np.zeros(n, dtype=bool)
    starts[0] = True
    starts[1:] |= done[:-1]
    if ids is not None:
        id_values = np.asarray(ids, dtype=object)
        starts[1:] |= id_values[1:] != id_values[:-1]
    nxt: Any = None
    if next_raw is not None:
        # Packed: only the new_obs that end an episode (or break the chain)
        # are unpacked.
        nxt = _LazyPacked(next_raw) if packed_obs else _track(next_raw, "new_obs", False)
        starts[1:] |= ~_continues(obs, nxt, obs_raw, next_raw, packed_obs)
    first = np.flatnonzero(starts)
    bounds = np.append(first, n)
    last = bounds[1:] - 1
    if isinstance(nxt, _LazyPacked):
        nxt.fetch(last.tolist())
    finals = [_zeros_like(obs[i]) if nxt is None else nxt[i] for i in last.tolist()]
    groups = len(first)
    if infos is None:
        info_columns = [Column.from_rows(int(k), KINDS["empty_dict"]) for k in
                        (bounds[1:] - first + 1).tolist()]
    else:
        # Most steps have no info: an episode whose packed infos are all the
        # empty map is counted, as one without an infos column is, instead
        # of decoding a dict per row.
        values = infos.tolist() if isinstance(infos, np.ndarray) else list(infos)
        empty = np.fromiter((type(v) is bytes and v == _EMPTY_MAP for v in values), bool, n)
        edges = bounds.tolist()
        info_columns = [Column.from_rows(b - a + 1, KINDS["empty_dict"]) if empty[a:b].all()
                        else Column.from_list([{}] + [_info(infos[i]) for i in range(a, b)])
                        for a, b in zip(edges[:-1], edges[1:])]
    return _assembled(
        [str(ids[a]) for a in first.tolist()] if ids is not None
        else [uuid.uuid4().hex for _ in range(groups)],
        _split(obs, bounds, finals), info_columns, _split(actions, bounds),
        _split(rewards, bounds), {k: _split(v, bounds) for k, v in extras.items()},
        dones[last], None if truncs is None else np.asarray(truncs)[last])


class _LazyPacked:
    """A packed column whose values are unpacked when first read; fetch()
    unpacks many at once."""

    def __init__(self, values: Any):
        self.values = values
        self.cache: dict = {}

    def __len__(self) -> int:
        return len(self.values)

    def fetch(self, rows: list) -> None:
        rows = [i for i in rows if i not in self.cache]
        if rows:
            values = _unpack_column([self.values[i] for i in rows], "new_obs")
            self.cache.update(zip(rows, values))

    def __getitem__(self, i: int) -> Any:
        if i not in self.cache:
            self.fetch([i])
        return self.cache[i]


# -- SampleBatch rows into episodes --------------------------------------------------------


def sample_batches_to_episodes(batch: Any, *, schema: Mapping[str, str] | None = None,
                               compress_columns: Sequence[str] = (),
                               to_numpy: bool = False) -> list[SingleAgentEpisode]:
    """Episodes from old-stack SampleBatch rows (each row one SampleBatch:
    each column a sequence of that batch's steps, or the whole column
    packed), as RLlib's ``OfflinePreLearner._map_sample_batch_to_episode``
    makes them (its ``input_read_sample_batches`` path), one episode per row.

    Unlike RLlib, observations packed one by one in a row are unpacked
    (RLlib hands the packed strings on as observations).
    """
    columns = _as_batch(batch)
    schema = SCHEMA | dict(schema or {})
    compress = set(compress_columns or ())
    obs_column = _column(columns, schema, "obs")
    names = _extra_names(columns, schema)
    episodes = []
    for i, obs in enumerate(obs_column):
        try:
            episodes.append(_sample_batch_episode(columns, schema, compress, names, i, obs,
                                                  to_numpy))
        except ValueError as error:
            raise ValueError(f"sample batch {i}: {error}") from error
    return episodes


def _sample_batch_episode(columns: dict, schema: dict, compress: set, names: list, i: int,
                          obs: Any, to_numpy: bool) -> SingleAgentEpisode:
    if isinstance(obs, str):
        # The whole column packed at once.
        obs = unpack_value(obs)
        obs = [obs[k, ...] for k in range(obs.shape[0])]
    elif isinstance(obs, np.ndarray):
        obs = obs.tolist()
        if schema["obs"] in compress:
            obs = [_unpack_if_needed(x) for x in obs]
    else:
        raise TypeError(f"Unknown observation type: {type(obs)}. When mapping from old recorded "
                        "`SampleBatches` batched observations should be either of type "
                        "`np.array` or - if the column is compressed - of `str` type.")
    if schema["new_obs"] in columns:
        last = columns[schema["new_obs"]][i][-1]
        obs.append(_unpack_if_needed(last) if schema["obs"] in compress else last)
    else:
        obs.append(obs[-1])
    terms, truncs = schema["terminateds"], schema["truncateds"]
    if truncs in columns and terms in columns:
        truncated, terminated = columns[truncs][i][-1], columns[terms][i][-1]
    elif truncs in columns:
        truncated, terminated = columns[truncs][i][-1], False
    elif terms in columns:
        terminated, truncated = columns[terms][i][-1], False
    elif "done" in columns:
        terminated, truncated = columns["done"][i][-1], False
    else:
        terminated, truncated = True, False
    actions = columns[schema["actions"]][i]
    episode = SingleAgentEpisode(
        id_=str(columns[schema["eps_id"]][i][0]) if schema["eps_id"] in columns
        else uuid.uuid4().hex,
        agent_id=None,
        observations=obs,
        infos=columns[schema["infos"]][i] if schema["infos"] in columns else [{}] * len(obs),
        actions=_unpack_if_needed(actions) if "actions" in compress else actions,
        rewards=columns[schema["rewards"]][i],
        terminated=terminated,
        truncated=truncated,
        extra_model_outputs={k: _unpack_if_needed(columns[k][i]) if k in compress
                             else columns[k][i] for k in names},
        len_lookback_buffer=0,
    )
    if to_numpy:
        episode.to_numpy()
    return episode


# -- episodes into rows ---------------------------------------------------------------------


def _tensor_type_class() -> Any:
    """Ray Data's ArrowTensorTypeV2 where Ray is installed (tables then go
    to Ray Data as its own); else a stand-in of the same name, storage and
    serialization, which files record, so that Ray reads them as tensors."""
    global _TENSOR_CLASS
    if _TENSOR_CLASS is None:
        try:
            from ray.data.extensions import ArrowTensorTypeV2
        except ImportError:
            _TENSOR_CLASS = _stand_in_tensor_type()
        else:
            _TENSOR_CLASS = ArrowTensorTypeV2
    return _TENSOR_CLASS


def _stand_in_tensor_type() -> Any:
    import pyarrow as pa

    class TensorTypeV2(pa.ExtensionType):
        """Ray Data's tensor column type, for writing without Ray."""

        def __init__(self, shape: tuple, dtype: Any):
            self._shape = tuple(shape)
            super().__init__(pa.large_list(dtype), _TENSOR_TYPES[0])

        def __arrow_ext_serialize__(self) -> bytes:
            return json.dumps(self._shape).encode()

        @classmethod
        def __arrow_ext_deserialize__(cls, storage_type: Any, serialized: bytes) -> Any:
            return cls(tuple(json.loads(serialized)), storage_type.value_type)

    return TensorTypeV2


_TENSOR_CLASS: Any = None


def _tensor_array(rows: np.ndarray) -> Any:
    # Ray's ArrowTensorArray.from_numpy of uniform rows.
    import pyarrow as pa

    rows = np.ascontiguousarray(rows)
    n, shape = rows.shape[0], rows.shape[1:]
    size = int(np.prod(shape, dtype=np.int64))
    values = pa.array(rows.reshape(-1))
    offsets = pa.array(np.arange(n + 1, dtype=np.int64) * size, type=pa.int64())
    storage = pa.LargeListArray.from_arrays(offsets, values)
    cls = _tensor_type_class()
    return pa.ExtensionArray.from_storage(cls(shape, values.type), storage)


def _arrow_column(items: list, name: str) -> Any:
    """Ray Data's conversion of a column of row values: ndarrays as a
    tensor column, anything else as pyarrow infers it."""
    import pyarrow as pa

    if items and isinstance(items[0], np.ndarray):
        if not all(isinstance(x, np.ndarray) and x.shape == items[0].shape
                   and x.dtype == items[0].dtype for x in items):
            raise TypeError(f"column {name!r}: arrays of several shapes or dtypes; pack the "
                            "column (compress_columns) to write them")
        return _tensor_array(np.stack(items))
    try:
        return pa.array(items, type=pa.infer_type(items) if items else pa.null())
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as error:
        raise TypeError(f"column {name!r}: {error}") from error


def episode_rows(episodes: Iterable[SingleAgentEpisode], *,
                 compress_columns: Sequence[str] = ("obs", "new_obs"),
                 infos: bool = True) -> "pa.Table":
    """Episodes in RLlib's row format: the table Ray Data makes of the rows
    ``OfflineSingleAgentEnvRunner._map_episodes_to_data`` gives for them
    (one row per step; `compress_columns` is RLlib's
    ``output_compress_columns``, where ``"obs"`` packs ``obs`` and
    ``new_obs``, and only ndarray values are packed).

    With ``infos=True`` (the default) the table's schema metadata keeps,
    for each row, the info that came with its ``new_obs``, packed as
    msgpack (under ``INFOS_KEY``): RLlib's row format drops infos, and
    RLlib's reader, which Ray Data hands the columns and not the metadata,
    meets none; :func:`rows_to_episodes` and `read_episodes` read them.
    """
    import pyarrow as pa

    compress = set(compress_columns or ())
    rows: dict[str, list] = {"eps_id": [], "agent_id": [], "module_id": [], "obs": [],
                             "actions": [], "rewards": [], "new_obs": [], "terminateds": [],
                             "truncateds": []}
    extra_rows: dict[str, list] = {}
    info_rows: list = []
    total = 0
    for episode in episodes:
        n = len(episode)
        if n == 0:
            continue
        observations = [episode.get_observations(i) for i in range(n + 1)]
        if "obs" in compress:
            observations = [pack_value(o) if isinstance(o, np.ndarray) else o
                            for o in observations]
        actions = [episode.get_actions(i) for i in range(n)]
        if "actions" in compress:
            actions = [pack_value(a) if isinstance(a, np.ndarray) else a for a in actions]
        rows["eps_id"] += [episode.id_] * n
        rows["agent_id"] += [episode.agent_id] * n
        rows["module_id"] += [episode.module_id] * n
        rows["obs"] += observations[:-1]
        rows["actions"] += actions
        rows["rewards"] += [episode.get_rewards(i) for i in range(n)]
        rows["new_obs"] += observations[1:]
        rows["terminateds"] += [False] * (n - 1) + [episode.is_terminated]
        rows["truncateds"] += [False] * (n - 1) + [episode.is_truncated]
        for key in episode.extra_model_outputs:
            values = [episode.get_extra_model_outputs(key, i) for i in range(n)]
            if key in compress:
                values = [pack_value(v) if isinstance(v, np.ndarray) else v for v in values]
            extra_rows.setdefault(key, [None] * total).extend(values)
        if infos:
            info_rows += [packb(episode.get_infos(i)) for i in range(1, n + 1)]
        total += n
        for values in extra_rows.values():
            values.extend([None] * (total - len(values)))
    arrays = {name: _arrow_column(values, name) for name, values in rows.items()}
    for name, values in extra_rows.items():
        arrays[name] = _arrow_column(values, name)
    if infos:
        arrays["infos"] = pa.array(info_rows, type=pa.binary())
    return infos_apart(pa.table(arrays))
