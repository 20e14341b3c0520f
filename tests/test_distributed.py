"""episode.distributed.DistributedSampler on a local Ray cluster (2 CPUs):
the actors' rollouts are those of local Samplers with the same seeds, a
policy (and weights) broadcast reaches every actor, restarted ones too, and
an actor that dies mid-rollout costs no episode, delivers none twice and
none in part."""
from __future__ import annotations

import functools
import os
import sys
import time

import gymnasium as gym
import numpy as np
import pytest

pytestmark = [pytest.mark.rllib]

ray = pytest.importorskip("ray")

from episode import Sampler  # noqa: E402
from episode.cli.envs import Copies  # noqa: E402
from episode.distributed import ActorNotStarted, DistributedSampler  # noqa: E402

# The envs and policies below go to the actors by value: this test module is
# not importable in Ray's workers.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module", autouse=True)
def ray_cluster(tmp_path_factory):
    # Ray puts the driver's working directory first on its workers' sys.path:
    # started from a checkout, they would import its episode/ (without the
    # compiled modules) instead of the installed package.
    if ray.is_initialized():
        ray.shutdown()
    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("ray"))
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    finally:
        os.chdir(cwd)
    yield
    ray.shutdown()


# -- envs and policies (pickled by value) -------------------------------------------

class CrashOnce(gym.Wrapper):
    """CartPole whose `crash_step`-th step ends the process (os._exit), in
    the first process to get there only: it leaves a marker file."""

    def __init__(self, marker: str, crash_step: int):
        super().__init__(gym.make("CartPole-v1"))
        self.marker, self.crash_step, self.steps = marker, crash_step, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.crash_step:
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.close(fd)
                os._exit(1)
        return self.env.step(action)


class FailsAt(gym.Wrapper):
    """CartPole whose `fail_step`-th step raises ValueError."""

    def __init__(self, fail_step: int):
        super().__init__(gym.make("CartPole-v1"))
        self.fail_step, self.steps = fail_step, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.fail_step:
            raise ValueError("the env failed on purpose")
        return self.env.step(action)


class Constant:
    """Always the same action; set_weights sets it."""

    def __init__(self, action: int):
        self.action = action

    def __call__(self, inputs):
        return np.full(len(inputs["obs"]), self.action, np.int64)

    def set_weights(self, weights):
        self.action = int(weights)


# -- helpers ----------------------------------------------------------------------

def local_episodes(env, seeds, **kwargs):
    """What local Samplers with `seeds` give in their first call, in order."""
    out = []
    for seed in seeds:
        sampler = Sampler(env, seed=seed, **kwargs)
        out += sampler.sample_episodes()
        sampler.close()
    return out


def assert_same_episodes(got, expected):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert len(a) == len(b)
        np.testing.assert_array_equal(a.get_observations(), b.get_observations())
        np.testing.assert_array_equal(a.get_actions(), b.get_actions())
        np.testing.assert_array_equal(a.get_rewards(), b.get_rewards())
        assert (a.is_terminated, a.is_truncated) == (b.is_terminated, b.is_truncated)


def kill(actor, restart):
    """Kills a DistributedSampler's actor and waits until it is gone: a
    call to it fails (Ray has restarted it, without a Sampler, or it is
    dead), so that no call of the test can still reach the old process."""
    ray.kill(actor, no_restart=not restart)
    for _ in range(600):
        try:
            ray.get(actor.get_metrics.remote(), timeout=30)
        except (ray.exceptions.RayActorError, ActorNotStarted):
            return
        time.sleep(0.05)
    raise AssertionError("the killed actor still answers")


def assert_whole(episodes):
    ids = [e.id_ for e in episodes]
    assert len(set(ids)) == len(ids)
    for e in episodes:
        assert e.is_numpy
        assert len(e) > 0
        assert len(e.get_observations()) == len(e.get_actions()) + 1 == len(e) + 1
        assert len(e.get_rewards()) == len(e)


# -- tests -------------------------------------------------------------------------

