"""episode.replay without RLlib: the native sample_batch() (transitions and
sequences, checked against the stored episodes recomputed in Python), Dict
observations, a Sampler's episodes added directly, pickling, file-backed
storage with a bounded resident size, and the memory a buffer holds."""
from __future__ import annotations

import gc
import os
import pickle
import tracemalloc

import gymnasium as gym
import numpy as np
import pytest

from episode import Sampler, SingleAgentEpisode, replay
from episode.replay import EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer
from episode.replay.stored import DEFAULT_AGENT_ID


def _episodes(n_episodes, *, seed=0, length=(3, 30), done=True):
    """Numpy'ized episodes with distinct observation rows (row i of episode
    e holds e * 1000 + i), random rewards; every other one truncated."""
    rng = np.random.default_rng(seed)
    out = []
    for e in range(n_episodes):
        n = int(rng.integers(*length))
        obs = [np.full(4, e * 1000 + i, np.float32) for i in range(n + 1)]
        out.append(SingleAgentEpisode(
            observations=obs, actions=[int(x) for x in rng.integers(0, 3, n)],
            rewards=[float(x) for x in rng.normal(size=n)], terminated=done and e % 2 == 0,
            truncated=done and e % 2 == 1, len_lookback_buffer=0).to_numpy())
    return out


