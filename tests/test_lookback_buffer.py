"""InfiniteLookbackBuffer: explicit expected values for RLlib 2.60's behaviour."""
import pickle

import gymnasium as gym
import numpy as np
import pytest

from episode import InfiniteLookbackBuffer
from episode._index import IndexTypeError


@pytest.fixture(params=[False, True], ids=["list", "finalized"])
def finalized(request):
    return request.param


def make(data, lookback=0, space=None, finalize=False):
    buf = InfiniteLookbackBuffer(list(data), lookback=lookback, space=space)
    if finalize:
        buf.finalize()
    return buf


def as_list(x):
    return x.tolist() if isinstance(x, np.ndarray) else x


def test_constructor_defaults():
    buf = InfiniteLookbackBuffer()
    assert buf.data == [] and buf.lookback == 0 and not buf.finalized
    assert buf.space is None and buf.space_struct is None
    assert len(buf) == 0 and buf.len_incl_lookback() == 0


def test_lookback_is_capped_at_data_length():
    assert InfiniteLookbackBuffer([1, 2], lookback=5).lookback == 2


def test_lookback_examples_from_rllib_docs(finalized):
    # [4, 5, 6] is the lookback, 7 is ts=0.
    buf = make([4, 5, 6, 7, 8, 9], lookback=3, finalize=finalized)
    assert len(buf) == 3
    assert buf.get(-1, neg_index_as_lookback=True) == 6
    assert as_list(buf.get(slice(-2, 1), neg_index_as_lookback=True)) == [5, 6, 7]
    assert buf.get(0) == 7 and buf.get(-1) == 9
    assert as_list(buf.get()) == [7, 8, 9]
    assert as_list(buf[1:]) == [8, 9]


def test_fill_example_from_rllib_docs(finalized):
    buf = make([10, 11, 12, 13, 14], lookback=2, finalize=finalized)
    got = buf.get(slice(-7, -2), fill=0.0)
    assert as_list(got) == [0.0, 0.0, 10, 11, 12]


def test_fill_past_both_ends(finalized):
    buf = make([1.0, 2.0, 3.0], finalize=finalized)
    assert as_list(buf.get(slice(-5, -2), fill=0.0)) == [0.0, 0.0, 1.0]
    assert as_list(buf.get(slice(2, 5), fill=0.0)) == [3.0, 0.0, 0.0]
    assert as_list(buf.get(slice(5, 7), fill=-1.0)) == [-1.0, -1.0]
    assert buf.get(10, fill=7.0) == 7.0
    assert as_list(buf.get([0, 10], fill=7.0)) == [1.0, 7.0]


def test_list_mode_returns_the_appended_types():
    buf = InfiniteLookbackBuffer()
    buf.append(1)
    buf.append(np.float32(2.0))
    buf.append(np.arange(3))
    assert type(buf.get(0)) is int
    assert type(buf.get(1)) is np.float32
    assert isinstance(buf.get(2), np.ndarray) and buf.get(2).tolist() == [0, 1, 2]
    assert isinstance(buf.get(slice(0, 2)), list)
    assert isinstance(buf.data, list)


def test_finalize_gives_arrays_and_numpys_dtype():
    buf = make([1.0, 2.0, 3.0])
    buf.finalize()
    assert buf.finalized and isinstance(buf.data, np.ndarray) and buf.data.dtype == np.float64
    assert isinstance(buf.get(slice(0, 2)), np.ndarray)
    assert type(buf.get(0)) is np.float64


def test_finalize_dict_items_gives_dict_of_arrays():
    items = [{"a": np.float32(i), "b": (i, np.full(2, i, np.int8))} for i in range(3)]
    buf = make(items, lookback=1)
    buf.finalize()
    data = buf.data
    assert list(data) == ["a", "b"]
    assert data["a"].dtype == np.float32 and data["a"].tolist() == [0, 1, 2]
    assert data["b"][0].tolist() == [0, 1, 2]
    assert data["b"][1].shape == (3, 2) and data["b"][1].dtype == np.int8
    assert len(buf) == 2
    got = buf.get(-1)
    assert got["a"] == 2 and got["b"][1].tolist() == [2, 2]
    buf.append({"a": np.float32(9), "b": (9, np.full(2, 9, np.int8))})
    assert buf.get(-1)["b"][0] == 9 and len(buf) == 3


