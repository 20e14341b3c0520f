"""SingleAgentEpisode memory: ours against RLlib 2.60's.

    pytest benchmarks/test_single_agent_episode.py --benchmark-json=mem.json
    python benchmarks/summarize.py mem.json --markdown

The timing workloads are in test_workloads.py (episode/cli/workloads.py). This
file measures what a 100k-step episode holds, parametrized over ``sae_impl``
(ours, rllib; rllib is skipped without ray); ``test_memory_100k`` records it
in ``extra_info["memory"]`` (summarize.py prints it).
"""
import gc
import tracemalloc

import numpy as np
import pytest

from episode.cli.workloads import held_input_bytes

N_MEM = 100_000
RAW_BYTES = (N_MEM + 1) * 16 + N_MEM * 8 * 3   # obs, actions, rewards, vf


@pytest.fixture(scope="module")
def inputs_100k():
    """100,001 distinct float32 (4,) obs arrays, int actions, distinct float
    rewards and vf values, and the per-step extra_model_outputs dicts."""
    rng = np.random.default_rng(5)
    obs = [row.copy() for row in rng.uniform(-1, 1, size=(N_MEM + 1, 4)).astype(np.float32)]
    actions = rng.integers(0, 2, size=N_MEM).tolist()
    rewards = rng.uniform(-1, 1, size=N_MEM).tolist()
    vf = rng.uniform(-1, 1, size=N_MEM).tolist()
    outs = [{"vf": v} for v in vf]
    return obs, actions, rewards, vf, outs


def _build_100k(cls, inputs):
    obs, actions, rewards, _, outs = inputs
    episode = cls()
    episode.add_env_reset(obs[0])
    step = episode.add_env_step
    for i in range(N_MEM):
        step(obs[i + 1], actions[i], rewards[i], extra_model_outputs=outs[i])
    return episode


def test_memory_100k(benchmark, sae_impl, inputs_100k):
    """Memory held by a 100k-step episode, list mode and after to_numpy().

    Inputs are made before tracemalloc starts, so the traced bytes are what
    the episode allocates itself (buffers, lists, per-step info dicts, ...).
    Objects of the inputs the episode keeps a reference to (RLlib's list mode
    keeps the obs arrays and the reward/vf floats) are held by it too: their
    sys.getsizeof() is added as "held inputs" (the int actions are cached
    small ints, counted as 0). The inputs' own list is not counted.
    Timed: building the 100k-step episode and to_numpy() (5 rounds).
    """
    benchmark.group = "build_to_numpy_100k"
    benchmark.extra_info["items"] = N_MEM
    obs, _, rewards, vf, _ = inputs_100k
    inputs = (*obs, *rewards, *vf)

    gc.collect()
    tracemalloc.start()
    try:
        episode = _build_100k(sae_impl, inputs_100k)
        gc.collect()
        list_cur, list_peak = tracemalloc.get_traced_memory()
        list_held = held_input_bytes(episode, inputs)
        tracemalloc.reset_peak()
        episode.to_numpy()
        gc.collect()
        np_cur, np_peak = tracemalloc.get_traced_memory()
        np_held = held_input_bytes(episode, inputs)
    finally:
        tracemalloc.stop()
    assert len(episode) == N_MEM and episode.is_numpy
    del episode

    def row(cur, peak, held):
        return {"traced": cur, "held_inputs": held, "total": cur + held,
                "ratio_to_raw": (cur + held) / RAW_BYTES, "peak": peak}

    benchmark.extra_info["memory"] = {
        "raw_bytes": RAW_BYTES,
        "list": row(list_cur, list_peak, list_held),
        # peak: the most traced during to_numpy() (the list-mode data included).
        "numpy": row(np_cur, np_peak, np_held),
    }
    print(f"\n{sae_impl.__module__}: {benchmark.extra_info['memory']}")

    def build():
        return _build_100k(sae_impl, inputs_100k).to_numpy()

    benchmark.pedantic(build, rounds=5, warmup_rounds=0, iterations=1)