def _source(episodes, obs_row):
    """The episode and step an observation row came from."""
    value = int(obs_row[0])
    episode = episodes[value // 1000]
    return episode, value % 1000


@pytest.mark.parametrize("n_step", [1, 3, (1, 5)])
@pytest.mark.parametrize("prioritized", [False, True])
def test_sample_batch_transitions_match_the_stored_episodes(n_step, prioritized):
    episodes = _episodes(40)
    buffer = (PrioritizedEpisodeReplayBuffer if prioritized else EpisodeReplayBuffer)(
        capacity=10_000)
    buffer.add(episodes)
    buffer.rng = np.random.default_rng(3)
    gamma = 0.9
    batch = buffer.sample_batch(64, n_step=n_step, gamma=gamma,
                                **({"beta": 0.5} if prioritized else {}))
    assert list(batch) == ["obs", "actions", "rewards", "new_obs", "terminateds", "truncateds",
                           "n_step", "weights", "indices"]
    assert batch["obs"].shape == (64, 4) and batch["obs"].dtype == np.float32
    assert batch["rewards"].dtype == np.float64 and batch["n_step"].dtype == np.int64
    for i in range(64):
        episode, t = _source(episodes, batch["obs"][i])
        steps = int(batch["n_step"][i])
        wanted = n_step if isinstance(n_step, int) else None
        assert 1 <= steps <= (wanted or 4) and (steps == wanted or t + steps == len(episode)
                                                or wanted is None)
        rewards = episode.get_rewards(slice(t, t + steps))
        assert batch["rewards"][i] == pytest.approx(sum(r * gamma ** k
                                                        for k, r in enumerate(rewards)))
        np.testing.assert_array_equal(batch["new_obs"][i], episode.get_observations(t + steps))
        assert batch["actions"][i] == episode.get_actions(t)
        ends = t + steps == len(episode)
        assert bool(batch["terminateds"][i]) == (ends and episode.is_terminated)
        assert bool(batch["truncateds"][i]) == (ends and episode.is_truncated)
    if not prioritized:
        np.testing.assert_array_equal(batch["weights"], np.ones(64, np.float32))


def test_prioritized_sample_batch_weights_and_updates():
    """Weights are (p * N) ** -beta over the largest possible one; the
    indices take update_priorities() as sample()'s do."""
    buffer = PrioritizedEpisodeReplayBuffer(capacity=1000, alpha=1.0)
    buffer.add(_episodes(10))
    buffer.rng = np.random.default_rng(0)
    batch = buffer.sample_batch(32, beta=0.0)
    np.testing.assert_array_equal(batch["weights"], np.ones(32, np.float32))
    # One step gets all the priority but the others' tiny share.
    priorities = np.full(32, 1e-6)
    priorities[0] = 1000.0
    buffer.update_priorities(priorities)
    batch = buffer.sample_batch(200, beta=1.0)
    leaves = np.array(buffer._store.leaves_of(batch["indices"]))
    counts = np.bincount(leaves)
    favourite = int(np.argmax(counts))
    assert counts[favourite] > 150
    n = buffer.get_num_timesteps()
    trees = buffer._store.priorities
    total, p_min = trees.sum(), trees.min() / trees.sum()
    p = trees.leaf_value(favourite)[0] / total
    expected = (p * n) ** -1.0 / (p_min * n) ** -1.0
    weights = batch["weights"][leaves == favourite]
    np.testing.assert_allclose(weights, expected, rtol=1e-6)


def test_sample_batch_sequences_stay_in_their_episode():
    episodes = _episodes(30, length=(2, 12))
    buffer = EpisodeReplayBuffer(capacity=10_000)
    buffer.add(episodes)
    buffer.rng = np.random.default_rng(1)
    T, lookback = 6, 2
    batch = buffer.sample_batch(50, batch_length_T=T, lookback=lookback)
    assert batch["obs"].shape == (50, lookback + T, 4)
    assert batch["mask"].shape == (50, lookback + T) and batch["lengths"].shape == (50,)
    for i in range(50):
        first = batch["obs"][i, lookback]
        episode, t = _source(episodes, first)
        length = int(batch["lengths"][i])
        assert length == min(T, len(episode) - t)
        for j in range(lookback + T):
            step = t - lookback + j
            valid = 0 <= step < t + length
            assert bool(batch["mask"][i, j]) == valid
            if valid:
                np.testing.assert_array_equal(batch["obs"][i, j], episode.get_observations(step))
                np.testing.assert_array_equal(batch["new_obs"][i, j],
                                              episode.get_observations(step + 1))
                assert batch["actions"][i, j] == episode.get_actions(step)
                assert batch["rewards"][i, j] == episode.get_rewards(step)
            else:
                assert not batch["obs"][i, j].any() and batch["actions"][i, j] == 0
        last = lookback + length - 1
        ends = t + length == len(episode)
        assert bool(batch["terminateds"][i, last]) == (ends and episode.is_terminated)
        assert bool(batch["truncateds"][i, last]) == (ends and episode.is_truncated)
        assert batch["terminateds"][i].sum() <= 1


def test_min_batch_length_T_skips_steps_near_the_end():
    buffer = EpisodeReplayBuffer(capacity=10_000)
    episodes = _episodes(20, length=(4, 10))
    buffer.add(episodes)
    buffer.rng = np.random.default_rng(2)
    batch = buffer.sample_batch(100, batch_length_T=3, min_batch_length_T=2)
    for row in batch["obs"][:, 0]:
        episode, t = _source(episodes, row)
        assert t + 2 < len(episode)


def test_dict_observations():
    space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,), np.float32),
                             "id": gym.spaces.Discrete(5)})
    rng = np.random.default_rng(0)
    episodes = []
    for e in range(5):
        n = 6
        obs = [{"pos": rng.normal(size=2).astype(np.float32), "id": e} for _ in range(n + 1)]
        episodes.append(SingleAgentEpisode(observations=obs, observation_space=space,
                                           actions=[0] * n, rewards=[1.0] * n,
                                           len_lookback_buffer=0).to_numpy())
    buffer = PrioritizedEpisodeReplayBuffer(capacity=100)
    buffer.add(episodes)
    buffer.rng = np.random.default_rng(0)
    batch = buffer.sample_batch(16, n_step=2)
    assert set(batch["obs"]) == {"pos", "id"} and batch["obs"]["pos"].shape == (16, 2)
    assert batch["obs"]["id"].dtype == episodes[0].get_observations(0)["id"].dtype
    sampled = buffer.sample(8, n_step=2)
    for episode in sampled:
        observation = episode.get_observations(0)
        assert set(observation) == {"pos", "id"}
        assert episode.observation_space == space


