"""Views, slices and pieces made in C give back every reference they take."""
import gc
import tracemalloc

import gymnasium as gym
import numpy as np

from episode import InfiniteLookbackBuffer, SingleAgentEpisode


def _growth(fn, rounds=3000):
    fn()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(rounds):
        fn()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before


def test_buffer_views_do_not_leak():
    buf = InfiniteLookbackBuffer([np.zeros(4, np.float32)] * 100, lookback=2)
    buf.finalize()

    def use():
        buf[0:5]
        buf.get(-1)
        buf.get(slice(-3, 1), neg_index_as_lookback=True, fill=0.0)
        buf.sub_buffer(slice(0, 10), False, 1, None).get(0)

    assert _growth(use) < 20_000


def test_episode_pieces_do_not_leak():
    ep = SingleAgentEpisode()
    ep.add_env_reset(np.zeros(4, np.float32))
    for i in range(100):
        ep.add_env_step(np.full(4, i, np.float32), 1, 1.0, extra_model_outputs={"vf": 0.5})
    ep.to_numpy()

    def use():
        ep[10:20].get_observations(-1)
        ep.cut(len_lookback_buffer=2)

    assert _growth(use, rounds=1000) < 20_000


def test_fill_path_keeps_dtype_references_balanced():
    import sys

    buf = InfiniteLookbackBuffer([np.zeros(4, np.float32)] * 10)
    buf.finalize()
    dtype = np.dtype(np.float64)
    buf.get(slice(-3, 1), neg_index_as_lookback=True, fill=0.0)
    before = sys.getrefcount(dtype)
    for _ in range(1000):
        buf.get(slice(-3, 1), neg_index_as_lookback=True, fill=0.0)
    assert sys.getrefcount(dtype) - before < 10


def test_columns_of_numbers_are_out_of_the_collectors_sight():
    """A Column of numbers can be in no reference cycle, so the collector
    does not track it (a replay batch makes hundreds); one that holds
    objects is tracked from the moment it does, and a cycle through it is
    collected."""
    numeric = SingleAgentEpisode(observations=[np.zeros(3, np.float32)] * 3, actions=[0, 1],
                                 rewards=[0.0, 1.0])
    for episode in (numeric, numeric.to_numpy()):
        for buf in (episode.observations, episode.actions, episode.rewards, episode.infos):
            assert not gc.is_tracked(buf._tree)
    objects = SingleAgentEpisode(observations=["a", "b"], actions=[0], rewards=[1.0])
    assert gc.is_tracked(objects.observations._tree)
    moved = SingleAgentEpisode(observations=[1.0, 2.0], actions=[0], rewards=[1.0])
    moved.observations.append("x")             # the Column moves to the object path
    assert gc.is_tracked(moved.observations._tree)

    def cycle():
        episode = SingleAgentEpisode(observations=[0.0, 1.0], actions=[0], rewards=[1.0],
                                     infos=[{}, {}])
        episode.infos.append({"episode": episode})   # infos -> Column -> dict -> episode
    assert _growth(cycle, rounds=2000) < 50_000


def _drawn(infos=False):
    from episode.replay import PrioritizedEpisodeReplayBuffer

    buffer = PrioritizedEpisodeReplayBuffer(capacity=100, seed=0)
    for k in range(3):
        episode = SingleAgentEpisode(observation_space=gym.spaces.Box(-1, 1, (3,), np.float32))
        episode.add_env_reset(np.zeros(3, np.float32), infos={"k": k} if infos else {})
        for t in range(6):
            episode.add_env_step(np.full(3, t, np.float32), 1, 1.0, infos={"t": t} if infos else {},
                                 extra_model_outputs={"vf": np.float32(t)})
        buffer.add(episode)
    return buffer.sample(num_items=8, n_step=2, sample_episodes=True,
                         include_infos=infos)


def _buffers(episode):
    return [episode.observations, episode.actions, episode.rewards, episode.infos,
            *episode.extra_model_outputs.values()]


def test_drawn_transitions_are_out_of_the_collectors_sight_until_changed():
    """A replay draw makes hundreds of one-step episodes of numbers: their
    buffers can be in no reference cycle, so the collector does not track
    them (each tracked object that outlives a young collection brings the
    next full one closer). Any change tracks a buffer again: a value that
    moves a leaf to the object path, new storage, a space, a fill state;
    a cycle made through one afterwards is collected."""
    episodes = _drawn()
    for episode in episodes:
        assert not any(gc.is_tracked(buf) for buf in _buffers(episode))
    first = episodes[0]
    first.observations.append("x")                      # the leaf moves to the object path
    assert gc.is_tracked(first.observations)
    episodes[1].rewards.space = gym.spaces.Box(-1, 1, (), np.float32)
    assert gc.is_tracked(episodes[1].rewards)
    episodes[2].actions.finalize()
    assert not gc.is_tracked(episodes[2].actions)       # numbers still
    episodes[2].actions.get(slice(-3, 1), neg_index_as_lookback=True, fill=0)
    assert gc.is_tracked(episodes[2].actions)           # a fill state holds the fill
    episodes[3].extra_model_outputs["weights"].append({"x": 1})
    assert gc.is_tracked(episodes[3].extra_model_outputs["weights"])
    # Infos that are not all empty hold objects: tracked from the start.
    assert all(gc.is_tracked(e.infos) for e in _drawn(infos=True))

    def cycle():
        episode = _drawn()[0]
        episode.observations.append({"episode": episode})   # obs -> Column -> dict -> episode
        episode.extra_model_outputs["n_step"].append([episode])
    assert _growth(cycle, rounds=600) < 500_000     # a leaked cycle: ~2 KB a round


def test_a_leaf_outliving_its_untracked_buffer_is_released():
    """The leaf of an untracked buffer points back at it (to track it
    again): the buffer lets go of that pointer when it dies, so a leaf
    kept alone and changed later touches nothing freed."""
    # (The 200 collections are quick: tests/conftest.py keeps the objects
    # made before the test out of them.)
    for _ in range(200):
        episode = _drawn()[0]
        leaf = episode.observations._tree
        del episode
        gc.collect()
        leaf.append("x")        # tracks the leaf (its holder is gone)
        assert gc.is_tracked(leaf)
