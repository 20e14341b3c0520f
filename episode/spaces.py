"""Space helpers: structs of spaces, fill values, one-hot, batching of nested items.

RLlib-compatible, without importing ray: the same results as RLlib's
``get_base_struct_from_space``, ``get_dummy_batch_for_space``, ``one_hot``,
``batch`` and ``gym_space_to_dict`` for the spaces episodes hold.
"""
from __future__ import annotations

import base64
import copy
import io
import zlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import gymnasium as gym
import numpy as np

__all__ = [
    "base_struct",
    "fill_batch",
    "one_hot",
    "one_hot_multidiscrete",
    "one_hot_struct",
    "stack",
    "space_to_dict",
    "space_from_dict",
    "map_struct",
    "flatten_struct",
    "check_same_nesting",
    "is_nesting",
    "space_contains",
    "batch_size",
]


def batch_size(batch: Any) -> int:
    """The leading axis of a batch (of its first leaf for Dict/Tuple items)."""
    while isinstance(batch, (dict, tuple)) and len(batch):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return len(batch)


def space_contains(space: gym.Space, value: Any) -> bool:
    """`space.contains(value)`, without the warning gymnasium's Box prints
    for a value that is not an ndarray (a Python float, a numpy scalar):
    the value is cast as Box.contains casts it, so the answer is the same."""
    if isinstance(space, gym.spaces.Box) and not isinstance(value, np.ndarray):
        try:
            value = np.asarray(value, dtype=space.dtype)
        except (ValueError, TypeError):
            return False
    return bool(space.contains(value))


# -- nested structs (dicts and tuples, as RLlib's Dict/Tuple spaces give) -----

def is_struct(x: Any) -> bool:
    return isinstance(x, (dict, tuple))


def map_struct(fn: Callable, first: Any, *rest: Any) -> Any:
    """Applies `fn` to the leaves of `first` and the matching leaves of `rest`.

    Dicts map by key (the result keeps `first`'s key order), tuples by
    position; a structure mismatch raises ValueError.
    """
    if isinstance(first, dict):
        for other in rest:
            if not isinstance(other, dict) or set(other) != set(first):
                raise ValueError(
                    f"structures differ: dict with keys {sorted(first)} vs {_describe(other)}"
                )
        mapped = {k: map_struct(fn, first[k], *(o[k] for o in rest)) for k in first}
        return OrderedDict(mapped) if isinstance(first, OrderedDict) else mapped
    if isinstance(first, tuple):
        for other in rest:
            if not isinstance(other, tuple) or len(other) != len(first):
                raise ValueError(
                    f"structures differ: tuple of {len(first)} vs {_describe(other)}"
                )
        return tuple(map_struct(fn, *parts) for parts in zip(first, *rest))
    return fn(first, *rest)


def _describe(x: Any) -> str:
    if isinstance(x, dict):
        return f"dict with keys {sorted(x)}"
    if isinstance(x, tuple):
        return f"tuple of {len(x)}"
    return type(x).__name__


def is_nesting(x: Any) -> bool:
    """Whether dm-tree (which RLlib maps nested data with) descends into `x`:
    lists, tuples, dicts and other sequences and mappings, not arrays or strings."""
    if isinstance(x, (str, bytes, np.ndarray)):
        return False
    return isinstance(x, (list, tuple, dict, Mapping, Sequence))


