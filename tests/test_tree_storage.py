"""Dict/Tuple items in a tree of typed Columns (one per leaf), in list mode too.

What the storage must guarantee: list-mode getters hand back what was
appended (types included), a leaf that stops fitting promotes only itself,
an item of another shape moves the buffer to the object path with every
value kept, finalize() batches nothing that is already typed, and the tree
survives pickling, slicing and cutting. RLlib comparisons are marked `rllib`.
"""
import collections
import copy
import pickle

import numpy as np
import pytest

import episode.lookback_buffer as lookback_buffer
from episode import InfiniteLookbackBuffer, SingleAgentEpisode


def item(i):
    return {"img": np.full((2, 2), i, np.uint8), "vec": np.full(3, i / 2, np.float32),
            "n": i, "x": float(i)}


def same_item(a, b):
    """Equal values of the same types (arrays: equal, same dtype and shape)."""
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same_item(a[k], b[k])
    elif isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same_item(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b or (a != a and b != b)


def test_dict_items_go_to_typed_leaves_in_list_mode():
    buf = InfiniteLookbackBuffer([item(i) for i in range(5)], lookback=1)
    assert buf._col is None and isinstance(buf._tree, dict)
    assert list(buf._tree) == ["img", "vec", "n", "x"]
    assert all(col.is_typed for col in buf._leaves)
    same_item(buf.get(0), item(1))
    assert type(buf.get(-1)["n"]) is int and type(buf.get(-1)["x"]) is float
    for got, want in zip(buf.get(slice(None)), [item(i) for i in range(1, 5)]):
        same_item(got, want)


def test_finalize_batches_nothing_that_is_typed(monkeypatch):
    buf = InfiniteLookbackBuffer([({"a": i}, np.full(2, i, np.float32)) for i in range(4)])

    def refuse(*args):
        raise AssertionError("typed leaves are arrays already")

    monkeypatch.setattr(lookback_buffer, "stack", refuse)
    monkeypatch.setattr(lookback_buffer, "stack_leaf", refuse)
    buf.finalize()
    (a, rows) = buf.get()
    np.testing.assert_array_equal(a["a"], [0, 1, 2, 3])
    assert rows.dtype == np.float32 and rows.shape == (4, 2)


def test_a_leaf_that_stops_fitting_promotes_only_itself():
    buf = InfiniteLookbackBuffer([item(0), item(1)])
    odd = item(2)
    odd["n"] = 2.5                     # int leaf gets a float
    buf.append(odd)
    odd = item(3)
    odd["vec"] = np.zeros(4, np.float32)   # another shape
    buf.append(odd)
    assert buf._col is None
    kinds = {k: col.is_typed for k, col in buf._tree.items()}
    assert kinds == {"img": True, "vec": False, "n": False, "x": True}
    assert type(buf.get(1)["n"]) is int and type(buf.get(2)["n"]) is float
    same_item(buf.get(3)["vec"], np.zeros(4, np.float32))
    buf.finalize()
    assert buf.get()["n"].dtype == np.float64
    assert buf.get()["vec"].dtype == object      # ragged rows, each kept


@pytest.mark.parametrize("other", [
    {"img": np.zeros((2, 2), np.uint8), "vec": np.zeros(3, np.float32), "n": 1},   # key missing
    {"vec": np.zeros(3, np.float32), "img": np.zeros((2, 2), np.uint8), "n": 1,
     "x": 1.0},                                                                    # other order
    collections.OrderedDict(item(7)),
    {"img": [1, 2], "vec": np.zeros(3, np.float32), "n": 1, "x": 1.0},             # nests a list
    {"img": {"deep": 1}, "vec": np.zeros(3, np.float32), "n": 1, "x": 1.0},
    "not a dict",
    None,
])
def test_an_item_of_another_shape_moves_the_buffer_to_the_object_path(other):
    items = [item(0), item(1), other, item(3)]
    buf = InfiniteLookbackBuffer(items[:2])
    for x in items[2:]:
        buf.append(x)
    assert buf._col is not None and not buf._col.is_typed
    for got, want in zip(buf.get(), items):
        same_item(got, want)


def test_tuple_items_and_namedtuples():
    Point = collections.namedtuple("Point", "x y")
    buf = InfiniteLookbackBuffer([(1, np.zeros(2)), (2, np.ones(2))])
    assert isinstance(buf._tree, tuple)
    buf.append((3, np.ones(2), 0))           # longer tuple
    assert buf._col is not None
    same_item(buf.get(-1), (3, np.ones(2), 0))
    buf = InfiniteLookbackBuffer([Point(1, 2)])
    assert buf._col is not None and buf.get(0) == Point(1, 2)


def test_empty_sub_structs_and_deep_items():
    buf = InfiniteLookbackBuffer([{"a": {}, "b": (), "c": 1}, {"a": {}, "b": (), "c": 2}])
    assert buf._col is None
    assert buf.get(1) == {"a": {}, "b": (), "c": 2}
    buf.finalize()
    got = buf.get(slice(None))
    assert got["a"] == {} and got["b"] == ()
    np.testing.assert_array_equal(got["c"], [1, 2])
    deep = 1
    for _ in range(200):
        deep = {"d": deep}
    buf = InfiniteLookbackBuffer([deep, deep])
    assert buf._col is not None and buf.get(1) is deep


def test_an_item_that_changes_while_it_is_read_keeps_the_leaves_aligned():
    buf = InfiniteLookbackBuffer([{"a": 1, "b": 2}])
    victim = {"a": 1}

    class Sneaky:
        # isinstance() reads __class__: this one takes "a" out of its dict
        # after the shape was checked and before the leaves are read.
        @property
        def __class__(self):
            victim.pop("a", None)
            return Sneaky

    sneaky = Sneaky()
    victim["b"] = sneaky
    buf.append(victim)
    assert [len(col) for col in buf._leaves] in ([2, 2], [2])
    assert len(buf) == 2
    assert buf.get(0) == {"a": 1, "b": 2} and buf.get(1) is victim


def test_data_moves_the_tree_to_its_live_list():
    buf = InfiniteLookbackBuffer([item(0), item(1)])
    data = buf.data
    assert type(data) is list and buf._col is not None
    data.append(item(2))
    same_item(buf.get(-1), item(2))


def test_set_keeps_the_tree_for_items_of_its_shape():
    buf = InfiniteLookbackBuffer([item(0), item(1), item(2)])
    buf.set(item(9), at_indices=1)
    assert buf._col is None
    same_item(buf.get(1), item(9))
    buf.set([item(7), "other"], at_indices=[0, 2])
    assert buf._col is not None
    same_item(buf.get(0), item(7))
    assert buf.get(2) == "other"


@pytest.mark.parametrize("finalized", [False, True])
@pytest.mark.parametrize("protocol", [2, 5])
def test_trees_pickle_and_copy(finalized, protocol):
    buf = InfiniteLookbackBuffer([item(i) for i in range(6)], lookback=2)
    if finalized:
        buf.finalize()
    for other in (pickle.loads(pickle.dumps(buf, protocol=protocol)), copy.deepcopy(buf)):
        assert other == buf
        assert isinstance(other._tree, dict) and other.finalized == finalized
        other.append(item(6))
        buf_copy = copy.deepcopy(buf)
        buf_copy.append(item(6))
        assert other == buf_copy


def test_pop_and_extend_on_a_tree():
    buf = InfiniteLookbackBuffer([item(i) for i in range(4)])
    buf.pop(1)
    buf.extend([item(8), item(9)])
    assert [x["n"] for x in buf.get()] == [0, 2, 3, 8, 9]
    assert buf._col is None


def dict_episode(steps, numpy):
    ep = SingleAgentEpisode()
    ep.add_env_reset(item(0))
    for t in range(1, steps + 1):
        ep.add_env_step(item(t), (t % 2, np.array([t, -t])), float(t),
                        infos={"t": t}, extra_model_outputs={"logp": {"a": np.float32(t)}})
    if numpy:
        ep.to_numpy()
    return ep


@pytest.mark.parametrize("numpy", [False, True])
def test_cut_and_slice_of_dict_episodes(numpy):
    ep = dict_episode(10, numpy)
    piece = ep[2:5]
    got = piece.get_observations()
    want = ep.get_observations(slice(2, 6))
    if numpy:
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
        assert np.shares_memory(got["img"], ep.get_observations()["img"])
    else:
        for a, b in zip(got, want):
            same_item(a, b)
    nxt = ep.cut(len_lookback_buffer=2)
    same = ep.get_actions(slice(-2, None))
    back = nxt.get_actions(slice(-2, None), neg_index_as_lookback=True)
    if numpy:
        np.testing.assert_array_equal(back[1], same[1])
    else:
        for a, b in zip(back, same):
            same_item(a, b)
    nxt.add_env_step(item(11), (1, np.array([11, -11])), 11.0,
                     extra_model_outputs={"logp": {"a": np.float32(11)}})
    assert len(nxt) == 1


def test_to_numpy_of_a_dict_episode_reads_the_leaves():
    ep = dict_episode(20, numpy=True)
    obs = ep.get_observations()
    assert list(obs) == ["img", "vec", "n", "x"]
    assert obs["img"].shape == (21, 2, 2) and obs["img"].dtype == np.uint8
    assert obs["n"].dtype == np.int64 and obs["x"].dtype == np.float64
    acts = ep.get_actions()
    assert isinstance(acts, tuple) and acts[1].shape == (20, 2)
    assert ep.get_extra_model_outputs("logp")["a"].dtype == np.float32
    # Infos stay dicts (a list), equal to what was added.
    assert ep.get_infos(-1) == {"t": 20}


@pytest.mark.rllib
@pytest.mark.parametrize("numpy", [False, True])
def test_dict_episodes_agree_with_rllib(numpy):
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode

    import gymnasium as gym

    space = gym.spaces.Dict({
        "img": gym.spaces.Box(0, 255, (2, 2), np.uint8),
        "vec": gym.spaces.Box(-10, 10, (3,), np.float32),
        "n": gym.spaces.Discrete(100),
        "x": gym.spaces.Box(-100, 100, (), np.float64),
    })
    ours, theirs = SingleAgentEpisode(observation_space=space), RLlibEpisode(
        observation_space=space)
    for ep in (ours, theirs):
        ep.add_env_reset(item(0))
        for t in range(1, 9):
            ep.add_env_step(item(t), (t % 2, np.array([t, -t])), float(t))
        if numpy:
            ep.to_numpy()
    for args in [(), (-1,), (slice(-4, None),), (slice(-3, 1),), ([0, 2, -1],)]:
        for kw in ({}, {"neg_index_as_lookback": True, "fill": 0.0}, {"fill": 0}):
            try:
                want = theirs.get_observations(*args, **kw)
            except Exception as error:  # noqa: BLE001 - compare the class
                with pytest.raises(type(error)):
                    ours.get_observations(*args, **kw)
                continue
            got = ours.get_observations(*args, **kw)
            if isinstance(want, list):
                assert isinstance(got, list) and len(got) == len(want)
                for a, b in zip(got, want):
                    same_item(a, b)
            else:
                same_item(got, want)