def test_a_samplers_episodes_go_in_directly():
    """Finished episodes and the cut chunks of running ones, chunk after
    chunk: the buffer joins the chunks of one episode."""
    sampler = Sampler(lambda: gym.make("CartPole-v1"), num_envs=4, seed=0,
                      rollout_fragment_length=25)
    buffer = PrioritizedEpisodeReplayBuffer(capacity=2000)
    added = chunks = 0
    for _ in range(6):
        episodes = sampler.sample_episodes()
        added += sum(len(e) for e in episodes)
        chunks += len(episodes)
        buffer.add(episodes)
    sampler.close()
    assert buffer.get_num_timesteps() == added >= 600
    assert buffer.get_num_episodes() < chunks   # running episodes' chunks were joined
    buffer.rng = np.random.default_rng(0)
    batch = buffer.sample_batch(128, n_step=3, beta=0.4)
    assert batch["obs"].shape == (128, 4) and batch["actions"].dtype == np.int64
    # n-step transitions across chunk boundaries come out whole.
    assert (batch["n_step"] == 3).sum() > 100


@pytest.mark.parametrize("cls", [EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer])
def test_pickling_gives_the_same_buffer(cls):
    buffer = cls(capacity=300)
    buffer.add(_episodes(30))
    buffer.rng = np.random.default_rng(5)
    # Protocol 5, the arrays out-of-band (as Ray's object store takes them).
    arrays: list = []
    data = pickle.dumps(buffer, protocol=5, buffer_callback=arrays.append)
    back = pickle.loads(data, buffers=arrays)
    assert arrays
    assert back.get_num_timesteps() == buffer.get_num_timesteps()
    assert back._indices == buffer._indices
    a, b = buffer.sample_batch(20, n_step=2), back.sample_batch(20, n_step=2)
    # (Indices name steps within one buffer object: not compared.)
    assert a.keys() == b.keys()
    for key in a.keys() - {"indices"}:
        np.testing.assert_array_equal(a[key], b[key])


def _rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"),
                    reason="reads the resident size from /proc")
@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="AddressSanitizer's shadow memory grows with every page touched")
def test_file_backed_storage_keeps_the_resident_size_bounded(tmp_path):
    """600 MB of 84x84 frames into files, then draws: the process holds
    only the block being filled and what one draw touches."""
    buffer = EpisodeReplayBuffer(capacity=90_000, storage=tmp_path)
    frames = np.random.default_rng(0).integers(0, 255, (1001, 84, 84), dtype=np.uint8)
    before = _rss()
    for i in range(90):
        frames[:, 0, 0] = i
        buffer.add(SingleAgentEpisode(observations=list(frames), actions=[0] * 1000,
                                      rewards=[1.0] * 1000, terminated=True,
                                      len_lookback_buffer=0).to_numpy())
    assert buffer.get_num_timesteps() == 90_000
    grown = _rss() - before
    buffer.rng = np.random.default_rng(1)
    for _ in range(60):
        batch = buffer.sample_batch(256, n_step=3)
        grown = max(grown, _rss() - before)
    assert grown < 150 << 20, grown
    # The data are there: each drawn frame holds its episode's number.
    assert set(np.unique(batch["obs"][:, 0, 0])) <= set(range(90))


def _raw_bytes(episodes) -> int:
    return sum(e.observations.data.nbytes + e.actions.data.nbytes + e.rewards.data.nbytes
               for e in episodes)