def check_same_nesting(a: Any, b: Any) -> None:
    """Raises what dm-tree's assert_same_structure(a, b) raises: ValueError
    when one nests where the other has a leaf or the keys or lengths differ,
    TypeError when the containers are of different kinds (a list for a tuple).
    Anything that is not a container (an array, a Column) is a leaf."""
    if is_nesting(a) != is_nesting(b):
        raise ValueError(f"the structures differ: {_nesting(a)} vs {_nesting(b)}")
    if not is_nesting(a):
        return
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            raise ValueError(f"the structures differ: dict keys {sorted(a, key=str)} vs "
                             f"{sorted(b, key=str)}")
        try:
            for k in a:
                check_same_nesting(a[k], b[k])
        except (TypeError, ValueError):
            # dm-tree walks the values in the order of the sorted keys: the
            # difference it meets first (and so its error class) is found
            # by the same walk.
            for k in sorted(a):
                check_same_nesting(a[k], b[k])
            raise
        return
    if type(a) is not type(b) and not _same_namedtuple(a, b):
        raise TypeError(f"the structures differ: a {type(a).__name__} vs a {type(b).__name__}")
    # dm-tree compares the elements it can pair before the lengths.
    for x, y in zip(a, b):
        check_same_nesting(x, y)
    if len(a) != len(b):
        raise ValueError(f"the structures differ: {_nesting(a)} vs {_nesting(b)}")


def _same_namedtuple(a: Any, b: Any) -> bool:
    # dm-tree takes two namedtuple classes of the same name and fields as one.
    return (isinstance(a, tuple) and isinstance(b, tuple) and hasattr(a, "_fields")
            and hasattr(b, "_fields") and type(a).__name__ == type(b).__name__
            and a._fields == b._fields)


def _nesting(x: Any) -> str:
    if not is_nesting(x):
        return "a leaf"
    if isinstance(x, Mapping):
        return f"a dict with keys {sorted(x, key=str)}"
    return f"a {type(x).__name__} of {len(x)}"


def flatten_struct(x: Any) -> list:
    """Leaves of a dict/tuple struct, dicts in sorted key order (as dm-tree)."""
    if isinstance(x, dict):
        return [leaf for k in sorted(x) for leaf in flatten_struct(x[k])]
    if isinstance(x, tuple):
        return [leaf for part in x for leaf in flatten_struct(part)]
    return [x]


# -- spaces ------------------------------------------------------------------

_LEAF_SPACES = frozenset([type(None), gym.spaces.Box, gym.spaces.Discrete,
                          gym.spaces.MultiDiscrete, gym.spaces.MultiBinary])

def base_struct(space: gym.Space | None) -> Any:
    """A Dict/Tuple space as a plain dict/tuple of its leaf spaces; others as is."""
    t = type(space)
    if t in _LEAF_SPACES:
        # Dict and Tuple are typing ABCs: isinstance against them is slow.
        return space
    # Their `spaces` attribute, not their (Python-level) Sequence/Mapping API.
    if t is gym.spaces.Tuple or isinstance(space, gym.spaces.Tuple):
        return tuple([base_struct(s) for s in space.spaces])
    if t is gym.spaces.Dict or isinstance(space, gym.spaces.Dict):
        return {k: base_struct(s) for k, s in space.spaces.items()}
    return space


def _one_hot_box(space: gym.Space) -> gym.Space:
    if isinstance(space, gym.spaces.Discrete):
        return gym.spaces.Box(0.0, 1.0, (int(space.n),), np.float32)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return gym.spaces.Box(0.0, 1.0, (int(np.sum(space.nvec)),), np.float32)
    return space


def fill_batch(space: Any, fill: Any, count: int, one_hot_discrete: bool = False) -> Any:
    """`count` rows of `fill` shaped and typed by `space` (no batch axis if count=0).

    Discrete/MultiDiscrete leaves become (zero-hot when fill is 0) one-hot rows
    when `one_hot_discrete` is set.
    """
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        space = base_struct(space)
    if is_struct(space):
        return map_struct(lambda s: fill_batch(s, fill, count, one_hot_discrete), space)
    if one_hot_discrete:
        space = _one_hot_box(space)
    shape = ([count] if count > 0 else []) + list(space.shape)
    return np.full(shape, fill_value=fill, dtype=space.dtype)