def test_episodes_are_the_local_samplers_with_the_same_seeds():
    kwargs = dict(num_envs=2, rollout_fragment_length=30)
    with DistributedSampler("CartPole-v1", num_actors=2, seed=11, **kwargs) as ds:
        assert ds.actor_seeds == [11, 13]
        episodes = ds.sample_episodes()
        assert_same_episodes(episodes, local_episodes("CartPole-v1", [11, 13], **kwargs))
        assert_whole(episodes)
        # The second call goes on from the first (running episodes continued).
        more = ds.sample_episodes()
        metrics = ds.get_metrics()
    assert 120 <= sum(len(e) for e in episodes) <= 122
    assert metrics["env_steps"] == sum(len(e) for e in episodes + more)
    assert metrics["actor_restarts"] == 0
    assert metrics["episodes_done"] == len(metrics["episode_returns"]) > 0


def test_batches_are_the_local_batches_concatenated():
    kwargs = dict(num_envs=2, rollout_fragment_length=25, batch_mode="complete_episodes")
    with DistributedSampler("CartPole-v1", num_actors=2, seed=5, **kwargs) as ds:
        batch = ds.sample()
        assert ds.multi_agent is False
    local = [Sampler("CartPole-v1", seed=s, **kwargs).sample() for s in (5, 7)]
    for column in ("obs", "new_obs", "actions", "rewards", "terminateds", "t"):
        np.testing.assert_array_equal(batch[column],
                                      np.concatenate([b[column] for b in local]))
    assert set(batch) == set(local[0])
    # complete_episodes: every episode in the batch ends.
    assert batch["terminateds"].sum() + batch["truncateds"].sum() == len(set(batch["eps_id"]))


def test_multi_agent_batches_per_module():
    env = functools.partial(Copies, "CartPole-v1", 2)
    kwargs = dict(num_envs=1, rollout_fragment_length=15)
    with DistributedSampler(env, num_actors=2, seed=0, **kwargs) as ds:
        assert ds.multi_agent is True
        batch = ds.sample()
    local = [Sampler(env, seed=s, **kwargs).sample() for s in (0, 1)]
    # Every agent maps to RLlib's default module.
    assert set(batch) == set(local[0]) == {"default_policy"}
    for module in batch:
        for column in ("obs", "actions", "rewards", "t"):
            np.testing.assert_array_equal(
                batch[module][column], np.concatenate([b[module][column] for b in local]))


def test_policy_and_weights_reach_every_actor_restarted_ones_too():
    kwargs = dict(num_envs=2, rollout_fragment_length=20)
    with DistributedSampler("CartPole-v1", Constant(1), num_actors=2, seed=0, **kwargs) as ds:
        def actions():
            return np.concatenate([e.get_actions() for e in ds.sample_episodes()])

        assert set(actions()) == {1}
        ds.set_policy(Constant(0))
        assert set(actions()) == {0}
        ds.set_weights(1)
        assert set(actions()) == {1}
        # A restarted actor gets the latest policy and weights.
        kill(ds.actors[0], restart=True)
        assert set(actions()) == {1}
        assert ds.get_metrics()["actor_restarts"] == 1
        ds.policy = None
        assert set(actions()) == {0, 1}
        with pytest.raises(TypeError):
            ds.set_weights(0)
        with pytest.raises(TypeError):
            ds.set_policy(3)


@pytest.mark.parametrize("batch_mode", ["truncate_episodes", "complete_episodes"])
def test_actor_death_mid_rollout(tmp_path, batch_mode):
    marker = tmp_path / "crashed"
    env = functools.partial(CrashOnce, str(marker), 30)
    kwargs = dict(num_envs=2, rollout_fragment_length=50, batch_mode=batch_mode)
    with DistributedSampler(env, num_actors=2, seed=100, **kwargs) as ds:
        episodes = ds.sample_episodes()
        seeds = ds.actor_seeds
        assert ds.get_metrics()["actor_restarts"] == 1
    assert marker.exists()
    # One actor came back with a seed no actor had: its rollout is a new one,
    # whole, in place of the one lost.
    assert sum(s in (100, 102) for s in seeds) == 1
    assert_same_episodes(episodes, local_episodes(env, seeds, **kwargs))
    assert_whole(episodes)
    if batch_mode == "complete_episodes":
        assert all(e.is_done for e in episodes)
    assert sum(len(e) for e in episodes) >= 2 * 2 * 50