def test_finalize_empty_buffer_uses_space():
    buf = InfiniteLookbackBuffer(space=gym.spaces.Box(-1, 1, (4,), np.float32))
    buf.finalize()
    assert buf.data.shape == (0, 4) and buf.data.dtype == np.float32
    buf.append(np.zeros(4, np.float32))
    assert len(buf) == 1
    plain = InfiniteLookbackBuffer()
    plain.finalize()
    assert plain.data.shape == (0,)
    plain.append(np.ones((2, 3), np.float32))     # nothing fixed its rows: they follow
    assert plain.data.shape == (1, 2, 3) and plain.data.dtype == np.float32


def test_append_after_finalize_is_amortized():
    buf = make([np.zeros(4, np.float32)] * 10)
    buf.finalize()
    capacities = set()
    for i in range(5000):
        buf.append(np.full(4, i, np.float32))
        capacities.add(buf._col.capacity)
    assert len(capacities) <= 12            # doubling, not a copy per append
    assert buf.get(-1).tolist() == [4999] * 4 and len(buf) == 5010


def test_views_of_finalized_data_share_memory_with_set():
    buf = make([1.0, 2.0, 3.0], finalize=True)
    view = buf.get(slice(0, 2))
    buf.set(10.0, at_indices=0)
    assert view[0] == 10.0


def test_one_hot_discrete(finalized):
    buf = make([0, 2, 1], lookback=1, space=gym.spaces.Discrete(3), finalize=finalized)
    np.testing.assert_array_equal(buf.get(0, one_hot_discrete=True), [0, 0, 1])
    got = buf.get(slice(-2, 1), neg_index_as_lookback=True, one_hot_discrete=True, fill=0.0)
    rows = np.asarray(got if finalized else np.stack(got))
    np.testing.assert_array_equal(rows, [[0, 0, 0], [1, 0, 0], [0, 0, 1]])
    zero_hot = buf.get(slice(5, 6), one_hot_discrete=True, fill=0.0)
    np.testing.assert_array_equal(np.asarray(zero_hot).reshape(-1), [0, 0, 0])


def test_one_hot_multidiscrete_and_dict(finalized):
    space = gym.spaces.Dict({"m": gym.spaces.MultiDiscrete([2, 3]), "x": gym.spaces.Box(0, 1, (1,))})
    items = [{"m": np.array([1, 2]), "x": np.array([0.5], np.float32)}]
    buf = make(items, space=space, finalize=finalized)
    got = buf.get(0, one_hot_discrete=True)
    np.testing.assert_array_equal(got["m"], [0, 1, 0, 0, 1])
    assert got["m"].dtype == np.float32
    np.testing.assert_array_equal(got["x"], [0.5])


def test_one_hot_without_space_raises_value_error():
    with pytest.raises(ValueError, match="gym.Space"):
        make([1, 2]).get(0, one_hot_discrete=True)


def test_fill_on_finalized_multidimensional_data_without_space():
    buf = make([np.ones((2, 2), np.float32)] * 2, finalize=True)
    got = buf.get(slice(-4, 1), fill=0.0)
    assert got.shape == (3, 2, 2)
    np.testing.assert_array_equal(got[0], np.zeros((2, 2)))
    np.testing.assert_array_equal(got[2], np.ones((2, 2)))


def test_fill_with_box_space_has_space_dtype_and_shape(finalized):
    space = gym.spaces.Box(-1, 1, (2,), np.float32)
    buf = make([np.ones(2, np.float32)], space=space, finalize=finalized)
    got = buf.get(slice(-2, 1), fill=0.0)
    if finalized:
        assert got.dtype == np.float32 and got.shape == (2, 2)
    else:
        assert got[0].dtype == np.float32 and got[0].shape == (2,)


@pytest.mark.parametrize("bad", [1.5, "0", (0,), {0: 1}])
def test_unsupported_index_types_raise_assertion_compatible_type_error(bad, finalized):
    buf = make([1, 2, 3], finalize=finalized)
    with pytest.raises(IndexTypeError):
        buf.get(bad)
    with pytest.raises(AssertionError):
        buf.get(bad)
    with pytest.raises(TypeError):
        buf[bad]


def test_numpy_integer_indices_are_accepted(finalized):
    buf = make([1, 2, 3], finalize=finalized)
    assert buf.get(np.int64(1)) == 2 and buf[np.int32(-1)] == 3


