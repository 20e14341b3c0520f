"""Column: the typed growable buffer under every lookback buffer."""
import sys
import tracemalloc

import numpy as np
import pytest

from episode._column import Column


def test_python_floats_are_typed_and_come_back_as_floats():
    col = Column.from_list([1.0, 2.5, -3.0])
    assert col.is_typed and col.dtype == np.float64
    assert col.to_list() == [1.0, 2.5, -3.0]
    assert all(type(x) is float for x in col.to_list())


@pytest.mark.parametrize(
    "items, dtype",
    [
        ([1, 2, 3], np.int64),
        ([True, False], np.bool_),
        ([np.float32(1.5), np.float32(2)], np.float32),
        ([np.int8(1), np.int8(-2)], np.int8),
        ([np.zeros(4, np.float32), np.ones(4, np.float32)], np.float32),
        ([np.zeros((2, 3), np.uint8)] * 3, np.uint8),
    ],
)
def test_typed_path_keeps_types_and_finalizes_to_numpys_dtype(items, dtype):
    col = Column.from_list(items)
    assert col.is_typed
    back = col.to_list()
    for a, b in zip(back, items):
        assert type(a) is type(b)
        np.testing.assert_array_equal(a, b)
    assert col.finalize() is True
    view = col.view()
    assert view.dtype == np.array(items).dtype == dtype
    np.testing.assert_array_equal(view, np.array(items))


@pytest.mark.parametrize(
    "items",
    [
        [1, 2.0],                                        # int then float
        [1.0, 2],                                        # float then int
        [np.float32(1), 2.0],                            # numpy scalar then Python float
        [np.zeros(4, np.float32), np.zeros(3, np.float32)],  # ragged rows
        [np.zeros(4, np.float32), np.zeros(4, np.float64)],  # dtype change
        [1, 2**70],                                      # int beyond int64
        ["a", "b"],
        [{"a": 1}, {"a": 2}],
        [None, 1],
    ],
)
def test_change_of_kind_moves_to_object_path_without_altering_values(items):
    col = Column.from_list(items)
    assert not col.is_typed
    back = col.to_list()
    assert len(back) == len(items)
    for a, b in zip(back, items):
        assert type(a) is type(b)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
        else:
            assert a == b


def test_rows_are_copied_in_not_referenced():
    row = np.arange(4, dtype=np.float32)
    col = Column.from_list([row])
    row[:] = -1
    np.testing.assert_array_equal(col.get(0), [0, 1, 2, 3])


def test_growth_keeps_every_row():
    col = Column()
    rows = np.arange(10_000 * 3, dtype=np.float64).reshape(10_000, 3)
    for r in rows:
        col.append(r)
    assert len(col) == 10_000
    col.finalize()
    np.testing.assert_array_equal(col.view(), rows)


def test_finalized_append_promotes_like_concatenate():
    col = Column.from_array(np.array([1, 2, 3]))
    col.append(4)
    assert col.view().dtype == np.int64
    col.append(2.5)
    assert col.view().dtype == np.float64
    np.testing.assert_array_equal(col.view(), [1, 2, 3, 4, 2.5])


def test_finalized_append_wrong_shape_raises_and_keeps_data():
    col = Column.from_array(np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="shape"):
        col.append(np.zeros(3, np.float32))
    assert len(col) == 2


def test_views_handed_out_survive_growth_and_pop():
    col = Column.from_array(np.arange(3.0))
    view = col.view()
    for i in range(100):
        col.append(float(i))
    np.testing.assert_array_equal(view, [0.0, 1.0, 2.0])
    view2 = col.view()
    col.pop(len(col) - 1)
    col.append(-7.0)
    assert view2[-1] == 99.0


def test_set_and_pop_in_list_mode_keep_types():
    col = Column.from_list([1.0, 2.0, 3.0])
    col.set(1, 20.0)
    assert col.to_list() == [1.0, 20.0, 3.0] and col.is_typed
    col.set(0, "x")                      # a different kind: object path
    assert col.to_list() == ["x", 20.0, 3.0] and not col.is_typed
    col.pop(0)
    assert col.to_list() == [20.0, 3.0]


def test_get_out_of_range_raises_index_error():
    col = Column.from_list([1.0])
    with pytest.raises(IndexError):
        col.get(1)
    assert col.get(-1) == 1.0


def test_public_methods_check_positions_before_touching_memory():
    col = Column.from_list([1.0, 2.0])
    other = Column.from_list([3.0])
    for call in (lambda: col.set(2, 0.0), lambda: col.set(-1, 0.0), lambda: col.pop(5),
                 lambda: col.extend_from(other, -3, 1), lambda: col.extend_from(other, 0, 2),
                 lambda: col.extend_from(other, 1, 0)):
        with pytest.raises(IndexError):
            call()
    assert col.to_list() == [1.0, 2.0]



def test_extend_from_none_raises_type_error():
    # A None typed as a Column once reached the C method with None's memory.
    col = Column.from_list([1.0, 2.0])
    for start, stop in ((0, 100), (0, 0), (10**6, 10**6 + 2)):
        with pytest.raises(TypeError):
            col.extend_from(None, start, stop)
    assert col.to_list() == [1.0, 2.0]


