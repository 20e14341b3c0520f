"""Hypothesis strategies for items of every space kind, shared by the property tests."""
from collections import OrderedDict, namedtuple

import gymnasium as gym
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

F32 = np.float32
box_floats = st.floats(-10, 10, width=32)


def box(shape):
    return arrays(F32, shape, elements=box_floats)


def int64(lo, hi):
    return st.integers(lo, hi).map(np.int64)


ITEMS = {
    "box4": box((4,)),
    "box23": box((2, 3)),
    "discrete_int": st.integers(0, 4),
    "discrete_np": int64(0, 4),
    "multidiscrete": st.tuples(st.integers(0, 1), st.integers(0, 2), st.integers(0, 3)).map(
        lambda t: np.array(t, dtype=np.int64)),
    # Dicts are built in the space's key order (hypothesis' fixed_dictionaries
    # may shuffle it; the key order of one-hot results is tested explicitly).
    "dict": st.builds(lambda a, b: {"a": a, "b": b}, box((2,)), int64(0, 2)),
    "nested": st.tuples(int64(0, 1), st.builds(
        lambda x, y: {"x": x, "y": y}, box((3,)),
        st.tuples(st.integers(0, 1), st.integers(0, 1)).map(
            lambda t: np.array(t, dtype=np.int64)))),
    "reward": st.floats(allow_nan=True, allow_infinity=True),
    "int_nospace": st.integers(-(2 ** 63), 2 ** 63 - 1),
    "box4_nospace": box((4,)),
    "info": st.builds(lambda step, flag: {"step": step, "flag": flag},
                      st.integers(-5, 5), st.booleans()),
    "string": st.text(alphabet="abc", max_size=3),
    "image_u8": arrays(np.uint8, (2, 2)),
    "multibinary": arrays(np.int8, (3,), elements=st.integers(0, 1)),
    "bool_nospace": st.booleans(),
    "f32_scalar": st.floats(width=32, allow_nan=True).map(np.float32),
    "mixed_scalar": st.one_of(st.floats(-1e6, 1e6), st.integers(-1000, 1000),
                              st.floats(-100, 100, width=32).map(np.float32),
                              st.integers(-5, 5).map(np.int64), st.booleans()),
}


def _with_last(arr, value):
    out = arr.copy()
    out.flat[-1] = value
    return out


# Items of the right type and shape that lie outside the kinds' spaces (for
# the space checks of set() and add_env_step()). Kinds without a space, or
# whose space holds every value of the item type, have no entry.
OUTSIDE = {
    "box4": box((4,)).map(lambda a: _with_last(a, F32(20))),
    "box23": box((2, 3)).map(lambda a: _with_last(a, F32(-20))),
    "discrete_int": st.integers(5, 9),
    "discrete_np": int64(5, 9),
    "multidiscrete": st.just(np.array([2, 3, 4], dtype=np.int64)),
    "dict": st.builds(lambda a: {"a": a, "b": np.int64(7)}, box((2,))),
    "nested": st.builds(lambda x: (np.int64(3), {"x": x, "y": np.array([0, 1], np.int64)}),
                        box((3,))),
    "multibinary": st.just(np.array([2, 0, 1], dtype=np.int8)),
}


# -- Dict/Tuple items of random structure --------------------------------------
#
# A structure is a nested dict/tuple whose leaves name a leaf kind (a key of
# LEAVES or of SPACE_LEAVES); dict keys keep the order they are drawn in,
# which is rarely sorted. Items are built in the structure's key order.

KEYS = ["obs", "b", "a", "z", "img", "vec", "x"]