def test_out_of_range_without_fill_raises_index_error(finalized):
    buf = make([1, 2, 3], lookback=1, finalize=finalized)
    with pytest.raises(IndexError, match="out of range"):
        buf.get(2)
    with pytest.raises(IndexError):
        buf.get(-2, neg_index_as_lookback=True)
    assert as_list(buf.data) == [1, 2, 3]


def test_slice_step_zero_raises_like_rllib(finalized):
    buf = make([1, 2, 3], finalize=finalized)
    with pytest.raises(ZeroDivisionError):
        buf.get(slice(0, 2, 0))
    with pytest.raises(ValueError):
        buf.get(slice(0, 2, 0))


def test_set_variants(finalized):
    buf = make([0, 1, 2, 3, 4], lookback=2, finalize=finalized)
    rows = np.array if finalized else list       # a batch once finalized
    buf.set(20, at_indices=0)
    buf[-1] = 40
    buf.set(rows([10, 11]), at_indices=slice(-2, 0), neg_index_as_lookback=True)
    buf.set([99, 98], at_indices=[0, 1])         # a list of items for a list of indices
    assert as_list(buf.data) == [10, 11, 99, 98, 40]
    buf.set(rows([7, 8, 9]))                     # everything after the lookback
    assert as_list(buf.data) == [10, 11, 7, 8, 9]


def test_set_wrong_length_raises_index_error_and_keeps_data(finalized):
    buf = make([0, 1, 2], finalize=finalized)
    rows = np.array if finalized else list
    with pytest.raises(IndexError, match="same size"):
        buf.set(rows([1, 2]), at_indices=slice(0, 3))
    with pytest.raises(IndexError):
        buf.set(5, at_indices=3)
    with pytest.raises(IndexError):
        buf.set([5, 6], at_indices=[0, 7])       # validated before any write
    assert as_list(buf.data) == [0, 1, 2]


def test_set_list_rows_into_finalized_data_raises_like_dm_tree():
    """After finalize() RLlib maps new data onto the arrays with dm-tree: a
    list is nesting there, not rows (ValueError), a list for a tuple of arrays
    another container (TypeError). The data stays as it was."""
    buf = make([0, 1, 2], finalize=True)
    with pytest.raises(ValueError):
        buf.set([5, 6, 7])
    with pytest.raises(ValueError):
        buf.set([5], at_indices=0)
    tup = make([(0, 1.0), (1, 2.0)], finalize=True)
    with pytest.raises(TypeError):
        tup.set([5, 6.0], at_indices=0)
    with pytest.raises(ValueError):
        tup.set((5,), at_indices=0)
    assert buf.data.tolist() == [0, 1, 2] and tup.data[0].tolist() == [0, 1]
    tup.set((np.int64(5), 6.0), at_indices=1)
    assert tup.data[0].tolist() == [0, 5] and tup.data[1].tolist() == [1.0, 6.0]


def test_set_outside_space_on_finalized_raises_and_keeps_data():
    buf = make([0, 1], space=gym.spaces.Discrete(2), finalize=True)
    with pytest.raises(AssertionError):
        buf.set(5, at_indices=0)
    assert buf.data.tolist() == [0, 1]


def test_set_on_finalized_dict_checks_leaf_spaces():
    space = gym.spaces.Dict({"a": gym.spaces.Discrete(3), "b": gym.spaces.Box(-1, 1, (2,), np.float32)})
    items = [{"a": i, "b": np.zeros(2, np.float32)} for i in range(3)]
    buf = make(items, space=space, finalize=True)
    buf.set({"a": 2, "b": np.ones(2, np.float32)}, at_indices=0)
    assert buf.get(0)["a"] == 2 and buf.get(0)["b"].tolist() == [1, 1]
    with pytest.raises(AssertionError):
        buf.set({"a": 7, "b": np.ones(2, np.float32)}, at_indices=1)
    assert buf.get(1)["a"] == 1


def test_pop_uses_raw_positions(finalized):
    buf = make([0, 1, 2, 3], lookback=1, finalize=finalized)
    buf.pop()
    buf.pop(0)
    assert as_list(buf.data) == [1, 2] and buf.lookback == 1
    with pytest.raises(IndexError):
        buf.pop(5)
    assert as_list(buf.data) == [1, 2]