def _block_owner(array):
    # The object that owns the memory an array views (numpy's base chain ends there).
    while isinstance(array, np.ndarray):
        array = array.base
    return array


@pytest.mark.parametrize("finalized", [False, True])
def test_growth_reallocs_one_block_unless_a_view_is_held(finalized):
    col = Column.from_list([np.zeros(4, np.float32)])
    if finalized:
        col.finalize()
    row = np.ones(4, np.float32)
    tracemalloc.start()
    try:
        for i in range(3000):
            col.append(row)
            if i % 100 == 0:
                col.view()               # a view handed out, then dropped
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # realloc'd: the traced peak is the final block (plus a few small
    # objects), where copying growth would hold the old block beside it.
    assert peak < 1.2 * col.capacity * 16 + 4096, (peak, col.capacity)
    held = col.view()
    assert _block_owner(col.view()) is _block_owner(held)      # one owner per block
    first = col.get(0)
    for _ in range(5000):                   # grows while a view is held: must copy
        col.append(row + 1)
    assert _block_owner(col.view()) is not _block_owner(held)
    np.testing.assert_array_equal(held, np.vstack([np.zeros((1, 4)), np.ones((3000, 4))]))
    np.testing.assert_array_equal(first, np.zeros(4))
    np.testing.assert_array_equal(col.view()[3001:], np.full((5000, 4), 2.0))


class Float32Subclass(np.float32):
    pass


def test_numpy_scalar_subclass_items_keep_their_type():
    items = [Float32Subclass(1.5), Float32Subclass(2.5)]
    col = Column.from_list(items)
    assert [type(x) for x in col.to_list()] == [Float32Subclass, Float32Subclass]
    assert col.to_list() == [1.5, 2.5]


def test_rows_of_many_dimensions_keep_their_shape():
    rows = [np.full((1, 2, 1, 3, 2), i, np.int16) for i in range(20)]
    col = Column.from_list(rows)
    assert col.is_typed and col.row_shape_tuple == (1, 2, 1, 3, 2)
    col.finalize()
    col.append(rows[0])
    with pytest.raises(ValueError, match="shape"):
        col.append(np.zeros((1, 2, 1, 3, 3), np.int16))
    np.testing.assert_array_equal(col.view(), np.stack(rows + rows[:1]))


def test_a_column_object_stays_small():
    # Several per episode: for short episodes their size is most of the memory.
    assert sys.getsizeof(Column()) <= 192


# -- after finalize() -----------------------------------------------------------

# One value per numeric kind, each with the extremes of its type: a typed
# append that wrote the wrong width, sign or slot would change them.
NUMERIC_KINDS = {
    "float": [1.5, -1e300],
    "int": [3, -(2**63)],
    "bool": [True, False],
    **{np.dtype(t).name: [np.iinfo(t).max, np.iinfo(t).min]
       for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                 np.uint64)},
    "float16": [np.float16(0.099976), np.finfo(np.float16).min],
    "float32": [np.float32(0.1), np.finfo(np.float32).tiny],
    "float64": [np.float64(0.1), np.finfo(np.float64).max],
    "bool_": [np.True_, np.False_],
    "complex64": [np.complex64(1 - 2j), np.complex64(np.finfo(np.float32).max * 1j)],
    "complex128": [np.complex128(0.1 + 3j), np.complex128(-1e300)],
}


def _items(kind):
    first, second = NUMERIC_KINDS[kind]
    if kind in ("float", "int", "bool"):
        return [first, second]
    dtype = {"bool_": np.bool_}.get(kind, kind)
    return [np.dtype(dtype).type(first), np.dtype(dtype).type(second)]


@pytest.mark.parametrize("stored", list(NUMERIC_KINDS))
@pytest.mark.parametrize("appended", list(NUMERIC_KINDS))
def test_append_after_finalize_stores_what_numpy_concatenate_gives(stored, appended):
    """RLlib appends to finalized data with np.concatenate([data, [item]]):
    the same kind stays in its dtype (the typed path), another kind promotes
    as numpy does. Dtype and every value must match, the old rows too."""
    items = _items(stored)
    col = Column.from_list(items)
    assert col.finalize() is True
    expected = np.array(items)
    for item in _items(appended):
        expected = np.concatenate([expected, np.asarray(item)[np.newaxis]])
        col.append(item)
        assert col.view().dtype == expected.dtype
        np.testing.assert_array_equal(col.view(), expected, strict=True)
    # Past the trimmed capacity (the first append grew it) and on.
    for _ in range(40):
        item = _items(appended)[0]
        expected = np.concatenate([expected, np.asarray(item)[np.newaxis]])
        col.append(item)
    np.testing.assert_array_equal(col.view(), expected, strict=True)


@pytest.mark.parametrize("kind", list(NUMERIC_KINDS))
def test_typed_append_after_finalize_gives_back_numpy_scalars(kind):
    items = _items(kind)
    col = Column.from_list(items[:1])
    col.finalize()
    col.append(items[1])
    got = col.get(-1)
    dtype = np.array(items).dtype
    assert type(got) is dtype.type and got == np.array(items)[1]


