"""Appends after to_numpy() and the memory to_numpy() leaves: ours against RLlib 2.60's.

    pytest benchmarks/test_after_to_numpy.py --benchmark-group-by=group \
        --benchmark-columns=median,iqr,rounds

Appends: 4,000 CartPole-sized add_env_step calls (float32 (4,) observation,
Python int action, Python float reward, extra_model_outputs={"action_logp":
np.float32}, no spaces) on an episode that is (a) in list mode, (b)
to_numpy()'d after one step (every track finalized), (c) to_numpy()'d right
after the reset (only the observations finalized). Memory: the bytes an
episode of n steps holds after to_numpy(), measured as tests/test_memory.py
does, in ``extra_info["memory"]``.
"""
import sys
from pathlib import Path

import numpy as np
import pytest

N_APPEND = 4_000
ROUNDS = 41


@pytest.fixture(scope="module")
def steps():
    rng = np.random.default_rng(0)
    obs = [row.copy() for row in rng.uniform(-1, 1, (N_APPEND + 2, 4)).astype(np.float32)]
    actions = rng.integers(0, 2, N_APPEND + 1).tolist()
    rewards = rng.uniform(-1, 1, N_APPEND + 1).tolist()
    outputs = [{"action_logp": np.float32(x)} for x in rng.uniform(-1, 0, N_APPEND + 1)]
    return obs, actions, rewards, outputs


def _fresh(cls, steps, mode):
    obs, actions, rewards, outputs = steps
    episode = cls()
    episode.add_env_reset(obs[0])
    if mode != "numpy_after_reset":
        episode.add_env_step(obs[1], actions[0], rewards[0], extra_model_outputs=outputs[0])
    if mode != "list":
        episode.to_numpy()
    return episode


def _append(episode, steps):
    obs, actions, rewards, outputs = steps
    step = episode.add_env_step
    for i in range(1, N_APPEND + 1):
        step(obs[i + 1], actions[i], rewards[i], extra_model_outputs=outputs[i])
    return episode


@pytest.mark.parametrize("mode", ["list", "numpy_after_one_step", "numpy_after_reset"])
def test_append_4000(benchmark, sae_impl, steps, mode):
    benchmark.group = f"append_4000_{mode}"
    benchmark.extra_info["items"] = N_APPEND
    benchmark.pedantic(_append, setup=lambda: ((_fresh(sae_impl, steps, mode), steps), {}),
                       rounds=ROUNDS if sae_impl.__module__.startswith("episode") else 9,
                       warmup_rounds=1, iterations=1)


@pytest.mark.parametrize("n", [1, 2, 17, 100, 1025, 65_537])
def test_held_after_to_numpy(benchmark, sae_impl, n):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_memory import held_bytes, raw_bytes

    held = held_bytes(sae_impl, n)
    benchmark.group = f"held_after_to_numpy_{n}"
    benchmark.extra_info["memory"] = {"raw_bytes": raw_bytes(n), "held": held,
                                      "ratio_to_raw": held / raw_bytes(n)}
    print(f"\n{sae_impl.__module__} n={n}: {held} bytes held, "
          f"{held / raw_bytes(n):.2f}x raw")
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
