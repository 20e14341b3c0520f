"""AgentCollector without RLlib: plain-dict batches, by hand.

tests/test_collector_rllib.py compares it with RLlib's collector on random
inputs; here the results are spelled out.
"""
from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest

from episode import AgentCollector, ViewRequirement
from episode.views import build_training_batch


@pytest.fixture(autouse=True)
def no_rllib(monkeypatch):
    # Batches are plain dicts unless RLlib's SampleBatch is loaded.
    monkeypatch.delitem(sys.modules, "ray.rllib.policy.sample_batch", raising=False)


def _views():
    return {"obs": ViewRequirement(),
            "new_obs": ViewRequirement("obs", shift=1, used_for_compute_actions=False),
            "actions": ViewRequirement(space=gym.spaces.Discrete(4)),
            "prev_actions": ViewRequirement("actions", shift=-1),
            "rewards": ViewRequirement(), "stack": ViewRequirement("obs", shift="-2:0"),
            "terminateds": ViewRequirement(), "truncateds": ViewRequirement(),
            "t": ViewRequirement()}


def _step(collector, i, done=False):
    collector.add_action_reward_next_obs({
        "new_obs": float(i + 1), "actions": i % 4, "rewards": float(10 * i),
        "terminateds": done, "truncateds": False})


def test_training_batch_by_hand():
    c = AgentCollector(_views())
    c.add_init_obs(episode_id=7, agent_index=0, env_id=0, init_obs=0.0)
    for i in range(3):
        _step(c, i)
    b = c.build_for_training(c.view_requirements)
    assert type(b) is dict
    np.testing.assert_array_equal(b["obs"], np.array([0, 1, 2], np.float32))
    np.testing.assert_array_equal(b["new_obs"], np.array([1, 2, 3], np.float32))
    np.testing.assert_array_equal(b["prev_actions"], [0, 0, 1])
    np.testing.assert_array_equal(b["stack"], np.array([[0, 0, 0], [0, 0, 1], [0, 1, 2]],
                                                       np.float32))
    np.testing.assert_array_equal(b["t"], [0, 1, 2])
    assert b["obs"].dtype == np.float32  # Python floats stored as float32

    # The trajectory goes on: the next batch's shifted views read the rows kept.
    _step(c, 3, done=True)
    b = c.build_for_training(c.view_requirements)
    np.testing.assert_array_equal(b["stack"], np.array([[1, 2, 3]], np.float32))
    np.testing.assert_array_equal(b["prev_actions"], [2])
    np.testing.assert_array_equal(b["terminateds"], [True])


def test_inference_keeps_only_what_it_needs():
    c = AgentCollector(_views(), is_training=False)
    c.add_init_obs(episode_id=1, agent_index=0, env_id=0, init_obs=0.0)
    for i in range(50):
        _step(c, i)
        b = c.build_for_inference()
        np.testing.assert_array_equal(b["stack"], np.array([[i - 1, i, i + 1]], np.float32)
                                      if i else np.array([[0, 0, 1]], np.float32))
    assert max(len(t) for tracks in c.buffers.values() for t in tracks) <= 4


def _gathered_in_python(c):
    # build_for_inference's rows the way the Python gather reads them.
    from episode.views import column_rows, gather_inference
    return {k: gather_inference(column_rows(c.buffers[vr.data_col or k][0]), vr.shift_arr)
            for k, vr in c.view_requirements.items() if vr.used_for_compute_actions}


@pytest.mark.parametrize("rows", [0, 1, 2])
def test_inference_over_tracks_cut_short_reads_as_numpy_indexes(rows):
    """Tracks swapped for shorter ones than the views' shifts need (by hand,
    or a bad restore): the compiled gather leaves them to numpy's indexing,
    which wraps or raises IndexError, and never reads outside a track."""
    from episode._column import Column
    c = AgentCollector(_views(), is_training=False)
    c.add_init_obs(episode_id=1, agent_index=0, env_id=0, init_obs=0.0)
    for i in range(6):
        _step(c, i)
    c.build_for_inference()
    for key in ("obs", "actions"):
        short = Column()
        short.extend([float(j) if key == "obs" else j for j in range(rows)])
        c.buffers[key][0] = short
    try:
        expected = _gathered_in_python(c)
    except IndexError:
        with pytest.raises(IndexError):
            c.build_for_inference()
        return
    got = c.build_for_inference()
    for k, v in expected.items():
        np.testing.assert_array_equal(got[k], v)
        assert got[k].dtype == v.dtype


