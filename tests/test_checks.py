"""in_box: the Sampler's compiled observation check against gymnasium's Box."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from episode._checks import in_box


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([np.float32, np.float64]),
       hnp.array_shapes(min_dims=1, max_dims=3, max_side=5), st.data())
def test_same_answer_as_box_contains(dtype, shape, data):
    values = st.floats(allow_nan=True, allow_infinity=True, width=32)
    low = data.draw(hnp.arrays(dtype, shape, elements=st.floats(-5, 0, width=32)))
    high = data.draw(hnp.arrays(dtype, shape, elements=st.floats(0, 5, width=32)))
    x = data.draw(hnp.arrays(dtype, shape, elements=values))
    box = gym.spaces.Box(low, high, dtype=dtype)
    assert in_box(x, box.low, box.high) == box.contains(x)


def test_what_it_does_not_read_is_left_to_the_caller():
    a = np.zeros((4, 3), np.float32)
    lo, hi = np.full_like(a, -1), np.full_like(a, 1)
    assert in_box(a, lo, hi) is True
    for x, low, high in [
        (a.astype(np.float64), lo, hi),            # another dtype
        (a.astype(np.int64), lo, hi),
        (a[:, :2], lo, hi),                        # another shape
        (a.T, lo.T, hi.T),                         # not C-contiguous
        (a.astype(">f4"), lo.astype(">f4"), hi.astype(">f4")),   # byte-swapped
        (a.tolist(), lo, hi), (a, None, hi), ("x", lo, hi),
        (a.reshape(12), lo, hi),                   # same size, other dims
    ]:
        assert in_box(x, low, high) is None


def test_nan_is_outside_any_bounds():
    lo, hi = np.full(2, -np.inf), np.full(2, np.inf)
    assert in_box(np.array([0.0, np.nan]), lo, hi) is False
    assert in_box(np.array([0.0, np.inf]), lo, hi) is True


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_sizes(n):
    a = np.zeros(n, np.float32)
    assert in_box(a, a - 1, a + 1) is True
