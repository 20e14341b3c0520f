"""episode.rllib.runners against RLlib 2.60's own env runner: the same
episodes (every column, dtype and shape), metrics and training runs for the
same seeds. Each runner runs in a fresh process (one process cannot mix the
two kinds of episodes)."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from test_rllib_install import _run

pytest.importorskip("ray.rllib")
pytestmark = pytest.mark.rllib

HERE = Path(__file__).parent


ENVS = ("cartpole", "pendulum", "infos", "lists", "callbacks", "multi", "turns",
        "multi_pendulum")


@functools.lru_cache(maxsize=None)
def _samples(runner: str) -> dict:
    # Every env's runner in one process per side (each starts ray and torch).
    environ = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(HERE / "runner_samples.py"), runner, *ENVS],
                          capture_output=True, text=True, timeout=900, env=environ, cwd=HERE)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("env, vectorized", [
    ("cartpole", True),      # Discrete actions, 8 envs
    ("pendulum", True),      # Box actions: the env gets them unsquashed
    ("infos", True),         # infos that are not empty, through resets and ends
    ("lists", True),         # episodes handed on as lists (episodes_to_numpy=False)
    ("callbacks", False),    # an episode callback: RLlib's own loop, on our episodes
    ("multi", True),         # MultiAgentCartPole, 3 agents on 2 modules, 2 envs
    ("turns", True),         # TicTacToe: one player acts per step, the other waits
    ("multi_pendulum", True),  # Box actions, unsquashed per agent
])
def test_sample_gives_rllibs_episodes(env, vectorized):
    """Truncated rollouts over several calls, explore=False, num_episodes,
    odd num_timesteps and force_reset: the same episodes call by call (each
    column's dtype, shape and values, infos, t, done flags), the same
    metrics; random actions (unseeded in RLlib) the same kinds of data."""
    theirs, ours = _samples("rllib")[env], _samples("ours")[env]
    assert ours["calls"] == theirs["calls"]
    assert ours["metrics"] == theirs["metrics"]
    assert ours["random"] == theirs["random"] and ours["random_steps"] > 0
    assert ours["vectorized"] is vectorized


@pytest.mark.parametrize("algo, episodes", [
    ("ppo", ["episode.single_agent_episode.SingleAgentEpisode"]),
    ("dqn", ["episode.single_agent_episode.SingleAgentEpisode"]),
    ("ppo_multi_agent", ["episode.multi_agent_episode.MultiAgentEpisode",
                         "episode.single_agent_episode.SingleAgentEpisode"]),
])
def test_training_with_our_runners_repeats_rllib_exactly(algo, episodes):
    """PPO (CartPole, 8 envs, GAE), DQN (epsilon-greedy actions from the
    module, prioritized episode replay) and multi-agent PPO
    (MultiAgentCartPole, two modules): the same returns and losses,
    iteration by iteration, as RLlib's runners on RLlib's classes."""
    theirs, ours = _run(algo, "rllib", 3), _run(algo, "runner", 3)
    assert ours["vectorized"] is True
    assert ours["curve"] == theirs["curve"]
    assert ours["learner_episodes"] == episodes


def test_single_agent_steps_take_the_block_pass_with_the_modules_outputs(monkeypatch):
    """Every env step of the single-agent loop, the default PPO module's
    outputs and weights_seq_no included, goes through VectorEpisodes'
    compiled block pass (not add_env_step per sub-env), and the episodes
    get each output under its key."""
    import logging

    from ray.rllib.algorithms.ppo import PPOConfig

    import episode.rllib
    import episode.rllib.runners as runners

    passes, steps = [], []

    class Counted(runners.VectorEpisodes):
        def record_step(self, *args, **kwargs):
            steps.append(sorted(kwargs.get("extra_model_outputs") or ()))
            return super().record_step(*args, **kwargs)

        def _add_rows(self, *args):
            found = super()._add_rows(*args)
            passes.append(found is not None)
            return found

    logging.disable(logging.WARNING)
    # Our runner without install(): RLlib's classes stay as they are for
    # the other tests of this process (the runner's episodes are ours anyway).
    monkeypatch.setattr(runners.patch, "install", lambda: None)   # (what runners call)
    monkeypatch.setattr(runners, "VectorEpisodes", Counted)
    config = (PPOConfig().environment("CartPole-v1")
              .env_runners(num_envs_per_env_runner=3, rollout_fragment_length=40)
              .debugging(seed=0))
    runner = runners.SingleAgentEnvRunner(config=config)
    try:
        assert runner.vectorized
        episodes = runner.sample()
        runner.episodes_to_numpy = False    # and in list mode
        episodes += runner.sample()
    finally:
        runner.stop()
    assert not episode.rllib.is_installed()     # RLlib's classes left as they were
    keys = ["action_dist_inputs", "action_logp", "weights_seq_no"]
    assert steps and all(s == keys for s in steps)
    assert passes == [True] * len(steps)
    for e in episodes:
        assert sorted(e.extra_model_outputs) == keys
    listed = [e for e in episodes if isinstance(e.get_rewards(), list)]
    assert listed and all(type(x) is int for e in listed
                          for x in e.get_extra_model_outputs("weights_seq_no"))


class _RaisingCartPole(gym.Wrapper):
    """CartPole whose first instance raises once, at its 60th step."""

    made = 0

    def __init__(self, config=None):
        super().__init__(gym.make("CartPole-v1"))
        _RaisingCartPole.made += 1
        self.first, self.steps = _RaisingCartPole.made == 1, 0

    def step(self, action):
        self.steps += 1
        if self.first and self.steps == 60:
            raise RuntimeError("the env failed")
        return self.env.step(action)


def test_episodes_that_ended_in_a_sample_that_raised_come_with_the_next(monkeypatch):
    """A sample() that raises midway (the env's error) loses no episode:
    those that ended before the error come with the next call. (RLlib's
    runner fails an internal assert on that next call.)"""
    import logging
    import time

    from ray.rllib.algorithms.ppo import PPOConfig

    import episode.rllib
    import episode.rllib.runners as runners

    logging.disable(logging.WARNING)
    monkeypatch.setattr(runners.patch, "install", lambda: None)   # (what runners call)
    config = (PPOConfig().environment(_RaisingCartPole)
              .env_runners(num_envs_per_env_runner=4, rollout_fragment_length=40)
              .debugging(seed=0))
    runner = runners.SingleAgentEnvRunner(config=config)
    try:
        assert runner.vectorized
        runner.sample()
        with pytest.raises(Exception):
            runner.sample()
        before = time.perf_counter()
        episodes = runner.sample()
    finally:
        runner.stop()
    assert not episode.rllib.is_installed()     # RLlib's classes left as they were
    carried = [e for e in episodes if e.is_done and e._last_step_time < before]
    assert carried
    assert sum(len(e) for e in episodes) >= 160