# Leaves without a space: every kind of value an env hands out.
LEAVES = {
    "py_float": st.floats(-1e3, 1e3),
    "py_int": st.integers(-1000, 1000),
    "py_bool": st.booleans(),
    "np_f32": st.floats(-100, 100, width=32).map(np.float32),
    "np_f64": st.floats(-100, 100).map(np.float64),
    "np_i8": st.integers(-128, 127).map(np.int8),
    "np_i32": st.integers(-1000, 1000).map(np.int32),
    "np_i64": int64(-1000, 1000),
    "np_u8": st.integers(0, 255).map(np.uint8),
    "np_bool": st.booleans().map(np.bool_),
    "img_u8": arrays(np.uint8, (2, 2, 3)),
    "vec_f32": box((3,)),
    "arr_i64": arrays(np.int64, (2,), elements=st.integers(-50, 50)),
}

# Leaves with a space: (space, values in it).
SPACE_LEAVES = {
    "discrete": (gym.spaces.Discrete(3), int64(0, 2)),
    "discrete_py": (gym.spaces.Discrete(4), st.integers(0, 3)),
    "multidiscrete": (gym.spaces.MultiDiscrete([2, 3]),
                      st.tuples(st.integers(0, 1), st.integers(0, 2)).map(
                          lambda t: np.array(t, dtype=np.int64))),
    "box": (gym.spaces.Box(-10.0, 10.0, (3,), F32), box((3,))),
    "image": (gym.spaces.Box(0, 255, (2, 2, 3), np.uint8), arrays(np.uint8, (2, 2, 3))),
    "multibinary": (gym.spaces.MultiBinary(2), arrays(np.int8, (2,), elements=st.integers(0, 1))),
}

# Tuples of every length a structure may change to, as namedtuples that
# pickle (module-level classes under their own names).
NT0 = namedtuple("NT0", [])
NT1 = namedtuple("NT1", ["f0"])
NT2 = namedtuple("NT2", ["f0", "f1"])
NT3 = namedtuple("NT3", ["f0", "f1", "f2"])
NT4 = namedtuple("NT4", ["f0", "f1", "f2", "f3"])
NAMEDTUPLES = [NT0, NT1, NT2, NT3, NT4]


def _dicts(children, min_size=0):
    return st.lists(st.sampled_from(KEYS), min_size=min_size, max_size=3, unique=True).flatmap(
        lambda keys: st.tuples(*[children] * len(keys)).map(lambda vs: dict(zip(keys, vs))))


def _tuples(children, min_size=0):
    return st.lists(children, min_size=min_size, max_size=3).map(tuple)


def _leaf_count(x):
    """Leaves of a structure or an item (dm-tree's: lists nest too)."""
    if isinstance(x, dict):
        return sum(_leaf_count(v) for v in x.values())
    if isinstance(x, (tuple, list)):
        return sum(_leaf_count(v) for v in x)
    return 1


def structures(leaf_names, max_leaves=5):
    """Dict/Tuple structures over the given leaf kinds: nested dict-in-tuple
    and tuple-in-dict, empty sub-dicts/tuples, single keys. Each has a leaf
    (RLlib cannot tell the length of numpy'ized data without one)."""
    inner = st.recursive(st.sampled_from(sorted(leaf_names)),
                         lambda children: st.one_of(_dicts(children), _tuples(children)),
                         max_leaves=max_leaves)
    return st.one_of(_dicts(inner, min_size=1), _tuples(inner, min_size=1)).filter(_leaf_count)


def item_of(structure, leaves=None):
    """Items of `structure` (leaf strategies from `leaves`: LEAVES and the
    values of SPACE_LEAVES by default)."""
    leaves = leaves or _ALL_LEAF_VALUES
    if isinstance(structure, dict):
        keys = tuple(structure)
        return st.tuples(*[item_of(v, leaves) for v in structure.values()]).map(
            lambda vs: dict(zip(keys, vs)))
    if isinstance(structure, tuple):
        return st.tuples(*[item_of(v, leaves) for v in structure])
    return leaves[structure]


_ALL_LEAF_VALUES = {**LEAVES, **{k: v for k, (_, v) in SPACE_LEAVES.items()}}


