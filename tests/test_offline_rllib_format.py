"""RLlib 2.60's recorded formats: ours against msgpack, msgpack_numpy and RLlib.

* episodes: pack_episode gives the very bytes of ``msgpack.packb(
  episode.get_state(), default=msgpack_numpy.encode)`` for RLlib's episode
  with the same data, unpack_episode what RLlib's ``from_state`` gives, item
  by item and type by type (hypothesis over spaces, rewards, infos, extra
  model outputs, lookbacks, done flags);
* rows: episode_rows gives the table Ray Data makes of RLlib's
  ``_map_episodes_to_data`` rows, rows_to_episodes what RLlib's
  ``_map_to_episodes`` gives (and whole episodes by default), and
  sample_batches_to_episodes what ``_map_sample_batch_to_episode`` gives;
* files recorded by RLlib (both formats, CartPole and a Dict action space)
  are read by ours, and ours by RLlib's OfflinePreLearner code paths;
* bad input raises ValueError/TypeError; the corrupt-bytes cases run in a
  child process (Python's debug allocator), so that a crash fails a test.
"""
from __future__ import annotations

import base64
import glob
import json
import os
import pickle
import subprocess
import sys
import textwrap
from collections import defaultdict
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from children import child_env, limit_child
from episode import SingleAgentEpisode
from episode.offline import rllib_format as F

pa = pytest.importorskip("pyarrow")
pytest.importorskip("lz4")

HERE = os.path.dirname(os.path.abspath(__file__))
SETTINGS = settings(max_examples=150, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _msgpack_numpy():
    msgpack = pytest.importorskip("msgpack")
    mnp = pytest.importorskip("msgpack_numpy")
    return msgpack, mnp


def rllib_pack(state):
    msgpack, mnp = _msgpack_numpy()
    return msgpack.packb(state, default=mnp.encode)


def rllib_unpack(blob):
    msgpack, mnp = _msgpack_numpy()
    return msgpack.unpackb(blob, object_hook=mnp.decode)


def rllib_episode_class():
    module = pytest.importorskip("ray.rllib.env.single_agent_episode")
    return module.SingleAgentEpisode


# -- generic values: packb/unpackb against msgpack + msgpack_numpy ---------------------------

F32 = np.float32
leaf_values = st.one_of(
    st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 64 - 1),
    st.floats(allow_nan=False), st.text(max_size=40), st.binary(max_size=40),
    st.integers(-100, 100).map(np.int64), st.floats(-1e3, 1e3, width=32).map(F32),
    st.floats(allow_nan=False).map(np.float64), st.booleans().map(np.bool_),
    st.integers(0, 255).map(np.uint8), st.complex_numbers(allow_nan=False, max_magnitude=1e6),
    st.complex_numbers(allow_nan=False, max_magnitude=1e6).map(np.complex64),
    arrays(st.sampled_from([np.float32, np.float64, np.int64, np.uint8, np.bool_, np.int16,
                            np.complex128]),
           st.sampled_from([(), (0,), (3,), (2, 3), (1, 2, 2)])),
    arrays(np.float64, (3, 2)).map(lambda a: a.T),                   # not C-contiguous
    st.just(np.array(["ab", "c"])), st.just(np.array([b"x", b"yz"])),
    st.just(np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")])),
)
values = st.recursive(
    leaf_values,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.lists(children, max_size=5).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=8), st.binary(max_size=8)), children,
                        max_size=5)),
    max_leaves=20)


@SETTINGS
@given(values)
def test_packb_is_msgpack_with_msgpack_numpy(value):
    msgpack, mnp = _msgpack_numpy()

    try:
        expected = msgpack.packb(value, default=mnp.encode)
    except OverflowError:
        with pytest.raises(OverflowError):
            F.packb(value)
        return
    packed = F.packb(value)
    assert packed == expected
    compare_values(F.unpackb(packed), msgpack.unpackb(expected, object_hook=mnp.decode))


def compare_values(ours, theirs, path="value"):
    """Equal values of identical types (ndarrays: dtype, shape, values)."""
    assert type(ours) is type(theirs), f"{path}: {type(ours)} != {type(theirs)}"
    if isinstance(theirs, np.ndarray):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, path
        assert ours.tobytes() == theirs.tobytes(), path
    elif isinstance(theirs, dict):
        assert list(ours) == list(theirs), path
        for k in theirs:
            compare_values(ours[k], theirs[k], f"{path}[{k!r}]")
    elif isinstance(theirs, list):
        assert len(ours) == len(theirs), path
        for i, (a, b) in enumerate(zip(ours, theirs)):
            compare_values(a, b, f"{path}[{i}]")
    elif isinstance(theirs, (float, np.floating, complex, np.complexfloating)):
        assert ours == theirs or (ours != ours and theirs != theirs), path
        if isinstance(theirs, np.generic):
            assert ours.dtype == theirs.dtype, path
    else:
        assert ours == theirs, path


def test_packb_errors_are_msgpacks():

    msgpack, mnp = _msgpack_numpy()
    for value in (2 ** 64, -(2 ** 63) - 1):
        with pytest.raises(OverflowError, match="Integer value out of range"):
            msgpack.packb(value, default=mnp.encode)
        with pytest.raises(OverflowError, match="Integer value out of range"):
            F.packb(value)
    for value in (object(), {1, 2}, np.datetime64("2020-01-01")):
        with pytest.raises(TypeError):
            msgpack.packb(value, default=mnp.encode)
        with pytest.raises(TypeError, match="can not serialize"):
            F.packb(value)
    # msgpack's C Packer's nesting limit, where an array or a scalar at the
    # bottom needs one or two levels more than a plain value.
    for leaf, deepest in ((None, 1024), (np.zeros(2), 1022), (np.int64(1), 1023)):
        deep = leaf
        for _ in range(deepest):
            deep = [deep]
        assert F.packb(deep) == msgpack.packb(deep, default=mnp.encode)
        with pytest.raises(ValueError):
            msgpack.packb([deep], default=mnp.encode)
        with pytest.raises(ValueError, match="recursion limit"):
            F.packb([deep])


def test_object_arrays_unpickle_through_the_restricted_unpickler():

    msgpack, mnp = _msgpack_numpy()
    arr = np.array([1, "a", None, {"k": [1.5]}], dtype=object)
    packed = F.packb(arr)
    assert packed == msgpack.packb(arr, default=mnp.encode)
    out = F.unpackb(packed)
    assert out.dtype == object and out.tolist() == arr.tolist()
    # An object array holding anything that names another global is refused.
    evil = np.array([SimpleNamespace(a=1)], dtype=object)
    with pytest.raises(ValueError, match="types.SimpleNamespace"):
        F.unpackb(msgpack.packb(evil, default=mnp.encode))


# -- episodes: hypothesis over RLlib's episodes -----------------------------------------------

def _box(shape, dtype):
    return gym.spaces.Box(-3, 3, shape, dtype)