def test_actors_killed_between_calls_come_back():
    kwargs = dict(num_envs=1, rollout_fragment_length=10)
    with DistributedSampler("CartPole-v1", num_actors=2, seed=0, max_restarts=1, **kwargs) as ds:
        first = ds.sample_episodes()
        # One restarted by Ray (its process then has no Sampler), one dead
        # for good (replaced by a new actor).
        kill(ds.actors[0], restart=True)
        kill(ds.actors[1], restart=False)
        episodes = ds.sample_episodes()
        seeds = ds.actor_seeds
        assert ds.get_metrics()["actor_restarts"] == 2
    assert all(s not in (0, 1) for s in seeds)
    assert_same_episodes(episodes, local_episodes("CartPole-v1", seeds, **kwargs))
    assert {e.id_ for e in first}.isdisjoint(e.id_ for e in episodes)


def test_errors_of_the_env_are_raised_not_restarted():
    with DistributedSampler(functools.partial(FailsAt, 5), num_actors=1) as ds:
        with pytest.raises(ValueError, match="on purpose"):
            ds.sample_episodes()
        assert ds.get_metrics()["actor_restarts"] == 0
    with pytest.raises(gym.error.Error):
        DistributedSampler("NoSuchEnv-v0", num_actors=1)
    with pytest.raises(RuntimeError, match="closed"):
        ds.sample()


@pytest.mark.parametrize("args, kwargs, error", [
    (("CartPole-v1",), {"num_actors": 0}, ValueError),
    (("CartPole-v1",), {"num_actors": True}, ValueError),
    (("CartPole-v1",), {"max_restarts": -1}, ValueError),
    (("CartPole-v1",), {"start_timeout_s": 0}, ValueError),
    (("CartPole-v1", 3), {}, TypeError),
    ((gym.make("CartPole-v1"),), {}, TypeError),
    (("CartPole-v1",), {"no_such_option": 1}, TypeError),
    (("CartPole-v1",), {"batch_mode": "whole"}, ValueError),
    (("CartPole-v1",), {"rollout_fragment_length": 0}, ValueError),
    (("CartPole-v1",), {"seed": "0"}, ValueError),
    (("CartPole-v1",), {"actor_options": {"max_task_retries": 2}}, ValueError),
    (("CartPole-v1",), {"init_kwargs": ["num_cpus"]}, TypeError),
])
def test_bad_input_fails_before_any_actor_starts(monkeypatch, args, kwargs, error):
    def no_actor(self):
        raise AssertionError("an actor was started")

    monkeypatch.setattr(DistributedSampler, "_new_actor", no_actor)
    with pytest.raises(error):
        DistributedSampler(*args, **kwargs)


class _CannotImport:
    """An actor whose process fails as a worker with the wrong episode on
    its sys.path does (the checkout's uncompiled source folder)."""

    def __init__(self, *args, **kwargs):
        raise ImportError("episode's compiled core is not in /checkout/episode (pinned)")

    def start(self, *args):
        return {}

    def close(self):
        return None


def test_an_actor_that_cannot_start_raises_its_cause_not_a_timeout(monkeypatch):
    import episode.distributed as distributed

    monkeypatch.setattr(distributed, "SamplerActor", _CannotImport)
    start = time.monotonic()
    with pytest.raises(Exception) as info:
        DistributedSampler("CartPole-v1", num_actors=1, start_timeout_s=60)
    assert not isinstance(info.value, TimeoutError)
    assert "compiled core is not in /checkout/episode" in str(info.value)
    assert time.monotonic() - start < 30