def test_extend_and_concat(finalized):
    buf = make([0, 1], lookback=1, finalize=finalized)
    buf.extend([2, 3])
    other = make([100, 4, 5], lookback=1)
    buf.concat(other)
    assert as_list(buf.data) == [0, 1, 2, 3, 4, 5] and len(buf) == 5


def test_add():
    a = make([1, 2], lookback=1)
    b = make([0, 3], lookback=1)
    assert (a + b).data == [1, 2, 3]
    assert (a + [5]).data == [1, 2, 5]
    assert (a + 1).data == [2, 3] and (a + 1).lookback == 1
    with pytest.raises(RuntimeError):
        make([1], finalize=True) + 1


def test_equality_and_repr(finalized):
    a = make([1, 2, 3], lookback=1, finalize=finalized)
    b = make([1, 2, 3], lookback=1, finalize=finalized)
    assert a == b
    assert a != make([1, 2, 4], lookback=1, finalize=finalized)
    assert a != make([1, 2, 3], lookback=0, finalize=finalized)
    expected = "InfiniteLookbackBuffer([1] <- lookback(1) | [2, 3])" if not finalized else \
        "InfiniteLookbackBuffer([1] <- lookback(1) | [2 3])"
    assert repr(a) == expected


def test_state_round_trip_and_pickle(finalized):
    space = gym.spaces.Box(-1, 1, (3,), np.float32)
    buf = make([np.full(3, i / 10, np.float32) for i in range(5)], lookback=2, space=space,
               finalize=finalized)
    state = buf.get_state()
    assert set(state) == {"data", "lookback", "finalized", "space"}
    again = InfiniteLookbackBuffer.from_state(state)
    assert again == buf and again.space == space
    unpickled = pickle.loads(pickle.dumps(buf, protocol=5))
    assert unpickled == buf and type(unpickled) is InfiniteLookbackBuffer


def test_data_can_be_assigned():
    buf = InfiniteLookbackBuffer([1, 2])
    buf.data = [5, 6, 7]
    assert buf.data == [5, 6, 7] and not buf.finalized
    buf.data = np.arange(3)
    assert buf.finalized and buf.get(-1) == 2


def test_ignore_last_ts_and_add_last_value():
    buf = make([1, 2, 3])
    assert buf.get(-1, _ignore_last_ts=True) == 2
    assert buf.get(None, _ignore_last_ts=True) == [1, 2]
    assert buf.get(-1, _add_last_ts_value=9) == 9
    # RLlib np.append()s the hanging value to the list: an ndarray comes back.
    out = buf.get(slice(-2, None), _add_last_ts_value=9)
    assert isinstance(out, np.ndarray) and out.tolist() == [3, 9]


def test_hanging_value_after_ignored_rows_promotes_with_the_data():
    """Rows that _ignore_last_ts leaves out still decide the dtype, as in
    RLlib's np.append(data[:-1], value): float64 data and an int value give
    float64 (a leaf with no rows at all takes the value's own dtype)."""
    buf = InfiniteLookbackBuffer([0.0])
    buf.finalize()
    out = buf.get(0, _ignore_last_ts=True, _add_last_ts_value=0)
    assert type(out) is np.float64 and out == 0.0
    rows = buf.get(slice(None), _ignore_last_ts=True, _add_last_ts_value=3)
    assert rows.dtype == np.float64 and rows.tolist() == [3.0]


def test_finalized_can_be_set():
    buf = InfiniteLookbackBuffer([1.0, 2.0])
    buf.finalized = True
    assert isinstance(buf.data, np.ndarray)
    buf.finalized = False
    assert buf.data == [1.0, 2.0] and not buf.finalized
    buf.append(3.0)
    assert buf.get(-1) == 3.0


def test_append_takes_its_item_by_keyword_too():
    # RLlib's append(self, item) is a plain method: append(item=x) works there.
    for finalize in (False, True):
        buf = InfiniteLookbackBuffer([1.0])
        if finalize:
            buf.finalize()
        buf.append(item=2.0)
        assert list(buf.get()) == [1.0, 2.0]


def test_hanging_value_after_pop_to_empty_keeps_the_rows_dtype():
    # Found by the state machine: a numpy'ized buffer emptied by pop() still
    # has float64 rows, and a hanging int joins them as RLlib's np.append does.
    buffer = InfiniteLookbackBuffer([0.0])
    buffer.finalize()
    buffer.pop()
    value = buffer.get(0, _add_last_ts_value=0)
    assert type(value) is np.float64 and value == 0.0