SPACE_KINDS = {
    # name: (space or None, item strategy)
    "box_f32": (_box((3,), np.float32), arrays(np.float32, (3,), elements=st.floats(-3, 3, width=32))),
    "box_f64_2x2": (_box((2, 2), np.float64), arrays(np.float64, (2, 2), elements=st.floats(-3, 3))),
    "box_u8": (gym.spaces.Box(0, 255, (2, 3), np.uint8), arrays(np.uint8, (2, 3))),
    "box_scalar": (_box((), np.float32), arrays(np.float32, (), elements=st.floats(-3, 3, width=32))),
    "discrete_np": (gym.spaces.Discrete(4), st.integers(0, 3).map(np.int64)),
    "discrete_int": (gym.spaces.Discrete(4), st.integers(0, 3)),
    "multidiscrete": (gym.spaces.MultiDiscrete([2, 3]),
                      st.tuples(st.integers(0, 1), st.integers(0, 2)).map(
                          lambda t: np.array(t, np.int64))),
    "dict": (gym.spaces.Dict({"a": _box((2,), np.float32), "b": gym.spaces.Discrete(3)}),
             st.builds(lambda a, b: {"a": a, "b": b},
                       arrays(np.float32, (2,), elements=st.floats(-3, 3, width=32)),
                       st.integers(0, 2).map(np.int64))),
    "tuple": (gym.spaces.Tuple((gym.spaces.Discrete(2), _box((2,), np.float64))),
              st.builds(lambda a, b: (a, b), st.integers(0, 1),
                        arrays(np.float64, (2,), elements=st.floats(-3, 3)))),
    "no_space_floats": (None, st.floats(-5, 5)),
    "no_space_strings": (None, st.text(max_size=3)),
}
REWARDS = {
    "float": st.floats(-10, 10),
    "int": st.integers(-5, 5),
    "f32": st.floats(-10, 10, width=32).map(np.float32),
    "f64": st.floats(-10, 10).map(np.float64),
    "mixed": st.one_of(st.floats(-10, 10), st.integers(-5, 5)),
}
INFOS = st.one_of(
    st.just({}),
    st.fixed_dictionaries({"n": st.integers(-5, 5)}),
    st.fixed_dictionaries({"x": arrays(np.float32, (2,)), "s": st.text(max_size=3)}),
    st.fixed_dictionaries({"nested": st.fixed_dictionaries({"k": st.lists(st.integers(-2 ** 63, 2 ** 64 - 1), max_size=2)})}),
)
EXTRAS = {
    "logp": st.floats(-3, 0, width=32).map(np.float32),
    "vf": arrays(np.float32, (1,)),
    "seq": st.integers(0, 3),
    "state": arrays(np.float32, (2, 2)),
}


@st.composite
def recipes(draw):
    obs_kind = draw(st.sampled_from(sorted(SPACE_KINDS)))
    act_kind = draw(st.sampled_from(sorted(SPACE_KINDS)))
    steps = draw(st.integers(0, 6))
    extras = draw(st.lists(st.sampled_from(sorted(EXTRAS)), unique=True, max_size=3))
    rewards = REWARDS[draw(st.sampled_from(sorted(REWARDS)))]
    obs_space, obs_items = SPACE_KINDS[obs_kind]
    act_space, act_items = SPACE_KINDS[act_kind]
    return {
        "spaces": draw(st.booleans()),
        "obs_space": obs_space, "act_space": act_space,
        "reset": (draw(obs_items), draw(INFOS)),
        "steps": [(draw(obs_items), draw(act_items), draw(rewards), draw(INFOS),
                   {k: draw(EXTRAS[k]) for k in extras}) for _ in range(steps)],
        "done": draw(st.sampled_from(["", "terminated", "truncated", "np_terminated"])),
        "cut": draw(st.sampled_from([None, 0, 1, 2])),
        "after_cut": draw(st.integers(0, 2)) if steps else 0,
        "custom_data": draw(st.sampled_from([None, {"a": [1, "x"]}, {"w": np.float32(2)}])),
        "ids": draw(st.sampled_from([(None, None), ("agent", "module")])),
        "numpy": draw(st.booleans()) and obs_kind not in ("tuple",) and act_kind not in ("tuple",),
    }


def build(cls, recipe):
    """The recipe's episode of class `cls` (RLlib's or ours): the same calls."""
    kw = {}
    if recipe["spaces"]:
        kw = {"observation_space": recipe["obs_space"], "action_space": recipe["act_space"]}
    ep = cls(id_="e" * 32, agent_id=recipe["ids"][0], module_id=recipe["ids"][1], **kw)
    obs, info = recipe["reset"]
    ep.add_env_reset(obs, infos=info)
    steps = recipe["steps"]
    done_at = len(steps) - 1 if recipe["cut"] is None else -1
    for i, (o, a, r, inf, ext) in enumerate(steps):
        flags = {}
        if i == done_at and recipe["done"]:
            flag = recipe["done"].replace("np_", "")
            flags = {flag: np.bool_(True) if recipe["done"].startswith("np_") else True}
        ep.add_env_step(o, a, r, infos=inf, extra_model_outputs=dict(ext) or None, **flags)
    if recipe["cut"] is not None and not ep.is_done:
        ep = ep.cut(len_lookback_buffer=min(recipe["cut"], len(ep)))
        for o, a, r, inf, ext in steps[:recipe["after_cut"]]:
            ep.add_env_step(o, a, r, infos=inf, extra_model_outputs=dict(ext) or None)
    if recipe["custom_data"] is not None:
        ep.custom_data.update(recipe["custom_data"])
    ep._start_time = 12.5
    ep._last_step_time = 13.25 if len(steps) else None
    if recipe["numpy"]:
        ep.to_numpy()
    return ep


def _rllib_can_pack(theirs):
    # RLlib's get_state() puts an extra model output holding only lookback
    # rows (a cut() successor's) into the state as the buffer itself, which
    # msgpack refuses (TypeError).
    return all(len(v) for v in theirs.extra_model_outputs.values())


def test_rllib_refuses_to_pack_a_cut_episode_with_extra_outputs():
    """Pinned: RLlib cannot pack a fresh cut() successor of an episode with
    extra model outputs; ours packs it, and RLlib's from_state reads ours."""
    RLlibEpisode = rllib_episode_class()
    recipe = {"spaces": False, "obs_space": None, "act_space": None,
              "reset": (np.zeros(2, F32), {}), "ids": (None, None), "numpy": False,
              "steps": [(np.ones(2, F32), 1, 1.0, {}, {"vf": np.float32(1)})] * 3,
              "done": "", "cut": 1, "after_cut": 0, "custom_data": None}
    theirs, ours = build(RLlibEpisode, recipe), build(SingleAgentEpisode, recipe)
    with pytest.raises(TypeError, match="InfiniteLookbackBuffer"):
        rllib_pack(theirs.get_state())
    blob = F.pack_episode(ours)
    assert blob == rllib_pack(ours.get_state())
    again = RLlibEpisode.from_state(rllib_unpack(blob))
    assert len(again) == 0 and again.extra_model_outputs["vf"].lookback == 1
    from difftools import compare_episodes

    compare_episodes(F.unpack_episode(blob), again)


@pytest.mark.rllib
@SETTINGS
@given(recipes())
def test_episodes_pack_and_unpack_as_rllib_does(recipe):
    from difftools import compare_episodes

    RLlibEpisode = rllib_episode_class()
    theirs, ours = build(RLlibEpisode, recipe), build(SingleAgentEpisode, recipe)
    blob = F.pack_episode(ours)
    # Our bytes are msgpack's of our state, which is RLlib's.
    assert blob == rllib_pack(ours.get_state())
    if _rllib_can_pack(theirs):
        assert blob == rllib_pack(theirs.get_state())
    state = rllib_unpack(blob)
    expected = RLlibEpisode.from_state(state)
    decoded = F.unpack_episode(blob)
    compare_episodes(decoded, expected)
    assert type(decoded.extra_model_outputs) is defaultdict
    assert decoded.custom_data == expected.custom_data
    assert F.pack_episode(decoded) == blob
    # The list version and the Arrow version give the same episodes.
    for again in (F.unpack_episodes([blob, blob])[1],
                  F.unpack_episodes(pa.array([b"", blob], pa.binary()).slice(1))[0],
                  F.unpack_episodes(pa.chunked_array([pa.array([blob], pa.large_binary())]))[0]):
        compare_episodes(again, expected)


