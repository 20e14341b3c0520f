"""Memory held by an episode: typed storage, not per-item Python objects.

Measured as the benchmarks measure it: inputs are made before tracemalloc
starts, so the traced bytes are what the episode allocated itself; inputs it
still refers to (a list-mode buffer keeps the caller's objects) are added at
their sys.getsizeof(). RLlib's episode is measured the same way in the same
process (tests marked `rllib`).
"""
import gc
import os
import tracemalloc

import numpy as np
import pytest

from episode import SingleAgentEpisode
from episode.cli.workloads import held_input_bytes


def raw_bytes(n):
    # float32 (4,) observations, int64 actions, float64 rewards and one
    # float64 extra output per step; infos are empty.
    return (n + 1) * 16 + n * 8 * 3


def _inputs(n):
    rng = np.random.default_rng(n)
    obs = [row.copy() for row in rng.standard_normal((n + 1, 4)).astype(np.float32)]
    actions = rng.integers(0, 2, n).tolist()
    rewards = rng.standard_normal(n).tolist()
    outputs = [{"vf": v} for v in rng.standard_normal(n).tolist()]
    return obs, actions, rewards, outputs


def held_bytes(cls, n, to_numpy=True, copies=1):
    """What an n-step episode of `cls` holds (after to_numpy() by default):
    the traced bytes that deleting it gives back, plus the inputs it refers
    to; averaged over `copies` such episodes alive at once. Caches that
    building them filled stay, so they do not count; full collections empty
    the interpreter's free lists, so neither do freed temporaries parked
    there, nor the episodes' own objects once freed. An object taken from a
    free list filled before tracing started is not traced at all: for small
    episodes, many copies make those few a negligible share."""
    obs, actions, rewards, outputs = _inputs(n)
    tracemalloc.start()
    try:
        episodes = []
        for _ in range(copies):
            episode = cls()
            episode.add_env_reset(obs[0])
            for t in range(n):
                episode.add_env_step(obs[t + 1], actions[t], rewards[t],
                                     extra_model_outputs=outputs[t])
            if to_numpy:
                episode.to_numpy()
            np.testing.assert_array_equal(episode.get_observations(-1), obs[-1])
            episodes.append(episode)
        inputs = held_input_bytes(episode, [*obs, *rewards, *(o["vf"] for o in outputs)])
        del episode
        gc.collect()
        with_episodes = tracemalloc.get_traced_memory()[0]
        episodes.clear()
        gc.collect()
        without = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return (with_episodes - without) / copies + inputs


def test_100k_step_episode_in_list_mode_holds_at_most_twice_its_raw_data():
    assert held_bytes(SingleAgentEpisode, 100_000, to_numpy=False) <= 2 * raw_bytes(100_000)


# 2**k + 1 steps: the length right after a capacity doubling, where spare
# capacity is largest.
@pytest.mark.parametrize("n", [1000, 1025, 4097, 10_000, 16_385, 65_537, 100_000])
def test_to_numpy_holds_at_most_1_3x_the_raw_data(n):
    held = held_bytes(SingleAgentEpisode, n)
    assert held <= 1.3 * raw_bytes(n), f"{held} bytes held for {raw_bytes(n)} raw"


@pytest.fixture(scope="module")
def rllib_episode():
    from difftools import rllib_buffer_class

    rllib_buffer_class()     # skips without ray[rllib]
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode

    return RLlibEpisode


