"""The deliberate differences from RLlib 2.60's InfiniteLookbackBuffer.

Where RLlib crashes or silently corrupts data, ours gives the sensible answer.
Each difference has a test pinning our behaviour (expected values derived in
the test, not copied from our output) and, marked `rllib`, a test confirming
that RLlib really behaves otherwise (so a future RLlib fix shows up here).
These cases are excluded from the differential tests.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from difftools import rllib_buffer_class
from episode import InfiniteLookbackBuffer
from episode._index import IndexTypeError

BOX4 = gym.spaces.Box(-10.0, 10.0, (4,), np.float32)
DICT = gym.spaces.Dict({"a": gym.spaces.Box(-10.0, 10.0, (2,), np.float32),
                        "b": gym.spaces.Discrete(3)})


def rows4(n):
    return [np.full(4, i, np.float32) for i in range(n)]


def dict_items(n):
    return [{"a": np.full(2, i, np.float32), "b": np.int64(i % 3)} for i in range(n)]


def finalized(cls, data, lookback=0, space=None):
    buf = cls(data, lookback, space)
    buf.finalize()
    return buf


# -- finalize() on an empty buffer ---------------------------------------------


@pytest.mark.parametrize("space, expected", [
    (None, {"shape": (0,), "dtype": np.float64}),
    (BOX4, {"shape": (0, 4), "dtype": np.float32}),
    (gym.spaces.Discrete(3), {"shape": (0,), "dtype": np.int64}),
    (gym.spaces.MultiDiscrete([2, 3]), {"shape": (0, 2), "dtype": np.int64}),
])
def test_finalize_empty_gives_empty_array(space, expected):
    buf = InfiniteLookbackBuffer([], 0, space)
    buf.finalize()
    assert buf.finalized and isinstance(buf.data, np.ndarray)
    assert buf.data.shape == expected["shape"] and buf.data.dtype == expected["dtype"]
    assert len(buf) == 0 and buf.len_incl_lookback() == 0
    # It then behaves like any finalized buffer.
    item = space.sample() if space is not None else 1.5
    buf.append(item)
    assert len(buf) == 1
    np.testing.assert_array_equal(buf.get(0), item)


def test_finalize_empty_dict_space_gives_dict_of_empty_arrays():
    buf = InfiniteLookbackBuffer([], 0, DICT)
    buf.finalize()
    assert list(buf.data) == ["a", "b"]
    assert buf.data["a"].shape == (0, 2) and buf.data["a"].dtype == np.float32
    assert buf.data["b"].shape == (0,) and buf.data["b"].dtype == np.int64
    buf.append(dict_items(2)[1])
    assert buf.data["a"].tolist() == [[1.0, 1.0]] and buf.data["b"].tolist() == [1]


@pytest.mark.rllib
def test_rllib_finalize_empty_raises():
    with pytest.raises(ValueError):
        rllib_buffer_class()([], 0, BOX4).finalize()


@pytest.mark.parametrize("how", ["state", "pickle"])
@pytest.mark.parametrize("row", [1, np.float32(2.0), np.zeros(3, np.float32)])
def test_finalized_empty_keeps_its_open_row_type_through_a_round_trip(how, row):
    """With no rows and no space, the first rows appended decide the row
    type; so too after get_state()/from_state() or pickling (the state of a
    multi-agent episode's agent without steps goes this way)."""
    import pickle

    fresh = InfiniteLookbackBuffer()
    fresh.finalize()
    back = (InfiniteLookbackBuffer.from_state(fresh.get_state()) if how == "state"
            else pickle.loads(pickle.dumps(fresh)))
    for buffer in (fresh, back):
        buffer.append(row)
    assert back.data.dtype == fresh.data.dtype and back.data.shape == fresh.data.shape
    np.testing.assert_array_equal(back.data, fresh.data)


# -- fill on finalized multi-dimensional data without a space ---------------------


FILL_SLICES = [
    # (slice, neg_index_as_lookback, fill rows left, data rows, fill rows right)
    (slice(-3, 1), True, 2, [0, 1], 0),  # past the lookback's start
    (slice(2, 6), False, 0, [3], 3),  # past the end
    (slice(5, 7), False, 0, [], 2),  # entirely after the data
    (slice(-6, -4), True, 2, [], 0),  # entirely before the lookback
]


@pytest.mark.parametrize("sl, neg, left, data_rows, right", FILL_SLICES)
def test_fill_without_space_gives_rows_of_the_row_shape(sl, neg, left, data_rows, right):
    # Data rows 0..3 (row i is all i), lookback 1: ts 0 is row 1.
    buf = finalized(InfiniteLookbackBuffer, rows4(4), lookback=1)
    got = buf.get(sl, neg_index_as_lookback=neg, fill=-1.0)
    expected = [[-1.0] * 4] * left + [[float(r)] * 4 for r in data_rows] + [[-1.0] * 4] * right
    assert isinstance(got, np.ndarray) and got.shape == (len(expected), 4)
    assert got.tolist() == expected
    # np.concatenate of the float32 rows with the fill rows of a Python float.
    assert got.dtype == np.result_type(np.float32, np.asarray(-1.0).dtype)


def test_fill_without_space_list_indices_fill_first():
    buf = finalized(InfiniteLookbackBuffer, rows4(4), lookback=1)
    got = buf.get([9, 0], fill=-1.0)
    assert got.shape == (2, 4) and got.tolist() == [[-1.0] * 4, [1.0] * 4]


def test_fill_without_space_on_finalized_dict_data():
    # Dict rows without a space: the fill rows take each leaf's row shape.
    items = [{"a": np.full(2, i, np.float32), "b": i} for i in range(3)]
    buf = finalized(InfiniteLookbackBuffer, items)
    got = buf.get(slice(1, 5), fill=0)
    assert got["a"].tolist() == [[1.0, 1.0], [2.0, 2.0], [0.0, 0.0], [0.0, 0.0]]
    assert got["b"].tolist() == [1, 2, 0, 0]


@pytest.mark.rllib
@pytest.mark.parametrize("sl, neg, left, data_rows, right", FILL_SLICES)
def test_rllib_fill_without_space_crashes_or_misshapes(sl, neg, left, data_rows, right):
    buf = finalized(rllib_buffer_class(), rows4(4), lookback=1)
    try:
        got = buf.get(sl, neg_index_as_lookback=neg, fill=-1.0)
    except ValueError:
        return  # np.concatenate of (k,) fill with (n, 4) rows
    assert got.shape != (left + len(data_rows) + right, 4)


@pytest.mark.rllib
def test_rllib_fill_without_space_list_indices_fill_first_crashes():
    buf = finalized(rllib_buffer_class(), rows4(4), lookback=1)
    with pytest.raises(ValueError):
        buf.get([9, 0], fill=-1.0)


# -- neg_index_as_lookback past the lookback's start, finalized, no fill -----------


@pytest.mark.parametrize("idx", [-2, -3, -5])
def test_neg_index_before_lookback_raises_index_error(idx):
    # Lookback 1: only -1 reaches back into the lookback.
    for fin in (False, True):
        buf = InfiniteLookbackBuffer([1.0, 2.0, 3.0, 4.0], 1)
        if fin:
            buf.finalize()
        with pytest.raises(IndexError):
            buf.get(idx, neg_index_as_lookback=True)
        with pytest.raises(IndexError):
            buf.get([0, idx], neg_index_as_lookback=True)
        assert buf.get(-1, neg_index_as_lookback=True) == 1.0
        assert buf.get(idx, neg_index_as_lookback=True, fill=0.0) == 0.0


@pytest.mark.rllib
def test_rllib_neg_index_before_lookback_wraps_around_when_finalized():
    buf = finalized(rllib_buffer_class(), [1.0, 2.0, 3.0, 4.0], lookback=1)
    assert buf.get(-2, neg_index_as_lookback=True) == 4.0  # data[-1]
    lst = rllib_buffer_class()([1.0, 2.0, 3.0, 4.0], 1)
    with pytest.raises(IndexError):
        lst.get(-2, neg_index_as_lookback=True)


# -- mixed-dtype ndarray rows at finalize --------------------------------------------


@pytest.mark.parametrize("first, second", [
    (np.array([1.0, 2.0], np.float32), np.array([0.1, 0.2], np.float64)),
    (np.array([1, 2], np.int64), np.array([0.5, 1.5], np.float64)),
    (np.array([1, 2], np.int8), np.array([300, -300], np.int64)),
])
def test_finalize_mixed_dtype_rows_promotes(first, second):
    buf = InfiniteLookbackBuffer([first, second])
    buf.finalize()
    assert buf.data.dtype == np.result_type(first.dtype, second.dtype)
    np.testing.assert_array_equal(buf.data[1], second)  # nothing lost


@pytest.mark.rllib
def test_rllib_finalize_mixed_dtype_rows_casts_to_first():
    buf = rllib_buffer_class()([np.array([1, 2], np.int64), np.array([0.5, 1.5])])
    buf.finalize()
    assert buf.data.dtype == np.int64 and buf.data[1].tolist() == [0, 1]


def test_finalize_mixed_dtype_leaves_of_dict_items_promotes():
    """The same rule for each leaf of Dict/Tuple items."""
    first, second = np.array([1, 2], np.uint8), np.array([300, -1], np.int64)
    buf = InfiniteLookbackBuffer([{"v": first, "k": 1}, {"v": second, "k": 2}])
    buf.finalize()
    assert buf.data["v"].dtype == np.int64 and buf.data["k"].dtype == np.int64
    np.testing.assert_array_equal(buf.get(1)["v"], second)


@pytest.mark.rllib
def test_rllib_finalize_mixed_dtype_leaves_casts_to_first():
    buf = rllib_buffer_class()([{"v": np.array([1, 2], np.uint8), "k": 1},
                                {"v": np.array([300, -1], np.int64), "k": 2}])
    buf.finalize()
    assert buf.data["v"].dtype == np.uint8 and buf.data["v"][1].tolist() == [44, 255]


# -- rows that do not form one array at finalize ---------------------------------------


RAGGED = [
    [np.zeros(2, np.float32), np.ones(3, np.float32)],    # rows of two lengths
    [0.0, np.ones(2, np.float32)],                        # a bare fill before rows
    [np.ones(2), 0.5],                                    # a scalar after a row
]


@pytest.mark.parametrize("items", RAGGED)
def test_finalize_ragged_rows_keeps_each_item(items):
    """Items that do not stack into one regular array stay as they are, in an
    object array (and come back as the same items from get())."""
    buf = InfiniteLookbackBuffer(list(items))
    buf.finalize()
    assert buf.data.dtype == object and buf.data.shape == (len(items),)
    for got, item in zip(buf.get(slice(None)), items):
        assert type(got) is type(item) and np.shape(got) == np.shape(item)
        np.testing.assert_array_equal(got, item)


RAGGED_LEAVES = [
    [{"v": np.zeros(2), "k": 1}, {"v": np.ones(3), "k": 2}],     # leaves of two lengths
    [{"v": np.int64(1), "k": 1}, {"v": np.array([1, 2]), "k": 2}],  # a scalar before a row
    [{"v": np.ones(2), "k": 1}, {"v": 0.5, "k": 2}],             # a scalar after a row
]


@pytest.mark.parametrize("items", RAGGED_LEAVES)
def test_finalize_ragged_leaves_keeps_each_value(items):
    """The same rule for a leaf of Dict/Tuple items: that leaf becomes an
    object array, the other leaves stack as usual."""
    buf = InfiniteLookbackBuffer([dict(item) for item in items])
    buf.finalize()
    assert buf.data["v"].dtype == object and buf.data["v"].shape == (len(items),)
    assert buf.data["k"].tolist() == [1, 2] and buf.data["k"].dtype == np.int64
    for i, item in enumerate(items):
        got = buf.get(i)["v"]
        assert type(got) is type(item["v"]) and np.shape(got) == np.shape(item["v"])
        np.testing.assert_array_equal(got, item["v"])


@pytest.mark.rllib
def test_rllib_finalize_ragged_leaves_raises_or_broadcasts():
    for items in RAGGED_LEAVES[:2]:
        buf = rllib_buffer_class()([dict(item) for item in items])
        with pytest.raises(ValueError):  # numpy's error while stacking the leaf
            buf.finalize()
    buf = rllib_buffer_class()([dict(item) for item in RAGGED_LEAVES[2]])
    buf.finalize()
    assert buf.data["v"].tolist() == [[1.0, 1.0], [0.5, 0.5]]


@pytest.mark.rllib
def test_rllib_finalize_ragged_rows_raises_or_reshapes():
    for items in RAGGED[:2]:
        buf = rllib_buffer_class()(list(items))
        with pytest.raises(ValueError):  # numpy's error while stacking
            buf.finalize()
    buf = rllib_buffer_class()(list(RAGGED[2]))
    buf.finalize()  # the scalar 0.5 is broadcast into a row of the first item's shape
    assert buf.data.tolist() == [[1.0, 1.0], [0.5, 0.5]]


# -- slices whose stop lies before their start, with no rows to address ---------------


NO_ROWS = [
    # (data, lookback, slice, get() options, expected)
    ([], 0, slice(None, -1), {}, []),
    ([], 0, slice(0, -1), {}, []),
    ([], 0, slice(None, -2), {"fill": 0.0}, [0.0, 0.0]),
    ([1.0], 1, slice(None, -1), {"_ignore_last_ts": True}, []),
]


@pytest.mark.parametrize("data, lookback, sl, options, expected", NO_ROWS)
def test_slice_before_the_start_of_no_rows_is_empty(data, lookback, sl, options, expected):
    """Python's rule for a stop before the start (nothing), padded by `fill`
    with RLlib's counts; set() of such a slice takes no items."""
    buf = InfiniteLookbackBuffer(list(data), lookback)
    assert buf.get(sl, **options) == expected
    if not options:
        buf.set([], at_indices=sl)
        assert buf.data == data


@pytest.mark.rllib
@pytest.mark.parametrize("data, lookback, sl, options, expected", NO_ROWS)
def test_rllib_slice_before_the_start_of_no_rows_asserts(data, lookback, sl, options, expected):
    buf = rllib_buffer_class()(list(data), lookback)
    with pytest.raises(AssertionError) as info:  # _interpret_slice: start -1 after clipping
        buf.get(sl, **options)
    assert info.value.args[0][0] < 0


# -- extend([]) on a finalized buffer ---------------------------------------------


@pytest.mark.parametrize("data, space", [
    ([1, 2, 3], None),
    (rows4(3), None),
    (dict_items(3), DICT),
])
def test_extend_empty_list_on_finalized_is_a_no_op(data, space):
    buf = finalized(InfiniteLookbackBuffer, data, space=space)
    before = buf.get_state()
    buf.extend([])
    after = buf.get_state()
    assert after["lookback"] == before["lookback"] and after["finalized"]
    if isinstance(before["data"], dict):
        for k in before["data"]:
            assert after["data"][k].dtype == before["data"][k].dtype
            np.testing.assert_array_equal(after["data"][k], before["data"][k])
    else:
        assert after["data"].dtype == before["data"].dtype
        np.testing.assert_array_equal(after["data"], before["data"])


@pytest.mark.rllib
def test_rllib_extend_empty_list_on_finalized_changes_dtype_or_crashes():
    ints = finalized(rllib_buffer_class(), [1, 2, 3])
    ints.extend([])
    assert ints.data.dtype == np.float64  # was int64
    with pytest.raises(ValueError):
        finalized(rllib_buffer_class(), rows4(3)).extend([])


# -- concat into a finalized buffer --------------------------------------------------


def test_concat_into_finalized_appends():
    buf = finalized(InfiniteLookbackBuffer, [0.0, 1.0], lookback=1)
    other = InfiniteLookbackBuffer([5.0, 6.0, 7.0], lookback=1)  # 5.0 is its lookback
    buf.concat(other)
    assert buf.finalized and buf.data.tolist() == [0.0, 1.0, 6.0, 7.0]
    assert len(buf) == 3 and buf.lookback == 1


@pytest.mark.rllib
def test_rllib_concat_into_finalized_raises_attribute_error():
    buf = finalized(rllib_buffer_class(), [0.0, 1.0])
    with pytest.raises(AttributeError):
        buf.concat(rllib_buffer_class()([5.0]))


# -- set on finalized Dict/Tuple data with a space -----------------------------------


def test_set_on_finalized_dict_checks_each_leaf():
    buf = finalized(InfiniteLookbackBuffer, dict_items(4), lookback=1, space=DICT)
    buf.set({"a": np.full(2, 9.0, np.float32), "b": np.int64(2)}, at_indices=0)
    assert buf.data["a"][1].tolist() == [9.0, 9.0] and buf.data["b"][1] == 2
    batch = {"a": np.full((2, 2), 7.0, np.float32), "b": np.array([1, 0])}
    buf.set(batch, at_indices=slice(1, 3))
    assert buf.data["a"][2:].tolist() == [[7.0, 7.0], [7.0, 7.0]]
    assert buf.data["b"].tolist() == [0, 2, 1, 0]
    # A leaf outside its leaf space is refused, and nothing changes.
    state = buf.get_state()
    with pytest.raises(AssertionError):
        buf.set({"a": np.full(2, 99.0, np.float32), "b": np.int64(0)}, at_indices=0)
    with pytest.raises(AssertionError):
        buf.set({"a": np.zeros(2, np.float32), "b": np.int64(5)}, at_indices=0)
    assert buf.data["a"].tolist() == state["data"]["a"].tolist()
    assert buf.data["b"].tolist() == state["data"]["b"].tolist()


@pytest.mark.rllib
def test_rllib_set_on_finalized_dict_with_space_fails():
    buf = finalized(rllib_buffer_class(), dict_items(4), lookback=1, space=DICT)
    with pytest.raises(AssertionError):
        buf.set({"a": np.full(2, 9.0, np.float32), "b": np.int64(2)}, at_indices=0)


# -- one_hot on empty data ------------------------------------------------------


@pytest.mark.parametrize("space, width", [
    (gym.spaces.Discrete(3), 3),
    (gym.spaces.MultiDiscrete([2, 3]), 5),
])
def test_one_hot_of_no_rows_gives_zero_rows(space, width):
    # Every item is in the lookback: get() selects no rows.
    buf = finalized(InfiniteLookbackBuffer, [space.sample(), space.sample()], 2, space)
    got = buf.get(one_hot_discrete=True)
    assert got.shape == (0, width) and got.dtype == np.float32


def test_one_hot_of_no_rows_dict():
    buf = finalized(InfiniteLookbackBuffer, dict_items(1), 1, DICT)
    got = buf.get(one_hot_discrete=True)
    assert got["a"].shape == (0, 2) and got["b"].shape == (0, 3)
    assert got["b"].dtype == np.float32


@pytest.mark.rllib
def test_rllib_one_hot_of_no_rows_crashes():
    buf = finalized(rllib_buffer_class(), [1, 2], 2, gym.spaces.Discrete(3))
    with pytest.raises(ValueError):
        buf.get(one_hot_discrete=True)


# -- index types -------------------------------------------------------------------


@pytest.mark.parametrize("bad", [1.0, "0", (0,), object()])
def test_bad_index_type_raises_index_type_error(bad):
    assert issubclass(IndexTypeError, TypeError) and issubclass(IndexTypeError, AssertionError)
    for fin in (False, True):
        buf = InfiniteLookbackBuffer([1.0, 2.0, 3.0])
        if fin:
            buf.finalize()
        with pytest.raises(IndexTypeError):
            buf.get(bad)
        with pytest.raises(IndexTypeError):
            buf.set(0.0, at_indices=bad)
        assert buf.get(0) == 1.0


@pytest.mark.parametrize("np_int", [np.int64, np.int32, np.uint8])
def test_numpy_integer_indices_are_accepted(np_int):
    for fin in (False, True):
        buf = InfiniteLookbackBuffer([1.0, 2.0, 3.0], lookback=1)
        if fin:
            buf.finalize()
        assert buf.get(np_int(1)) == 3.0 and buf[np_int(0)] == 2.0
        assert list(buf.get([np_int(0), np_int(1)])) == [2.0, 3.0]
        buf.set(9.0, at_indices=np_int(1))
        buf[np_int(0)] = 8.0
        assert list(buf.get()) == [8.0, 9.0]


@pytest.mark.rllib
def test_rllib_numpy_integer_index_asserts():
    buf = rllib_buffer_class()([1.0, 2.0, 3.0])
    with pytest.raises(AssertionError):
        buf.get(np.int64(0))
    with pytest.raises(AssertionError):
        buf.get(1.0)


# -- _add_last_ts_value on slices ------------------------------------------------------


@pytest.mark.parametrize("fin", [False, True])
def test_add_last_ts_value_on_slices_keeps_rows(fin):
    buf = InfiniteLookbackBuffer(rows4(4), 1)
    if fin:
        buf.finalize()
    extra = np.full(4, 9.0, np.float32)
    got = buf.get(slice(-2, None), _add_last_ts_value=extra)
    # Data (incl. lookback) plus the extra row: rows 0, 1, 2, 3, extra; the last two.
    got = np.asarray(got)
    assert got.shape == (2, 4) and got.tolist() == [[3.0] * 4, [9.0] * 4]
    assert buf.len_incl_lookback() == 4  # the extra row is not kept


@pytest.mark.rllib
def test_rllib_add_last_ts_value_on_slices_flattens():
    buf = finalized(rllib_buffer_class(), rows4(4), 1)
    got = buf.get(slice(-2, None), _add_last_ts_value=np.full(4, 9.0, np.float32))
    assert got.shape == (2,)  # two scalars out of the flattened data


# -- a failed call leaves the buffer unchanged -------------------------------------------


@pytest.mark.parametrize("fin", [False, True])
def test_failed_set_with_list_indices_changes_nothing(fin):
    buf = InfiniteLookbackBuffer([1.0, 2.0, 3.0])
    if fin:
        buf.finalize()
    with pytest.raises(IndexError):
        buf.set([7.0, 8.0], at_indices=[0, 9])
    assert list(buf.get()) == [1.0, 2.0, 3.0]


@pytest.mark.rllib
def test_rllib_failed_set_with_list_indices_sets_the_first():
    buf = rllib_buffer_class()([1.0, 2.0, 3.0])
    with pytest.raises(IndexError):
        buf.set([7.0, 8.0], at_indices=[0, 9])
    assert buf.data == [7.0, 2.0, 3.0]


# -- storage semantics: copies in list mode, in-place growth after finalize ------


def test_list_mode_keeps_a_copy_of_appended_arrays():
    """RLlib stores the caller's array object itself; ours copies numeric rows
    into typed storage, so later changes to the caller's array do not reach
    the buffer (and an item read back is the caller's to change)."""
    buf = InfiniteLookbackBuffer()
    row = np.zeros(2)
    buf.append(row)
    row += 7
    assert buf.get(0).tolist() == [0.0, 0.0]
    got = buf.get(0)
    got += 5
    assert buf.get(0).tolist() == [0.0, 0.0]


def test_list_mode_dict_items_are_rebuilt_on_each_read():
    """RLlib stores each Dict/Tuple item object and hands it back; ours keeps
    the leaves in typed Columns, so a read gives a new dict/tuple, equal to
    the one appended with the same leaf types, and writing into it (or into
    the dict appended) does not change the buffer."""
    appended = {"a": 1, "b": np.zeros(2)}
    buf = InfiniteLookbackBuffer([appended])
    got = buf.get(0)
    assert got is not appended and got["a"] == 1 and type(got["a"]) is int
    got["a"] = 5
    appended["a"] = 6
    assert buf.get(0)["a"] == 1


@pytest.mark.rllib
def test_rllib_list_mode_hands_back_the_appended_dict():
    appended = {"a": 1, "b": np.zeros(2)}
    buf = rllib_buffer_class()([appended])
    assert buf.get(0) is appended
    buf.get(0)["a"] = 5
    assert buf.get(0)["a"] == 5


def test_finalize_of_items_without_leaves_raises_and_changes_nothing():
    """Dicts that hold only empty dicts have no leaf to make an array of:
    ours refuses to finalize them; RLlib finalizes to a struct without
    arrays, whose len() then fails."""
    buf = InfiniteLookbackBuffer([{"e": {}}] * 3)
    with pytest.raises(ValueError):
        buf.finalize()
    assert not buf.finalized and len(buf) == 3 and buf.get(-1) == {"e": {}}


@pytest.mark.rllib
def test_rllib_finalize_of_items_without_leaves_breaks_len():
    buf = rllib_buffer_class()([{"e": {}}] * 3)
    buf.finalize()
    assert buf.data == {"e": {}}
    with pytest.raises(IndexError):
        len(buf)


def test_list_mode_data_is_the_live_list():
    """As in RLlib, changing `.data` in list mode changes the buffer."""
    buf = InfiniteLookbackBuffer([1.0, 2.0])
    buf.data.append(3.0)
    buf.data[0] = 9.0
    assert buf.get() == [9.0, 2.0, 3.0] and len(buf) == 3


def test_views_of_finalized_data_detach_only_when_an_append_moves_the_rows():
    """RLlib's append after finalize makes a new array (O(n) each time), so
    every append detaches the views taken before it. Ours appends in place
    while the storage has room. finalize() leaves none (it trims the storage
    to the rows in use), so the first append moves the rows and detaches
    earlier views as RLlib's does; a view taken after it keeps sharing memory
    with the buffer until the storage grows again."""
    buf = InfiniteLookbackBuffer([1.0, 2.0, 3.0])
    buf.finalize()
    before = buf.get(slice(0, 2))
    buf.append(4.0)
    after = buf.get(slice(0, 2))
    buf.append(5.0)
    buf.set(100.0, at_indices=0)
    assert before.tolist() == [1.0, 2.0]
    assert after.tolist() == [100.0, 2.0]


@pytest.mark.rllib
def test_rllib_append_after_finalize_detaches_every_view():
    buf = finalized(rllib_buffer_class(), [1.0, 2.0, 3.0])
    buf.append(4.0)
    after = buf.get(slice(0, 2))
    buf.append(5.0)
    buf.set(100.0, at_indices=0)
    assert after.tolist() == [1.0, 2.0]


def test_lookback_of_finalized_dict_data_is_capped_by_rows_not_keys():
    """RLlib caps the lookback at len(data), which for a dict is its number of keys."""
    buf = InfiniteLookbackBuffer({"a": np.arange(5), "b": np.arange(5)}, lookback=3)
    assert buf.lookback == 3 and len(buf) == 2


# -- lookbacks outside 0..2**60 -------------------------------------------------------


def test_negative_lookback_is_refused():
    with pytest.raises(ValueError, match="lookback"):
        InfiniteLookbackBuffer([1.0, 2.0, 3.0], lookback=-2)
    buf = InfiniteLookbackBuffer([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="lookback"):
        buf.lookback = -1
    with pytest.raises(ValueError, match="lookback"):
        buf.lookback = 2**61
    assert buf.lookback == 0 and buf.get() == [1.0, 2.0, 3.0]


@pytest.mark.rllib
def test_rllib_negative_lookback_reads_from_the_end():
    buf = rllib_buffer_class()([1.0, 2.0, 3.0], lookback=-2)
    assert buf.lookback == -2 and len(buf) == 5
    assert buf.get(0) == 2.0                 # data[-2]: the second item from the end


# -- int indices beyond 64 bits on numpy'ized data ----------------------------------------


@pytest.mark.parametrize("index", [2**63, -2**63 - 1, 2**100])
def test_huge_index_on_numpy_data_is_out_of_range(index):
    buf = finalized(InfiniteLookbackBuffer, [1.0, 2.0, 3.0])
    with pytest.raises(IndexError):
        buf.get(index)
    assert buf.get(index, fill=0.0) == 0.0     # as in list mode, and as RLlib there


@pytest.mark.rllib
def test_rllib_huge_index_on_numpy_data_fails_converting_it():
    buf = finalized(rllib_buffer_class(), [1.0, 2.0, 3.0])
    with pytest.raises(OverflowError):
        buf.get(2**63)
    with pytest.raises(OverflowError):
        buf.get(2**63, fill=0.0)
    listed = rllib_buffer_class()([1.0, 2.0, 3.0])
    with pytest.raises(IndexError):
        listed.get(2**63)
    assert listed.get(2**63, fill=0.0) == 0.0


# -- one-hot of values that are not integers ------------------------------------------


@pytest.mark.parametrize("finalize", [False, True])
def test_one_hot_of_non_integer_values_raises_index_error(finalize):
    buf = InfiniteLookbackBuffer([1, 1.5, 2.0], space=gym.spaces.Discrete(3))
    if finalize:
        buf.finalize()
    with pytest.raises(IndexError, match="integer"):
        buf.get(one_hot_discrete=True)
    assert list(buf.get()) == [1, 1.5, 2.0]


@pytest.mark.rllib
def test_rllib_one_hot_of_a_python_float_fails_inside():
    buf = rllib_buffer_class()([1, 1.5], space=gym.spaces.Discrete(3))
    with pytest.raises(AttributeError):         # a float has no dtype
        buf.get(one_hot_discrete=True)
    buf.finalize()
    with pytest.raises(IndexError):             # numpy refuses float indices
        buf.get(one_hot_discrete=True)


def test_a_lookback_that_is_not_an_int_is_refused_where_it_is_set():
    with pytest.raises(TypeError):
        InfiniteLookbackBuffer([1.0, 2.0, 3.0], lookback=1.5)
    buf = InfiniteLookbackBuffer([1.0, 2.0, 3.0], lookback=1)
    with pytest.raises(TypeError):
        buf.lookback = 1.5
    assert buf.lookback == 1 and buf.get() == [2.0, 3.0]


@pytest.mark.rllib
def test_rllib_stores_a_float_lookback_and_fails_reading():
    buf = rllib_buffer_class()([1.0, 2.0, 3.0], lookback=1.5)
    assert buf.lookback == 1.5
    with pytest.raises(TypeError):
        buf.get(0)