def one_hot(x: Any, depth: int = 0) -> np.ndarray:
    """One-hot float32 encoding of integer `x` along a new last axis.

    Bool input is encoded with depth 2. Values must be < depth
    (AssertionError otherwise, as in RLlib); negative values count from the end.
    Non-integer values raise IndexError.
    """
    if isinstance(x, int):
        x = np.array(x, dtype=np.int32)
    x = np.asarray(x)
    if x.dtype == np.bool_:
        x = x.astype(np.int_)
        depth = 2
    if x.dtype.kind not in "iu":
        # A float would be truncated to some slot: refuse it, as numpy's
        # indexing refuses it inside RLlib's one_hot.
        raise IndexError(f"one_hot needs integer values, got {x.dtype} ({x!r})")
    if x.size == 0:
        return np.zeros(x.shape + (int(depth),), dtype=np.float32)
    if depth == 0:
        depth = int(np.max(x)) + 1
    top = np.max(x)
    if not top < depth:
        raise AssertionError(f"one_hot: the largest value {top} must be below the depth {depth}")
    out = np.zeros(x.shape + (int(depth),), dtype=np.float32)
    np.put_along_axis(out, x.astype(np.intp)[..., None], 1.0, axis=-1)
    return out


def one_hot_multidiscrete(x: Any, depths: Any) -> np.ndarray:
    """Concatenated one-hot encodings of the components of MultiDiscrete `x`."""
    x = np.asarray(x)
    return np.concatenate(
        [one_hot(x[..., i], depth=int(n)) for i, n in enumerate(depths)], axis=-1
    )


def one_hot_leaf(x: Any, space: Any) -> Any:
    if isinstance(space, gym.spaces.Discrete):
        return one_hot(x, depth=int(space.n))
    if isinstance(space, gym.spaces.MultiDiscrete):
        return one_hot_multidiscrete(x, depths=space.nvec)
    return x


def one_hot_struct(x: Any, space_struct: Any) -> Any:
    """One-hot encodes the Discrete/MultiDiscrete leaves of `x` (a batch or one
    item); the result keeps `x`'s key order."""
    return map_struct(one_hot_leaf, x, space_struct) \
        if is_struct(space_struct) else one_hot_leaf(x, space_struct)


# -- batching ----------------------------------------------------------------

def _object_array(items: list) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


def stack_leaf(items: list) -> np.ndarray:
    """Items of one leaf as one array with a leading batch axis.

    The dtype is numpy's (`np.array(items)` / `np.stack` promotion), so no value
    is cast away; items that do not form a regular array (ragged rows, mixed
    shapes) give an object array holding them unchanged.
    """
    first = items[0]
    try:
        if isinstance(first, np.ndarray):
            return np.stack(items)
        out = np.array(items)
    except ValueError:
        return _object_array(items)
    if out.ndim == 0:
        return _object_array(items)
    return out


def stack(items: list) -> Any:
    """A list of (possibly nested) items as a (nested) struct of arrays, as
    RLlib's batching gives it: dict/tuple items (OrderedDicts and namedtuples
    too) are mapped with dm-tree's rules (lists inside nest as well; another
    structure raises ValueError, another container type TypeError) and the
    result is built like the first item; anything else is one leaf."""
    if not items:
        raise ValueError("cannot batch an empty list of items")
    first = items[0]
    if not isinstance(first, (dict, tuple)):
        return stack_leaf(items)
    for item in items[1:]:
        check_same_nesting(first, item)
    columns = zip(*[_nested_leaves(item) for item in items])
    return _nested_like(first, iter([stack_leaf(list(column)) for column in columns]))


def _nested_leaves(x: Any) -> list:
    """dm-tree's flatten: mappings in sorted key order, sequences in order."""
    if not is_nesting(x):
        return [x]
    parts = [x[k] for k in sorted(x)] if isinstance(x, Mapping) else x
    return [leaf for part in parts for leaf in _nested_leaves(part)]


def _nested_like(template: Any, leaves: Any) -> Any:
    """dm-tree's unflatten_as: `template`'s containers (their types and key
    order) around the next values of `leaves`."""
    if not is_nesting(template):
        return next(leaves)
    if isinstance(template, Mapping):
        values = {k: _nested_like(template[k], leaves) for k in sorted(template)}
        return type(template)((k, values[k]) for k in template)
    parts = [_nested_like(part, leaves) for part in template]
    if isinstance(template, tuple) and hasattr(template, "_fields"):
        return type(template)(*parts)
    return type(template)(parts)


