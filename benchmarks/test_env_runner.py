"""RLlib's SingleAgentEnvRunner against ours (episode.rllib.runners), in one process.

    pytest benchmarks/test_env_runner.py --benchmark-group-by=group \
        --benchmark-columns=median,iqr,rounds

- ``env_runner_sample_cartpole_8``: SingleAgentEnvRunner.sample() of 2,000
  env steps (CartPole-v1, 8 envs, rollout_fragment_length 250, the default
  PPO module, exploring);
- ``env_runner_sample_multi_agent``: MultiAgentEnvRunner.sample() of 400 env
  steps (MultiAgentCartPole with 4 agents on 2 modules, 4 envs,
  rollout_fragment_length 100);

each runner built from the same config and seed. RLlib's runner keeps RLlib's episode classes: ours is made
without `episode.rllib.install()` (its episodes are ours either way; the
install is for the RLlib code that reads them later), so that both run in
one process.
"""
import logging

import pytest

pytest.importorskip("ray.rllib")
from ray.rllib.algorithms.ppo import PPOConfig  # noqa: E402
from ray.rllib.env.multi_agent_env_runner import (  # noqa: E402
    MultiAgentEnvRunner as RLlibMultiAgentRunner,
)
from ray.rllib.env.single_agent_env_runner import (  # noqa: E402
    SingleAgentEnvRunner as RLlibRunner,
)
from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole  # noqa: E402

import episode.rllib.runners  # noqa: E402

ENVS, FRAGMENT = 8, 250
MA_ENVS, MA_FRAGMENT = 4, 100


def _runner(impl: str, multi_agent: bool, monkeypatch):
    logging.disable(logging.WARNING)
    if multi_agent:
        config = (PPOConfig().environment(MultiAgentCartPole, env_config={"num_agents": 4})
                  .env_runners(num_envs_per_env_runner=MA_ENVS,
                               rollout_fragment_length=MA_FRAGMENT)
                  .multi_agent(policies={"p0", "p1"},
                               policy_mapping_fn=lambda aid, *a, **k: f"p{aid % 2}"))
        ours, theirs = episode.rllib.runners.MultiAgentEnvRunner, RLlibMultiAgentRunner
    else:
        config = (PPOConfig().environment("CartPole-v1")
                  .env_runners(num_envs_per_env_runner=ENVS, rollout_fragment_length=FRAGMENT))
        ours, theirs = episode.rllib.runners.SingleAgentEnvRunner, RLlibRunner
    config = config.debugging(seed=0)
    if impl == "rllib":
        return theirs(config=config)
    monkeypatch.setattr(episode.rllib, "install", lambda: None)
    runner = ours(config=config)
    assert runner.vectorized
    return runner


def _time_sample(benchmark, runner) -> list:
    runner.sample()     # the first reset, and warm caches
    episodes = benchmark.pedantic(runner.sample, rounds=15, warmup_rounds=2)
    runner.stop()
    return episodes


@pytest.mark.benchmark(group="env_runner_sample_cartpole_8")
@pytest.mark.parametrize("impl", ["ours", "rllib"])
def test_sample(benchmark, impl, monkeypatch):
    episodes = _time_sample(benchmark, _runner(impl, False, monkeypatch))
    # At least the steps asked for; the last vector step may go a few past.
    assert ENVS * FRAGMENT <= sum(len(e) for e in episodes) < (ENVS + 1) * FRAGMENT


@pytest.mark.benchmark(group="env_runner_sample_multi_agent")
@pytest.mark.parametrize("impl", ["ours", "rllib"])
def test_sample_multi_agent(benchmark, impl, monkeypatch):
    episodes = _time_sample(benchmark, _runner(impl, True, monkeypatch))
    assert MA_ENVS * MA_FRAGMENT <= sum(e.env_steps() for e in episodes) \
        < (MA_ENVS + 1) * MA_FRAGMENT