def test_rows_after_finalize_are_copied_in_and_keep_their_bits():
    col = Column.from_list([np.zeros(4, np.float32)])
    col.finalize()
    row = np.array([np.nan, -0.0, np.inf, 1e-45], np.float32)
    col.append(row)
    row[:] = 7
    assert col.view()[1].tobytes() == np.array([np.nan, -0.0, np.inf, 1e-45], np.float32).tobytes()


def test_append_after_finalize_of_another_layout_takes_numpys_path():
    col = Column.from_list([np.zeros(2, np.float32)])
    col.finalize()
    col.append(np.ones(2, np.float64))                      # promotes
    col.append(np.arange(4, dtype=np.float32)[::2])         # not contiguous
    col.append(np.array([5, 6], np.int64).astype(">i8"))    # byte-swapped
    col.append([7, 8])                                      # a list
    assert col.view().dtype == np.float64
    np.testing.assert_array_equal(col.view(), [[0, 0], [1, 1], [0, 2], [5, 6], [7, 8]])


@pytest.mark.parametrize("n, kept", [(1, 1), (2, 2), (17, 17), (1000, 1024), (1025, 1025),
                                     (900, 900)])
def test_finalize_trims_spare_capacity_beyond_an_eighth(n, kept):
    col = Column.from_list([np.full(3, i, np.float32) for i in range(n)])
    assert col.capacity > n                  # list mode's spare room
    col.finalize()
    assert col.capacity == kept              # 24 spare rows of 1024 stay (< 1000 // 8)
    np.testing.assert_array_equal(col.view(), np.repeat(np.arange(n, dtype=np.float32), 3)
                                  .reshape(n, 3))


def test_finalize_keeps_capacity_while_a_list_mode_view_is_out():
    col = Column.from_list([1.0, 2.0, 3.0])
    view = col.view()
    col.finalize()                      # would realloc under the view: must not
    assert col.capacity == 16
    np.testing.assert_array_equal(view, [1.0, 2.0, 3.0])


def _peak_growth(call, items):
    """Traced bytes at the peak of call(x) for each x in `items`, above what
    was traced before."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for x in items:
            call(x)
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kind", list(NUMERIC_KINDS))
def test_same_kind_appends_after_finalize_allocate_nothing(kind):
    """The typed path writes the item's bytes into the storage; numpy's
    general path (np.asarray, promotion, slice assignment) allocates
    temporaries on every append."""
    items = _items(kind)
    col = Column.from_list(items)
    col.finalize()
    col.append(items[0])               # grows: room for the appends below
    more = items * 5
    # The loop itself, calling a method that allocates nothing.
    assert _peak_growth(col.append, more) == _peak_growth(callable, more)
    expected = np.array(items + [items[0]] + more)
    np.testing.assert_array_equal(col.view(), expected, strict=True)


@pytest.mark.parametrize("storage", ["own block", "shared block", "adopted array"])
def test_collecting_cycles_through_typed_storage_frees_each_block_once(storage):
    """The garbage collector clears every object of an unreachable cycle, in
    the order they were made: Columns that only the cycle holds included, and
    before the objects that hold them. A Column's block must still be freed
    by its owner, exactly once (the sanitizer build checks it)."""
    import gc

    # Twenty cycles, one collection (a full collection costs about a second
    # in a process that has imported Ray and torch).
    views = []
    for _ in range(20):
        if storage == "adopted array":
            col = Column.from_array(np.arange(12.0).reshape(6, 2))
        else:
            col = Column.from_list([np.full(2, i, np.float64) for i in range(6)])
        views.append(col.view() if storage == "shared block" else None)
        cycle = [col]
        cycle.append(cycle)
        del col, cycle
    assert gc.collect() >= 20
    for view in views:
        if view is not None:
            np.testing.assert_array_equal(view, np.repeat(np.arange(6.0), 2).reshape(6, 2))


@pytest.mark.parametrize("start", [0, 3])
def test_a_view_outliving_its_column_grows_into_a_block_of_its_own(start):
    """A finalized view of rows [start, stop) (an episode's slice) shares
    its Column's block, kept alive by the block's Memory. Once the Column is
    gone the view alone holds the block: its first growth may realloc the
    block where the view starts at it, and must copy where it starts inside
    it (a realloc of a pointer into a block corrupts the heap)."""
    import gc

    from episode import SingleAgentEpisode

    episode = SingleAgentEpisode()
    episode.add_env_reset(np.zeros(3, np.float32))
    for t in range(9):
        episode.add_env_step(np.full(3, t + 1, np.float32), t, float(t))
    episode.to_numpy()
    view = episode.slice(slice(start, start + 4), len_lookback_buffer=0)
    expected = episode.get_observations(slice(start, start + 5)).copy()
    del episode
    gc.collect()
    for t in range(100):
        view.add_env_step(np.full(3, -t, np.float32), 0, 0.0)
    observations = view.get_observations()
    np.testing.assert_array_equal(observations[:5], expected)
    np.testing.assert_array_equal(observations[5:], -np.arange(100.0)[:, None] * np.ones(3))