def space_of(structure, ordered=True):
    """The gymnasium space of `structure` (SPACE_LEAVES leaves). With
    `ordered`, a Dict space keeps the structure's key order (built from an
    OrderedDict); otherwise gymnasium sorts the keys."""
    if isinstance(structure, dict):
        subs = [(k, space_of(v, ordered)) for k, v in structure.items()]
        return gym.spaces.Dict(OrderedDict(subs) if ordered else dict(subs))
    if isinstance(structure, tuple):
        return gym.spaces.Tuple([space_of(v, ordered) for v in structure])
    return SPACE_LEAVES[structure][0]


# -- changes a later item may bring ---------------------------------------------------

def _leaf_changes(x):
    """(name, new value) pairs: a leaf promoted to another type, dtype or
    shape, or turned into a container."""
    out = []
    if isinstance(x, bool):
        out.append(("bool -> int", int(x) + 2))
    elif isinstance(x, int):
        out.append(("int -> float", x + 0.5))
    elif isinstance(x, float):
        out.append(("float -> int", int(x)))
    if isinstance(x, np.ndarray):
        wider = {np.dtype(np.float32): np.float64, np.dtype(np.uint8): np.int64,
                 np.dtype(np.int8): np.int64, np.dtype(np.int64): np.float64}
        if x.dtype in wider:
            out.append(("array dtype", x.astype(wider[x.dtype]) + (x.dtype.kind != "f") * 300))
        out.append(("array shape", np.concatenate([x.ravel(), x.ravel()[:1]])))
    elif isinstance(x, np.generic):
        out.append(("numpy scalar dtype", np.float64(x) + 0.25))
        out.append(("scalar -> array", np.array([x, x])))
    out += [("-> str", "s"), ("-> None", None), ("-> list", [x, x]), ("-> dict", {"x": x}),
            ("-> tuple", (x,))]
    return out


def _node_changes(node):
    if isinstance(node, dict):
        keys = list(node)
        out = [("extra key", {**node, "new": 0}), ("OrderedDict", OrderedDict(node))]
        if keys:
            out.append(("missing key", {k: node[k] for k in keys[1:]}))
        if len(keys) > 1:
            out.append(("key order", {k: node[k] for k in reversed(keys)}))
        return out
    if isinstance(node, tuple):
        out = [("longer tuple", node + (node[-1] if node else 0,))]
        if node:
            out.append(("shorter tuple", node[:-1]))
        if len(node) < len(NAMEDTUPLES):
            out.append(("namedtuple", NAMEDTUPLES[len(node)](*node)))
        return out
    return _leaf_changes(node)


def _nodes(x, path=()):
    yield path, x
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _nodes(v, path + (k,))
    elif isinstance(x, tuple):
        for i, v in enumerate(x):
            yield from _nodes(v, path + (i,))


def _replace(x, path, new):
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(x, dict):
        return {k: (_replace(v, rest, new) if k == head else v) for k, v in x.items()}
    return tuple(_replace(v, rest, new) if i == head else v for i, v in enumerate(x))


@st.composite
def changed_item(draw, structure, leaves=None):
    """An item of `structure` with one change somewhere: a leaf promoted
    (int -> float, float32 -> float64 array, another shape, a str, None) or
    a different structure (an extra/missing key, another key order, another
    tuple length, a leaf that becomes a list/dict/tuple, an OrderedDict or a
    namedtuple in place of a dict or tuple)."""
    item = draw(item_of(structure, leaves))
    path, node = draw(st.sampled_from(list(_nodes(item))), label="changed node")
    changes = [c for c in _node_changes(node) if _leaf_count(_replace(item, path, c[1]))]
    _, new = draw(st.sampled_from(changes), label="change")
    return _replace(item, path, new)


def items_of(structure, changed=1, leaves=None):
    """Items of `structure`; about `changed` in 6 of them with one change."""
    return st.one_of(*[item_of(structure, leaves)] * (6 - changed)
                     + [changed_item(structure, leaves)] * changed)
