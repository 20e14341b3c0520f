"""The deliberate differences from RLlib 2.60's SingleAgentEpisode.

Where RLlib crashes or silently corrupts data, ours gives the sensible answer.
Each difference has a test pinning our behaviour (expected values derived in
the test or taken from RLlib on an equivalent input it handles, never copied
from our output) and, marked `rllib`, a test showing that RLlib really
behaves otherwise (so a future RLlib fix shows up here). These cases are
excluded from the differential tests. The buffer's own differences
(test_lookback_buffer_differences.py) apply to episodes too; a few are pinned
here at the episode level.

Also here: behaviours that are the SAME as RLlib's but easy to get wrong
(extra_model_outputs after from_state, memory shared by slices and cuts).
"""
from __future__ import annotations

import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest

from difftools import compare, episode_state, rllib_buffer_class, rllib_episode_class
from episode import InfiniteLookbackBuffer, SingleAgentEpisode

BOX4 = gym.spaces.Box(-10.0, 10.0, (4,), np.float32)
DISCRETE = gym.spaces.Discrete(3)
DICT = gym.spaces.Dict({"a": gym.spaces.Box(-10.0, 10.0, (2,), np.float32),
                        "b": gym.spaces.Discrete(3)})
TUPLE = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(-10.0, 10.0, (2,), np.float32)))


def box(i):
    return np.full(4, i, np.float32)


def dict_obs(i):
    return {"a": np.full(2, i, np.float32), "b": np.int64(i % 3)}


def tuple_obs(i):
    return (np.int64(i % 2), np.full(2, i, np.float32))


OBS = {"box": (BOX4, box), "dict": (DICT, dict_obs), "tuple": (TUPLE, tuple_obs)}


def run(cls, obs, steps, start=0, space=None, reset=True, episode=None, extras=True):
    ep = episode if episode is not None else cls(id_="ep", observation_space=space,
                                                  action_space=DISCRETE)
    if reset:
        ep.add_env_reset(obs(start), infos={"reset": start})
    for i in range(start + 1, start + steps + 1):
        ep.add_env_step(obs(i), i % 3, float(i), infos={"i": i} if i % 2 else None,
                        extra_model_outputs={"logp": np.float32(-i)} if extras else None)
    return ep