def test_item_types_of_a_recorded_cartpole_episode():
    """What RLlib's recording holds for CartPole: float32 observation rows,
    np.int64 actions, Python float rewards, np.bool_ flags, int extras."""
    ep = SingleAgentEpisode(id_="x", observation_space=_box((4,), np.float32),
                            action_space=gym.spaces.Discrete(2))
    ep.add_env_reset(np.zeros(4, F32))
    for t in range(3):
        ep.add_env_step(np.full(4, t, F32), np.int64(t % 2), 1.0, terminated=np.bool_(t == 2),
                        extra_model_outputs={"weights_seq_no": 0})
    got = F.unpack_episode(F.pack_episode(ep))
    assert [type(x) for x in got.get_observations()] == [np.ndarray] * 4
    assert got.get_observations(1).dtype == np.float32
    assert [type(x) for x in got.get_actions()] == [np.int64] * 3
    assert got.get_rewards() == [1.0, 1.0, 1.0] and type(got.get_rewards(0)) is float
    assert type(got.is_terminated) is np.bool_ and got.is_terminated
    assert got.get_extra_model_outputs("weights_seq_no") == [0, 0, 0]
    assert got.observation_space == ep.observation_space
    assert got.rewards.space == ep.rewards.space
    assert got.get_infos() == [{}] * 4


# -- rows: RLlib's _map_episodes_to_data + Ray Data against episode_rows ----------------------

def _rllib_rows(episodes, compress):
    """The table Ray Data makes of RLlib's recorded rows of `episodes`."""
    runner = pytest.importorskip("ray.rllib.offline.offline_env_runner")
    from ray.data._internal.arrow_block import ArrowBlockBuilder

    ns = SimpleNamespace(output_compress_columns=list(compress), _samples=[])
    runner.OfflineSingleAgentEnvRunner._map_episodes_to_data(ns, episodes)
    # What ray.data.from_items' block builder collects (a missing column is
    # None), then builds (its size estimate would start a Ray instance).
    columns = {}
    for k, row in enumerate(ns._samples):
        for name in row:
            columns.setdefault(name, [None] * k)
        for name, values in columns.items():
            values.append(row.get(name))
    return ArrowBlockBuilder._table_from_pydict(columns)


ROW_KINDS = ["box_f32", "box_u8", "discrete_np", "discrete_int", "multidiscrete"]


@st.composite
def row_recipes(draw):
    obs_kind = draw(st.sampled_from(ROW_KINDS))
    act_kind = draw(st.sampled_from(ROW_KINDS))
    reward_kind = draw(st.sampled_from(["float", "f32"]))
    extras = draw(st.lists(st.sampled_from(["logp", "vf", "seq"]), unique=True, max_size=2))
    episodes = []
    for e in range(draw(st.integers(1, 3))):
        steps = draw(st.integers(1, 5))
        episodes.append({
            "spaces": True, "obs_space": SPACE_KINDS[obs_kind][0],
            "act_space": SPACE_KINDS[act_kind][0],
            "reset": (draw(SPACE_KINDS[obs_kind][1]), {}),
            "steps": [(draw(SPACE_KINDS[obs_kind][1]), draw(SPACE_KINDS[act_kind][1]),
                       draw(REWARDS[reward_kind]), draw(INFOS),
                       {k: draw(EXTRAS[k]) for k in extras}) for _ in range(steps)],
            "done": draw(st.sampled_from(["", "terminated", "truncated"])),
            "cut": None, "after_cut": 0, "custom_data": None, "ids": (None, None),
            "numpy": draw(st.booleans()),
        })
    compress = draw(st.sampled_from([(), ("obs", "new_obs"), ("obs",), ("new_obs",),
                                     ("obs", "actions", "vf")]))
    return episodes, compress


def _ipc_bytes(table):
    # The table as Arrow writes it (values, validity and all; NaN is NaN).
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.combine_chunks())
    return sink.getvalue().to_pybytes()


def _ids(episodes):
    for i, ep in enumerate(episodes):
        ep.id_ = f"{i:032d}"
    return episodes


@pytest.mark.rllib
@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(row_recipes())
def test_episode_rows_are_rllibs_recorded_rows(recipe):
    from difftools import compare_episodes

    RLlibEpisode = rllib_episode_class()
    recipes_, compress = recipe
    theirs = _ids([build(RLlibEpisode, r) for r in recipes_])
    ours = _ids([build(SingleAgentEpisode, r) for r in recipes_])
    expected = _rllib_rows(theirs, compress)
    table = F.episode_rows(ours, compress_columns=compress, infos=False)
    assert table.schema == expected.schema
    assert _ipc_bytes(table) == _ipc_bytes(expected)
    # RLlib's reader on our rows and ours give the same one-step episodes.
    with_infos = F.episode_rows(ours, compress_columns=compress)
    # (Our infos are in the schema metadata: RLlib's reader, handed the
    # columns, meets no infos and no extra output of them.)
    assert with_infos.column_names == table.column_names
    assert F.INFOS_KEY in with_infos.schema.metadata
    rllib_read = _rllib_map_to_episodes(F.to_numpy_batch(with_infos), compress)
    assert all(e.get_infos() == [{}, {}] and "infos" not in e.extra_model_outputs
               for e in rllib_read)
    ours_read = F.rows_to_episodes(with_infos, compress_columns=compress, whole_episodes=False)
    assert len(ours_read) == len(rllib_read) == table.num_rows
    k = 0
    for ep in ours:
        for i in range(len(ep)):
            expected_ep = rllib_read[k]
            expected_ep.infos.data[1] = ep.get_infos(i + 1)   # ours keeps them
            compare_episodes(ours_read[k], expected_ep)
            k += 1
    # Whole episodes: the recorded ones again (no lookback; the reset info is lost).
    whole = F.rows_to_episodes(with_infos, compress_columns=compress)
    assert len(whole) == len(ours)
    for got, ep in zip(whole, ours):
        assert got.id_ == ep.id_ and len(got) == len(ep)
        assert got.is_terminated == ep.is_terminated and got.is_truncated == ep.is_truncated
        for i in range(len(ep) + 1):
            np.testing.assert_array_equal(got.get_observations(i), ep.get_observations(i))
        for i in range(len(ep)):
            np.testing.assert_array_equal(got.get_actions(i), ep.get_actions(i))
            assert got.get_rewards(i) == ep.get_rewards(i)
            compare_values(got.get_infos(i + 1), ep.get_infos(i + 1))
            for key in ep.extra_model_outputs:
                np.testing.assert_array_equal(got.get_extra_model_outputs(key, i),
                                              ep.get_extra_model_outputs(key, i))
        assert got.get_infos(0) == {}


def _rllib_map_to_episodes(batch, compress, ignore_final=False, schema=None, sample_batches=False,
                           to_numpy=True):
    prelearner = pytest.importorskip("ray.rllib.offline.offline_prelearner")
    from ray.rllib.algorithms.bc import BCConfig

    config = BCConfig().offline_data(input_compress_columns=list(compress),
                                     ignore_final_observation=ignore_final,
                                     input_read_schema=schema or {})
    p = SimpleNamespace(config=config)
    if sample_batches:
        return prelearner.OfflinePreLearner._map_sample_batch_to_episode(
            p, batch, to_numpy=to_numpy)["episodes"]
    return prelearner.OfflinePreLearner._map_to_episodes(p, batch)["episodes"]