def empty_batch(space: Any) -> Any:
    """A batch of zero rows shaped by `space`, or float64 (0,) without a space."""
    if space is None:
        return np.array([])
    return map_struct(lambda s: np.zeros((0,) + tuple(s.shape), dtype=s.dtype), base_struct(space))


# -- serialization (the format RLlib's get_state uses) ----------------------

def _pack_array(array: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, array)
    return base64.b64encode(zlib.compress(buf.getvalue())).decode("ascii")


def _unpack_array(text: str) -> np.ndarray:
    # Numbers only: a space read from a file must not run a pickle.
    return np.load(io.BytesIO(zlib.decompress(base64.b64decode(text))), allow_pickle=False)


def space_to_dict(space: gym.Space | None) -> dict | None:
    """A JSON-able dict describing `space`, in RLlib's serialization format."""
    if space is None:
        return None
    key = _to_dict_key(space)
    if key is not None:
        d = _TO_DICT.get(key)
        if d is None:
            d = _remember(_TO_DICT, key, _space_to_dict(space))
        # The values are strings and tuples: a shallow copy is a full one.
        return dict(d)
    return _space_to_dict(space)


def _space_to_dict(space: gym.Space) -> dict:
    if isinstance(space, gym.spaces.Box):
        return {"space": "box", "low": _pack_array(space.low), "high": _pack_array(space.high),
                "shape": space.shape, "dtype": space.dtype.str}
    if isinstance(space, gym.spaces.Discrete):
        return {"space": "discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"space": "multi-binary", "n": space.n}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"space": "multi-discrete", "nvec": _pack_array(space.nvec),
                "dtype": space.dtype.str}
    if isinstance(space, gym.spaces.Tuple):
        return {"space": "tuple", "spaces": [space_to_dict(s) for s in space.spaces]}
    if isinstance(space, gym.spaces.Dict):
        return {"space": "dict",
                "spaces": {k: space_to_dict(s) for k, s in space.spaces.items()}}
    if isinstance(space, gym.spaces.Text):
        return {"space": "text", "min_length": space.min_length,
                "max_length": space.max_length,
                "charset": "".join(sorted(space.character_set))}
    name = type(space).__name__
    if name == "Simplex":
        return {"space": "simplex", "shape": space.shape,
                "concentration": space.concentration, "dtype": space.dtype.str}
    if name == "Repeated":
        return {"space": "repeated", "child_space": space_to_dict(space.child_space),
                "max_len": space.max_len}
    raise ValueError(f"cannot serialize a space of type {name}")


def space_from_dict(d: dict | None) -> gym.Space | None:
    """Rebuilds a space from `space_to_dict`'s (or RLlib's) description."""
    if d is None:
        return None
    key = _from_dict_key(d)
    if key is not None:
        plan = _FROM_DICT.get(key)
        if plan is None:
            plan = _remember(_FROM_DICT, key, _copy_plan(_space_from_dict(d)))
        return _copy_space(plan)
    return _space_from_dict(d)


