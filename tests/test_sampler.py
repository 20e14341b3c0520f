"""Sampler: batch modes, step counting, policies, bad input (no RLlib needed).

tests/test_sampler_rllib.py compares truncate mode with RLlib's EnvRunners.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from episode import Sampler, ViewRequirement
from episode.sampling import default_view_requirements


class Counter(gym.Env):
    """Observations count the steps; episodes end after `length` steps
    (terminated) or, with `lengths`, after each length in turn."""

    observation_space = gym.spaces.Box(0.0, 1e6, (1,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, length=98, lengths=None, bad_obs_at=None):
        self.lengths = list(lengths) if lengths else None
        self.length = length
        self.bad_obs_at = bad_obs_at
        self.total = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.lengths:
            self.length = self.lengths.pop(0) if len(self.lengths) > 1 else self.lengths[0]
        self.t = 0
        return np.array([self.total], np.float32), {}

    def step(self, action):
        self.t += 1
        self.total += 1
        obs = np.array([self.total], np.float32)
        if self.bad_obs_at is not None and self.total == self.bad_obs_at:
            obs = np.array([-5.0], np.float32)
        return obs, float(action), self.t >= self.length, False, {}


def _steps(episodes):
    return sum(len(e) for e in episodes)


def test_complete_episodes_cover_the_fragment_with_whole_episodes():
    # The seed document's example: 98-step episodes, fragment length 100.
    s = Sampler(Counter(98), batch_mode="complete_episodes", rollout_fragment_length=100)
    for _ in range(3):
        episodes = s.sample_episodes()
        assert [len(e) for e in episodes] == [98, 98]
        assert all(e.is_terminated and e.t_started == 0 for e in episodes)


def test_complete_episodes_waste_no_step():
    # Episodes still running when a call returns go on in the next call:
    # every observation the env made is in exactly one episode, in order.
    s = Sampler(lambda: Counter(lengths=[5, 30, 7, 12, 3, 40]), num_envs=2,
                batch_mode="complete_episodes", rollout_fragment_length=10)
    seen = []
    for _ in range(6):
        for e in s.sample_episodes():
            obs = e.get_observations()[:, 0]
            np.testing.assert_array_equal(np.diff(obs), 1)
            seen.append((obs[0], obs[-1]))
    for a, b in zip(seen, seen[1:]):
        pass
    # Per sub-env the episodes tile its counter: each starts where one ended.
    starts = sorted(s for s, _ in seen)
    ends = sorted(e for _, e in seen)
    assert starts[0] == 0 and all(x in ends for x in starts[2:] if x != 0)


@pytest.mark.parametrize("num_envs, fragment", [(1, 7), (3, 5), (4, 50)])
def test_truncate_mode_steps_and_continuation(num_envs, fragment):
    s = Sampler("CartPole-v1", num_envs=num_envs, rollout_fragment_length=fragment, seed=5)
    by_id: dict = {}
    for _ in range(6):
        episodes = s.sample_episodes()
        # rollout_fragment_length x num_envs env steps per call, counted at
        # the top of each vector step (the reset step after an episode ends
        # is not one): up to num_envs - 1 more, as in RLlib.
        target = num_envs * fragment
        assert target <= _steps(episodes) < target + num_envs
        metrics = s.get_metrics()
        assert metrics["env_steps"] == _steps(episodes)
        for e in episodes:
            assert isinstance(e.get_observations(), np.ndarray)  # numpy'ized
            chunks = by_id.setdefault(e.id_, [])
            if chunks:
                # A chunk goes on where the last one of its episode stopped.
                assert e.t_started == chunks[-1].t
                np.testing.assert_array_equal(e.get_observations(0),
                                              chunks[-1].get_observations(-1))
            chunks.append(e)
    for chunks in by_id.values():
        assert all(not c.is_done for c in chunks[:-1])


def test_truncate_chunks_keep_the_lookback_their_views_need():
    views = {"obs": ViewRequirement(), "stack": ViewRequirement("obs", shift="-3:0")}
    s = Sampler(Counter(1000), view_requirements=views, rollout_fragment_length=5)
    s.sample()
    batch = s.sample()
    np.testing.assert_array_equal(batch["stack"][0], [[2], [3], [4], [5]])
    np.testing.assert_array_equal(batch["obs"][:, 0], [5, 6, 7, 8, 9])


def test_sample_leaves_out_views_not_used_for_training():
    views = default_view_requirements()
    views["obs"] = ViewRequirement(used_for_training=False)
    batch = Sampler("CartPole-v1", view_requirements=views, rollout_fragment_length=4).sample()
    assert "obs" not in batch and "new_obs" in batch
    assert len(batch["actions"]) == 4


def test_policy_sees_the_inference_views_and_its_outputs_are_stored():
    views = {"obs": ViewRequirement(),
             "prev_actions": ViewRequirement("actions", shift=-1),
             "stack": ViewRequirement("obs", shift="-1:0")}
    seen = []

    def policy(inputs):
        seen.append(inputs)
        n = len(inputs["obs"])
        return np.ones(n, np.int64), {"vf_preds": np.full(n, 0.5, np.float32)}

    s = Sampler(lambda: Counter(1000), policy, view_requirements=views, num_envs=2,
                rollout_fragment_length=3)
    episodes = s.sample_episodes()
    assert set(seen[0]) == {"obs", "prev_actions", "stack"}
    np.testing.assert_array_equal(seen[0]["prev_actions"], [0, 0])
    np.testing.assert_array_equal(seen[1]["prev_actions"], [1, 1])
    np.testing.assert_array_equal(seen[1]["stack"][:, :, 0], [[0, 1], [0, 1]])
    for e in episodes:
        np.testing.assert_array_equal(e.get_extra_model_outputs("vf_preds"), [0.5] * 3)


@pytest.mark.parametrize("kwargs", [
    {"rollout_fragment_length": 0}, {"rollout_fragment_length": -3},
    {"rollout_fragment_length": 2.5}, {"batch_mode": "whole"},
    {"count_steps_by": "steps"}, {"num_envs": 0}, {"seed": "x"},
])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        Sampler("CartPole-v1", **kwargs)


def test_one_env_cannot_be_several():
    with pytest.raises(ValueError, match="num_envs"):
        Sampler(Counter(), num_envs=2)


@pytest.mark.parametrize("bad, match", [
    (lambda n: np.zeros(n + 1, np.int64), "one row per sub-env"),
    (lambda n: np.full(n, 7, np.int64), "outside"),
    (lambda n: 1, "one row per sub-env"),
])
def test_bad_policy_output_raises_before_anything_is_added(bad, match):
    calls = []

    def policy(inputs):
        calls.append(1)
        n = len(inputs["obs"])
        return bad(n) if len(calls) == 4 else np.zeros(n, np.int64)

    s = Sampler(lambda: Counter(1000), policy, num_envs=2, rollout_fragment_length=10)
    with pytest.raises(ValueError, match=match):
        s.sample_episodes()
    # The three steps taken so far are intact, the bad one is not there.
    assert [len(e) for e in s._vector.episodes] == [3, 3]


@pytest.mark.parametrize("returned, said", [
    (None, "returned None as the actions"),
    (np.zeros(3, np.int64), "an array of shape (3,) (int64)"),
    ([0], "a list of 1 item(s)"),
])
def test_a_policy_with_the_wrong_number_of_actions_hears_what_it_returned(returned, said):
    s = Sampler(lambda: Counter(1000), lambda inputs: returned, num_envs=2)
    with pytest.raises(ValueError) as raised:
        s.sample_episodes()
    message = str(raised.value)
    assert said in message and "expected a batch of 2 actions" in message


def test_an_action_outside_the_space_names_the_sub_env_and_its_space():
    s = Sampler("CartPole-v1", lambda inputs: np.array([1, 7]), num_envs=2)
    with pytest.raises(ValueError) as raised:
        s.sample_episodes()
    assert str(raised.value) == ("the policy returned sub-env 1 the action np.int64(7), "
                                 "outside its action space Discrete(2)")


def _with_outputs(inputs):
    n = len(inputs["obs"])
    return np.zeros(n, np.int64), {"vf_preds": np.full(n, 0.5, np.float32),
                                   "action_logp": np.full(n, -0.7, np.float32)}


def test_sample_includes_the_policys_extra_outputs():
    """As RLlib's policies add a view of each extra action output, sample()
    has a column for each, unless a requirement of that name says
    used_for_training=False."""
    batch = Sampler(lambda: Counter(1000), _with_outputs, num_envs=2,
                    rollout_fragment_length=3).sample()
    np.testing.assert_array_equal(batch["vf_preds"], np.full(6, 0.5, np.float32))
    np.testing.assert_array_equal(batch["action_logp"], np.full(6, -0.7, np.float32))
    views = default_view_requirements()
    views["vf_preds"] = ViewRequirement(used_for_training=False)
    views["prev_logp"] = ViewRequirement("action_logp", shift=-1,
                                         used_for_compute_actions=False)
    batch = Sampler(lambda: Counter(1000), _with_outputs, view_requirements=views,
                    rollout_fragment_length=3).sample()
    assert "vf_preds" not in batch
    np.testing.assert_array_equal(batch["action_logp"], np.full(3, -0.7, np.float32))
    # (Before the first step a view repeats the first value, as RLlib's collector pads.)
    np.testing.assert_array_equal(batch["prev_logp"], np.full(3, -0.7, np.float32))


def test_multi_agent_sample_includes_the_policys_extra_outputs():
    def policy(inputs):
        return ({aid: 1 for aid in inputs},
                {aid: {"vf_preds": np.float32(0.25)} for aid in inputs})

    (module, columns), = Sampler(_relay(), policy, batch_mode="complete_episodes",
                                 rollout_fragment_length=1).sample().items()
    np.testing.assert_array_equal(columns["vf_preds"], np.full(8, 0.25, np.float32))


def test_sampling_after_close_raises():
    s = Sampler("CartPole-v1", rollout_fragment_length=2)
    s.sample()
    s.close()
    for call in (s.sample, s.sample_episodes):
        with pytest.raises(RuntimeError, match="closed"):
            call()
    m = Sampler(_relay())
    m.close()
    with pytest.raises(RuntimeError, match="closed"):
        m.sample()


def test_observation_outside_the_space_raises_before_it_is_added():
    s = Sampler(Counter(1000, bad_obs_at=3), rollout_fragment_length=10)
    with pytest.raises(ValueError, match="outside"):
        s.sample_episodes()
    assert len(s._vector.episodes[0]) == 2


def test_metrics():
    s = Sampler(Counter(4), rollout_fragment_length=10)
    s.sample_episodes()
    m = s.get_metrics()
    assert m["episodes_done"] == 2 and m["episode_lengths"] == [4, 4]
    assert m["episode_returns"] == [pytest.approx(r) for r in m["episode_returns"]]
    assert m["env_steps"] == m["agent_steps"] == 10
    assert s.get_metrics()["env_steps"] == 0


def _relay():
    pettingzoo = pytest.importorskip("pettingzoo")

    class Relay(pettingzoo.ParallelEnv):
        """Two agents; a0 ends after 3 steps, a1 after 5."""

        metadata = {"name": "relay_v0"}
        possible_agents = ["a0", "a1"]

        def observation_space(self, agent):
            return gym.spaces.Box(-10.0, 10.0, (1,), np.float32)

        def action_space(self, agent):
            return gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            self.agents = list(self.possible_agents)
            self.t = 0
            return {a: np.zeros(1, np.float32) for a in self.agents}, {a: {} for a in self.agents}

        def step(self, actions):
            self.t += 1
            ends = {"a0": 3, "a1": 5}
            obs = {a: np.full(1, self.t, np.float32) for a in self.agents}
            rewards = {a: 1.0 for a in self.agents}
            terms = {a: self.t >= ends[a] for a in self.agents}
            truncs = {a: False for a in self.agents}
            self.agents = [a for a in self.agents if not terms[a]]
            return obs, rewards, terms, truncs, {a: {} for a in obs}

    return Relay()


@pytest.mark.parametrize("count_steps_by, expected", [
    # env steps: 4 per call; agent steps (fragment 5): both agents step for
    # 3 env steps, a1 alone for 2 more, 8 agent steps per episode.
    ("env_steps", [4, 4, 4]),
    ("agent_steps", [3, 4, 4]),
])
def test_multi_agent_counting(count_steps_by, expected):
    s = Sampler(_relay(), rollout_fragment_length=4 if count_steps_by == "env_steps" else 5,
                count_steps_by=count_steps_by)
    counts = []
    for _ in range(3):
        episodes = s.sample_episodes()
        m = s.get_metrics()
        counts.append(m["env_steps"])
        assert m["agent_steps"] == sum(e.agent_steps() for e in episodes)
    assert counts == expected


def test_multi_agent_complete_episodes_and_batches():
    s = Sampler(_relay(), batch_mode="complete_episodes", rollout_fragment_length=6)
    episodes = s.sample_episodes()
    assert [e.env_steps() for e in episodes] == [5, 5]
    assert all(e.is_done for e in episodes)
    batch = Sampler(_relay(), batch_mode="complete_episodes", rollout_fragment_length=1).sample()
    (module, columns), = batch.items()
    np.testing.assert_array_equal(columns["obs"][:, 0], [0, 1, 2, 0, 1, 2, 3, 4])
    np.testing.assert_array_equal(columns["agent_index"], [0, 0, 0, 1, 1, 1, 1, 1])


def test_multi_agent_policy_and_its_errors():
    def policy(inputs):
        return {aid: 1 for aid in inputs}

    s = Sampler(_relay(), policy, rollout_fragment_length=5)
    episodes = s.sample_episodes()
    assert episodes[0].get_actions(env_steps=False)["a0"].tolist() == [1, 1, 1]
    with pytest.raises(ValueError, match="each agent"):
        Sampler(_relay(), lambda inputs: {"a0": 1}).sample_episodes()
    with pytest.raises(ValueError, match="outside"):
        Sampler(_relay(), lambda inputs: {a: 5 for a in inputs}).sample_episodes()


def test_a_view_of_a_column_no_episode_has_raises_before_anything_is_added():
    views = {"obs": ViewRequirement(), "prev_values": ViewRequirement("values", shift=-1)}
    s = Sampler(lambda: Counter(1000), lambda inputs: np.zeros(2, np.int64),
                view_requirements=views, num_envs=2, rollout_fragment_length=3)
    with pytest.raises(ValueError, match="'values'"):
        s.sample_episodes()
    assert [len(e) for e in s._vector.episodes] == [0, 0]
    # The policy's own outputs are columns too.
    s = Sampler(lambda: Counter(1000),
                lambda inputs: (np.zeros(2, np.int64), {"values": np.ones(2, np.float32)}),
                view_requirements=views, num_envs=2, rollout_fragment_length=3)
    batch = s.sample()
    np.testing.assert_array_equal(batch["prev_values"], np.array([1, 1, 1, 1, 1, 1], np.float32))


class DictObs(gym.Env):
    """Dict observations ({"pos": float32 (2,), "id": Discrete}), 5-step episodes."""

    observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-10.0, 10.0, (2,), np.float32),
                                         "id": gym.spaces.Discrete(50)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return {"pos": np.full(2, self.t, np.float32), "id": self.t}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= 5, False, {}


def test_dict_observations_and_their_views():
    views = {"obs": ViewRequirement(), "prev_obs": ViewRequirement("obs", shift=-1),
             "actions": ViewRequirement()}
    seen = []

    def policy(inputs):
        seen.append(inputs)
        return np.ones(2, np.int64)

    s = Sampler(DictObs, policy, view_requirements=views, num_envs=2, rollout_fragment_length=6)
    batch = s.sample()
    assert set(batch["obs"]) == {"id", "pos"}
    np.testing.assert_array_equal(batch["obs"]["id"][:5], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(batch["prev_obs"]["id"][:5], [0, 0, 1, 2, 3])
    assert batch["obs"]["pos"].dtype == np.float32 and batch["obs"]["pos"].shape[1:] == (2,)
    assert set(seen[1]["prev_obs"]) == {"id", "pos"} and len(seen[1]["obs"]["id"]) == 2


def test_batches_as_rllib_sample_batches():
    sample_batch = pytest.importorskip("ray.rllib.policy.sample_batch")
    from episode.views import build_inference_batch, build_training_batch

    s = Sampler("CartPole-v1", num_envs=2, rollout_fragment_length=5, seed=0)
    episodes = s.sample_episodes()
    views = default_view_requirements()
    batch = build_training_batch(episodes, views, sample_batch=True)
    assert type(batch) is sample_batch.SampleBatch and batch.count == 10
    inputs = build_inference_batch(s.ongoing_episodes(), views, sample_batch=True)
    assert type(inputs) is sample_batch.SampleBatch and len(inputs["obs"]) == 2
    m = Sampler(_relay(), rollout_fragment_length=4)
    multi = build_training_batch(m.sample_episodes(), views, sample_batch=True)
    assert type(multi) is sample_batch.MultiAgentBatch and multi.env_steps() == 4


def test_episodes_that_ended_before_an_error_come_with_the_next_rollout():
    """Truncate mode: a rollout that raises loses no episode; the ones that
    ended before the error are handed on (and counted) by the next call."""
    calls = []

    def policy(inputs):
        calls.append(1)
        n = len(inputs["obs"])
        return np.full(n, 7, np.int64) if len(calls) == 6 else np.zeros(n, np.int64)

    s = Sampler(lambda: Counter(3), policy, num_envs=2, rollout_fragment_length=10)
    with pytest.raises(ValueError, match="outside"):
        s.sample_episodes()
    # Steps 1-3 ended one episode per sub-env, step 4 reset them, step 5
    # was a step: 8 env steps, no episode handed on yet.
    assert {k: v for k, v in s.get_metrics().items() if k != "episode_returns"} == {
        "episodes_done": 0, "episode_lengths": [], "env_steps": 8, "agent_steps": 8}
    episodes = s.sample_episodes()
    done = [e for e in episodes if e.is_done]
    # The two that ended before the error come first, then this call's.
    assert [(len(e), e.get_observations(0)[0]) for e in done[:2]] == [(3, 0.0), (3, 0.0)]
    assert len(done) == 2 + 6
    metrics = s.get_metrics()
    assert metrics["episodes_done"] == 8 and metrics["episode_lengths"] == [3] * 8
    assert metrics["env_steps"] == 20


@pytest.mark.parametrize("mode", ["complete_episodes", "multi_agent"])
def test_no_episode_is_lost_to_a_rollout_that_raises(mode):
    """Complete mode and multi-agent envs: the episodes that ended before a
    rollout raised come with the next call (as in truncate mode), or now
    with take_pending()."""
    calls = []
    if mode == "multi_agent":
        def policy(inputs):
            calls.append(1)
            if len(calls) == 9:
                raise RuntimeError("the policy failed")
            return {aid: 0 for aid in inputs}

        s = Sampler(_relay(), policy, rollout_fragment_length=20)
    else:
        def policy(inputs):
            calls.append(1)
            if len(calls) == 7:
                raise RuntimeError("the policy failed")
            return np.zeros(len(inputs["obs"]), np.int64)

        s = Sampler(lambda: Counter(3), policy, num_envs=2, batch_mode="complete_episodes",
                    rollout_fragment_length=20)
    with pytest.raises(RuntimeError, match="failed"):
        s.sample_episodes()
    pending = s.take_pending()
    done = [e for e in pending if e.is_done]
    # Two episodes ended before the error (one per sub-env, or the first
    # multi-agent one after 5 env steps).
    assert len(done) == (2 if mode != "multi_agent" else 1)
    assert all(e.is_numpy for e in pending)
    assert not [e for e in s.take_pending() if len(e)]      # nothing new since
    # Sampling goes on from there.
    assert [e for e in s.sample_episodes() if e.is_done]


class _Outside(gym.Env):
    """Observations outside its Box from the third step on."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(2, 5.0 if self.t >= 3 else 0.0, np.float32), 1.0, self.t >= 6, False, {}


def test_observations_outside_the_space_name_the_sub_env_and_can_be_let_in():
    with pytest.raises(ValueError, match=r"sub-env 0 returned an observation outside its space "
                                         r"Box\(-1.0, 1.0, \(2,\), float32\)"):
        Sampler(_Outside, num_envs=2, rollout_fragment_length=10).sample_episodes()
    sampler = Sampler(_Outside, num_envs=2, rollout_fragment_length=10, check_observations=False)
    episodes = sampler.sample_episodes()
    assert sum(len(e) for e in episodes) == 20 and episodes[0].get_observations(-1)[0] == 5.0
    with pytest.raises(TypeError):
        Sampler(_Outside, check_observations=1)
