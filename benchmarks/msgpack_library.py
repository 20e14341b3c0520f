"""RLlib's episode format read with the msgpack library used well: what the
C decoder (episode._msgpack) is measured against (see
benchmarks/test_rllib_msgpack.py), and kept here, out of the package, for
that figure.

msgpack's C unpacker makes each step's msgpack-numpy map (no object hook);
a track whose maps all describe arrays of one dtype and shape (or numbers,
or empty infos) then becomes one rows array by a join of their data bytes,
checked with C-level passes (``map`` of ``itemgetter``, ``set``), no Python
code run per step. Anything else is decoded item by item, as
msgpack_numpy's object hook would, and goes through ``from_state``. The
episodes are the C decoder's, type for type (the benchmark checks it).
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from operator import itemgetter
from typing import Any

import numpy as np

from episode._column import KINDS, Column
from episode._episode import REWARDS_SPACE, make_episode
from episode.offline.rllib_format import _decode, _dtype, _shape, _unpackb, packb
from episode.spaces import space_from_dict, space_to_dict

# The keys of RLlib's get_state(), in its order; all but custom_data are required.
STATE_KEYS = ("id_", "agent_id", "module_id", "multi_agent_episode_id", "observations",
              "actions", "rewards", "infos", "extra_model_outputs", "is_terminated",
              "is_truncated", "t_started", "t", "_observation_space", "_action_space",
              "_start_time", "_last_step_time", "custom_data")
_REQUIRED = STATE_KEYS[:-1]
_KNOWN = frozenset(STATE_KEYS)
_TRACK_KEYS = {"data", "lookback", "finalized", "space"}
_MAX_DEPTH = 32

_ND = itemgetter(b"nd")
_FLOAT, _INT, _BOOL, _SCALAR, _ARRAY, _EMPTY_DICT = (
    KINDS[k] for k in ("float", "int", "bool", "scalar", "array", "empty_dict"))
_ND_FIELDS = itemgetter(b"nd", b"type", b"kind", b"shape")
_SCALAR_FIELDS = itemgetter(b"nd", b"type")
_DATA = itemgetter(b"data")



def _decoded(value: Any, depth: int = 0) -> Any:
    # What the object hook would have made of a value unpacked without it
    # (maps inside out, as msgpack calls it).
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
        if arr.ndim < 1 or arr.shape[0] == 0 or arr.dtype.kind not in "biufc" \
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


def _track(state: Any, tree: bool) -> tuple:
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
        obs, act, rew, inf = (_track(state["observations"], True), _track(state["actions"], True),
                              _track(state["rewards"], True), _track(state["infos"], False))
        extras_state = state["extra_model_outputs"]
        if extras_state is None:
            extras_state = {}
        elif type(extras_state) is not dict:
            raise _NotFast()
        extras = {}
        for name, value in extras_state.items():
            if type(name) is not str and type(name) is not bytes:
                raise ValueError(f"a map key must be str or bytes, not {type(name).__name__}")
            extras[name] = _track(value, True)
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
            if not _same(track[2], given):
                buf.space = self.space(track[2])
        return episode


def _values(state: dict) -> Any:
    # A state's plain values, decoded as the object hook would (maps, lists).
    def value(key: str) -> Any:
        v = state.get(key)
        return _decoded(v) if type(v) is dict or type(v) is list else v
    return value


def _same(a: Any, b: Any) -> bool:
    # (Descriptions as unpacked: plain values, whose == does not raise.)
    return type(a) is type(b) and a == b


def unpack_episode(blob: Any, cls: type) -> Any:
    """The episode of class `cls` a packed state (bytes-like) describes, as
    ``cls.from_state(msgpack.unpackb(blob, object_hook=msgpack_numpy.decode))``
    builds it. ValueError for corrupt or truncated bytes."""
    return _Decoder(cls).decode(blob)


def _raise_at(error: Exception, i: int) -> None:
    cls = AssertionError if isinstance(error, AssertionError) else \
        TypeError if isinstance(error, TypeError) else ValueError
    raise cls(f"packed episode {i}: {error}") from error


def unpack_episodes(blobs: Iterable[Any], cls: type) -> list:
    """`unpack_episode` of each item of `blobs`, sharing the spaces; an item
    that fails raises its error with its position."""
    decoder = _Decoder(cls)
    out = []
    for i, blob in enumerate(blobs):
        try:
            out.append(decoder.decode(blob))
        except (ValueError, TypeError, AssertionError) as error:
            _raise_at(error, i)
    return out


def unpack_episodes_arrow(data: Any, offsets: np.ndarray, cls: type) -> list:
    """`unpack_episodes` of an Arrow binary array's values, read in place:
    `data` its data buffer, `offsets` its len + 1 value offsets (already
    shifted by the array's offset), checked first."""
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
    return unpack_episodes(map(view.__getitem__, map(slice, edges[:-1], edges[1:])), cls)
