"""RLlib's SingleAgentEnvRunner against ours (episode.rllib_runners), in one process.

    pytest benchmarks/test_env_runner.py --benchmark-group-by=group \
        --benchmark-columns=median,iqr,rounds

`sample()` of 2,000 env steps (CartPole-v1, 8 envs, rollout_fragment_length
250, the default PPO module, exploring), each runner built from the same
config and seed. RLlib's runner keeps RLlib's episode classes: ours is made
without `episode.rllib.install()` (its episodes are ours either way; the
install is for the RLlib code that reads them later), so that both run in
one process.
"""
import logging

import pytest

pytest.importorskip("ray.rllib")
from ray.rllib.algorithms.ppo import PPOConfig  # noqa: E402
from ray.rllib.env.single_agent_env_runner import (  # noqa: E402
    SingleAgentEnvRunner as RLlibRunner,
)

import episode.rllib_runners  # noqa: E402

ENVS, FRAGMENT = 8, 250


def _runner(impl: str, monkeypatch):
    logging.disable(logging.WARNING)
    config = (PPOConfig().environment("CartPole-v1")
              .env_runners(num_envs_per_env_runner=ENVS, rollout_fragment_length=FRAGMENT)
              .debugging(seed=0))
    if impl == "rllib":
        return RLlibRunner(config=config)
    monkeypatch.setattr(episode.rllib, "install", lambda: None)
    runner = episode.rllib_runners.SingleAgentEnvRunner(config=config)
    assert runner.vectorized
    return runner


@pytest.mark.benchmark(group="env_runner_sample_cartpole_8")
@pytest.mark.parametrize("impl", ["ours", "rllib"])
def test_sample(benchmark, impl, monkeypatch):
    runner = _runner(impl, monkeypatch)
    runner.sample()     # the first reset, and warm caches
    episodes = benchmark.pedantic(runner.sample, rounds=15, warmup_rounds=2)
    # At least the steps asked for; the last vector step may go a few past.
    assert ENVS * FRAGMENT <= sum(len(e) for e in episodes) < (ENVS + 1) * FRAGMENT
    runner.stop()