def _cartpole_like(n_episodes=3, steps=(4, 1, 6), numpy_actions=True):
    episodes = []
    for e in range(n_episodes):
        ep = SingleAgentEpisode(id_=f"ep{e}", observation_space=_box((4,), np.float32),
                                action_space=gym.spaces.Discrete(2))
        ep.add_env_reset(np.full(4, e, F32))
        for t in range(steps[e % len(steps)]):
            ep.add_env_step(np.full(4, 10 * e + t, F32), np.int64(t % 2) if numpy_actions else t % 2,
                            1.0, infos={"t": t}, terminated=t == steps[e % len(steps)] - 1,
                            extra_model_outputs={"weights_seq_no": 0})
        episodes.append(ep)
    return episodes


@pytest.mark.rllib
@pytest.mark.parametrize("ignore_final", [False, True])
@pytest.mark.parametrize("compress", [(), ("obs",)])
def test_one_step_episodes_are_rllibs(compress, ignore_final):
    from difftools import compare_episodes

    table = F.episode_rows(_cartpole_like(), compress_columns=compress, infos=False)
    batch = F.to_numpy_batch(table)
    expected = _rllib_map_to_episodes(batch, compress, ignore_final)
    for source in (table, batch):
        got = F.rows_to_episodes(source, compress_columns=compress,
                                 ignore_final_observation=ignore_final, whole_episodes=False)
        assert len(got) == len(expected) == 11
        for a, b in zip(got, expected):
            compare_episodes(a, b)


@pytest.mark.rllib
def test_input_read_schema_renames_columns():
    from difftools import compare_episodes

    table = F.episode_rows(_cartpole_like(), compress_columns=(), infos=False)
    renamed = table.rename_columns(["episode", "agent_id", "module_id", "o", "a", "r", "o2",
                                    "term", "truncateds", "weights_seq_no"])
    schema = {"eps_id": "episode", "obs": "o", "actions": "a", "rewards": "r", "new_obs": "o2",
              "terminateds": "term"}
    expected = _rllib_map_to_episodes(F.to_numpy_batch(renamed), (), schema=schema)
    got = F.rows_to_episodes(renamed, schema=schema, whole_episodes=False)
    for a, b in zip(got, expected):
        compare_episodes(a, b)
    whole = F.rows_to_episodes(renamed, schema=schema)
    assert [len(e) for e in whole] == [4, 1, 6] and whole[2].id_ == "ep2"


def test_whole_episodes_join_consecutive_rows():
    episodes = _cartpole_like(numpy_actions=False)
    table = F.episode_rows(episodes)
    whole = F.rows_to_episodes(table, compress_columns=("obs",))
    assert [(e.id_, len(e)) for e in whole] == [("ep0", 4), ("ep1", 1), ("ep2", 6)]
    got = whole[2]
    assert got.t_started == 0 and got.is_terminated and type(got.is_terminated) is np.bool_
    np.testing.assert_array_equal(np.stack(got.get_observations()),
                                  np.stack(episodes[2].get_observations()))
    # Item types are those of RLlib's one-step episodes: Ray Data's numpy batch.
    assert [type(a) for a in got.get_actions()] == [np.int64] * 6
    assert [type(r) for r in got.get_rewards()] == [np.float64] * 6
    assert got.get_infos() == [{}] + [{"t": t} for t in range(6)]
    assert got.get_extra_model_outputs("weights_seq_no") == [0] * 6
    assert type(got.get_extra_model_outputs("weights_seq_no", 0)) is np.int64


def test_whole_episodes_infos_empty_or_not():
    """Packed infos that are all the empty map are counted, not decoded row
    by row: the same infos (each a dict of its own) as an episode with some
    infos, and as rows without an infos column."""
    episodes = _cartpole_like(numpy_actions=False)
    plain = [SingleAgentEpisode(observations=list(e.get_observations()),
                                actions=list(e.get_actions()), rewards=list(e.get_rewards()),
                                terminated=e.is_terminated, id_=e.id_,
                                observation_space=e.observation_space,
                                action_space=e.action_space, len_lookback_buffer=0)
             for e in episodes[:2]] + episodes[2:]
    table = F.with_kept_infos(F.episode_rows(plain))
    assert table.column("infos").to_pylist()[:5] == [b"\x80"] * 5
    for source, kept in ((F.episode_rows(plain), True), (table, True),
                         (F.to_numpy_batch(table), True),
                         (F.to_numpy_batch(table.drop(["infos"])), False)):
        whole = F.rows_to_episodes(source, compress_columns=("obs",))
        assert [e.get_infos() for e in whole[:2]] == [[{}] * 5, [{}] * 2]
        assert whole[2].get_infos() == [{}] + [{"t": t} if kept else {} for t in range(6)]
        infos = whole[0].get_infos()
        infos[1]["k"] = 1
        assert whole[0].get_infos(2) == {} and whole[1].get_infos(1) == {}


def test_whole_episodes_split_where_rows_do_not_continue():
    episodes = _cartpole_like()
    # Two chunks of one episode id whose rows do not continue each other
    # (a recording that wrote the same episode twice), and a chunk that does.
    ep = episodes[2]
    first, second = ep[0:3], ep[3:6]
    for chunk in (first, second):
        chunk.id_ = "same"
    table = F.episode_rows([first, second, first])
    whole = F.rows_to_episodes(table, compress_columns=("obs",))
    assert [(e.id_, len(e)) for e in whole] == [("same", 6), ("same", 3)]
    plain = F.rows_to_episodes(F.episode_rows([first, first], compress_columns=()))
    assert [len(e) for e in plain] == [3, 3]
    # Without new_obs (ignore_final_observation) only ids and done flags split.
    zeros = F.rows_to_episodes(table, compress_columns=("obs",), ignore_final_observation=True)
    assert [len(e) for e in zeros] == [6, 3]
    zeros = F.rows_to_episodes(F.episode_rows([first, first]), compress_columns=("obs",),
                               ignore_final_observation=True)
    assert [len(e) for e in zeros] == [6]
    np.testing.assert_array_equal(zeros[0].get_observations(-1), np.zeros(4, F32))
    np.testing.assert_array_equal(zeros[0].get_observations(3), first.get_observations(0))


def test_whole_episodes_without_ids_or_truncateds():
    table = F.episode_rows(_cartpole_like(), compress_columns=())
    table = table.drop_columns(["eps_id", "truncateds"]).replace_schema_metadata(None)
    whole = F.rows_to_episodes(table)
    assert [len(e) for e in whole] == [4, 1, 6]
    assert len({e.id_ for e in whole}) == 3 and not any(e.is_truncated for e in whole)
    assert whole[0].get_infos() == [{}] * 5
    # An all-null id column (Ray Data's float32 NaN) is no ids either.
    nulls = table.append_column("eps_id", pa.nulls(table.num_rows))
    assert [len(e) for e in F.rows_to_episodes(nulls)] == [4, 1, 6]


def test_rows_from_a_dict_of_lists_and_ragged_observations():
    batch = {"eps_id": np.array(["a", "a"], dtype=object),
             "obs": np.array([np.zeros(2, F32), np.zeros(3, F32)], dtype=object),
             "new_obs": np.array([np.zeros(3, F32), np.ones(1, F32)], dtype=object),
             "actions": np.array([0, 1]), "rewards": np.array([1.0, 2.0]),
             "terminateds": np.array([False, True])}
    whole = F.rows_to_episodes(batch)
    assert len(whole) == 1 and [o.shape for o in whole[0].get_observations()] == [(2,), (3,), (1,)]


# -- sample batches -------------------------------------------------------------------------------