@pytest.mark.parametrize("steps", [4097, 8192, 16385, 32769, 50_000])
def test_memory_held_stays_within_a_fifth_of_the_data(steps):
    """tracemalloc: what the buffer holds against the bytes of the stored
    data (each observation once), at fill levels just past powers of two
    (where doubling storage would waste half)."""
    rng = np.random.default_rng(0)
    episodes, done = [], 0
    while done < steps:
        n = min(200, steps - done)
        obs = rng.normal(size=(n + 1, 4)).astype(np.float32)
        episodes.append(SingleAgentEpisode(
            observations=list(obs), actions=[int(a) for a in rng.integers(0, 2, n)],
            rewards=[1.0] * n, terminated=True, len_lookback_buffer=0).to_numpy())
        done += n
    raw = _raw_bytes(episodes)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        buffer = EpisodeReplayBuffer(capacity=50_000)
        buffer.add(episodes)
        del episodes
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert buffer.get_num_timesteps() == steps
    assert held <= 1.2 * raw, (held, raw)


def test_priorities_of_a_native_batch_skip_steps_evicted_since():
    """update_priorities(indices=batch["indices"]) after add() calls that
    evicted some drawn steps (and handed their tree leaves to new steps):
    the steps still stored get their priorities, the new ones keep theirs."""
    buffer = PrioritizedEpisodeReplayBuffer(capacity=40, alpha=1.0)
    buffer.add(_episodes(4, length=(10, 11)))
    buffer.rng = np.random.default_rng(0)
    batch = buffer.sample_batch(64)
    trees = buffer._store.priorities
    before = buffer._store.leaves_of(batch["indices"])
    assert -1 not in before
    buffer.add(_episodes(2, seed=1, length=(10, 11)))    # evicts the two oldest
    after = buffer._store.leaves_of(batch["indices"])
    gone = [k for k, leaf in enumerate(after) if leaf == -1]
    assert gone and len(gone) < len(after)
    reused = {before[k] for k in gone} & {leaf for leaf, _ in trees.used_leaves()}
    assert reused   # the freed leaves now stand for new steps
    buffer.update_priorities(np.full(64, 5.0), indices=batch["indices"])
    for leaf in {after[k] for k in range(len(after)) if after[k] != -1}:
        assert trees.leaf_value(leaf)[0] == 5.0
    for leaf in reused - set(after):
        assert trees.leaf_value(leaf)[0] == 1.0


def _filled(cls, seed=0):
    buffer = cls(capacity=500, seed=seed)
    rng = np.random.default_rng(seed)
    for k in range(6):
        episode = SingleAgentEpisode(observation_space=gym.spaces.Box(-9, 9, (3,), np.float32))
        episode.add_env_reset(rng.random(3).astype(np.float32))
        for t in range(20):
            episode.add_env_step(rng.random(3).astype(np.float32), int(rng.integers(2)),
                                 float(rng.random()), terminated=t == 19)
        buffer.add(episode.to_numpy())
    return buffer


def _view(episode, with_id=True):
    from replay_tools import episode_view

    return repr(episode_view(episode, with_id=with_id))


@pytest.mark.parametrize("cls", [EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer])
def test_spent_transitions_are_made_over_only_when_no_one_holds_them(cls):
    """A draw makes over the episodes of an earlier draw that no one holds
    any more (so it adds nothing for the garbage collector to track): the
    same samples as new episodes; an episode, its list, or its extra
    outputs' dict still held by the caller is never touched."""
    kw = dict(num_items=16, n_step=2, gamma=0.9, sample_episodes=True)
    kept_list = None
    held, held_views, held_outputs, outputs_view = [], [], None, None
    made_over = fresh = 0
    seen = set()
    recycled, reference = _filled(cls), _filled(cls)
    every = []                          # the reference keeps every list: nothing made over
    for draw in range(12):
        episodes = recycled.sample(**kw)
        every.append(reference.sample(**kw))
        assert [_view(e, False) for e in episodes] == [_view(e, False) for e in every[-1]]
        made_over += sum(id(e) in seen for e in episodes)
        fresh += sum(id(e) not in seen for e in episodes)
        seen.update(id(e) for e in episodes)
        if draw == 0:
            kept_list = episodes
            kept_views = [_view(e) for e in episodes]
        elif draw == 1:
            held = episodes[:4]
            held_views = [_view(e) for e in held]
            held_outputs = episodes[5].extra_model_outputs
            outputs_view = {k: v.get() for k, v in held_outputs.items()}
        del episodes
    assert made_over > 0 and fresh > 0
    assert [_view(e) for e in kept_list] == kept_views
    assert [_view(e) for e in held] == held_views
    assert {k: v.get() for k, v in held_outputs.items()} == outputs_view