def test_inference_plan_takes_only_lists_of_columns():
    from episode._collect import InferencePlan
    shifts = np.zeros(1, np.int64)
    for tracks in (None, [None], [np.zeros(3)], ("not", "a list")):
        with pytest.raises(TypeError):
            InferencePlan({}, False, [("obs", "obs", tracks, shifts, None)], None, None)
    with pytest.raises((TypeError, ValueError)):
        InferencePlan({}, False, [("obs", "obs")], None, None)


def test_inference_refuses_future_views():
    c = AgentCollector({"obs": ViewRequirement(), "new_obs": ViewRequirement("obs", shift=1)})
    c.add_init_obs(episode_id=1, agent_index=0, env_id=0, init_obs=0.0)
    with pytest.raises(ValueError, match="future"):
        c.build_for_inference()


def test_recurrent_state_views_and_seq_lens():
    views = {"obs": ViewRequirement(),
             "state_in_0": ViewRequirement("state_out_0", shift=-1, batch_repeat_value=2,
                                           space=gym.spaces.Box(-1, 1, (2,))),
             "state_out_0": ViewRequirement(space=gym.spaces.Box(-1, 1, (2,)),
                                            used_for_compute_actions=False)}
    c = AgentCollector(views, max_seq_len=2, is_policy_recurrent=True,
                       intial_states=[np.zeros(2, np.float32)])
    c.add_init_obs(episode_id=1, agent_index=0, env_id=0, init_obs=0.0)
    for i in range(5):
        c.add_action_reward_next_obs({"new_obs": float(i + 1), "actions": 0, "rewards": 0.0,
                                      "terminateds": i == 4, "truncateds": False,
                                      "state_out_0": np.full(2, i + 1, np.float32)})
    b = c.build_for_training(views)
    # One state per sequence of two: the initial one, then the outs of t=1, t=3.
    np.testing.assert_array_equal(b["state_in_0"], np.array([[0, 0], [2, 2], [4, 4]],
                                                            np.float32))
    np.testing.assert_array_equal(b["seq_lens"], [2, 2, 1])


def test_non_recurrent_policy_has_no_state():
    views = {"obs": ViewRequirement(), "state_in_0": ViewRequirement("state_out_0", shift=-1)}
    c = AgentCollector(views)
    c.add_init_obs(episode_id=1, agent_index=0, env_id=0, init_obs=0.0)
    with pytest.raises(ValueError, match="not recurrent"):
        c.build_for_inference()


def test_a_step_may_not_carry_obs():
    c = AgentCollector(_views())
    c.add_init_obs(episode_id=1, agent_index=0, env_id=0, init_obs=0.0)
    with pytest.raises(AssertionError):
        c.add_action_reward_next_obs({"obs": 1.0, "new_obs": 1.0})
    with pytest.raises(AssertionError):
        c.add_action_reward_next_obs({"new_obs": 1.0, "eps_id": 2})


def test_without_obs_views_reset_columns_get_one_row_more():
    # RLlib's collector (with no view reaching before the start) gives the
    # columns recorded from the reset on (t, eps_id, ...) a row more than
    # the per-step ones; the collector keeps that, episode views do not.
    views = {"t": ViewRequirement(), "actions": ViewRequirement()}
    c = AgentCollector(views)
    c.add_init_obs(episode_id=1, agent_index=0, env_id=0, init_obs=0.0)
    _step(c, 0, done=True)
    b = c.build_for_training(views)
    np.testing.assert_array_equal(b["t"], [-1, 0])
    np.testing.assert_array_equal(b["actions"], [0])
    from episode import SingleAgentEpisode
    e = SingleAgentEpisode()
    e.add_env_reset(0.0)
    e.add_env_step(1.0, 0, 0.0, terminated=True)
    np.testing.assert_array_equal(build_training_batch([e], views)["t"], [0])


def test_a_continuing_training_batch_keeps_the_inference_plan():
    """A sampler's training-mode collector ends a fragment (a training batch
    of a trajectory that goes on) and keeps stepping: the kept rows stay in
    the same track lists, so build_for_inference goes on with the views it
    resolved before, and reads the new rows."""
    c = AgentCollector(_views())
    c.add_init_obs(episode_id=1, agent_index=0, env_id=0, init_obs=0.0)
    for i in range(5):
        _step(c, i)
    c.build_for_inference()
    plan = c._inference
    lists = {key: tracks for key, tracks in c.buffers.items()}
    c.build_for_training(c.view_requirements)
    assert all(c.buffers[key] is tracks for key, tracks in lists.items())
    for i in range(5, 7):
        _step(c, i)
        b = c.build_for_inference()
        np.testing.assert_array_equal(b["stack"], np.array([[i - 1, i, i + 1]], np.float32))
        np.testing.assert_array_equal(b["prev_actions"], [(i - 1) % 4])
    assert c._inference is plan
    assert all(track.is_typed for key in ("obs", "actions", "rewards")
               for track in c.buffers[key])