def _space_from_dict(d: dict) -> gym.Space:
    kind = d["space"]
    args = {k: v for k, v in d.items() if k != "space"}
    if "dtype" in args:
        args["dtype"] = np.dtype(args["dtype"])
    if kind == "box":
        args["low"], args["high"] = _unpack_array(d["low"]), _unpack_array(d["high"])
        return gym.spaces.Box(**args)
    if kind == "discrete":
        return gym.spaces.Discrete(**args)
    if kind == "multi-binary":
        return gym.spaces.MultiBinary(**args)
    if kind == "multi-discrete":
        args["nvec"] = _unpack_array(d["nvec"])
        return gym.spaces.MultiDiscrete(**args)
    if kind == "tuple":
        return gym.spaces.Tuple([space_from_dict(s) for s in d["spaces"]])
    if kind == "dict":
        return gym.spaces.Dict(OrderedDict((k, space_from_dict(s)) for k, s in d["spaces"].items()))
    if kind == "text":
        return gym.spaces.Text(**args)
    if kind in ("simplex", "repeated"):
        # RLlib's own spaces: only states that came from RLlib hold them.
        from ray.rllib.utils.spaces.repeated import Repeated
        from ray.rllib.utils.spaces.simplex import Simplex

        if kind == "simplex":
            return Simplex(**args)
        return Repeated(space_from_dict(d["child_space"]), max_len=d["max_len"])
    raise ValueError(f"unknown serialized space kind {kind!r}")


# -- caching the serialized forms of Box and MultiDiscrete spaces --------------
#
# Their descriptions hold arrays as np.save + zlib + base64 text, which costs
# tens of microseconds each way, and every get_state()/from_state() of an
# episode converts the same few spaces (its spaces, and the rewards' Box).
# Both directions are cached, keyed by everything the result depends on, and
# callers get copies: changing a returned dict or space changes no cached one.

_TO_DICT: dict[tuple, dict] = {}
_FROM_DICT: dict[tuple, tuple] = {}   # key -> _copy_plan()
_MAX_CACHED = 256


def _remember(cache: dict, key: tuple, value: Any) -> Any:
    if len(cache) >= _MAX_CACHED:
        cache.clear()
    cache[key] = value
    return value


def _array_key(a: np.ndarray) -> tuple:
    # What np.save writes for `a`: dtype, order, shape and the values' bytes.
    return (a.dtype, a.shape, bool(np.isfortran(a)), a.tobytes())


def _to_dict_key(space: Any) -> tuple | None:
    """The key of space_to_dict(space) for an exact Box or MultiDiscrete, else None."""
    t = type(space)
    if t is gym.spaces.Box:
        return ("box", space.shape, space.dtype.str, _array_key(space.low),
                _array_key(space.high))
    if t is gym.spaces.MultiDiscrete:
        return ("multi-discrete", space.dtype.str, _array_key(space.nvec))
    return None


_BOX_FIELDS = frozenset(["space", "low", "high", "shape", "dtype"])
_MULTI_DISCRETE_FIELDS = frozenset(["space", "nvec", "dtype"])


def _from_dict_key(d: Any) -> tuple | None:
    """The key of space_from_dict(d) for a Box or MultiDiscrete description
    made of exact strs (and a tuple or list of ints as shape: msgpack, as in
    RLlib's recordings, gives lists), else None."""
    if type(d) is not dict:
        return None
    kind = d.get("space")
    if kind == "box" and d.keys() == _BOX_FIELDS:
        low, high, shape, dtype = d["low"], d["high"], d["shape"], d["dtype"]
        if (type(low) is str and type(high) is str and type(dtype) is str
                and type(shape) in (tuple, list) and all(type(n) is int for n in shape)):
            return ("box", low, high, tuple(shape), dtype)
    elif kind == "multi-discrete" and d.keys() == _MULTI_DISCRETE_FIELDS:
        nvec, dtype = d["nvec"], d["dtype"]
        if type(nvec) is str and type(dtype) is str:
            return ("multi-discrete", nvec, dtype)
    return None


# Attribute types a copy of a space may share with it: immutable ones.
_SHARED_TYPES = (type(None), bool, int, float, str, tuple, np.dtype, np.generic)


def _copy_plan(space: gym.Space) -> tuple:
    """(space, names of its array attributes), or (space, None) when it has
    attributes of other mutable types (a copy then needs deepcopy)."""
    arrays = []
    for name, value in vars(space).items():
        if type(value) is np.ndarray:
            arrays.append(name)
        elif not isinstance(value, _SHARED_TYPES):
            return space, None
    return space, tuple(arrays)


