"""Views over episodes: build_training_batch and build_inference_batch.

One padding rule for episodes and the collector: random trajectories go
through an AgentCollector and a SingleAgentEpisode, both chunked at the same
points (the collector's build_for_training of an ongoing trajectory, the
episode's cut() with the lookback the views need), and every chunk's views
must be the same arrays. (tests/test_collector_rllib.py holds the collector
to RLlib's.) The inference input at each step must be the training row of
that step.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from episode import MultiAgentEpisode, SingleAgentEpisode, ViewRequirement
from episode.collector import AgentCollector
from episode.views import build_inference_batch, build_training_batch

BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
DICT = gym.spaces.Dict({"pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float64),
                        "id": gym.spaces.Discrete(5)})
ACTIONS = gym.spaces.Discrete(3)
DATA_COLS = ["obs", "actions", "rewards", "infos", "vf_preds", "t", "terminateds",
             "truncateds", "agent_index", "env_id", "eps_id"]

_shift_values = st.integers(-4, 3)
SHIFTS = st.one_of(
    _shift_values,
    st.lists(_shift_values, min_size=1, max_size=4),
    st.builds(lambda a, k: f"{a}:{a + k}", st.integers(-4, 0), st.integers(0, 4)),
)


@st.composite
def view_requirements(draw):
    vrs = {}
    for i in range(draw(st.integers(1, 6))):
        data_col = draw(st.sampled_from(DATA_COLS))
        shift = draw(SHIFTS)
        if data_col in ("infos", "eps_id"):
            shift = draw(_shift_values)  # object/str rows: one shift
        vrs[f"view_{i}"] = ViewRequirement(data_col, shift=shift)
    for name, data_col, shift in (("prev_actions", "actions", -1),
                                  ("prev_rewards", "rewards", -1)):
        if draw(st.booleans()):
            vrs[name] = ViewRequirement(data_col, shift=shift)
    # The collector reads these requirements' spaces for its zero rows.
    vrs["actions"] = ViewRequirement(space=ACTIONS)
    # Without an obs view (shift_before 0) RLlib's collector gives the
    # columns that start at the reset (t, eps_id, ...) one row more than the
    # others; test_collector.py pins that.
    vrs["obs"] = ViewRequirement()
    vrs["rewards"] = ViewRequirement()
    return vrs


@st.composite
def trajectories(draw):
    space = draw(st.sampled_from([BOX, DICT]))
    space.seed(draw(st.integers(0, 1000)))
    n = draw(st.integers(1, 14))
    obs = [space.sample() for _ in range(n + 1)]
    actions = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    rewards = draw(st.lists(st.floats(-10, 10, width=32), min_size=n, max_size=n))
    vf = [np.float32(r / 2) for r in rewards]
    end = draw(st.sampled_from(["none", "terminated", "truncated"]))
    cuts = sorted(set(draw(st.lists(st.integers(1, n), max_size=3))) - {n})
    return space, obs, actions, rewards, vf, end, cuts


def _same(a, b, path=""):
    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            _same(a[k], b[k], f"{path}/{k}")
        return
    assert a.dtype == b.dtype and a.shape == b.shape, (path, a.dtype, b.dtype, a.shape, b.shape)
    if a.dtype == object:
        assert list(a.ravel()) == list(b.ravel()), path
    else:
        np.testing.assert_array_equal(a, b, err_msg=path)


@settings(max_examples=150, deadline=None)
@given(view_requirements(), trajectories(), st.booleans())
def test_chunks_match_the_collector(vrs, trajectory, numpy_chunks):
    space, obs, actions, rewards, vf, end, cuts = trajectory
    n = len(actions)
    collector = AgentCollector(vrs)
    episode = SingleAgentEpisode(observation_space=space, action_space=ACTIONS)
    collector.add_init_obs(episode.id_, 0, 5, obs[0], {"k": 0})
    episode.add_env_reset(obs[0], {"k": 0})
    start = 0
    for i in range(n):
        last = i == n - 1
        terminated, truncated = last and end == "terminated", last and end == "truncated"
        collector.add_action_reward_next_obs({
            "new_obs": obs[i + 1], "actions": actions[i], "rewards": rewards[i],
            "terminateds": terminated, "truncateds": truncated, "infos": {"k": i + 1},
            "vf_preds": vf[i], "env_id": 5, "agent_index": 0})
        episode.add_env_step(obs[i + 1], actions[i], rewards[i], infos={"k": i + 1},
                             terminated=terminated, truncated=truncated,
                             extra_model_outputs={"vf_preds": vf[i]})
        if i + 1 in cuts or last:
            expected = dict(collector.build_for_training(vrs))
            if numpy_chunks:
                episode.to_numpy()
            got = build_training_batch([episode], vrs, env_ids=[5])
            expected.pop("unroll_id", None)
            assert set(got) == set(expected)
            for key in expected:
                _same(expected[key], got[key], key)
            assert len(episode) == i + 1 - start
            start = i + 1
            if not last:
                episode = episode.cut(len_lookback_buffer=collector.shift_before)


@settings(max_examples=80, deadline=None)
@given(view_requirements(), trajectories())
def test_inference_input_is_the_training_row(vrs, trajectory):
    space, obs, actions, rewards, vf, end, _ = trajectory
    # What is known before the action at t: observations (and what comes
    # with them) up to t, the per-step columns up to t - 1.
    per_step = ("actions", "rewards", "vf_preds", "terminateds", "truncateds")
    vrs = {k: v for k, v in vrs.items()
           if (v.shift_arr <= (-1 if (v.data_col or k) in per_step else 0)).all()}
    episode = SingleAgentEpisode(observation_space=space, action_space=ACTIONS)
    episode.add_env_reset(obs[0], {"k": 0})
    inputs = []
    for i in range(len(actions)):
        inputs.append(build_inference_batch([episode], vrs, env_ids=[5]))
        episode.add_env_step(obs[i + 1], actions[i], rewards[i], infos={"k": i + 1},
                             extra_model_outputs={"vf_preds": vf[i]})
    batch = build_training_batch([episode], vrs, env_ids=[5])
    for t, row in enumerate(inputs):
        assert list(row) == list(vrs)
        for key in row:
            data_col = vrs[key].data_col or key
            zero_padded = {"actions": "prev_actions", "rewards": "prev_rewards"}.get(data_col)
            if (data_col in per_step and zero_padded not in vrs
                    and t + vrs[key].shift_arr.min() < 0):
                # Training rows repeat the first action before the start,
                # which the input of that first action cannot know.
                continue
            expected = batch[key]
            pick = (lambda a: a[t:t + 1])
            _same(_map(pick, expected), row[key], key)


def _map(fn, x):
    return {k: _map(fn, v) for k, v in x.items()} if isinstance(x, dict) else fn(x)


def _episode(n, obs0=0.0, terminated=True):
    e = SingleAgentEpisode()
    e.add_env_reset(np.float32(obs0))
    for i in range(n):
        e.add_env_step(np.float32(obs0 + i + 1), i % 3, float(i), terminated=terminated and i == n - 1)
    return e


def test_padding_rule_by_hand():
    vrs = {"obs": ViewRequirement(), "next": ViewRequirement("obs", shift=1),
           "stack": ViewRequirement("obs", shift="-2:0"),
           "prev_actions": ViewRequirement("actions", shift=-1),
           "a_back": ViewRequirement("actions", shift=-2),
           "r_back": ViewRequirement("rewards", shift=-1),
           "a_ahead": ViewRequirement("actions", shift=1)}
    b = build_training_batch([_episode(3)], vrs)
    np.testing.assert_array_equal(b["obs"], np.array([0, 1, 2], np.float32))
    np.testing.assert_array_equal(b["next"], np.array([1, 2, 3], np.float32))
    # Before the start: the first observation again.
    np.testing.assert_array_equal(b["stack"], np.array([[0, 0, 0], [0, 0, 1], [0, 1, 2]],
                                                       np.float32))
    # prev_actions in the views: actions read zeros before the start, for
    # every view of them; rewards (no prev_rewards view) repeat the first.
    np.testing.assert_array_equal(b["prev_actions"], [0, 0, 1])
    np.testing.assert_array_equal(b["a_back"], [0, 0, 0])
    np.testing.assert_array_equal(b["r_back"], np.array([0.0, 0.0, 1.0], np.float32))
    assert b["r_back"].dtype == np.float32  # float64 rewards stored as float32
    # Past the end: zeros.
    np.testing.assert_array_equal(b["a_ahead"], [1, 2, 0])


def test_several_episodes_and_sampler_columns():
    vrs = {"obs": ViewRequirement(), "t": ViewRequirement(), "env_id": ViewRequirement(),
           "terminateds": ViewRequirement(), "truncateds": ViewRequirement(),
           "eps_id": ViewRequirement(), "seq_state": ViewRequirement("obs", batch_repeat_value=2),
           "advantages": ViewRequirement()}
    a, b = _episode(3), _episode(2, obs0=10.0, terminated=False)
    batch = build_training_batch([a, SingleAgentEpisode(), b], vrs, env_ids=[7, 8, 9],
                                 max_seq_len=2)
    np.testing.assert_array_equal(batch["obs"], np.array([0, 1, 2, 10, 11], np.float32))
    np.testing.assert_array_equal(batch["t"], [0, 1, 2, 0, 1])
    np.testing.assert_array_equal(batch["env_id"], [7, 7, 7, 9, 9])
    np.testing.assert_array_equal(batch["terminateds"], [False, False, True, False, False])
    np.testing.assert_array_equal(batch["truncateds"], [False] * 5)
    assert list(batch["eps_id"]) == [a.id_] * 3 + [b.id_] * 2
    np.testing.assert_array_equal(batch["seq_state"], np.array([0, 2, 10], np.float32))
    np.testing.assert_array_equal(batch["seq_lens"], [2, 1, 2])
    assert batch["seq_lens"].dtype == np.int32
    assert "advantages" not in batch  # no episode has it (postprocessing adds it)


def test_empty_input():
    assert build_training_batch([], {"obs": ViewRequirement()}) == {}
    assert build_inference_batch([], {"obs": ViewRequirement()}) == {}


def test_inference_batches_episodes_and_pads_fresh_ones():
    vrs = {"obs": ViewRequirement(), "prev_actions": ViewRequirement("actions", shift=-1),
           "prev_rewards": ViewRequirement("rewards", shift=-1),
           "stack": ViewRequirement("obs", shift=[-2, -1, 0]),
           "train_only": ViewRequirement("obs", shift=1, used_for_compute_actions=False)}
    fresh = SingleAgentEpisode(action_space=ACTIONS)
    fresh.add_env_reset(np.float32(5.0))
    batch = build_inference_batch([_episode(3), fresh], vrs)
    assert list(batch) == ["obs", "prev_actions", "prev_rewards", "stack"]
    np.testing.assert_array_equal(batch["obs"], np.array([3, 5], np.float32))
    np.testing.assert_array_equal(batch["prev_actions"], [2, 0])
    np.testing.assert_array_equal(batch["prev_rewards"], np.array([2.0, 0.0], np.float32))
    np.testing.assert_array_equal(batch["stack"], np.array([[1, 2, 3], [5, 5, 5]], np.float32))


def test_inference_refuses_future_shifts():
    with pytest.raises(ValueError, match="future"):
        build_inference_batch([_episode(2)], {"next": ViewRequirement("obs", shift=1)})


def test_multi_agent_episodes_give_one_batch_per_module():
    e = MultiAgentEpisode(agent_module_ids={"a": "shared", "b": "shared", "c": "solo"})
    e.add_env_reset(observations={"a": 0.0, "b": 10.0, "c": 20.0})
    e.add_env_step(observations={"a": 1.0, "b": 11.0, "c": 21.0},
                   actions={"a": 0, "b": 1, "c": 2}, rewards={"a": 1.0, "b": 2.0, "c": 3.0})
    e.add_env_step(observations={"a": 2.0, "c": 22.0}, actions={"a": 1, "b": 0, "c": 1},
                   rewards={"a": 1.0, "b": 2.0, "c": 3.0})
    vrs = {"obs": ViewRequirement(), "actions": ViewRequirement(),
           "agent_index": ViewRequirement()}
    batch = build_training_batch([e], vrs)
    assert set(batch) == {"shared", "solo"}
    np.testing.assert_array_equal(batch["shared"]["obs"], np.array([0, 1, 10], np.float32))
    np.testing.assert_array_equal(batch["shared"]["agent_index"], [0, 0, 1])
    np.testing.assert_array_equal(batch["solo"]["actions"], [2, 1])


# -- the compiled inference pass ----------------------------------------------

from episode import views as views_module  # noqa: E402
from episode._views import gather_next_rows  # noqa: E402


@st.composite
def ongoing_episodes(draw):
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int8]))
    episodes = []
    for _ in range(draw(st.integers(1, 5))):
        # A fresh episode's actions are padded by its action space's zeros.
        e = SingleAgentEpisode(action_space=draw(st.sampled_from(
            [None, ACTIONS, gym.spaces.Box(-1.0, 1.0, (), np.float32)])))
        e.add_env_reset(np.zeros(2, dtype))
        for i in range(draw(st.integers(0, 8))):
            e.add_env_step(np.full(2, i + 1, dtype), i % 3, float(i),
                           extra_model_outputs={"vf": np.float32(i)})
        if len(e) and draw(st.booleans()):
            e = e.cut(len_lookback_buffer=draw(st.integers(0, 3)))
            e.add_env_step(np.full(2, 50, dtype), 2, 5.0, extra_model_outputs={"vf": np.float32(9)})
        if draw(st.booleans()):
            e.to_numpy()
        episodes.append(e)
    return episodes


@settings(max_examples=150, deadline=None)
@given(ongoing_episodes(), st.sampled_from(["obs", "actions", "rewards", "vf"]),
       st.lists(st.integers(-6, 0), min_size=1, max_size=4), st.booleans())
def test_compiled_inference_pass_equals_the_general_one(episodes, data_col, shifts, zeros):
    vrs = {"view": ViewRequirement(data_col, shift=shifts)}
    if zeros:
        vrs["prev_actions"] = ViewRequirement("actions", shift=-1)
        vrs["prev_rewards"] = ViewRequirement("rewards", shift=-1)
    fast = build_inference_batch(episodes, vrs)
    original = views_module.gather_next_rows
    views_module.gather_next_rows = lambda *args: None
    try:
        general = build_inference_batch(episodes, vrs)
    finally:
        views_module.gather_next_rows = original
    assert list(fast) == list(general)
    for key in fast:
        _same(general[key], fast[key], key)


def test_compiled_inference_pass_declines_what_it_cannot_read():
    a = _episode(3)
    assert gather_next_rows([], "obs", [0], False) is None
    assert gather_next_rows([a, "not an episode"], "obs", [0], False) is None
    assert gather_next_rows([a], "infos", [0], False) is None
    assert gather_next_rows([a], "missing", [0], False) is None
    assert gather_next_rows([a], "obs", [[0]], False) is None
    assert gather_next_rows([a], "obs", [-(1 << 41)], False) is None
    c = SingleAgentEpisode()
    c.add_env_reset(np.zeros(3, np.float32))  # another row shape
    assert gather_next_rows([a, c], "obs", [0], False) is None
    d = SingleAgentEpisode()
    d.add_env_reset(0.0)  # Python float: float64 rows, not float32
    assert gather_next_rows([a, d], "obs", [0], False) is None
    e = SingleAgentEpisode()
    e.add_env_reset({"x": 1.0})  # Dict items
    assert gather_next_rows([e], "obs", [0], False) is None


def test_compiled_inference_pass_with_garbage_steps():
    # t and t_started are plain attributes: a length beyond the rows, or one
    # that does not fit an index, must not reach the memory.
    a = _episode(3)
    a.t = 10 ** 6
    assert gather_next_rows([a], "obs", [0, -1], False) is None
    a.t, a.t_started = 2 ** 62, -(2 ** 62)
    with pytest.raises(OverflowError):
        gather_next_rows([a], "obs", [0], False)
    a.t, a.t_started = 0, 5
    with pytest.raises(ValueError):
        gather_next_rows([a], "obs", [0], False)
    b = _episode(2)
    b.observations.lookback = 7  # more lookback than rows: positions past the end are zeros
    np.testing.assert_array_equal(gather_next_rows([b], "obs", [0, -20], False)[0],
                                  [0.0, 0.0])


# -- differences from RLlib's collector, pinned ---------------------------------

def _rllib_collector_batches(views_for):
    collectors = pytest.importorskip("ray.rllib.evaluation.collectors.agent_collector")
    from ray.rllib.policy.view_requirement import ViewRequirement as RV

    views = views_for(RV)
    c = collectors.AgentCollector(views)
    inference = _three_steps(c)
    return inference, c.build_for_training(views)


def _three_steps(collector):
    """Actions 1, 2, 3 and rewards 10, 20, 30 into `collector`; its
    inference input after each."""
    collector.add_init_obs(episode_id=1, agent_index=0, env_id=0, init_obs=0.0)
    inference = []
    for i in range(3):
        collector.add_action_reward_next_obs({
            "new_obs": float(i + 1), "actions": i + 1, "rewards": 10.0 * (i + 1),
            "terminateds": i == 2, "truncateds": False})
        inference.append(collector.build_for_inference())
    return inference


def _prev_views(cls):
    return {"obs": cls(), "actions": cls(space=gym.spaces.Discrete(5),
                                         used_for_compute_actions=False),
            "prev_actions": cls("actions", shift=-1),
            "rewards": cls(used_for_compute_actions=False)}


@pytest.mark.rllib
def test_inference_prev_actions_are_the_last_action_rllib_collector_lags():
    inference, training = _rllib_collector_batches(_prev_views)
    # RLlib's collector: after actions 1, 2, 3 its inputs read 0, 1, 2 (the
    # action before the last), while its training rows 1, 2 read 1, 2.
    assert [int(b["prev_actions"][0]) for b in inference] == [0, 1, 2]
    np.testing.assert_array_equal(training["prev_actions"], [0, 1, 2])
    # Ours: each input reads the last action, the training row of that timestep.
    e = SingleAgentEpisode(action_space=gym.spaces.Discrete(5))
    e.add_env_reset(0.0)
    ours = []
    for i in range(3):
        e.add_env_step(float(i + 1), i + 1, 10.0 * (i + 1), terminated=i == 2)
        ours.append(build_inference_batch([e], _prev_views(ViewRequirement)))
    assert [int(b["prev_actions"][0]) for b in ours] == [1, 2, 3]
    # Our collector keeps RLlib's behaviour.
    got = _three_steps(AgentCollector(_prev_views(ViewRequirement)))
    assert [int(b["prev_actions"][0]) for b in got] == [0, 1, 2]


@pytest.mark.rllib
def test_reset_columns_have_one_row_per_step_rllib_collector_one_more():
    _, training = _rllib_collector_batches(lambda cls: {"t": cls(), "actions": cls()})
    np.testing.assert_array_equal(training["t"], [-1, 0, 1, 2])   # four rows
    np.testing.assert_array_equal(training["actions"], [1, 2, 3])  # three
    e = _episode(3)
    batch = build_training_batch([e], {"t": ViewRequirement(), "actions": ViewRequirement()})
    np.testing.assert_array_equal(batch["t"], [0, 1, 2])


def test_a_column_some_episodes_lack_raises_none_left_out():
    # Rows that would not line up: ValueError naming the column; a column no
    # episode has (what postprocessing adds) is left out, as RLlib's
    # collector leaves it out.
    a, b = _episode(2), _episode(2)
    with_vf = SingleAgentEpisode()
    with_vf.add_env_reset(np.float32(0.0))
    with_vf.add_env_step(np.float32(1.0), 0, 0.0, extra_model_outputs={"vf": 1.0})
    views = {"obs": ViewRequirement(), "vf": ViewRequirement()}
    with pytest.raises(ValueError, match="'vf'"):
        build_training_batch([with_vf, b], views)
    assert set(build_training_batch([a, b], views)) == {"obs"}