# Short episodes are where this is closest (1,393 vs 1,418 bytes for a reset
# only): each of our tracks (a buffer, a Column, a Memory only while views of
# its block are out) weighs about what one of RLlib's does (a buffer with its
# attributes, an ndarray or a list), and RLlib's per-step info dicts then make
# the difference.
@pytest.mark.rllib
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 8, 13, 17, 100, 1025, 4097, 65_537])
def test_to_numpy_holds_no_more_than_rllib(rllib_episode, n):
    copies = max(1, 2000 // (n + 1))       # short ones: as a replay buffer holds them
    ours, theirs = held_bytes(SingleAgentEpisode, n, copies=copies), \
        held_bytes(rllib_episode, n, copies=copies)
    assert ours <= theirs, f"{n} steps: ours {ours} bytes, RLlib's {theirs}"


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="AddressSanitizer keeps freed blocks in its quarantine")
def test_rss_stays_flat_over_millions_of_appends_after_to_numpy():
    """Each round: a numpy'ized episode grows by a million steps, then is
    dropped. Blocks left behind by growth would add up round after round."""
    obs = np.zeros(4, np.float32)
    rss = []
    for _ in range(4):
        episode = SingleAgentEpisode()
        episode.add_env_reset(obs)
        episode.add_env_step(obs, 0, 1.0, extra_model_outputs={"vf": 0.5})
        episode.to_numpy()
        step = episode.add_env_step
        for t in range(1_000_000):
            step(obs, 1, 1.0, extra_model_outputs={"vf": 0.5})
        assert len(episode) == 1_000_001
        np.testing.assert_array_equal(episode.get_rewards(slice(-2, None)), [1.0, 1.0])
        del episode, step
        gc.collect()
        rss.append(_rss_bytes())
    # One round's data is 40 MB (80 MB of capacity at most).
    assert max(rss[1:]) - rss[1] < 16 * 2**20, rss


def _append_peak(to_numpy):
    """Traced peak (above the start) of 30 CartPole-sized steps appended to
    an episode whose storage has room for them, in list mode or after
    to_numpy()."""
    rng = np.random.default_rng(3)
    obs = [row.copy() for row in rng.standard_normal((201, 4)).astype(np.float32)]
    steps = [(obs[i + 1], i % 2, float(i), {"action_logp": np.float32(-i)})
             for i in range(200)]
    episode = SingleAgentEpisode()
    episode.add_env_reset(obs[0])
    for o, a, r, x in steps[:100]:
        episode.add_env_step(o, a, r, extra_model_outputs=x)
    if to_numpy:
        episode.to_numpy()
    # Past 128 rows (list mode's capacity) and 100 (to_numpy() trims to the
    # rows in use): either way there is room for 190 rows after this.
    for o, a, r, x in steps[100:160]:
        episode.add_env_step(o, a, r, extra_model_outputs=x)
    step = episode.add_env_step
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for o, a, r, x in steps[160:190]:
            step(o, a, r, extra_model_outputs=x)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(episode.get_extra_model_outputs("action_logp", -1),
                                  np.float32(-189))
    return peak


def test_steps_after_to_numpy_allocate_no_more_than_in_list_mode():
    """A step's numbers are written straight into the typed storage in both
    modes (numpy scalars included): no per-step temporaries, no checks that
    allocate. numpy's general append path would allocate on every step."""
    assert _append_peak(to_numpy=True) <= _append_peak(to_numpy=False)


def test_views_handed_out_after_to_numpy_survive_the_appends_that_grow_storage():
    """Growth reallocs the storage only when no view of it is out; views the
    getters, slices and cuts handed out keep their rows (the sanitizer run
    would also catch a read of a moved block)."""
    obs = [np.full(4, i, np.float32) for i in range(6001)]
    episode = SingleAgentEpisode()
    episode.add_env_reset(obs[0])
    for i in range(10):
        episode.add_env_step(obs[i + 1], i % 2, float(i), extra_model_outputs={"vf": -float(i)})
    episode.to_numpy()
    views = {
        "observations": episode.get_observations(slice(0, 5)),
        "data": episode.observations.data,
        "actions": episode.get_actions(),
        "rewards": episode.get_rewards(slice(-3, None)),
        "vf": episode.get_extra_model_outputs("vf"),
        "slice": episode[2:6].get_observations(),
        "cut": episode.cut(len_lookback_buffer=3).get_observations(),
    }
    copies = {k: v.copy() for k, v in views.items()}
    for i in range(10, 6000):
        episode.add_env_step(obs[i + 1], i % 2, float(i), extra_model_outputs={"vf": -float(i)})
    for key, view in views.items():
        np.testing.assert_array_equal(view, copies[key], err_msg=key)
    np.testing.assert_array_equal(episode.get_observations(), np.stack(obs))
    np.testing.assert_array_equal(episode.get_rewards(), np.arange(6000, dtype=np.float64))