def _sample_batch_rows(packed_whole_obs):
    obs0 = np.arange(12, dtype=F32).reshape(3, 4)
    obs1 = np.arange(8, dtype=F32).reshape(2, 4) + 100
    obs = np.empty(2, dtype=object)
    if packed_whole_obs:
        obs[0], obs[1] = F.pack_value(obs0), F.pack_value(obs1)
    else:
        obs[0], obs[1] = obs0, obs1

    def col(*rows):
        # One row per SampleBatch, each a column of its steps (Ray Data's layout).
        out = np.empty(len(rows), dtype=object)
        for i, row in enumerate(rows):
            out[i] = row
        return out
    return {
        "eps_id": col(np.array(["a", "a", "a"]), np.array(["b", "b"])),
        "obs": obs,
        "new_obs": col(obs0 + 1, obs1 + 1),
        "actions": col(np.array([0, 1, 0]), np.array([1, 1])),
        "rewards": col(np.array([1.0, 1.0, 1.0]), np.array([0.5, 0.5])),
        "terminateds": col(np.array([False, False, True]), np.array([False, False])),
        "truncateds": col(np.array([False, False, False]), np.array([False, True])),
        "action_logp": col(np.array([-0.1, -0.2, -0.3], F32), np.array([-1.0, -2.0], F32)),
    }


@pytest.mark.rllib
@pytest.mark.parametrize("packed_whole_obs", [False, True])
def test_sample_batches_become_rllibs_episodes(packed_whole_obs):
    from difftools import compare_episodes

    batch = _sample_batch_rows(packed_whole_obs)
    compress = ("obs",) if packed_whole_obs else ()
    expected = _rllib_map_to_episodes(batch, compress, sample_batches=True)
    got = F.sample_batches_to_episodes(batch, compress_columns=compress, to_numpy=True)
    assert [len(e) for e in got] == [3, 2]
    for a, b in zip(got, expected):
        compare_episodes(a, b)


@pytest.mark.rllib
def test_rllib_hands_on_observations_packed_one_by_one_in_sample_batches():
    """Pinned: with each observation of a SampleBatch row packed on its own,
    RLlib's _map_sample_batch_to_episode keeps the packed strings as the
    observations (it unpacks the list, not its items), and its reading path
    (to_numpy) then fails stacking strings with the unpacked last
    observation; ours unpacks them."""
    batch = _sample_batch_rows(False)
    obs = np.empty(2, dtype=object)
    obs[0] = np.array([F.pack_value(np.full(4, i, F32)) for i in range(3)], dtype=object)
    obs[1] = np.array([F.pack_value(np.full(4, i, F32)) for i in range(2)], dtype=object)
    batch["obs"] = obs
    batch["new_obs"] = obs
    with pytest.raises(ValueError, match="inhomogeneous"):
        _rllib_map_to_episodes(batch, ("obs",), sample_batches=True)
    expected = _rllib_map_to_episodes(batch, ("obs",), sample_batches=True, to_numpy=False)
    assert isinstance(expected[0].get_observations(0), str)
    got = F.sample_batches_to_episodes(batch, compress_columns=("obs",), to_numpy=True)
    np.testing.assert_array_equal(got[0].get_observations(1), np.full(4, 1, F32))
    np.testing.assert_array_equal(got[0].get_observations(-1), np.full(4, 2, F32))


def test_sample_batch_errors():
    batch = _sample_batch_rows(False)
    batch["obs"] = np.array([1, 2])
    with pytest.raises(TypeError, match="Unknown observation type"):
        F.sample_batches_to_episodes(batch)
    batch = _sample_batch_rows(True)
    batch["obs"][1] = "not base64 !"
    with pytest.raises(ValueError, match="sample batch 1"):
        F.sample_batches_to_episodes(batch, compress_columns=("obs",))


# -- packed values ----------------------------------------------------------------------------------

def test_pack_value_is_rllibs_pack():
    compression = pytest.importorskip("ray.rllib.utils.compression")
    for arr in (np.arange(4, dtype=F32), np.zeros((2, 3), np.uint8), np.zeros((), np.bool_),
                np.arange(10.0).reshape(2, 5).T, np.zeros(70000, np.uint8)):
        packed = F.pack_value(arr)
        assert packed == compression.pack(arr)
        out = F.unpack_value(packed)
        assert out.dtype == arr.dtype and out.shape == arr.shape and np.array_equal(out, arr)
        cells = [packed, packed]
        stacked = F._unpack_column(np.array(cells, dtype=object), "obs")
        np.testing.assert_array_equal(stacked, np.stack([arr, arr]))


def test_the_restricted_unpickler_refuses_other_globals():
    import lz4.frame

    evil = base64.b64encode(lz4.frame.compress(pickle.dumps(SimpleNamespace(x=1)))).decode()
    with pytest.raises(ValueError, match="names types.SimpleNamespace"):
        F.unpack_value(evil)

    class Exploit:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    packed = F.pack_value(Exploit())
    with pytest.raises(ValueError, match="names posix.system"):
        F.unpack_value(packed)
    with pytest.raises(ValueError, match="names posix.system"):
        F.rows_to_episodes({"obs": np.array([packed], dtype=object),
                            "new_obs": np.array([packed], dtype=object),
                            "actions": np.array([0]), "rewards": np.array([1.0]),
                            "terminateds": np.array([True])}, compress_columns=("obs",))
    for junk, match in (("not base64!", "base64"), (base64.b64encode(b"junk").decode(), "lz4"),
                        (base64.b64encode(lz4.frame.compress(b"\x80\x05junk")).decode(),
                         "corrupt pickle")):
        with pytest.raises(ValueError, match=match):
            F.unpack_value(junk)
    with pytest.raises(TypeError):
        F.unpack_value(3)


def test_detect_format():
    assert F.detect_format(pa.schema([("item", pa.binary())])) == "rllib_episodes"
    assert F.detect_format(pa.schema([("item", pa.large_binary())])) == "rllib_episodes"
    assert F.detect_format(F.episode_rows(_cartpole_like()).schema) == "rllib_rows"
    assert F.detect_format(pa.schema([("item", pa.string())])) is None
    assert F.detect_format(pa.schema([("obs", pa.float32())])) is None
    with pytest.raises(TypeError):
        F.detect_format({"item": "binary"})


# -- bad input --------------------------------------------------------------------------------------

def test_unpack_episode_errors_name_what_is_wrong():
    blob = F.pack_episode(_cartpole_like()[0])
    with pytest.raises(ValueError, match="truncated"):
        F.unpack_episode(blob[:-3])
    with pytest.raises(ValueError, match="bytes after"):
        F.unpack_episode(blob + b"\x00")
    with pytest.raises(ValueError, match="a map"):
        F.unpack_episode(b"\x93\x01\x02\x03")
    with pytest.raises(ValueError, match="no 'agent_id'"):
        F.unpack_episode(F.packb({"id_": "x"}))
    with pytest.raises(TypeError, match="not str"):
        F.unpack_episode("text")
    with pytest.raises(TypeError):
        F.unpack_episode(None)
    with pytest.raises(ValueError, match="packed episode 1"):
        F.unpack_episodes([blob, blob[:10]])
    with pytest.raises(TypeError, match="binary"):
        F.unpack_episodes(pa.array(["x"]))
    with pytest.raises(ValueError, match="null"):
        F.unpack_episodes(pa.array([blob, None], pa.binary()))
    # A state with tracks of inconsistent lengths: RLlib's AssertionError.
    state = rllib_unpack(blob) if _has_msgpack() else None
    if state is not None:
        state["rewards"]["data"].append(1.0)
        with pytest.raises(AssertionError):
            F.unpack_episode(rllib_pack(state))


