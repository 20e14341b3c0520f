"""Minari's spaces: their JSON form in a dataset's metadata.json, and a
space's leaves (where each one's rows are stored and what they look like)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, List

import gymnasium as gym
import numpy as np


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


_KIND_NAMES = {"b": "bool", "i": "int", "u": "uint", "f": "float", "c": "complex"}


def _kinds(kinds: str) -> str:
    return "/".join(_KIND_NAMES[k] for k in kinds)
