"""ViewRequirement: RLlib 2.60's dataclass, compared with RLlib's own.

Random shifts of every form (ints, lists, range strings, malformed strings)
build a requirement on both sides: same exception class, or the same fields,
shift_arr (values and dtype), range bounds, repr, to_dict and from_dict.
Where RLlib leaves `shift_arr` unset (a range starting at 0, a numpy int, a
tuple) ours sets the intended value; those are pinned below.
"""
from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from episode import ViewRequirement

_ints = st.integers(-60, 60)
SHIFTS = st.one_of(
    _ints,
    st.lists(_ints, max_size=5),
    st.builds(lambda a, b: f"{a}:{b}", _ints, _ints),
    st.builds(lambda a, b, c: f"{a}:{b}:{c}", _ints, _ints, st.integers(-4, 4)),
    st.builds(lambda a, b: f" {a} : {b} ", _ints, _ints),
    st.sampled_from(["", "1", "1:2:3:4", "a:b", "1:x", "1.5:3", "::", "1:2:"]),
)
SPACES = st.sampled_from([None, gym.spaces.Discrete(4), gym.spaces.Box(-1.0, 1.0, (3,)),
                          gym.spaces.Dict({"a": gym.spaces.Discrete(2)})])


def _rllib_class():
    module = pytest.importorskip("ray.rllib.policy.view_requirement")
    return module.ViewRequirement


def _make(cls, **kwargs):
    try:
        return cls(**kwargs), None
    except Exception as e:  # noqa: BLE001 -- the class is what is compared
        return None, type(e)


def _intended_by_rllib(shift) -> bool:
    """Shifts for which RLlib leaves shift_arr unset (the pinned differences)."""
    return isinstance(shift, str) and shift.count(":") in (1, 2) and _starts_at_zero(shift)


def _starts_at_zero(shift: str) -> bool:
    try:
        return int(shift.split(":")[0]) == 0
    except ValueError:
        return False


@pytest.mark.rllib
@settings(max_examples=400, deadline=None, derandomize=True)
@given(shift=SHIFTS, space=SPACES, data_col=st.sampled_from([None, "obs", "actions"]),
       index=st.sampled_from([None, -1, 3]), repeat=st.integers(1, 20),
       compute=st.booleans(), train=st.booleans())
def test_same_as_rllib(shift, space, data_col, index, repeat, compute, train):
    kwargs = dict(data_col=data_col, space=space, shift=shift, index=index,
                  batch_repeat_value=repeat, used_for_compute_actions=compute,
                  used_for_training=train)
    ours, our_error = _make(ViewRequirement, **kwargs)
    theirs, their_error = _make(_rllib_class(), **kwargs)
    if _intended_by_rllib(shift) and their_error is None:
        # RLlib leaves shift_arr unset; ours has the range (or refuses step 0).
        assert not hasattr(theirs, "shift_arr")
        if ours is None:
            assert our_error is ZeroDivisionError and ours is None
        else:
            assert np.array_equal(ours.shift_arr, np.arange(
                ours.shift_from, ours.shift_to + 1, ours.shift_step))
        return
    assert our_error is their_error
    if our_error is not None:
        return
    assert [f.name for f in dataclasses.fields(ours)] == \
        [f.name for f in dataclasses.fields(theirs)]
    for name in ("data_col", "space", "shift", "index", "batch_repeat_value",
                 "used_for_compute_actions", "used_for_training", "shift_from", "shift_to",
                 "shift_step"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.shift_arr.dtype == theirs.shift_arr.dtype
    assert np.array_equal(ours.shift_arr, theirs.shift_arr)
    assert repr(ours).replace("episode.views.", "") == repr(theirs).replace(
        "ray.rllib.policy.view_requirement.", "")
    assert ours.to_dict() == theirs.to_dict()
    d = ours.to_dict()
    back = ViewRequirement.from_dict(d)
    assert isinstance(d["space"], gym.Space)      # replaced in place, as RLlib does
    assert np.array_equal(back.shift_arr, ours.shift_arr) and back.space == ours.space
    rllib_back = _rllib_class().from_dict(theirs.to_dict())
    assert np.array_equal(rllib_back.shift_arr, back.shift_arr)


def test_defaults():
    req = ViewRequirement()
    assert req.space == gym.spaces.Box(float("-inf"), float("inf"), shape=())
    assert req.space.dtype == np.float32
    assert req.shift == 0 and req.shift_arr.tolist() == [0] and req.shift_arr.dtype == np.int64
    assert req.shift_from is req.shift_to is req.shift_step is None
    assert (req.data_col, req.index, req.batch_repeat_value) == (None, None, 1)
    assert req.used_for_compute_actions and req.used_for_training


@pytest.mark.parametrize("shift, arr, bounds", [
    (-1, [-1], (None, None, None)),
    ([-3, -2, -1, 0], [-3, -2, -1, 0], (None, None, None)),
    ("-3:0", [-3, -2, -1, 0], (-3, 0, 1)),
    ("-50:-1", list(range(-50, 0)), (-50, -1, 1)),
    ("1:6:2", [1, 3, 5], (1, 6, 2)),
    ("3:0:-1", [3, 2], (3, 0, -1)),          # (RLlib's to + 1 end with a negative step)
    ("2:1", [], (2, 1, 1)),
])
def test_shift_forms(shift, arr, bounds):
    req = ViewRequirement(shift=shift)
    assert req.shift_arr.tolist() == arr
    assert (req.shift_from, req.shift_to, req.shift_step) == bounds


@pytest.mark.parametrize("shift, error", [
    ("", AssertionError), ("1", AssertionError), ("1:2:3:4", AssertionError),
    ("a:b", ValueError), ("1:2.5", ValueError), ("1:2:0", ZeroDivisionError),
    (1.5, ValueError), (None, ValueError), ({"a": 1}, ValueError),
])
def test_malformed_shifts_raise(shift, error):
    with pytest.raises(error) as raised:
        ViewRequirement(shift=shift)
    if error is not ZeroDivisionError:
        # The message names the accepted forms.
        message = str(raised.value)
        assert repr(shift) in message and "'from:to'" in message and "'from:to:step'" in message
        assert "int" in message and "list of ints" in message


# -- differences: RLlib leaves shift_arr unset, ours has the intended value -------

INTENDED = [
    ("0:3", [0, 1, 2, 3]),        # a range from 0 reads as "no range" in RLlib
    ("0:0", [0]),
    ("-0:2", [0, 1, 2]),
    (np.int64(-1), [-1]),         # RLlib checks for int and list only
    ((-2, -1), [-2, -1]),
]


@pytest.mark.parametrize("shift, arr", INTENDED)
def test_shifts_rllib_leaves_unset(shift, arr):
    req = ViewRequirement(shift=shift)
    assert req.shift_arr.tolist() == arr and req.shift_arr.dtype == np.int64


@pytest.mark.rllib
@pytest.mark.parametrize("shift, arr", INTENDED)
def test_rllib_leaves_these_shifts_unset(shift, arr):
    req = _rllib_class()(shift=shift)
    with pytest.raises(AttributeError):
        req.shift_arr


@pytest.mark.rllib
@pytest.mark.parametrize("shift", [1.5, None])
def test_rllib_accepts_other_shift_types_without_shift_arr(shift):
    """Ours raises the ValueError RLlib builds here (and forgets to raise)."""
    req = _rllib_class()(shift=shift)
    with pytest.raises(AttributeError):
        req.shift_arr