def _has_msgpack():
    try:
        import msgpack  # noqa: F401
        import msgpack_numpy  # noqa: F401
    except ImportError:
        return False
    return True


def test_wrong_types_in_columns():
    table = F.episode_rows(_cartpole_like())
    with pytest.raises(ValueError, match="no column 'new_obs'"):
        F.rows_to_episodes(table.drop_columns(["new_obs"]), compress_columns=("obs",))
    with pytest.raises(ValueError, match="'terminateds'.*'dones'"):
        F.rows_to_episodes(table.drop_columns(["terminateds"]), compress_columns=("obs",),
                           whole_episodes=False)
    batch = F.to_numpy_batch(table)
    batch["rewards"] = batch["rewards"][:3]
    with pytest.raises(ValueError, match="'rewards' has 3 rows"):
        F.rows_to_episodes(batch, compress_columns=("obs",))
    batch = F.to_numpy_batch(table)
    batch["obs"] = batch["obs"].copy()
    batch["obs"][2] = "AAAA"
    with pytest.raises(ValueError, match="row 2"):
        F.rows_to_episodes(batch, compress_columns=("obs",))
    with pytest.raises(TypeError, match="Table or a dict"):
        F.rows_to_episodes([1, 2, 3])
    # A tensor column whose rows do not have the declared shape.
    bad = pa.table({"x": pa.array([[1.0, 2.0], [3.0]], pa.large_list(pa.float32()))})
    field = pa.field("x", bad.schema.field("x").type, metadata={
        b"ARROW:extension:name": b"ray.data.arrow_tensor_v2", b"ARROW:extension:metadata": b"[2]"})
    with pytest.raises(ValueError, match="column 'x'"):
        F.to_numpy_batch(pa.table([bad.column("x")], schema=pa.schema([field])))


# Corrupt bytes run in a child process: a crash there fails the test instead
# of ending pytest. The child reports each case's outcome as JSON.
CHILD = textwrap.dedent("""
    import json, sys, random
    import numpy as np
    sys.path.insert(0, {here!r})
    import test_offline_rllib_format as T
    from episode.offline import rllib_format as F
    outcomes = {{}}
    def record(kind, fn):
        try:
            fn()
            key = "ok"
        except (ValueError, TypeError, AssertionError) as e:
            key = type(e).__name__
        except Exception as e:
            print("UNEXPECTED", kind, type(e).__name__, e, flush=True)
            key = "unexpected:" + type(e).__name__
        outcomes.setdefault(kind, {{}})
        outcomes[kind][key] = outcomes[kind].get(key, 0) + 1
    rng = random.Random(0)
    for blob in T.corpus():
        for cut in range(len(blob)):
            record("truncated", lambda: F.unpack_episode(blob[:cut]))
        for _ in range({flips}):
            b = bytearray(blob)
            for _ in range(rng.randint(1, 3)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            record("flipped", lambda: F.unpack_episode(bytes(b)))
            record("flipped_list", lambda: F.unpack_episodes([bytes(b)]))
        # header bytes of every kind at every position
        for _ in range({flips}):
            b = bytearray(blob)
            pos = rng.randrange(len(b))
            b[pos] = rng.choice([0xc1, 0xc4, 0xc5, 0xc6, 0xdc, 0xdd, 0xde, 0xdf, 0xd9, 0xdb,
                                 0xc7, 0xd4, 0xcf, 0xd3, 0x9f, 0x8f, 0xbf, 0xca])
            record("headers", lambda: F.unpack_episode(bytes(b)))
    for cell in T.cells():
        for cut in range(0, len(cell)):
            record("cell_truncated", lambda: F._unpack_column([cell[:cut], cell], "obs"))
        for _ in range({flips}):
            c = bytearray(cell.encode())
            c[rng.randrange(len(c))] = rng.choice(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")
            record("cell_flipped", lambda: F._unpack_column([cell, c.decode()], "obs"))
    # Pickles of arrays, scalars and dtypes with flipped bytes: the
    # restricted unpickler, and the C reader of packed cells.
    for raw in T.pickles():
        for _ in range({flips}):
            b = bytearray(raw)
            for _ in range(rng.randint(1, 2)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            record("pickle_flipped", lambda: F.safe_loads(bytes(b)))
            cell = T.packed_raw(bytes(b))
            record("pickle_cell", lambda: F._unpack_column([cell], "obs"))
    print("OUTCOMES", json.dumps(outcomes), flush=True)
""")


def corpus():
    """Packed episodes to corrupt: CartPole-like, Dict/Tuple items, infos,
    extras, a numpy'ized one."""
    episodes = _cartpole_like()[:2]
    rng = np.random.default_rng(0)
    ep = SingleAgentEpisode(observation_space=SPACE_KINDS["dict"][0],
                            action_space=SPACE_KINDS["tuple"][0])
    ep.add_env_reset({"a": np.zeros(2, F32), "b": np.int64(1)}, infos={"s": "x"})
    for t in range(3):
        ep.add_env_step({"a": rng.random(2).astype(F32), "b": np.int64(t % 3)},
                        (t % 2, rng.random(2)), float(t), infos={"arr": np.arange(2)},
                        extra_model_outputs={"v": np.float32(t)})
    episodes.append(ep)
    numpy_ep = _cartpole_like()[2]
    numpy_ep.to_numpy()
    episodes.append(numpy_ep)
    episodes.append(_numpy_dict_episode())
    return [F.pack_episode(e) for e in episodes]


def _numpy_dict_episode():
    """A numpy'ized episode of nested Dict observations and extra outputs:
    its tracks are packed as (dicts of) arrays."""
    space = gym.spaces.Dict({"a": _box((2,), np.float32),
                             "n": gym.spaces.Dict({"b": gym.spaces.Discrete(3)})})
    ep = SingleAgentEpisode(observation_space=space, action_space=gym.spaces.Discrete(2))
    ep.add_env_reset({"a": np.zeros(2, F32), "n": {"b": np.int64(0)}})
    for t in range(4):
        ep.add_env_step({"a": np.full(2, t, F32), "n": {"b": np.int64(t % 3)}}, t % 2,
                        float(t), terminated=t == 3, extra_model_outputs={"v": np.float32(t)})
    ep.to_numpy()
    return ep


@pytest.mark.rllib
def test_numpy_episodes_are_read_from_their_arrays(monkeypatch):
    """A numpy'ized episode's tracks (arrays, dicts of arrays) are copied
    straight from the bytes, without the generic decoder and from_state(),
    into what RLlib's from_state() gives."""
    from difftools import compare_episodes

    RLlibEpisode = rllib_episode_class()
    numpy_ep = _cartpole_like()[0]
    numpy_ep.to_numpy()
    blobs = [F.pack_episode(e) for e in (numpy_ep, _numpy_dict_episode())]
    expected = [RLlibEpisode.from_state(rllib_unpack(b)) for b in blobs]
    monkeypatch.setattr(SingleAgentEpisode, "from_state",
                        staticmethod(lambda state: pytest.fail("from_state() called")))
    for got, want, blob in zip(F.unpack_episodes(blobs), expected, blobs):
        compare_episodes(got, want)
        assert got.is_numpy and got.observations.finalized and not got.infos.finalized
        assert F.pack_episode(got) == blob
    # Its arrays are its own (RLlib's are read-only views of the bytes).
    got.set_observations(new_data={"a": np.ones(2, F32), "n": {"b": np.int64(2)}}, at_indices=0)
    assert got.get_observations(0)["n"]["b"] == 2


def cells():
    return [F.pack_value(np.arange(4, dtype=F32)), F.pack_value(np.zeros((2, 2), np.uint8))]


