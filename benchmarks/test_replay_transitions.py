"""Transitions of a vector env, added a step of all envs at a time (SB3's
and cpprb's way), and batches drawn from them: ours `add_transition()` and
`sample_batch()` beside SB3's ReplayBuffer and cpprb's ReplayBuffer and
PrioritizedReplayBuffer, in the same run.

    pytest benchmarks/test_replay_transitions.py --benchmark-group-by=group \
        --benchmark-columns=median,iqr,rounds

The stream: 8 envs of CartPole-sized steps (observations float32 (4,), int
actions, float32 rewards), each env's episodes ending at random (1 in 40
steps); a done env's next observation starts its next episode, as in SB3's
loop. Each buffer (capacity 50,000) first takes 50,000 transitions, so that
the timed adds evict as a long run does.

Groups (the `impl` parameter names the implementation; medians per call,
extra_info["ns_per_item"] per transition):

- replay_add_transition_8envs: one call that adds a step of the 8 envs:
  ours `add_transition(obs, next_obs, actions, rewards, terminated,
  truncated)` (uniform and prioritized), SB3's `add(obs, next_obs, actions,
  rewards, dones, infos)`, cpprb's `add(obs=..., act=..., rew=...,
  next_obs=..., done=...)` (plain, and prioritized);
- replay_sample_transitions: a batch of 256 one-step transitions from the
  full buffer: ours `sample_batch(256)` (numpy arrays, and torch tensors
  with device="cpu", as SB3 hands out), SB3's `sample(256)`, cpprb's
  `sample(256)`.
"""
import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ENVS = 8
CAPACITY = 50_000
FILL = CAPACITY // ENVS
TIMED = 4_000
BATCH = 256


def _stream(steps: int) -> list:
    """(obs, next_obs, actions, rewards, terminated, truncated) per vector step."""
    rng = np.random.default_rng(0)
    obs = rng.random((ENVS, 4), np.float32)
    out = []
    for _ in range(steps):
        next_obs = rng.random((ENVS, 4), np.float32)
        terminated = rng.random(ENVS) < 1 / 40
        out.append((obs, next_obs, rng.integers(0, 2, ENVS), np.ones(ENVS, np.float32),
                    terminated, np.zeros(ENVS, np.bool_)))
        obs = next_obs
    return out


STREAM = _stream(FILL + TIMED + 200)


class Ours:
    def __init__(self, prioritized: bool):
        from episode.replay import EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer

        cls = PrioritizedEpisodeReplayBuffer if prioritized else EpisodeReplayBuffer
        self.buffer = cls(capacity=CAPACITY, seed=0)

    def add(self, step):
        self.buffer.add_transition(*step)

    def sample(self):
        return self.buffer.sample_batch(BATCH)


class OursTorch(Ours):
    def sample(self):
        return self.buffer.sample_batch(BATCH, device="cpu")


class SB3:
    def __init__(self):
        import gymnasium as gym
        buffers = pytest.importorskip("stable_baselines3.common.buffers")

        self.buffer = buffers.ReplayBuffer(
            CAPACITY // ENVS, gym.spaces.Box(0.0, 1.0, (4,), np.float32), gym.spaces.Discrete(2),
            device="cpu", n_envs=ENVS, handle_timeout_termination=False)
        self.infos = [{} for _ in range(ENVS)]

    def add(self, step):
        obs, next_obs, actions, rewards, terminated, truncated = step
        self.buffer.add(obs, next_obs, actions, rewards, terminated | truncated, self.infos)

    def sample(self):
        return self.buffer.sample(BATCH)


class Cpprb:
    def __init__(self, prioritized: bool):
        cpprb = pytest.importorskip("cpprb")
        env = {"obs": {"shape": 4, "dtype": np.float32}, "act": {"dtype": np.int64},
               "rew": {"dtype": np.float32}, "next_obs": {"shape": 4, "dtype": np.float32},
               "done": {"dtype": np.bool_}}
        self.buffer = cpprb.PrioritizedReplayBuffer(CAPACITY, env) if prioritized else \
            cpprb.ReplayBuffer(CAPACITY, env)

    def add(self, step):
        obs, next_obs, actions, rewards, terminated, truncated = step
        self.buffer.add(obs=obs, act=actions, rew=rewards, next_obs=next_obs,
                        done=terminated | truncated)

    def sample(self):
        return self.buffer.sample(BATCH)


IMPLS = {"ours": lambda: Ours(False), "ours_prioritized": lambda: Ours(True),
         "ours_torch": lambda: OursTorch(False), "sb3": SB3,
         "cpprb": lambda: Cpprb(False), "cpprb_prioritized": lambda: Cpprb(True)}


def _filled(name: str):
    run = IMPLS[name]()
    for step in STREAM[:FILL]:
        run.add(step)
    return run


@pytest.mark.benchmark(group="replay_add_transition_8envs")
@pytest.mark.parametrize("impl", ["ours", "ours_prioritized", "sb3", "cpprb",
                                  "cpprb_prioritized"])
def test_add_transition_8envs(benchmark, impl):
    run = _filled(impl)
    steps = iter(STREAM[FILL:])
    benchmark.pedantic(lambda: run.add(next(steps)), rounds=TIMED, iterations=1,
                       warmup_rounds=100)
    benchmark.extra_info["ns_per_item"] = benchmark.stats.stats.median * 1e9 / ENVS
    if impl.startswith("ours"):
        assert len(run.buffer) <= CAPACITY and run.buffer.get_num_episodes_evicted() > 0


@pytest.mark.benchmark(group="replay_sample_transitions")
@pytest.mark.parametrize("impl", ["ours", "ours_torch", "sb3", "cpprb"])
def test_sample_transitions(benchmark, impl):
    run = _filled(impl)
    batch = run.sample()
    obs = batch["obs"] if isinstance(batch, dict) else batch.observations
    assert tuple(obs.shape) == (BATCH, 4)
    benchmark(run.sample)
    benchmark.extra_info["ns_per_item"] = benchmark.stats.stats.median * 1e9 / BATCH