def _copy_space(plan: tuple) -> gym.Space:
    """A copy of a cached space that shares none of its mutable parts."""
    space, arrays = plan
    if arrays is None:
        return copy.deepcopy(space)
    fields = dict(vars(space))
    for name in arrays:
        fields[name] = fields[name].copy()
    new = object.__new__(type(space))
    new.__dict__ = fields
    return new


# -- pickling spaces by description ---------------------------------------------
#
# Rebuilding a gymnasium Box from its pickle (four arrays and __setstate__)
# costs more than loading the rest of a 10k-step episode. A plain leaf space
# that has no RNG state yet pickles instead as a short hashable description,
# and unpickling maps each description to one shared space object per process,
# just as the episodes of one env runner share its env's spaces.

_SHARED_SPACES: dict[tuple, gym.Space] = {}
_MAX_SHARED_SPACES = 256


def _space_key(space: Any) -> tuple | None:
    """The description of a plain Box/Discrete/MultiDiscrete/MultiBinary with
    no RNG state, or None for any other space (those pickle as themselves)."""
    t = type(space)
    if getattr(space, "_np_random", 0) is not None:
        return None
    if t is gym.spaces.Box:
        return ("box", space.shape, space.dtype.str, np.asarray(space.low, space.dtype).tobytes(),
                np.asarray(space.high, space.dtype).tobytes())
    if t is gym.spaces.Discrete:
        return ("discrete", int(space.n), int(space.start), space.dtype.str)
    if t is gym.spaces.MultiDiscrete:
        return ("multi-discrete", space.shape, space.dtype.str, space.nvec.tobytes(),
                space.start.tobytes())
    if t is gym.spaces.MultiBinary:
        n = space.n
        return ("multi-binary", tuple(n) if isinstance(n, (tuple, list, np.ndarray)) else int(n))
    return None


def _space_from_key(key: tuple) -> gym.Space:
    kind = key[0]
    if kind == "box":
        _, shape, dtype, low, high = key
        return gym.spaces.Box(np.frombuffer(low, dtype).reshape(shape),
                              np.frombuffer(high, dtype).reshape(shape), shape, np.dtype(dtype))
    if kind == "discrete":
        _, n, start, dtype = key
        return gym.spaces.Discrete(n, start=start, dtype=np.dtype(dtype))
    if kind == "multi-discrete":
        _, shape, dtype, nvec, start = key
        return gym.spaces.MultiDiscrete(np.frombuffer(nvec, dtype).reshape(shape), dtype=dtype,
                                        start=np.frombuffer(start, dtype).reshape(shape))
    if kind == "multi-binary" and len(key) == 2:
        return gym.spaces.MultiBinary(key[1])
    raise ValueError(f"no space is described by {key!r:.200}")


def shared_space(key: tuple) -> gym.Space:
    """The process's space for description `key` (made on first use)."""
    space = _SHARED_SPACES.get(key)
    if space is None:
        if len(_SHARED_SPACES) >= _MAX_SHARED_SPACES:
            _SHARED_SPACES.clear()
        space = _SHARED_SPACES[key] = _space_from_key(key)
    return space


def share_space(space: gym.Space) -> None:
    """Makes `space` the object that descriptions equal to its own unpickle to."""
    key = _space_key(space)
    if key is not None:
        _SHARED_SPACES[key] = space


class _SpaceByKey:
    """Stands in for a space in a pickle: loads as shared_space(key)."""
    __slots__ = ("key",)

    def __init__(self, key: tuple):
        self.key = key

    def __reduce__(self):
        return (shared_space, (self.key,))


def pickled_space(space: Any) -> Any:
    """What to put in a __reduce__ for `space`: its description when it has one."""
    key = _space_key(space)
    return space if key is None else _SpaceByKey(key)


def unpickled_space(value: Any) -> Any:
    """The space for a value pickled_space() gave. Unpickling has already made
    it one; copy.copy/deepcopy hand the stand-in itself to the restore function."""
    return shared_space(value.key) if type(value) is _SpaceByKey else value