def pickles():
    """Pickles (protocols 2, 4, 5) of what the restricted unpickler reads."""
    objects = [np.arange(4, dtype=F32), np.arange(6.0).reshape(2, 3).T, np.zeros((), np.bool_),
               np.array([1, "a", {"k": np.arange(2)}], dtype=object), np.float32(2.5),
               np.dtype("<U3"), [np.int64(3), {"a": np.zeros(2, ">i4")}]]
    return [pickle.dumps(obj, protocol=proto) for obj in objects for proto in (2, 4, 5)]


def packed_raw(raw):
    import lz4.frame

    return base64.b64encode(lz4.frame.compress(raw)).decode()


def test_corrupt_bytes_never_crash():
    proc = subprocess.run([sys.executable, "-c", CHILD.format(here=HERE, flips=150)],
                          capture_output=True, text=True, timeout=900, env=child_env(),
                          check=False, preexec_fn=limit_child, cwd=HERE)
    assert proc.returncode == 0, f"the child crashed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("OUTCOMES ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    outcomes = json.loads(lines[-1][len("OUTCOMES "):])
    unexpected = {k: v for k, v in outcomes.items() if any(x.startswith("unexpected") for x in v)}
    assert not unexpected, (unexpected, proc.stdout[-3000:])
    # Every truncated blob is refused (a prefix of a map is never a whole state).
    assert set(outcomes["truncated"]) == {"ValueError"}
    assert "ValueError" in outcomes["flipped"] and "ValueError" in outcomes["headers"]
    assert "ValueError" in outcomes["cell_truncated"]
    assert "ValueError" in outcomes["pickle_flipped"] and "ValueError" in outcomes["pickle_cell"]


# -- files recorded by RLlib, and ours read by RLlib ------------------------------------------------

RECORD = textwrap.dedent("""
    import logging, sys
    import gymnasium as gym
    import numpy as np
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.offline.offline_env_runner import OfflineSingleAgentEnvRunner

    class DictActions(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
        action_space = gym.spaces.Dict({"move": gym.spaces.Discrete(3),
                                        "force": gym.spaces.Box(-1, 1, (2,), np.float32)})
        def __init__(self, config=None):
            self.t = 0
        def reset(self, *, seed=None, options=None):
            self.t = 0
            return np.zeros(3, np.float32), {"start": 1}
        def step(self, action):
            self.t += 1
            return (np.full(3, self.t / 10, np.float32), float(action["move"]), self.t >= 7, False,
                    {"t": self.t})

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR)
    out = sys.argv[1]
    for env, name in (("CartPole-v1", "cartpole"), (DictActions, "dict")):
        for episodes in (True, False):
            config = (PPOConfig().environment(env)
                      .env_runners(num_env_runners=0, batch_mode="complete_episodes")
                      .offline_data(output=f"{out}/{name}-{'episodes' if episodes else 'rows'}",
                                    output_write_episodes=episodes))
            runner = OfflineSingleAgentEnvRunner(config=config)
            runner.sample(num_timesteps=60, random_actions=True)
            runner.stop()
    ray.shutdown()
""")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    pytest.importorskip("ray.rllib")
    _msgpack_numpy()
    out = tmp_path_factory.mktemp("recorded")
    proc = subprocess.run([sys.executable, "-c", RECORD, str(out)], capture_output=True,
                          text=True, timeout=600, check=False, cwd=HERE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _read(recorded, name):
    import pyarrow.parquet as pq

    files = sorted(glob.glob(f"{recorded}/{name}/*/*/*.parquet"))
    assert files, f"no files under {recorded}/{name}"
    return pa.concat_tables([pq.read_table(f) for f in files])


@pytest.mark.rllib
@pytest.mark.parametrize("env", ["cartpole", "dict"])
def test_recorded_episodes_read_as_rllib_reads_them(recorded, env):
    from difftools import compare_episodes

    RLlibEpisode = rllib_episode_class()
    table = _read(recorded, f"{env}-episodes")
    assert F.detect_format(table.schema) == "rllib_episodes"
    column = table.column("item")
    ours = F.unpack_episodes(column)
    theirs = [RLlibEpisode.from_state(rllib_unpack(b)) for b in column.to_pylist()]
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs):
        compare_episodes(a, b)
    for blob in column.to_pylist():
        assert F.pack_episode(F.unpack_episode(blob)) == blob
    if env == "dict":
        action = ours[0].get_actions(0)
        assert type(action) is dict and set(action) == {"move", "force"}


@pytest.mark.rllib
@pytest.mark.parametrize("env", ["cartpole", "dict"])
def test_recorded_rows_read_as_rllib_reads_them(recorded, env):
    from difftools import compare_episodes

    table = _read(recorded, f"{env}-rows")
    assert F.detect_format(table.schema) == "rllib_rows"
    batch = F.to_numpy_batch(table)
    compress = ("obs", "new_obs")
    expected = _rllib_map_to_episodes(batch, compress)
    got = F.rows_to_episodes(table, compress_columns=compress, whole_episodes=False)
    assert len(got) == len(expected) == table.num_rows
    for a, b in zip(got, expected):
        compare_episodes(a, b)
    # Whole episodes: RLlib's recorded episodes again (the last one cut where
    # the sample ended), step for step the one-step episodes in row order.
    whole = F.rows_to_episodes(table, compress_columns=compress)
    assert sum(len(e) for e in whole) == table.num_rows
    assert len(whole) == len(set(batch["eps_id"]))
    k = 0
    for ep in whole:
        for i in range(len(ep)):
            row = expected[k]
            assert row.id_ == ep.id_
            compare_values(ep.get_observations(i), row.get_observations(0))
            compare_values(ep.get_observations(i + 1), row.get_observations(1))
            compare_values(ep.get_actions(i), row.get_actions(0))
            compare_values(ep.get_rewards(i), row.get_rewards(0))
            k += 1
        assert ep.is_terminated == expected[k - 1].is_terminated
        assert ep.is_truncated == expected[k - 1].is_truncated


