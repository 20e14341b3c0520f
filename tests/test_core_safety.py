"""The compiled core's guards: what its C paths trust is checked first.

Lookbacks, storage and pickled state are validated before any raw access;
indices of any size resolve like RLlib's; copies between arrays of one type
number but different item sizes (str/bytes widths, structured dtypes) never
read or write bytes outside a row. RLlib comparisons are marked `rllib`.
"""
import copy
import pickle
from collections import OrderedDict

import numpy as np
import pytest

from episode import InfiniteLookbackBuffer, SingleAgentEpisode
from episode._column import COLUMN_FORMAT, Column

HUGE = [2**63, -2**63, 2**64, -2**64 - 5, 2**62, -2**62, 2**100]


def outcome(fn):
    """What `fn()` gives: ("value", repr) or ("raises", exception class)."""
    try:
        return "value", repr(fn())
    except Exception as e:  # noqa: BLE001 - the class is what is compared
        return "raises", type(e)


# -- lookback ------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, -2, -100_000_000, 2**61, 2**63, 2**80])
def test_lookback_out_of_range_is_refused_and_changes_nothing(bad):
    if bad < 0:              # the constructor caps a large one at the data's length
        with pytest.raises(ValueError, match="lookback"):
            InfiniteLookbackBuffer([1.0, 2.0, 3.0], lookback=bad)
    buf = InfiniteLookbackBuffer([1.0, 2.0, 3.0], lookback=1)
    with pytest.raises(ValueError, match="lookback"):
        buf.lookback = bad
    assert buf.lookback == 1 and buf.get() == [2.0, 3.0]
    other = InfiniteLookbackBuffer([4.0, 5.0])
    buf.concat(other)
    assert buf.get() == [2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize("bad", [1.5, "1", None, [1]])
def test_lookback_of_another_type_is_a_type_error(bad):
    buf = InfiniteLookbackBuffer([1.0, 2.0])
    with pytest.raises(TypeError):
        buf.lookback = bad
    assert buf.lookback == 0


def test_lookback_takes_numpy_ints_and_may_exceed_the_data():
    buf = InfiniteLookbackBuffer([1.0, 2.0, 3.0])
    buf.lookback = np.int64(2)
    assert type(buf.lookback) is int and buf.get() == [3.0]
    buf.lookback = 5            # as after popping lookback items: no data after it
    assert len(buf) == 0 and buf.get() == []
    buf.append(4.0)
    assert len(buf) == 0


def test_from_state_refuses_a_negative_lookback():
    state = InfiniteLookbackBuffer([1.0, 2.0], lookback=1).get_state()
    state["lookback"] = -3
    with pytest.raises(ValueError, match="lookback"):
        InfiniteLookbackBuffer.from_state(state)


def test_slice_refuses_a_negative_len_lookback_buffer():
    episode = SingleAgentEpisode(observations=[0.0, 1.0, 2.0], actions=[0, 1],
                                 rewards=[0.0, 1.0], len_lookback_buffer=0)
    with pytest.raises(ValueError, match="lookback"):
        episode.observations.sub_buffer(slice(0, 2), False, -1, None)


# -- storage -------------------------------------------------------------------


def test_storage_attributes_are_read_only():
    buf = InfiniteLookbackBuffer([1.0, 2.0])
    for name, value in (("_col", None), ("_tree", {"a": Column()}), ("_col", Column())):
        with pytest.raises(AttributeError):
            setattr(buf, name, value)
    assert buf.get() == [1.0, 2.0]
    col = buf._col
    with pytest.raises(AttributeError):
        col.row_type_open = True


@pytest.mark.parametrize("tree, error", [
    (None, TypeError),
    ([Column.from_list([1.0])], TypeError),
    ({"a": np.zeros(2)}, TypeError),
    ({}, ValueError),                                                    # no Column
    ({"a": Column.from_list([1.0]), "b": Column.from_array(np.zeros(1))}, ValueError),
    ({"a": Column.from_array(np.zeros(2)), "b": Column.from_array(np.zeros(3))}, ValueError),
    (OrderedDict(a=Column.from_list([1.0])), TypeError),                # list mode walks exact dicts
])
def test_set_storage_checks_its_argument(tree, error):
    buf = InfiniteLookbackBuffer([1.0, 2.0])
    with pytest.raises(error):
        buf._set_storage(tree)
    assert buf.get() == [1.0, 2.0]


def test_set_storage_refuses_a_column_twice_in_one_tree():
    col = Column.from_array(np.zeros(2))
    buf = InfiniteLookbackBuffer([1.0, 2.0])
    with pytest.raises(ValueError, match="distinct"):
        buf._set_storage({"a": col, "b": col})
    assert buf.get() == [1.0, 2.0]


# -- indices of any size ----------------------------------------------------------


@pytest.mark.parametrize("mode", ["list", "numpy"])
@pytest.mark.parametrize("index", HUGE)
def test_huge_int_indices_are_out_of_range(mode, index):
    buf = InfiniteLookbackBuffer([1.0, 2.0, 3.0, 4.0], lookback=1)
    if mode == "numpy":
        buf.finalize()
    with pytest.raises(IndexError):
        buf.get(index)
    with pytest.raises(IndexError):
        buf[index]
    assert buf.get(index, fill=0.0) == 0.0
    assert list(buf.get([index, 0], fill=9.0)) == [9.0, 2.0]
    with pytest.raises(IndexError):
        buf.set(7.0, at_indices=index)
    with pytest.raises(IndexError):
        buf.pop(index)
    assert list(buf.get()) == [2.0, 3.0, 4.0]


@pytest.mark.parametrize("mode", ["list", "numpy"])
def test_huge_slice_fields_clamp_like_python_slices(mode):
    buf = InfiniteLookbackBuffer([1.0, 2.0, 3.0, 4.0], lookback=1)
    if mode == "numpy":
        buf.finalize()
    assert list(buf.get(slice(0, 2**63))) == [2.0, 3.0, 4.0]
    assert list(buf.get(slice(-2**63, 2))) == [1.0, 2.0, 3.0]
    assert list(buf.get(slice(None, None, 2**63))) == [2.0]
    assert list(buf.get(slice(None, None, -2**63))) == []
    assert list(buf.get(slice(-2**70, -2**70 + 2))) == []
    assert list(buf.get(slice(-3, 64), fill=0.0)) == [2.0, 3.0, 4.0] + [0.0] * 61
    with pytest.raises((MemoryError, ValueError, OverflowError)):
        buf.get(slice(0, 2**62), fill=0.0)      # that much fill cannot be allocated


@pytest.mark.rllib
@pytest.mark.parametrize("mode", ["list", "numpy"])
@pytest.mark.parametrize("index", HUGE)
def test_huge_indices_agree_with_rllib(rllib_buffer, mode, index):
    def make(cls):
        buf = cls([1.0, 2.0, 3.0, 4.0], lookback=1)
        if mode == "numpy":
            buf.finalize()
        return buf

    calls = [lambda b: b.get(index), lambda b: b[index],
             lambda b: b.get(index, fill=0.0),
             lambda b: b.get(index, neg_index_as_lookback=True, fill=0.0),
             lambda b: b.get([index, 0], fill=9.0)]
    for call in calls:
        ours, theirs = outcome(lambda: call(make(InfiniteLookbackBuffer))), \
            outcome(lambda: call(make(rllib_buffer)))
        if mode == "numpy" and abs(index) >= 2**63 and theirs == ("raises", OverflowError):
            # numpy's index conversion fails inside RLlib (a deliberate difference,
            # pinned in test_lookback_buffer_differences.py).
            continue
        assert ours == theirs
    for sl in (slice(0, index), slice(index, 2), slice(None, None, index)):
        assert outcome(lambda: make(InfiniteLookbackBuffer).get(sl)) == \
            outcome(lambda: make(rllib_buffer).get(sl))


# -- item sizes: rows of one type number, different widths --------------------------


STRUCT = np.dtype([("a", "i4"), ("b", "f8")])
STRUCT_SWAPPED = np.dtype([("b", "f8"), ("a", "i4")])

ITEM_SIZE_CASES = {
    "str_fill_float": lambda c: finalized(c, ["obs_1"]).get(slice(None, 5), fill=0.0),
    "str_fill_str": lambda c: finalized(c, ["abcde", "fghij"]).get(slice(-4, None), fill="z"),
    "str_fill_int": lambda c: finalized(c, ["abcde", "fghij"]).get(slice(-4, None), fill=1),
    "bytes_fill": lambda c: finalized(c, [b"ab", b"cd"]).get(slice(-4, None), fill=0.0),
    "object_fill": lambda c: finalized(c, [1, "x", None]).get(slice(-4, None), fill=0.0),
    "datetime_fill": lambda c: finalized(
        c, [np.datetime64("2020-01-01")] * 2).get(slice(-4, None), fill=0),
    "struct_fill": lambda c: finalized(c, [np.array((1, 2.0), STRUCT)] * 2).get(
        slice(-4, None), fill=0),
    "append_narrower_str": lambda c: appended(c, ["abcde", "fghij"], np.array("abc")),
    "append_wider_str": lambda c: appended(c, ["abcde", "fghij"], np.array("abcdefg")),
    "append_str_scalar": lambda c: appended(c, ["abcde", "fghij"], "xy"),
    "append_narrower_bytes": lambda c: appended(c, [b"abcde", b"fghij"], np.array(b"ab")),
    "append_struct": lambda c: appended(c, [np.array((1, 2.0), STRUCT)] * 2,
                                        np.array((5, 6.0), STRUCT)),
    "append_struct_other_order": lambda c: appended(c, [np.array((1, 2.0), STRUCT)] * 2,
                                                    np.array((6.0, 5), STRUCT_SWAPPED)),
    "set_narrower_str": lambda c: written(c, ["abcde", "fghij"], 0, np.array("ab")),
    "set_wider_str": lambda c: written(c, ["abcde", "fghij"], 0, "abcdefgh"),
    "set_struct_other_order": lambda c: written(c, [np.array((1, 2.0), STRUCT)] * 2, 0,
                                                np.array((6.0, 5), STRUCT_SWAPPED)),
    # Fill only: no data rows, so no common dtype is needed.
    "all_fill_struct": lambda c: finalized(c, [np.array((1, 2.0), STRUCT)] * 2).get(
        slice(5, 7), fill=0.0),
    "all_fill_datetime": lambda c: finalized(
        c, [np.datetime64("2020-01-01")] * 2).get(slice(5, 7), fill=0),
    "all_fill_timedelta": lambda c: finalized(
        c, [np.timedelta64(1, "D")] * 2).get(slice(-5, -3), fill=-7.0),
    # The same fill before and after the dtype widens within its type number.
    "fill_after_str_widens": lambda c: filled_around_append(c, ["ab", "cdefg"], "w" * 20, True),
    "fill_after_timedelta_widens": lambda c: filled_around_append(
        c, [np.timedelta64(1, "D")] * 2, np.timedelta64(4, "s"), 0),
}


def filled_around_append(cls, data, item, fill):
    buf = finalized(cls, data)
    before = buf.get(slice(-4, None), fill=fill)
    buf.append(item)
    return before, buf.get(slice(-5, None), fill=fill)


def finalized(cls, data):
    buf = cls(data)
    buf.finalize()
    return buf


def appended(cls, data, item):
    buf = finalized(cls, data)
    buf.append(item)
    return buf.get()


def written(cls, data, index, value):
    buf = finalized(cls, data)
    buf.set(value, at_indices=index)
    return buf.get()


def _ours(case):
    return ITEM_SIZE_CASES[case](InfiniteLookbackBuffer)


def test_string_fill_has_no_stray_bytes():
    out = _ours("str_fill_float")
    assert out.tolist() == ["obs_1", "0.0", "0.0", "0.0", "0.0"] and out.dtype == "<U32"
    assert _ours("bytes_fill").tolist() == [b"0.0", b"0.0", b"ab", b"cd"]
    assert _ours("append_narrower_str").tolist() == ["abcde", "fghij", "abc"]
    assert _ours("append_narrower_bytes").tolist() == [b"abcde", b"fghij", b"ab"]
    assert _ours("append_wider_str").dtype == "<U7"
    assert _ours("append_struct")[-1].tolist() == (5, 6.0)


def test_fill_plans_follow_the_storage_dtype():
    before, after = _ours("fill_after_str_widens")
    assert before.tolist() == ["True", "True", "ab", "cdefg"]
    assert after.tolist() == ["True", "True", "ab", "cdefg", "w" * 20]
    before, after = _ours("fill_after_timedelta_widens")
    assert after.dtype == "m8[s]" and after[-1] == np.timedelta64(4, "s")
    assert after[2] == np.timedelta64(1, "D")
    assert _ours("all_fill_struct").tolist() == [0.0, 0.0]
    assert _ours("all_fill_datetime").tolist() == [0, 0]


def test_string_fill_through_the_episode():
    episode = SingleAgentEpisode()
    episode.add_env_step(observation="obs_1", action=44, reward=6)
    chunk = episode.cut(len_lookback_buffer=0)
    chunk.to_numpy()
    out = chunk.get_observations(slice(None, 5), fill=0.0)
    assert out.tolist() == ["obs_1", "0.0", "0.0", "0.0", "0.0"]


@pytest.mark.rllib
@pytest.mark.parametrize("case", sorted(ITEM_SIZE_CASES))
def test_item_size_cases_agree_with_rllib(rllib_buffer, case):
    ours = outcome(lambda: ITEM_SIZE_CASES[case](InfiniteLookbackBuffer))
    theirs = outcome(lambda: ITEM_SIZE_CASES[case](rllib_buffer))
    assert ours == theirs


# -- pickling: every dtype, and corrupt states refused ---------------------------------


DTYPE_ROWS = {
    "datetime64": np.array(["2020-01-01", "2021-06-01"], dtype="M8[D]"),
    "timedelta64": np.array([1, 2], dtype="m8[s]"),
    "str": np.array(["a", "bcd"]),
    "bytes": np.array([b"x", b"yz"]),
    "struct": np.array([(1, 2.0), (3, 4.0)], dtype=STRUCT),
    "object": np.array([1, "x", None], dtype=object),
    "float16": np.array([1.5, 2.0], dtype=np.float16),
    "longdouble": np.array([1.0, 2.0], dtype=np.longdouble),
    "complex64": np.array([1 + 2j, 3], dtype=np.complex64),
    "bool": np.array([True, False]),
    "big_endian": np.array([1, 2], dtype=">i4"),
    "empty_rows": np.zeros((2, 0)),
    "empty_str_rows": np.zeros((2, 3, 0), dtype="U3"),
}


@pytest.mark.parametrize("name", sorted(DTYPE_ROWS))
@pytest.mark.parametrize("protocol", [2, 4, 5])
@pytest.mark.parametrize("numpy_mode", [False, True])
def test_every_dtype_round_trips_through_pickle(name, protocol, numpy_mode):
    rows = DTYPE_ROWS[name]
    observations = list(rows) + [rows[0]]
    episode = SingleAgentEpisode(observations=observations, actions=[0] * len(rows),
                                 rewards=[0.0] * len(rows), len_lookback_buffer=0)
    if numpy_mode:
        episode.to_numpy()
    before = episode.get_observations()
    for restored in (pickle.loads(pickle.dumps(episode, protocol=protocol)),
                     copy.deepcopy(episode)):
        after = restored.get_observations()
        if numpy_mode:
            assert after.dtype == before.dtype.newbyteorder("=") or after.dtype == before.dtype
            assert after.tolist() == before.tolist()
        else:
            assert [type(x) for x in after] == [type(x) for x in before]
            assert [np.asarray(x).tolist() for x in after] == \
                [np.asarray(x).tolist() for x in before]


def _column_state(items, finalize=False):
    col = Column.from_list(items)
    if finalize:
        col.finalize()
    restore, args = col.__reduce_ex__(5)
    return restore, list(args)


def test_column_state_carries_a_format_version():
    restore, args = _column_state([1.0, 2.0])
    assert args[0] == COLUMN_FORMAT
    assert restore(*args).to_list() == [1.0, 2.0]
    args[0] = COLUMN_FORMAT + 1
    with pytest.raises(ValueError, match="format"):
        restore(*args)


def _payload_array(args):
    payload = args[-1]
    if type(payload) is tuple:
        data, dtype, shape = payload
        return np.frombuffer(data, dtype).reshape(shape).copy()
    return payload


# Corruptions of (version, kind, finalized, row_type_open, payload).
CORRUPTIONS = {
    "kind_out_of_range": lambda a: a.__setitem__(1, 99),
    "kind_not_an_int": lambda a: a.__setitem__(1, "5"),
    "float_kind_over_int8": lambda a: a.__setitem__(4, np.zeros(3, np.int8)),
    "scalar_kind_over_object": lambda a: (a.__setitem__(1, 4),
                                          a.__setitem__(4, np.array([1, None], dtype=object))),
    "array_kind_over_strings_in_list_mode": lambda a: (a.__setitem__(1, 5),
                                                       a.__setitem__(4, np.array(["ab"]))),
    "float_kind_with_rows": lambda a: a.__setitem__(4, np.zeros((2, 3))),
    "zero_dim_payload": lambda a: a.__setitem__(4, np.float64(1.0)),
    "buffer_too_short": lambda a: a.__setitem__(4, (b"\0" * 12, "<f8", (2,))),
    "buffer_shape_mismatch": lambda a: a.__setitem__(4, (b"\0" * 16, "<f8", (3,))),
    "buffer_negative_shape": lambda a: a.__setitem__(4, (b"\0" * 16, "<f8", (-1,))),
    "buffer_object_dtype": lambda a: a.__setitem__(4, (b"\0" * 16, "|O", (2,))),
    "payload_not_an_array": lambda a: a.__setitem__(4, [1.0, 2.0]),
    "object_kind_with_array": lambda a: (a.__setitem__(1, 6),
                                         a.__setitem__(4, np.zeros(2))),
    "empty_dict_kind_negative_count": lambda a: (a.__setitem__(1, 7), a.__setitem__(4, -4)),
    "finalized_not_a_bool": lambda a: a.__setitem__(2, 1),
    "open_row_type_with_rows": lambda a: (a.__setitem__(2, True), a.__setitem__(3, True)),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corrupt_column_states_are_refused(name):
    restore, args = _column_state([1.0, 2.0])
    CORRUPTIONS[name](args)
    with pytest.raises((ValueError, TypeError)):
        restore(*args)


# Finalized rows over read-only bytes (what an out-of-band buffer from Ray's
# object store is) are read in place: the same checks must refuse bad ones.
READ_ONLY_CORRUPTIONS = {
    "too_short": (b"\0" * 12, "<f8", (2,)),
    "shape_mismatch": (b"\0" * 16, "<f8", (3,)),
    "negative_shape": (b"\0" * 16, "<f8", (-1,)),
    "object_dtype": (b"\0" * 16, "|O", (2,)),
    "zero_dim": (b"\0" * 8, "<f8", ()),
}


@pytest.mark.parametrize("name", sorted(READ_ONLY_CORRUPTIONS))
def test_corrupt_read_only_finalized_states_are_refused(name):
    restore, args = _column_state([1.0, 2.0], finalize=True)
    args[4] = READ_ONLY_CORRUPTIONS[name]
    with pytest.raises((ValueError, TypeError)):
        restore(*args)


@pytest.mark.parametrize("write", ["set", "append", "extend_rows", "extend_none", "pop",
                                   "writable_view"])
def test_writes_to_a_column_over_read_only_bytes_copy_it_first(write):
    rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    data = rows.tobytes()
    restore, args = _column_state([np.zeros(2, np.float32)], finalize=True)
    args[4] = (data, "<f4", (3, 2))
    col = restore(*args)
    view = col.view()
    assert not view.flags.writeable and np.shares_memory(view, np.frombuffer(data, np.uint8))
    expected = rows.tolist()
    if write == "set":
        col.set(1, np.full(2, 9, np.float32))
        expected[1] = [9.0, 9.0]
    elif write == "append":
        col.append(np.full(2, 7, np.float32))
        expected.append([7.0, 7.0])
    elif write == "extend_rows":
        col.extend_rows(np.full((2, 2), 5, np.float32))
        expected += [[5.0, 5.0]] * 2
    elif write == "extend_none":
        col.extend_rows(np.zeros((0, 2), np.float32))
    elif write == "writable_view":
        col.writable_view()[1:] = 3
        expected[1:] = [[3.0, 3.0]] * 2
    else:
        col.pop(0)
        expected.pop(0)
    assert col.view().tolist() == expected
    assert data == rows.tobytes() and view.tolist() == rows.tolist()


def test_extend_rows_needs_a_batch_and_keeps_list_mode_types():
    for col in (Column.from_array(np.zeros(3)), Column.with_open_row_type()):
        with pytest.raises(ValueError):
            col.extend_rows(5.0)
    col = Column.from_list([1.0])
    col.extend_rows(np.array(["a", "bc"]))
    assert col.to_list() == [1.0, "a", "bc"] and not col.finalized


def test_a_column_restored_from_a_view_of_the_pickle_grows_in_its_own_memory():
    restore, args = _column_state([1.0, 2.0])
    col = restore(*args)
    for i in range(100):
        col.append(float(i))
    assert col.to_list()[:2] == [1.0, 2.0] and len(col) == 102


def test_open_row_type_survives_pickling():
    buf = InfiniteLookbackBuffer([])
    buf.finalize()
    restored = pickle.loads(pickle.dumps(buf, protocol=5))
    restored.append(np.ones((2, 3), np.float32))
    buf.append(np.ones((2, 3), np.float32))
    assert restored.get().shape == buf.get().shape == (1, 2, 3)
    assert restored.get().dtype == buf.get().dtype == np.float32


def test_restore_refuses_a_class_that_is_not_a_buffer():
    restore, args = InfiniteLookbackBuffer([1.0]).__reduce__()
    with pytest.raises(TypeError):
        restore(dict, *args[1:])


def test_the_build_is_checked_when_asked_to_be():
    # The sanitizer run sets EPISODE_EXPECT_CHECKED=1: its build must really
    # carry the bounds checks (EPISODE_CHECKED=ON), not just the sanitizers.
    import os

    from episode._column import CHECKED_BUILD

    if os.environ.get("EPISODE_EXPECT_CHECKED") != "1":
        pytest.skip("only the checked build's run asks this")
    assert CHECKED_BUILD


def test_raw_accesses_go_through_the_checked_accessors():
    # The checked build bounds-checks row_ptr and array_bytes; a raw data
    # pointer taken anywhere else would escape those checks.
    import pathlib
    import re

    pyx = pathlib.Path(__file__).resolve().parent.parent / "pyx" / "episode"
    sources = sorted(pyx.glob("*.pyx")) + sorted(pyx.glob("*.pxd"))
    if not sources:
        pytest.skip("the Cython sources are not beside these tests")
    allowed = {
        "return <char*>cnp.PyArray_DATA(arr)",             # array_bytes
        "self.data = <char*>cnp.PyArray_DATA(arr)",        # _adopt_storage
        "return self.data + pos * self.row_bytes",         # row_ptr
    }
    offenders = []
    for path in sources:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0].strip()
            if re.search(r"PyArray_DATA\(|\.data\s*[+\[]|\.ptr\s*[+\[]", code) \
                    and code not in allowed:
                offenders.append(f"{path.name}:{number}: {code}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("version", [True, 1.0, "1", None])
def test_column_format_version_must_be_the_int(version):
    restore, args = _column_state([1.0, 2.0])
    args[0] = version
    with pytest.raises(ValueError, match="format"):
        restore(*args)


def test_cut_with_a_huge_lookback_takes_everything():
    episode = SingleAgentEpisode(observations=[0.0, 1.0, 2.0], actions=[0, 1],
                                 rewards=[0.0, 1.0], len_lookback_buffer=0)
    whole = episode.cut(len_lookback_buffer=2)        # both steps: all there is
    for lookback in (2**63, 2**100):
        chunk = episode.cut(len_lookback_buffer=lookback)
        assert chunk.observations.lookback == whole.observations.lookback == 2
        assert chunk.get_observations(slice(-3, None), neg_index_as_lookback=True) == \
            [0.0, 1.0, 2.0]


def test_reshaping_the_callers_array_in_place_does_not_reach_the_storage():
    data = np.arange(40.0).reshape(10, 2, 2)
    buf = InfiniteLookbackBuffer(data)
    data.shape = (40,)                 # the caller's object, reshaped in place
    np.testing.assert_array_equal(buf[0], [[0.0, 1.0], [2.0, 3.0]])
    np.testing.assert_array_equal(buf[-2:][1], [[36.0, 37.0], [38.0, 39.0]])
    data[0] = 99.0                     # the memory is still shared, as RLlib's
    assert buf[0][0, 0] == 99.0
