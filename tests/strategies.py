"""Hypothesis strategies for items of every space kind, shared by the property tests."""
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
