"""Memory held by an episode: typed storage, not per-item Python objects."""
import gc
import tracemalloc

import numpy as np

from episode import SingleAgentEpisode

N = 100_000
# Raw data: float32 (4,) observations, int64 actions, float64 rewards and one
# float64 extra output per step; infos are empty.
RAW = (N + 1) * 16 + N * 8 * 3


def held_bytes(to_numpy):
    obs = np.random.default_rng(0).standard_normal((N + 1, 4)).astype(np.float32)
    rows = list(obs)
    gc.collect()
    tracemalloc.start()
    episode = SingleAgentEpisode()
    episode.add_env_reset(rows[0])
    for t in range(N):
        episode.add_env_step(rows[t + 1], t % 2, 1.0, extra_model_outputs={"vf": 0.5})
    if to_numpy:
        episode.to_numpy()
    gc.collect()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    np.testing.assert_array_equal(episode.get_observations(-1), obs[-1])
    return held


def test_100k_step_episode_holds_at_most_twice_its_raw_data():
    assert held_bytes(to_numpy=False) <= 2 * RAW
    assert held_bytes(to_numpy=True) <= 2 * RAW