def leaves(x):
    """x as plain Python values (arrays -> lists, numpy scalars -> Python)."""
    if isinstance(x, dict):
        return {k: leaves(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [leaves(v) for v in x]
    if isinstance(x, (np.ndarray, np.generic)):
        return x.tolist()
    return x


def timeline(ep):
    """Every step of an episode, item by item (lookback included), as plain values."""
    lb_obs = ep.observations.lookback
    lb = ep.actions.lookback
    return {
        "obs": [leaves(ep.get_observations(i, neg_index_as_lookback=True))
                for i in range(-lb_obs, len(ep) + 1)],
        "actions": [leaves(ep.get_actions(i, neg_index_as_lookback=True))
                    for i in range(-lb, len(ep))],
        "rewards": [leaves(ep.get_rewards(i, neg_index_as_lookback=True))
                    for i in range(-lb, len(ep))],
        "infos": [ep.get_infos(i, neg_index_as_lookback=True)
                  for i in range(-ep.infos.lookback, len(ep) + 1)],
        "extras": {k: [leaves(ep.get_extra_model_outputs(k, i, neg_index_as_lookback=True))
                       for i in range(-v.lookback, len(ep))]
                   for k, v in ep.extra_model_outputs.items()},
        "len": len(ep), "t": ep.t, "t_started": ep.t_started,
    }


# -- the space check of add_env_step on numpy'ized episodes ----------------------------


@pytest.mark.parametrize("bad", ["observation", "action"])
def test_step_outside_space_raises_before_appending(bad):
    ep = run(SingleAgentEpisode, box, 3, space=BOX4)
    ep.to_numpy()
    before = episode_state(ep)
    obs = np.full(4, 99.0, np.float32) if bad == "observation" else box(4)
    action = 7 if bad == "action" else 1
    with pytest.raises(AssertionError):
        ep.add_env_step(obs, action, 1.0, extra_model_outputs={"logp": np.float32(0)})
    compare(episode_state(ep), before, "episode after the refused step")
    ep.add_env_step(box(4), 1, 1.0, extra_model_outputs={"logp": np.float32(0)})  # goes on
    assert len(ep) == 4 and ep.get_observations(-1).tolist() == [4.0] * 4


def test_step_outside_space_is_checked_at_every_t():
    """RLlib skips the check whenever t % 100 == 0; ours checks every step."""
    ep = run(SingleAgentEpisode, box, 99, space=BOX4, extras=False)
    ep.to_numpy()
    assert ep.t == 99
    with pytest.raises(AssertionError):  # it would be t == 100
        ep.add_env_step(np.full(4, 99.0, np.float32), 0, 1.0)
    assert ep.t == 99 and len(ep.get_observations()) == 100


def test_list_mode_does_not_check_spaces():
    """As RLlib: no space check before to_numpy()."""
    ep = run(SingleAgentEpisode, box, 2, space=BOX4)
    ep.add_env_step(np.full(4, 99.0, np.float32), 7, 1.0,
                    extra_model_outputs={"logp": np.float32(0)})
    assert ep.get_actions(-1) == 7 and len(ep) == 3


@pytest.mark.rllib
def test_rllib_step_outside_space_appends_then_asserts():
    ep = run(rllib_episode_class(), box, 3, space=BOX4)
    ep.to_numpy()
    with pytest.raises(AssertionError):
        ep.add_env_step(np.full(4, 99.0, np.float32), 1, 1.0,
                        extra_model_outputs={"logp": np.float32(0)})
    assert len(ep) == 4 and ep.get_observations(-1).tolist() == [99.0] * 4
    ep = run(rllib_episode_class(), box, 99, space=BOX4, extras=False)
    ep.to_numpy()
    ep.add_env_step(np.full(4, 99.0, np.float32), 0, 1.0)  # t == 100: not checked
    assert ep.t == 100


# -- concat_episode of Dict/Tuple observations, or into a numpy'ized episode -------------


def cut_and_continue(cls, obs, space, self_numpy, other_numpy, other_steps=3, lookback=0):
    ep = run(cls, obs, 3, space=space)
    chunk = ep.cut(len_lookback_buffer=lookback)
    run(cls, obs, other_steps, start=3, reset=False, episode=chunk)
    if self_numpy:
        ep.to_numpy()
    if other_numpy:
        chunk.to_numpy()
    return ep, chunk


CONCAT_CASES = [
    ("dict", False, True), ("dict", True, False), ("dict", True, True),
    ("tuple", False, True), ("tuple", True, False), ("tuple", True, True),
    ("box", True, False), ("box", True, True),
]


@pytest.mark.parametrize("kind, self_numpy, other_numpy", CONCAT_CASES)
@pytest.mark.parametrize("other_steps", [0, 3])
def test_concat_struct_or_into_numpy(kind, self_numpy, other_numpy, other_steps):
    """The result is the episode that was never cut (its steps item by item),
    numpy'ized if `self` was."""
    space, obs = OBS[kind]
    ep, chunk = cut_and_continue(SingleAgentEpisode, obs, space, self_numpy, other_numpy,
                                 other_steps)
    chunk.custom_data["c"] = 1
    ep.concat_episode(chunk)
    whole = run(SingleAgentEpisode, obs, 3 + other_steps, space=space)
    assert ep.is_numpy is self_numpy
    assert timeline(ep) == timeline(whole)
    ep.validate()
    assert ep.custom_data == {"c": 1}
    if self_numpy:  # with the dtypes the never-cut episode gets from to_numpy()
        whole_np = copy.deepcopy(whole).to_numpy()
        for getter in ("get_observations", "get_actions", "get_rewards"):
            for mine, ref in zip(flat_arrays(getattr(ep, getter)()),
                                 flat_arrays(getattr(whole_np, getter)())):
                assert mine.dtype == ref.dtype and mine.shape == ref.shape, getter
        mine, ref = ep.get_extra_model_outputs("logp"), whole_np.get_extra_model_outputs("logp")
        assert mine.dtype == ref.dtype == np.float32
    # It goes on like the never-cut episode.
    run(SingleAgentEpisode, obs, 1, start=8, reset=False, episode=ep)
    run(SingleAgentEpisode, obs, 1, start=8, reset=False, episode=whole)
    assert timeline(ep) == timeline(whole)


@pytest.mark.rllib
@pytest.mark.parametrize("kind, self_numpy, other_numpy",
                         [c for c in CONCAT_CASES if c[0] != "box" and c[1] != c[2]])
def test_rllib_concat_struct_crashes(kind, self_numpy, other_numpy):
    # (Both numpy'ized, RLlib gets through: compared in the differential tests.)
    space, obs = OBS[kind]
    ep, chunk = cut_and_continue(rllib_episode_class(), obs, space, self_numpy, other_numpy)
    with pytest.raises((AssertionError, ValueError)):
        ep.concat_episode(chunk)


def flat_arrays(x):
    if isinstance(x, dict):
        return [a for v in x.values() for a in flat_arrays(v)]
    if isinstance(x, tuple):
        return [a for v in x for a in flat_arrays(v)]
    return [x]


@pytest.mark.rllib
def test_rllib_concat_empty_chunk_into_numpy_episode_corrupts_or_crashes():
    ep, chunk = cut_and_continue(rllib_episode_class(), box, BOX4, True, False, other_steps=0)
    ep.concat_episode(chunk)  # extend([]) of the int actions: float64 now
    assert ep.get_actions().dtype == np.float64
    assert ep.get_extra_model_outputs("logp").dtype == np.float64  # was float32
    ep = rllib_episode_class()(id_="b", observations=[box(i) for i in range(3)],
                               actions=[box(i) for i in range(2)], rewards=[0.0, 1.0],
                               len_lookback_buffer=0)
    chunk = ep.cut()
    ep.to_numpy()
    with pytest.raises(ValueError):  # extend([]) of (n, 4) action rows
        ep.concat_episode(chunk)


def test_concat_empty_chunk_with_box_actions_into_numpy_episode():
    ep = SingleAgentEpisode(id_="b", observations=[box(i) for i in range(3)],
                            actions=[box(i) for i in range(2)], rewards=[0.0, 1.0],
                            len_lookback_buffer=0)
    chunk = ep.cut()
    ep.to_numpy()
    ep.concat_episode(chunk)
    assert ep.get_actions().shape == (2, 4) and ep.get_actions().dtype == np.float32
    assert ep.get_observations().shape == (3, 4) and len(ep) == 2


def dict_action_episode(cls, numpy_chunk):
    """Box observations, Dict actions; cut, 2 more steps, the chunk numpy'ized."""
    ep = cls(id_="a", observation_space=BOX4, action_space=DICT)
    ep.add_env_reset(box(0))
    for i in range(1, 3):
        ep.add_env_step(box(i), dict_obs(i), float(i))
    chunk = ep.cut()
    for i in range(3, 5):
        chunk.add_env_step(box(i), dict_obs(i), float(i))
    if numpy_chunk:
        chunk.to_numpy()
    return ep, chunk


def test_concat_numpy_chunk_with_dict_actions():
    ep, chunk = dict_action_episode(SingleAgentEpisode, True)
    ep.concat_episode(chunk)
    whole, _ = dict_action_episode(SingleAgentEpisode, False)
    whole.add_env_step(box(3), dict_obs(3), 3.0)
    whole.add_env_step(box(4), dict_obs(4), 4.0)
    assert timeline(ep) == timeline(whole) and len(ep) == 4


@pytest.mark.rllib
def test_rllib_concat_numpy_chunk_with_dict_actions_corrupts():
    ep, chunk = dict_action_episode(rllib_episode_class(), True)
    ep.concat_episode(chunk)  # list.extend() of the chunk's dict of arrays: its keys
    assert ep.actions.data[-2:] == ["a", "b"]  # (2 keys for 2 steps: validate() passes)


# -- cut() of a numpy'ized episode whose infos slice is empty ------------------------------


def empty_infos_episode(cls, buf_cls):
    """Observations, actions and rewards all in the lookback, no infos at all
    (len 0 everywhere, which validates); then numpy'ized."""
    ep = cls(id_="e", observations=buf_cls([0.0, 1.0, 2.0], 3), infos=buf_cls([]),
             actions=buf_cls([0, 1], 2), rewards=buf_cls([1.0, 2.0], 2))
    return ep


def test_cut_numpy_episode_with_empty_infos_slice():
    ep = empty_infos_episode(SingleAgentEpisode, InfiniteLookbackBuffer)
    ep.to_numpy()
    try:
        chunk = ep.cut(len_lookback_buffer=1)
    except Exception as e:  # noqa: BLE001 - reported without a traceback (see difftools)
        pytest.fail(f"cut() raised {type(e).__name__}: {e}", pytrace=False)
    # As RLlib's cut of the same episode before to_numpy() (which works, below):
    # the last 2 observations, a lookback of 1 (one reward), empty infos.
    assert len(chunk) == 0 and chunk.t_started == chunk.t == 0
    assert leaves(chunk.get_observations(slice(-2, None), neg_index_as_lookback=True)) == \
        [1.0, 2.0]
    assert leaves(chunk.get_rewards(-1, neg_index_as_lookback=True)) == 2.0
    assert chunk.get_infos(0) == {}
    chunk.validate()


@pytest.mark.rllib
def test_rllib_cut_numpy_episode_with_empty_infos_slice_crashes():
    ep = empty_infos_episode(rllib_episode_class(), rllib_buffer_class())
    chunk = copy.deepcopy(ep).cut(len_lookback_buffer=1)  # list mode: works
    assert chunk.get_observations(slice(-2, None), neg_index_as_lookback=True) == [1.0, 2.0]
    assert chunk.get_rewards(-1, neg_index_as_lookback=True) == 2.0
    assert chunk.get_infos(0) == {}
    ep.to_numpy()
    with pytest.raises(ValueError):  # "truth value of an array ... is ambiguous"
        ep.cut(len_lookback_buffer=1)


@pytest.mark.parametrize("n_obs", [1, 4])
def test_constructor_numpy_observations_without_infos(n_obs):
    """The same root cause: one empty info per observation, as for lists."""
    ep = SingleAgentEpisode(id_="n", observations=np.arange(n_obs, dtype=np.float32),
                            actions=np.arange(n_obs - 1), rewards=np.ones(n_obs - 1),
                            len_lookback_buffer=1)
    expected = rllib_free_reference(n_obs)
    assert ep.get_infos(slice(-1, None), neg_index_as_lookback=True) == \
        expected.get_infos(slice(-1, None), neg_index_as_lookback=True)
    assert ep.get_infos() == expected.get_infos()
    assert len(ep.infos) == len(ep.observations) and ep.observations.finalized
    ep.validate()


def rllib_free_reference(n_obs):
    """The same episode from lists (the way that works in RLlib too)."""
    return SingleAgentEpisode(id_="n", observations=[float(i) for i in range(n_obs)],
                              actions=list(range(n_obs - 1)), rewards=[1.0] * (n_obs - 1),
                              len_lookback_buffer=1)


@pytest.mark.rllib
def test_rllib_constructor_numpy_observations_without_infos_crashes():
    Rllib = rllib_episode_class()
    with pytest.raises(ValueError):
        Rllib(id_="n", observations=np.arange(4, dtype=np.float32), actions=np.arange(3),
              rewards=np.ones(3), len_lookback_buffer=1)
    # The list form works there.
    assert Rllib(id_="n", observations=[0.0, 1.0, 2.0, 3.0], actions=[0, 1, 2],
                 rewards=[1.0] * 3, len_lookback_buffer=1).get_infos() == [{}, {}, {}]


# -- fill without a space on multi-dimensional or Dict/Tuple numpy'ized data ----------------


def test_fill_without_space_gives_rows_of_the_row_shape():
    ep = SingleAgentEpisode(id_="f", observations=[box(i) for i in range(5)],
                            actions=[0, 1, 2, 0], rewards=[0.0] * 4, len_lookback_buffer=1,
                            extra_model_outputs={"s": [np.full(2, i, np.float32)
                                                       for i in range(4)]})
    ep.to_numpy()
    # Observations 0..4, lookback 1: ts -1 is row 0. Two fill rows, then rows 0, 1.
    got = ep.get_observations(slice(-3, 1), neg_index_as_lookback=True, fill=-1.0)
    assert got.shape == (4, 4) and got.tolist() == [[-1.0] * 4] * 2 + [[0.0] * 4, [1.0] * 4]
    got = ep.get_extra_model_outputs("s", slice(2, 6), fill=0.0)
    assert got.shape == (4, 2) and got.tolist() == [[3.0, 3.0], [0.0, 0.0], [0.0, 0.0],
                                                    [0.0, 0.0]]
    dict_ep = SingleAgentEpisode(id_="d", observations=[dict_obs(i) for i in range(3)],
                                 actions=[0, 1], rewards=[0.0, 0.0], len_lookback_buffer=0)
    dict_ep.to_numpy()
    got = dict_ep.get_observations(slice(1, 5), fill=0)
    assert got["a"].tolist() == [[1.0, 1.0], [2.0, 2.0], [0.0, 0.0], [0.0, 0.0]]
    assert got["b"].tolist() == [1, 2, 0, 0]


@pytest.mark.rllib
def test_rllib_fill_without_space_crashes_or_misshapes():
    ep = rllib_episode_class()(id_="f", observations=[box(i) for i in range(5)],
                               actions=[0, 1, 2, 0], rewards=[0.0] * 4, len_lookback_buffer=1)
    ep.to_numpy()
    try:
        got = ep.get_observations(slice(-3, 1), neg_index_as_lookback=True, fill=-1.0)
    except ValueError:
        return
    assert got.shape != (4, 4)


# -- infos: empty infos are stored compactly ------------------------------------------------


def infos_history(history):
    """An episode whose infos are: all empty ("empty"), or a non-empty reset
    info then None / {"i": 1} / {} / None ("mixed")."""
    ep = SingleAgentEpisode(id_="i")
    if history == "empty":
        ep.add_env_reset(box(0))
        for i, info in enumerate([None, {}, None, {}], 1):
            ep.add_env_step(box(i), 0, 1.0, infos=info)
    else:
        ep.add_env_reset(box(0), infos={"reset": 0})
        for i, info in enumerate([None, {"i": 2}, {}, None], 1):
            ep.add_env_step(box(i), 0, 1.0, infos=info)
    return ep


@pytest.mark.parametrize("mode", ["list", "numpy"])
def test_empty_infos_are_fresh_dicts_while_all_infos_are_empty(mode):
    """Only empty infos so far: ours keeps just their count, so each read is a
    fresh {} (in RLlib, the stored dict: writing into it changes the episode)."""
    ep = infos_history("empty")
    if mode == "numpy":
        ep.to_numpy()
    for idx in (1, 3, 4):  # None, {}, None
        empty = ep.get_infos(idx)
        assert empty == {} and type(empty) is dict
        assert ep.get_infos(idx) is not empty, f"get_infos({idx}) twice: the same dict"
        empty["written"] = True
        assert ep.get_infos(idx) == {}, f"get_infos({idx}) after writing into it"
    assert ep.get_infos([1, 3]) == [{}, {}]
    assert ep.get_infos(slice(3, None)) == [{}, {}]


@pytest.mark.parametrize("mode", ["list", "numpy"])
def test_infos_are_the_stored_dicts_once_any_info_is_not_empty(mode):
    """With a non-empty info in the episode, infos live in a list as RLlib's:
    every read, empty or not, is the stored dict (this one is not a difference)."""
    ep = infos_history("mixed")
    if mode == "numpy":
        ep.to_numpy()
    for idx in (1, 2, 3):  # None -> {}, {"i": 2}, {}
        info = ep.get_infos(idx)
        assert ep.get_infos(idx) is info
        info["written"] = idx
        assert ep.get_infos(idx)["written"] == idx


@pytest.mark.rllib
def test_rllib_empty_infos_are_the_stored_dicts():
    ep = run(rllib_episode_class(), box, 4)
    empty = ep.get_infos(2)
    empty["written"] = True
    assert ep.get_infos(2) == {"written": True}


@pytest.mark.parametrize("mode", ["list", "numpy"])
def test_state_of_all_empty_infos_is_one_shared_dict(mode):
    """While all infos are empty, the infos data of get_state() lists one empty
    dict once per step (it pickles as references to that dict, not as one dict
    per step); it is a new list, not the episode's. from_state() of it gives
    distinct dicts again."""
    ep = infos_history("empty")
    if mode == "numpy":
        ep.to_numpy()
    state = ep.get_state()
    data = state["infos"]["data"]
    assert type(data) is list and data == [{}] * 5
    assert all(info is data[0] for info in data)
    data[0]["written"] = True               # shows in every entry of the state ...
    assert data[4] == {"written": True}
    assert ep.get_infos() == [{}] * 5       # ... not in the episode
    data[0].clear()
    for restored in (SingleAgentEpisode.from_state(state),
                     SingleAgentEpisode.from_state(pickle.loads(pickle.dumps(state, 5)))):
        infos = restored.get_infos()
        assert infos == [{}] * 5 and len({id(info) for info in infos}) == 5
    assert ep.get_state()["infos"]["data"][0] is not data[0]   # one dict per call


@pytest.mark.rllib
@pytest.mark.parametrize("mode", ["list", "numpy"])
def test_rllib_state_of_all_empty_infos_is_its_own_list(mode):
    ep = rllib_episode_class()(id_="i")
    ep.add_env_reset(box(0))
    for i, info in enumerate([None, {}, None, {}], 1):
        ep.add_env_step(box(i), 0, 1.0, infos=info)
    if mode == "numpy":
        ep.to_numpy()
    data = ep.get_state()["infos"]["data"]
    assert data == [{}] * 5 and len({id(info) for info in data}) == 5
    assert data is ep.infos.data
    data[0]["written"] = True
    assert ep.get_infos(0) == {"written": True} and data[4] == {}


# -- copies on append ---------------------------------------------------------------------


def test_appended_arrays_are_copied():
    ep = SingleAgentEpisode(id_="c")
    obs, action = np.zeros(4, np.float32), np.zeros(2)
    ep.add_env_reset(obs)
    obs += 1
    ep.add_env_step(obs, action, 1.0)
    obs += 1
    action += 5
    assert ep.get_observations(0).tolist() == [0.0] * 4
    assert ep.get_observations(1).tolist() == [1.0] * 4
    assert ep.get_actions(0).tolist() == [0.0, 0.0]


@pytest.mark.rllib
def test_rllib_keeps_the_callers_arrays():
    ep = rllib_episode_class()(id_="c")
    obs = np.zeros(4, np.float32)
    ep.add_env_reset(obs)
    obs += 1
    assert ep.get_observations(0) is obs


# -- buffer differences at the episode level ------------------------------------------------


@pytest.mark.parametrize("space", [None, BOX4], ids=["no-space", "box-space"])
def test_to_numpy_of_an_empty_episode(space):
    """RLlib raises; ours converts nothing, and the episode stays usable for
    the observations it was made for (an empty episode has no row shape to
    hold on to, unless its space gives one)."""
    ep = SingleAgentEpisode(id_="e", observation_space=space)
    assert ep.to_numpy() is ep
    assert ep.is_numpy is False  # no steps: the rewards stay a list (as RLlib's rule)
    assert len(ep) == 0 and not ep.is_reset
    ep.add_env_reset(box(0))
    ep.add_env_step(box(1), 1, 1.0)
    assert leaves(ep.get_observations(-1)) == [1.0] * 4 and len(ep) == 1


@pytest.mark.rllib
def test_rllib_to_numpy_of_an_empty_episode_raises():
    with pytest.raises(ValueError):
        rllib_episode_class()(id_="e").to_numpy()


@pytest.mark.parametrize("kind", ["dict", "tuple"])
def test_cut_of_numpy_struct_episode_keeps_the_lookback(kind):
    """RLlib caps a numpy'ized Dict/Tuple buffer's lookback at its number of
    keys (2 here): cut(3) then fails to validate. Ours: the chunk of the
    list-mode cut (RLlib's, below), numpy'ized."""
    space, obs = OBS[kind]
    ep = run(SingleAgentEpisode, obs, 5, space=space)
    ep.to_numpy()
    chunk = ep.cut(len_lookback_buffer=3)
    assert chunk.observations.lookback == 3 and len(chunk) == 0
    expected = run(SingleAgentEpisode, obs, 5, space=space).cut(len_lookback_buffer=3)
    assert timeline(chunk) == timeline(expected)


@pytest.mark.rllib
def test_rllib_cut_of_numpy_struct_episode_fails():
    ep = run(rllib_episode_class(), dict_obs, 5, space=DICT)
    listed = copy.deepcopy(ep).cut(len_lookback_buffer=3)
    assert listed.observations.lookback == 3
    ep.to_numpy()
    with pytest.raises(AssertionError):
        ep.cut(len_lookback_buffer=3)


def test_neg_index_before_a_numpy_chunks_lookback_raises():
    ep = run(SingleAgentEpisode, box, 4, space=BOX4)
    ep.to_numpy()
    chunk = ep.cut(len_lookback_buffer=1)
    assert chunk.get_actions(-1, neg_index_as_lookback=True) == 4 % 3
    with pytest.raises(IndexError):
        chunk.get_actions(-2, neg_index_as_lookback=True)
    assert chunk.get_actions(-2, neg_index_as_lookback=True, fill=0) == 0


@pytest.mark.rllib
def test_rllib_neg_index_before_a_numpy_chunks_lookback_wraps():
    ep = run(rllib_episode_class(), box, 4, space=BOX4)
    ep.to_numpy()
    chunk = ep.cut(len_lookback_buffer=1)
    assert chunk.get_actions(-2, neg_index_as_lookback=True) == 4 % 3  # data[-1]


def test_one_hot_of_an_empty_numpy_chunk():
    ep = run(SingleAgentEpisode, box, 3, space=BOX4)
    ep.to_numpy()
    chunk = ep.cut()
    got = chunk.get_actions(one_hot_discrete=True)
    assert got.shape == (0, 3) and got.dtype == np.float32


@pytest.mark.rllib
def test_rllib_one_hot_of_an_empty_numpy_chunk_crashes():
    ep = run(rllib_episode_class(), box, 3, space=BOX4)
    ep.to_numpy()
    with pytest.raises(ValueError):
        ep.cut().get_actions(one_hot_discrete=True)


def test_slice_before_the_start_of_an_empty_episode():
    """An episode with no observations, or only the reset one: a slice whose
    stop lies before its start is an empty episode, and the data dict of an
    empty episode has no rows."""
    empty = SingleAgentEpisode(id_="e")
    for piece in (empty[:-1], empty.slice(slice(0, -2), len_lookback_buffer=1)):
        assert len(piece) == 0 and not piece.is_reset and piece.t_started == 0
    data = empty.get_data_dict()
    assert data["obs"] == [] and data["actions"] == [] and data["t"] == []
    reset = SingleAgentEpisode(id_="r")
    reset.add_env_reset(box(0))
    piece = reset[:-1]
    assert len(piece) == 0 and not piece.is_reset and piece.get_observations() == []


@pytest.mark.rllib
def test_rllib_slice_before_the_start_of_an_empty_episode_asserts():
    empty = rllib_episode_class()(id_="e")
    for call in (lambda: empty[:-1], lambda: empty.slice(slice(0, -2), len_lookback_buffer=1),
                 empty.get_data_dict):
        with pytest.raises(AssertionError):  # the buffer's _interpret_slice
            call()
    reset = rllib_episode_class()(id_="r")
    reset.add_env_reset(box(0))
    with pytest.raises(AssertionError):
        reset[:-1]


# -- get_state() of extra model outputs with no steps after the lookback -------------------


@pytest.mark.parametrize("mode", ["list", "numpy"])
def test_state_of_extra_model_outputs_all_in_the_lookback(mode):
    """Ours stores every extra model output as a state, and from_state()
    reads that and the buffer object RLlib's get_state() leaves there."""
    ep = SingleAgentEpisode(id_="x", observations=[box(i) for i in range(3)],
                            actions=[0, 1], rewards=[0.0, 1.0],
                            extra_model_outputs={"logp": [np.float32(-1), np.float32(-2)]})
    if mode == "numpy":
        ep.to_numpy()
    state = ep.get_state()
    assert isinstance(state["extra_model_outputs"]["logp"], dict)
    with_object = {**state, "extra_model_outputs": {"logp": ep.extra_model_outputs["logp"]}}
    for source in (state, with_object):
        got = SingleAgentEpisode.from_state(copy.deepcopy(source)).extra_model_outputs["logp"]
        assert got.lookback == 2 and len(got) == 0
        assert leaves(got.get(slice(-2, None), neg_index_as_lookback=True)) == [-1.0, -2.0]


@pytest.mark.rllib
@pytest.mark.parametrize("mode", ["list", "numpy"])
def test_rllib_state_of_extra_model_outputs_all_in_the_lookback_fails(mode):
    """RLlib's get_state() keeps a length-0 buffer as the object itself
    (`v.get_state() if v else v`), and its own from_state() fails on it."""
    ep = rllib_episode_class()(id_="x", observations=[box(i) for i in range(3)],
                               actions=[0, 1], rewards=[0.0, 1.0],
                               extra_model_outputs={"logp": [np.float32(-1), np.float32(-2)]})
    if mode == "numpy":
        ep.to_numpy()
    state = ep.get_state()
    assert state["extra_model_outputs"]["logp"] is ep.extra_model_outputs["logp"]
    with pytest.raises(AssertionError):  # validate(): read as data with no lookback
        rllib_episode_class().from_state(copy.deepcopy(state))


# -- the deprecated temporary-timestep-data helpers ---------------------------------------


def test_temporary_timestep_helpers_raise_every_time():
    ep = run(SingleAgentEpisode, box, 1)
    for method in ("add_temporary_timestep_data", "get_temporary_timestep_data"):
        for _ in range(2):
            with pytest.raises(ValueError):
                getattr(ep, method)()


@pytest.mark.rllib
def test_rllib_temporary_timestep_helpers_raise_once_per_process():
    """RLlib's @Deprecated(error=True) raises only while `log_once` is fresh;
    later calls run the stub and return None."""
    reset_log_once = pytest.importorskip("ray.util.debug").reset_log_once
    ep = run(rllib_episode_class(), box, 1)
    reset_log_once("add_temporary_timestep_data")
    with pytest.raises(ValueError):
        ep.add_temporary_timestep_data()
    assert ep.add_temporary_timestep_data() is None


# -- the same as RLlib, pinned: from_state's defaultdict, shared memory ------------------------


@pytest.mark.parametrize("with_extras", [True, False])
def test_from_state_extra_model_outputs_is_a_defaultdict(with_extras):
    ep = run(SingleAgentEpisode, box, 3, extras=with_extras)
    restored = SingleAgentEpisode.from_state(ep.get_state())
    assert "new" not in restored.extra_model_outputs
    buf = restored.extra_model_outputs["new"]  # no KeyError
    assert isinstance(buf, InfiniteLookbackBuffer) and len(buf) == 0 and buf.lookback == 0
    assert "new" in restored.extra_model_outputs
    assert restored.get_extra_model_outputs("other") == []
    with pytest.raises(KeyError):  # a fresh episode's extra_model_outputs is a plain dict
        SingleAgentEpisode(id_="x").extra_model_outputs["new"]


@pytest.mark.parametrize("make", ["slice", "getitem", "cut"])
def test_numpy_slices_and_cuts_share_memory(make):
    ep = run(SingleAgentEpisode, box, 6, space=BOX4)
    ep.to_numpy()
    if make == "cut":
        part = ep.cut(len_lookback_buffer=2)
        # part's lookback: actions 5, 6 and observations 4, 5, 6.
        part.set_observations(new_data=box(9), at_indices=-1, neg_index_as_lookback=True)
        assert ep.get_observations(5).tolist() == [9.0] * 4
        ep.set_actions(new_data=2, at_indices=-1)
        assert part.get_actions(-1, neg_index_as_lookback=True) == 2
        return
    part = ep.slice(slice(2, 4)) if make == "slice" else ep[2:4]
    part.set_observations(new_data=box(8), at_indices=0)
    assert ep.get_observations(2).tolist() == [8.0] * 4
    ep.set_rewards(new_data=-5.0, at_indices=3)
    assert part.get_rewards(1) == -5.0
    ep.set_extra_model_outputs(key="logp", new_data=np.float32(7), at_indices=2)
    assert part.get_extra_model_outputs("logp", 0) == 7


@pytest.mark.rllib
@pytest.mark.parametrize("make", ["slice", "cut"])
def test_rllib_numpy_slices_and_cuts_share_memory(make):
    ep = run(rllib_episode_class(), box, 6, space=BOX4)
    ep.to_numpy()
    if make == "cut":
        part = ep.cut(len_lookback_buffer=2)
        part.set_observations(new_data=box(9), at_indices=-1, neg_index_as_lookback=True)
        assert ep.get_observations(5).tolist() == [9.0] * 4
        return
    part = ep.slice(slice(2, 4))
    part.set_observations(new_data=box(8), at_indices=0)
    assert ep.get_observations(2).tolist() == [8.0] * 4


# -- pickling: plain spaces come back as one shared object per process ------------

def _pickled_twice(cls):
    episode = cls(observation_space=gym.spaces.Box(-1, 1, (4,), np.float32),
                  action_space=gym.spaces.Discrete(2))
    episode.add_env_reset(np.zeros(4, np.float32))
    return [pickle.loads(pickle.dumps(episode, protocol=5)) for _ in range(2)]


def test_unpickled_plain_spaces_are_shared():
    """Ours: one space object per description, as the episodes of one env
    runner share its env's spaces (and loading skips rebuilding a Box)."""
    first, second = _pickled_twice(SingleAgentEpisode)
    assert first.observation_space == gym.spaces.Box(-1, 1, (4,), np.float32)
    assert first.observation_space is second.observation_space
    assert first.action_space is second.action_space


@pytest.mark.rllib
def test_rllib_unpickled_spaces_are_separate_objects():
    first, second = _pickled_twice(rllib_episode_class())
    assert first.observation_space == second.observation_space
    assert first.observation_space is not second.observation_space


# -- env step counters are 64-bit ---------------------------------------------------------


@pytest.mark.parametrize("field", ["t", "t_started"])
def test_step_counters_beyond_64_bits_are_refused(field):
    episode = SingleAgentEpisode(observations=[0.0, 1.0], actions=[0], rewards=[0.0],
                                 len_lookback_buffer=0)
    with pytest.raises(OverflowError):
        setattr(episode, field, 2**63)
    assert (episode.t, episode.t_started, len(episode)) == (1, 0, 1)
    with pytest.raises(OverflowError):
        SingleAgentEpisode(t_started=2**63)


def test_a_step_past_the_largest_counter_is_refused():
    episode = SingleAgentEpisode(observations=[0.0], t_started=2**63 - 1)
    with pytest.raises(OverflowError):
        episode.add_env_step(1.0, 0, 1.0)
    assert episode.t == 2**63 - 1 and episode.get_observations() == [0.0]
    episode.validate()


@pytest.mark.rllib
def test_rllib_keeps_any_python_int_as_step_counter():
    episode = rllib_episode_class()(t_started=2**63)
    assert episode.t == episode.t_started == 2**63 and len(episode) == 0


def test_a_float_t_started_is_refused():
    with pytest.raises(TypeError):
        SingleAgentEpisode(t_started=2.0)


@pytest.mark.rllib
def test_rllib_keeps_a_float_t_started_and_len_fails():
    episode = rllib_episode_class()(t_started=2.0)
    assert episode.t == episode.t_started == 2.0
    with pytest.raises(TypeError):
        len(episode)


# -- to_numpy() of data that cannot be batched ---------------------------------------------


def _mixed_actions(cls):
    episode = cls()
    episode.add_env_reset({"a": 1})
    episode.add_env_step({"a": 2}, {"x": 1}, 1.0)
    episode.add_env_step({"a": 3}, {"y": 1}, 1.0)      # other keys: no batch of actions
    return episode


def test_to_numpy_that_cannot_batch_changes_nothing():
    episode = _mixed_actions(SingleAgentEpisode)
    with pytest.raises(ValueError):
        episode.to_numpy()
    assert not episode.observations.finalized and not episode.is_numpy
    assert episode.get_observations() == [{"a": 1}, {"a": 2}, {"a": 3}]
    assert episode.get_actions() == [{"x": 1}, {"y": 1}]


@pytest.mark.rllib
def test_rllib_to_numpy_that_cannot_batch_numpyizes_the_observations_first():
    episode = _mixed_actions(rllib_episode_class())
    with pytest.raises(ValueError):
        episode.to_numpy()
    assert episode.observations.finalized


# -- an extra output slot that holds no buffer ------------------------------------------


@pytest.mark.parametrize("slot", [[1], None, "x", np.zeros(1)])
@pytest.mark.parametrize("numpy", [False, True])
def test_a_step_into_a_slot_that_is_no_buffer_changes_nothing(slot, numpy):
    """Anything but a buffer under an extra output's key (put there by hand)
    makes the step raise TypeError, naming the object's class with its
    module, before anything is added; the getter raises the same error,
    which is also the AssertionError RLlib's getter raises."""
    episode = SingleAgentEpisode(observations=[0, 1], actions=[0], rewards=[0.0],
                                 extra_model_outputs={"x": [1]}, len_lookback_buffer=0)
    if numpy:
        episode.to_numpy()
    episode.extra_model_outputs["x"] = slot
    name = f"{type(slot).__module__}.{type(slot).__qualname__}"
    with pytest.raises(TypeError, match=name):
        episode.add_env_step(2, 0, 1.0, extra_model_outputs={"y": 1.0, "x": 2})
    with pytest.raises(AssertionError, match=name):
        episode.get_extra_model_outputs("x")
    assert len(episode) == 1 and list(episode.get_observations()) == [0, 1]
    assert list(episode.extra_model_outputs) == ["x"]


@pytest.mark.rllib
def test_rllib_appends_to_a_list_in_an_extra_output_slot():
    episode = rllib_episode_class()(observations=[0, 1], actions=[0], rewards=[0.0],
                                    extra_model_outputs={"x": [1]}, len_lookback_buffer=0)
    episode.extra_model_outputs["x"] = [1]
    episode.add_env_step(2, 0, 1.0, extra_model_outputs={"x": 2})
    assert episode.extra_model_outputs["x"] == [1, 2]     # a list, not a buffer
    with pytest.raises(AssertionError):
        episode.get_extra_model_outputs("x")              # which its getter refuses


# -- extra model outputs that are not a mapping -----------------------------------------


def test_extra_model_outputs_without_items_change_nothing():
    episode = SingleAgentEpisode()
    episode.add_env_reset(observation=0.0)
    with pytest.raises(AttributeError):
        episode.add_env_step(1.0, 0, 1.0, extra_model_outputs=[("vf", 9.0)])
    assert len(episode) == 0 and episode.get_observations() == [0.0]
    episode.validate()


@pytest.mark.rllib
def test_rllib_extra_model_outputs_without_items_raise_after_appending():
    episode = rllib_episode_class()()
    episode.add_env_reset(observation=0.0)
    with pytest.raises(AttributeError):
        episode.add_env_step(1.0, 0, 1.0, extra_model_outputs=[("vf", 9.0)])
    assert episode.get_observations() == [0.0, 1.0]     # the step is half in


# -- writes into an episode unpickled from read-only buffers (Ray's object store) ----------


def _from_read_only_buffers(episode):
    buffers = []
    data = pickle.dumps(episode, protocol=5, buffer_callback=buffers.append)
    return pickle.loads(data, buffers=[bytes(b.raw()) for b in buffers])


def _numpy_episode(cls):
    episode = cls(observations=[box(i) for i in range(4)], actions=[0, 1, 2],
                  rewards=[1.0, 2.0, 3.0], len_lookback_buffer=0)
    return episode.to_numpy()


def test_set_on_an_episode_from_read_only_buffers_copies_then_sets():
    """Its arrays are read-only views of the buffers, as RLlib's are; a
    set_*() copies the track out first."""
    episode = _from_read_only_buffers(_numpy_episode(SingleAgentEpisode))
    assert not episode.get_observations().flags.writeable
    episode.set_observations(new_data=box(7), at_indices=1)
    episode.set_actions(new_data=0, at_indices=2)
    assert episode.get_observations(1).tolist() == [7.0] * 4
    assert episode.get_actions().tolist() == [0, 1, 0]


def _cartpole_episode(spaces: bool):
    """A numpy'ized CartPole episode, spaces set as RLlib's env runners set
    them (or not), with an extra output."""
    env = gym.make("CartPole-v1")
    kwargs = dict(observation_space=env.observation_space,
                  action_space=env.action_space) if spaces else {}
    episode = SingleAgentEpisode(**kwargs)
    obs, info = env.reset(seed=0)
    episode.add_env_reset(obs, info)
    for t in range(5):
        obs, reward, *_ = env.step(t % 2)
        episode.add_env_step(obs, t % 2, reward, extra_model_outputs={"logp": np.float32(t)})
    return episode.to_numpy()


# Each track's new rows: an int index sets one, the others the first two or all five.
NEW_ROWS = {"observations": np.full((6, 4), 0.125, np.float32), "actions": np.array([1, 0] * 3),
            "rewards": np.full(6, 2.0), "logp": np.full(6, 9.0, np.float32)}


@pytest.mark.parametrize("spaces", [True, False])
@pytest.mark.parametrize("indices", [1, [0, 1], slice(None), slice(1, 3), None],
                         ids=["int", "list", "slice", "slice13", "None"])
@pytest.mark.parametrize("track", sorted(NEW_ROWS))
def test_every_index_form_copies_then_sets_on_read_only_buffers(track, indices, spaces):
    """Copy-then-set holds for every index form, with or without spaces
    (as an env runner's episodes have them), with no warning on the way."""
    import warnings

    original = _cartpole_episode(spaces)
    episode = _from_read_only_buffers(original)
    before = copy.deepcopy(original)
    read = (lambda e, *a: e.get_extra_model_outputs("logp", *a)) if track == "logp" \
        else (lambda e, *a: getattr(e, f"get_{track}")(*a))
    rows = read(episode)
    assert not rows.flags.writeable
    all_rows = list(range(len(rows)))
    positions = (all_rows if indices is None else all_rows[indices]
                 if isinstance(indices, slice) else np.atleast_1d(indices).tolist())
    new = NEW_ROWS[track][1] if isinstance(indices, int) else NEW_ROWS[track][:len(positions)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if track == "logp":
            episode.set_extra_model_outputs(key="logp", new_data=new, at_indices=indices)
        else:
            getattr(episode, f"set_{track}")(new_data=new, at_indices=indices)
    expected = np.array(read(before))
    expected[positions] = new
    np.testing.assert_array_equal(read(episode), expected)
    assert read(episode).dtype == expected.dtype
    # The shared buffers (another reader's view of them) are unchanged.
    np.testing.assert_array_equal(rows, read(before))


@pytest.mark.rllib
def test_rllib_set_on_an_episode_from_read_only_buffers_raises():
    episode = _from_read_only_buffers(_numpy_episode(rllib_episode_class()))
    assert not episode.get_observations().flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        episode.set_observations(new_data=box(7), at_indices=1)
