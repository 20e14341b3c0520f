"""RLlib's prioritized episode replay buffer holding our episodes or RLlib's.

    pytest benchmarks/test_replay_buffer.py --benchmark-group-by=group \
        --benchmark-columns=median,iqr,rounds

DQN's buffer (`PrioritizedEpisodeReplayBuffer`, RLlib 2.60) with numpy'ized
episodes of either class, as env runners hand them over, in one process:

- ``replay_add_*``: a fresh buffer takes every episode (`add`);
- ``replay_sample_*``: 100 draws of 32 3-step transitions, as DQN asks
  (`sample(num_items=32, n_step=3, beta=0.4, sample_episodes=True)`), from
  the full buffer;

for ``cartpole_100k`` (100,000 CartPole-sized steps in 500-step episodes) and
``frames_10k`` (10,000 uint8 84x84 frames in 100-step episodes).
`extra_info["held_bytes"]` is what the full buffer holds (tracemalloc).
"""
import tracemalloc

import numpy as np
import pytest

pytest.importorskip("ray.rllib")
from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode  # noqa: E402
from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import (  # noqa: E402
    PrioritizedEpisodeReplayBuffer,
)

from episode import InfiniteLookbackBuffer, SingleAgentEpisode  # noqa: E402

DATA = {"cartpole_100k": (100_000, 500, (4,), np.float32),
        "frames_10k": (10_000, 100, (84, 84), np.uint8)}
CLASSES = {"ours": SingleAgentEpisode, "rllib": RLlibEpisode}
_cache: dict = {}


def _episodes(impl: str, data: str) -> list:
    key = (impl, data)
    if key not in _cache:
        _cache[key] = _make_episodes(impl, data)
    return _cache[key]


def _make_episodes(impl: str, data: str) -> list:
    # The same numpy'ized episodes for either class (seeded data).
    steps, length, shape, dtype = DATA[data]
    rng = np.random.default_rng(0)
    episodes = []
    for _ in range(steps // length):
        obs = (rng.integers(0, 255, (length + 1,) + shape) if dtype == np.uint8
               else rng.normal(size=(length + 1,) + shape)).astype(dtype)
        e = CLASSES[impl]()
        e.add_env_reset(obs[0])
        for t in range(length):
            e.add_env_step(obs[t + 1], int(rng.integers(2)), 1.0, terminated=t == length - 1)
        episodes.append(e.to_numpy())
    return episodes


def _held_bytes(impl: str, data: str) -> int:
    # What the episodes and the full buffer hold, made from scratch.
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    buffer = PrioritizedEpisodeReplayBuffer(capacity=DATA[data][0], alpha=0.6)
    buffer.add(_make_episodes(impl, data))
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del buffer
    return held


@pytest.fixture
def classes(monkeypatch, impl):
    """For ours, the buffer modules' episode and buffer classes are ours while
    the test runs (what episode.rllib.install() does to every module): the
    sampled episodes it makes are then ours."""
    if impl == "ours":
        import ray.rllib.utils.replay_buffers.episode_replay_buffer as plain
        import ray.rllib.utils.replay_buffers.prioritized_episode_buffer as prioritized

        for module in (plain, prioritized):
            for name, ours in (("SingleAgentEpisode", SingleAgentEpisode),
                               ("InfiniteLookbackBuffer", InfiniteLookbackBuffer)):
                if hasattr(module, name):
                    monkeypatch.setattr(module, name, ours)
    return CLASSES[impl]


def _full_buffer(impl: str, data: str):
    buffer = PrioritizedEpisodeReplayBuffer(capacity=DATA[data][0], alpha=0.6)
    buffer.add(_episodes(impl, data))
    buffer.rng = np.random.default_rng(0)
    return buffer


@pytest.mark.parametrize("data", list(DATA))
@pytest.mark.parametrize("impl", list(CLASSES))
def test_replay_add(benchmark, impl, data, classes):
    episodes = _episodes(impl, data)
    benchmark.group = f"replay_add_{data}"
    benchmark.extra_info["held_bytes"] = _held_bytes(impl, data)
    assert _full_buffer(impl, data).get_num_timesteps() == DATA[data][0]

    def run():
        PrioritizedEpisodeReplayBuffer(capacity=DATA[data][0], alpha=0.6).add(episodes)
    benchmark.pedantic(run, rounds=5, warmup_rounds=1, iterations=1)


@pytest.mark.parametrize("data", list(DATA))
@pytest.mark.parametrize("impl", list(CLASSES))
def test_replay_sample(benchmark, impl, data, classes):
    buffer = _full_buffer(impl, data)
    benchmark.group = f"replay_sample_{data}"

    def run():
        for _ in range(100):
            sampled = buffer.sample(num_items=32, n_step=3, beta=0.4, gamma=0.99,
                                    sample_episodes=True)
        return sampled
    sampled = run()
    assert sum(len(e) for e in sampled) == 32
    assert all(type(e) is classes for e in sampled)
    benchmark.pedantic(run, rounds=5, warmup_rounds=1, iterations=1)