@pytest.mark.parametrize("cls", [EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer])
def test_a_subclass_update_add_metrics_is_called_with_the_counts(cls):
    """add() tallies its metrics without RLlib's per-key calls, unless a
    subclass has its own _update_add_metrics(): that one is called, with
    RLlib's arguments, and what it logs is what the buffer reports."""
    calls = []

    class Mine(cls):
        def _update_add_metrics(self, **counts):
            calls.append(counts)
            super()._update_add_metrics(**counts)

    plain, mine = cls(capacity=40), Mine(capacity=40)
    for episodes in (_episodes(2, seed=1), _episodes(3, seed=2), _episodes(1, seed=3)):
        plain.add(episodes)
        mine.add(episodes)
    assert len(calls) == 3
    assert [c["num_env_steps_added"] for c in calls] == [
        sum(len(e) for e in _episodes(n, seed=s)) for n, s in ((2, 1), (3, 2), (1, 3))]
    assert calls[0]["agent_to_num_episodes_added"] == {DEFAULT_AGENT_ID: 2}
    reported = plain.get_metrics()
    assert sum(c["num_episodes_evicted"] for c in calls) == reported["num_episodes_evicted"] > 0
    assert mine.get_metrics() == reported


@pytest.mark.parametrize("T", [None, 4])
@pytest.mark.parametrize("cls", [replay.EpisodeReplayBuffer, replay.PrioritizedEpisodeReplayBuffer,
                                 replay.MultiAgentEpisodeReplayBuffer,
                                 replay.MultiAgentPrioritizedEpisodeReplayBuffer])
def test_sample_batch_counts_its_items_as_sample_does(cls, T):
    """get_sampled_timesteps() counts sample_batch()'s items as it counts
    sample()'s (a sequence's at T steps; per module on the multi-agent
    buffers, and once per call in the total)."""
    buffer = cls(capacity=500)
    if cls.__name__.startswith("MultiAgent"):
        from episode import MultiAgentEpisode
        for _ in range(3):
            episode = MultiAgentEpisode()
            episode.add_env_reset(observations={"a": np.zeros(2, np.float32),
                                                "b": np.zeros(2, np.float32)})
            for t in range(12):
                episode.add_env_step({"a": np.full(2, t, np.float32),
                                      "b": np.full(2, t, np.float32)}, {"a": 0, "b": 1},
                                     {"a": 1.0, "b": 2.0})
            buffer.add(episode.to_numpy())
        buffer.sample_batch(5, batch_length_T=T)
        assert buffer.get_sampled_timesteps() == 5 * (T or 1)
        assert buffer._modules
        for module_id in buffer._modules:
            assert buffer.get_sampled_timesteps(module_id) == 5 * (T or 1)
    else:
        for _ in range(3):
            episode = SingleAgentEpisode(observations=[np.zeros(2, np.float32)] * 13,
                                         actions=[0] * 12, rewards=[1.0] * 12,
                                         len_lookback_buffer=0)
            buffer.add(episode.to_numpy())
        buffer.sample_batch(5, batch_length_T=T)
        assert buffer.get_sampled_timesteps() == 5 * (T or 1)
    if T is None:
        buffer.sample(3, batch_length_T=1)
        assert buffer.get_sampled_timesteps() == 5 + 3