@pytest.mark.rllib
def test_rllib_reads_our_files_through_ray_data(tmp_path):
    """Our episodes written in both formats, read by Ray Data and mapped by
    RLlib's OfflinePreLearner code paths, give RLlib's episodes."""
    import pyarrow.parquet as pq

    from difftools import compare_episodes

    RLlibEpisode = rllib_episode_class()
    episodes = _cartpole_like()
    pq.write_table(pa.table({"item": pa.array(F.pack_episodes(episodes), pa.binary())}),
                   tmp_path / "episodes.parquet")
    pq.write_table(F.episode_rows(episodes), tmp_path / "rows.parquet")
    code = textwrap.dedent(f"""
        import logging, pickle
        import msgpack, msgpack_numpy as mnp, ray
        from types import SimpleNamespace
        from ray.rllib.algorithms.bc import BCConfig
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode
        from ray.rllib.offline.offline_prelearner import OfflinePreLearner
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR)
        ep_batch = ray.data.read_parquet({str(tmp_path / 'episodes.parquet')!r}).take_batch(100)
        episodes = [SingleAgentEpisode.from_state(msgpack.unpackb(s, object_hook=mnp.decode))
                    for s in ep_batch["item"]]
        row_batch = ray.data.read_parquet({str(tmp_path / 'rows.parquet')!r}).take_batch(100)
        config = BCConfig().offline_data(input_compress_columns=["obs", "new_obs"])
        rows = OfflinePreLearner._map_to_episodes(SimpleNamespace(config=config), row_batch)
        states = [e.get_state() for e in episodes], [e.get_state() for e in rows["episodes"]]
        # (A file, not stdout: Ray Data's progress output may reach stdout.)
        with open({str(tmp_path / 'states.pickle')!r}, "wb") as f:
            pickle.dump(states, f)
        ray.shutdown()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=600,
                          check=False, cwd=HERE)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    episode_states, row_states = pickle.loads((tmp_path / "states.pickle").read_bytes())
    for state, ours in zip(episode_states, episodes):
        compare_episodes(SingleAgentEpisode.from_state(ours.get_state()),
                         RLlibEpisode.from_state(state))
    assert len(row_states) == sum(len(e) for e in episodes)
    mine = F.rows_to_episodes(F.episode_rows(episodes), compress_columns=("obs",),
                              whole_episodes=False)
    for state, ours in zip(row_states, mine):
        theirs = RLlibEpisode.from_state(state)
        # (Our infos are in the file's metadata: RLlib meets none.)
        assert theirs.get_infos(1) == {} and "infos" not in theirs.extra_model_outputs
        theirs.infos.data[1] = ours.get_infos(1)
        compare_episodes(ours, theirs)


# -- imports ------------------------------------------------------------------------------------

def _child(code, *blocked):
    script = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in blocked) \
        + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=HERE, check=False)


def test_importing_the_module_imports_neither_pyarrow_nor_lz4():
    result = _child("""
        import episode.offline.rllib_format as F
        from episode import SingleAgentEpisode
        ep = SingleAgentEpisode(observations=[0, 1], actions=[0], rewards=[1.0],
                                len_lookback_buffer=0)
        assert F.unpack_episode(F.pack_episode(ep)).get_observations() == [0, 1]
        print(sorted(m for m in ("pyarrow", "lz4", "msgpack", "msgpack_numpy", "ray")
                     if m in sys.modules))
    """)
    assert result.returncode == 0, result.stderr
    # (msgpack, a dependency, packs the episode: the format's own library.)
    assert result.stdout.strip() == "['msgpack']"


def test_without_lz4_packed_columns_say_what_to_install():
    result = _child("""
        import numpy as np
        from episode.offline import rllib_format as F
        F.unpack_value("AAAA")
    """, "lz4")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("ImportError: ")
    assert "pip install lz4" in result.stderr


def test_rows_written_without_ray_are_ray_tensor_columns(tmp_path):
    """Without Ray, tensor columns get a stand-in of Ray Data's type: the
    file records Ray's type name and shape, and our reader (and Ray's, in
    test_rllib_reads_our_files_through_ray_data) reads them as tensors."""
    result = _child(f"""
        import numpy as np, pyarrow as pa, pyarrow.parquet as pq
        sys.path.insert(0, {HERE!r})
        import test_offline_rllib_format as T
        from episode.offline import rllib_format as F
        table = F.episode_rows(T._cartpole_like(), compress_columns=())
        pq.write_table(table, {str(tmp_path / "rows.parquet")!r})
        print(table.schema.field("obs").type.extension_name)
    """, "ray")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ray.data.arrow_tensor_v2"
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "rows.parquet")
    whole = F.rows_to_episodes(table)
    assert [len(e) for e in whole] == [4, 1, 6]
    np.testing.assert_array_equal(np.stack(whole[2].get_observations()),
                                  np.stack(_cartpole_like()[2].get_observations()))


# A float32 array's pickle (protocol 5, as RLlib packs observations) with one
# byte of its dtype state changed (a NONE became BININT2): numpy's
# dtype.__setstate__ trusts the state, and on numpy 2.4 pickle.loads of it
# kills the interpreter (SIGSEGV).
CORRUPT_DTYPE_STATE = bytes.fromhex(
    "80059584000000000000008c136e756d70792e5f636f72652e6e756d65726963948c0b5f66726f6d62756666"
    "657294939428961000000000000000000000000000803f0000004000004040948c056e756d7079948c056474"
    "7970659493948c02663494898887945294284b038c013c944d4e4e4affffffff4affffffff4b007494624b04"
    "85948c014394749452942e")


@pytest.mark.rllib
def test_a_corrupt_dtype_state_kills_rllibs_reader_not_ours():
    """Pinned: RLlib unpacks a packed cell with cloudpickle.loads, which hands
    numpy's dtype.__setstate__ whatever state the bytes hold; a one-byte
    corruption crashes the process. Ours checks the state first."""
    pytest.importorskip("ray.rllib")
    cell = packed_raw(CORRUPT_DTYPE_STATE)
    code = f"from ray.rllib.utils.compression import unpack\nunpack({cell!r})\nprint('returned')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False, preexec_fn=limit_child, cwd=HERE)
    assert proc.returncode != 0 and "returned" not in proc.stdout
    with pytest.raises(ValueError, match="dtype state"):
        F.unpack_value(cell)
    with pytest.raises(ValueError, match="dtype state"):
        F.safe_loads(CORRUPT_DTYPE_STATE)
    batch = F.to_numpy_batch(F.episode_rows(_cartpole_like()))
    batch["obs"] = batch["obs"].copy()
    batch["obs"][3] = cell
    with pytest.raises(ValueError, match="row 3"):
        F.rows_to_episodes(batch, compress_columns=("obs",))


def test_bulk_reads_leave_the_collector_as_they_found_it():
    import gc

    blobs = F.pack_episodes(_cartpole_like())
    table = F.episode_rows(_cartpole_like())
    assert gc.isenabled()
    assert len(F.unpack_episodes(blobs)) == 3 and gc.isenabled()
    assert len(F.rows_to_episodes(table, compress_columns=("obs",))) == 3 and gc.isenabled()
    with pytest.raises(ValueError):
        F.unpack_episodes([blobs[0][:5]])
    assert gc.isenabled()
    gc.disable()
    try:
        F.unpack_episodes(blobs)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_packed_columns_unpack_whole_or_cell_by_cell():
    """A packed column of arrays of one dtype and shape comes back as one
    array (the cells' pickles compared as one byte table); anything else
    cell by cell, each value what RLlib's unpack gives."""
    rng = np.random.default_rng(0)
    rows = rng.random((5, 2, 3)).astype(np.float32)
    column = np.array([F.pack_value(r) for r in rows], dtype=object)
    out = F._unpack_column(column, "obs")
    assert type(out) is np.ndarray and out.dtype == np.float32 and out.shape == (5, 2, 3)
    assert out.tobytes() == rows.tobytes() and out.flags.writeable and out.flags.c_contiguous
    # Fortran-ordered arrays: their pickles hold the bytes in another order.
    fortran = [np.asfortranarray(r) for r in rows]
    out = F._unpack_column([F.pack_value(r) for r in fortran], "obs")
    assert np.array_equal(np.asarray(out), rows)
    # One cell of another dtype or shape: a list of each cell's array.
    for odd in (rows[0].astype(np.float64), rows[0][:1]):
        cells = [F.pack_value(r) for r in rows[:2]] + [F.pack_value(odd)]
        out = F._unpack_column(cells, "obs")
        assert type(out) is list and out[2].dtype == odd.dtype and out[2].shape == odd.shape
        assert np.array_equal(out[0], rows[0]) and np.array_equal(out[2], odd)
    # Damage in one cell names it, with the error class RLlib's readers see.
    cells = [F.pack_value(r) for r in rows]
    cells[3] = cells[3][:-8]
    with pytest.raises(ValueError, match="row 3"):
        F._unpack_column(cells, "obs")


def test_msgpack_extension_values_are_refused_on_read():
    msgpack = pytest.importorskip("msgpack")
    blob = msgpack.packb({"info": msgpack.ExtType(3, b"x")})
    with pytest.raises(ValueError, match="extension value"):
        F.unpackb(blob)
