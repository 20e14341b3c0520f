"""add_transition(): SB3-style transitions of a vector env into the
single-agent buffers. The same steps added as one-step chunks through add()
give the same buffer: the same get_state(), samples and sample_batch()es
under the same seed. Bad input is refused before anything is stored."""
from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest

from difftools import compare
from replay_tools import plain_state
from episode import SingleAgentEpisode
from episode.replay import (EpisodeReplayBuffer, MultiAgentEpisodeReplayBuffer,
                            MultiAgentPrioritizedEpisodeReplayBuffer,
                            PrioritizedEpisodeReplayBuffer)
from episode.replay import transitions

STEP_BITS = (1 << 56) - 1      # an index without its store's tag


@pytest.fixture
def counted_ids(monkeypatch):
    """New episodes' ids e0, e1, ... in the order add_transition() opens them."""
    counter = itertools.count()
    monkeypatch.setattr(transitions, "_new_id", lambda: f"e{next(counter)}")


def _obs(rng, n, kind):
    if kind == "box":
        return rng.random((n, 3), np.float32)
    return {"pos": rng.random((n, 2)), "more": (rng.integers(0, 5, n),
                                               rng.integers(0, 255, (n, 2, 2), np.uint8))}


def _row(obs, i):
    if isinstance(obs, dict):
        return {k: _row(v, i) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_row(v, i) for v in obs)
    return obs[i]


def _stream(seed, n, steps, kind="box", with_infos=False, single=False):
    """(obs, next_obs, action, reward, terminated, truncated, infos) per
    vector step, each env's episodes ending at random (gymnasium's
    next-step autoreset: a done env's next obs starts its next episode)."""
    rng = np.random.default_rng(seed)
    obs = _obs(rng, n, kind)
    for step in range(steps):
        next_obs = _obs(rng, n, kind)
        done = rng.random(n)
        terminated, truncated = done < 0.08, (done >= 0.08) & (done < 0.12)
        action = rng.integers(0, 3, n)
        reward = rng.random(n).astype(np.float32)
        infos = [{"step": step, "env": i} if i % 2 else {} for i in range(n)] \
            if with_infos else None
        if single:
            yield (_row(obs, 0), _row(next_obs, 0), int(action[0]), float(reward[0]),
                   bool(terminated[0]), bool(truncated[0]), infos[0] if infos else None)
        else:
            yield obs, next_obs, action, reward, terminated, truncated, infos
        obs = next_obs


class _Chunks:
    """The same transitions as one-step episodes, for add()."""

    def __init__(self, n):
        self.ids = [None] * n
        self.t = [0] * n
        self.last_infos = [{}] * n
        self.counter = itertools.count()

    def chunks(self, obs, next_obs, action, reward, terminated, truncated, infos, single):
        out = []
        n = len(self.ids)
        for i in range(n):
            if self.ids[i] is None:
                self.ids[i], self.t[i], self.last_infos[i] = f"e{next(self.counter)}", 0, {}
            pick = (lambda x: x) if single else (lambda x: _row(x, i))
            info = (infos if single else infos[i]) if infos is not None else {}
            reward_i = np.asarray(reward)[()] if single else reward[i]
            episode = SingleAgentEpisode(
                id_=self.ids[i], observations=[pick(obs), pick(next_obs)],
                actions=[pick(action)], rewards=[reward_i],
                infos=[self.last_infos[i], info],
                terminated=bool(pick(terminated)),
                truncated=bool(pick(truncated)) and not bool(pick(terminated)),
                t_started=self.t[i], len_lookback_buffer=0)
            out.append(episode.to_numpy())
            self.t[i] += 1
            self.last_infos[i] = info
            if pick(terminated) or pick(truncated):
                self.ids[i] = None
        return out


def _same_buffers(one, two, prioritized, rounds=2):
    compare(plain_state(one.get_state()), plain_state(two.get_state()))
    for _ in range(rounds):
        a = one.sample_batch(16, n_step=3, **({"beta": 0.4} if prioritized else {}))
        b = two.sample_batch(16, n_step=3, **({"beta": 0.4} if prioritized else {}))
        a["indices"] &= STEP_BITS
        b["indices"] &= STEP_BITS
        compare(a, b)
        if prioritized:
            one.update_priorities(a["rewards"] + 0.5)
            two.update_priorities(b["rewards"] + 0.5)
        sequences = [buffer.sample_batch(4, batch_length_T=5, lookback=1) for buffer in (one, two)]
        for s in sequences:
            s["indices"] &= STEP_BITS
        compare(*sequences)
        episodes = [buffer.sample(batch_size_B=6, n_step=2, sample_episodes=True,
                                  include_infos=True) for buffer in (one, two)]
        # (A prioritized buffer's transitions have new ids.)
        compare([dict(e.get_state(), id_=None) for e in episodes[0]],
                [dict(e.get_state(), id_=None) for e in episodes[1]])
        if prioritized:
            one.update_priorities(np.linspace(0.1, 2.0, 6))
            two.update_priorities(np.linspace(0.1, 2.0, 6))
    compare(plain_state(one.get_state()), plain_state(two.get_state()))


@pytest.mark.parametrize("cls", [EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer])
@pytest.mark.parametrize("capacity", [17, 40, 10_000])
@pytest.mark.parametrize("kind, with_infos, n, single", [
    ("box", False, 4, False), ("dict", True, 3, False), ("box", True, 1, True),
    ("dict", False, 1, True), ("box", False, 8, False)])
def test_transitions_are_the_chunks_added(counted_ids, cls, capacity, kind, with_infos, n,
                                          single):
    ours = cls(capacity=capacity, seed=3)
    chunked = cls(capacity=capacity, seed=3)
    chunks = _Chunks(n)
    compiled = []
    steps = ours._add_steps
    ours._add_steps = lambda *args: compiled.append(steps(*args)) or compiled[-1]
    for k, step in enumerate(_stream(7, n, 60, kind, with_infos, single)):
        ours.add_transition(*step)
        chunked.add(chunks.chunks(*step, single=single))
        if k % 20 == 19:
            _same_buffers(ours, chunked, cls is PrioritizedEpisodeReplayBuffer)
    assert ours.get_num_episodes_evicted() == chunked.get_num_episodes_evicted()
    # The first call lays the store out through add(); the compiled path takes the rest.
    assert compiled == [True] * 59
    if capacity < 100:
        assert ours.get_num_episodes_evicted() > 0
    compare(ours.get_metrics(), chunked.get_metrics())


def test_a_vector_env_loop(counted_ids):
    # SB3's loop: same-step autoreset, a done env's next_obs is its final one.
    envs = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    buffer = PrioritizedEpisodeReplayBuffer(capacity=500, seed=0)
    chunked = PrioritizedEpisodeReplayBuffer(capacity=500, seed=0)
    chunks = _Chunks(4)
    obs, _ = envs.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(200):
        actions = rng.integers(0, 2, 4)
        next_obs, rewards, terminated, truncated, infos = envs.step(actions)
        final = next_obs.copy()
        for i in np.flatnonzero(infos.get("_final_obs", ())):
            final[i] = infos["final_obs"][i]
        buffer.add_transition(obs, final, actions, rewards, terminated, truncated)
        chunked.add(chunks.chunks(obs, final, actions, rewards, terminated, truncated, None,
                                  False))
        obs = next_obs
    envs.close()
    assert 400 < len(buffer) <= 500 and buffer.get_num_episodes_evicted() > 4
    _same_buffers(buffer, chunked, True)
    batch = buffer.sample_batch(32, n_step=3, beta=0.4)
    assert batch["obs"].shape == (32, 4) and batch["obs"].dtype == np.float32
    assert batch["rewards"].dtype == np.float64      # (the env's rewards)


def test_a_done_step_closes_the_episode_and_next_obs_is_stored_once(counted_ids):
    buffer = EpisodeReplayBuffer(capacity=100)
    obs = np.arange(6, dtype=np.float32).reshape(2, 3)
    for t in range(3):
        done = np.array([t == 1, False])
        buffer.add_transition(obs + t, obs + t + 1, np.array([t, t]),
                              np.array([1.0, 2.0]), done, np.zeros(2, bool))
    episodes = list(buffer.episodes)
    assert [(e.id_, len(e), e.is_terminated, e.t_started) for e in episodes] == [
        ("e0", 2, True, 0), ("e1", 3, False, 0), ("e2", 1, False, 0)]
    np.testing.assert_array_equal(episodes[1].get_observations(),
                                  np.array([[3, 4, 5], [4, 5, 6], [5, 6, 7], [6, 7, 8]],
                                           np.float32))
    np.testing.assert_array_equal(episodes[0].get_actions(), [0, 1])
    assert len(buffer) == 6


def _stored(buffer):
    return plain_state(buffer.get_state())


@pytest.mark.parametrize("cls", [EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer])
@pytest.mark.parametrize("args, error, words", [
    # a step of an open episode that does not start at its last next_obs
    (lambda o, a, r, f: (o + 1, o, a, r, f, f), ValueError, "env 0: obs is not the next_obs"),
    (lambda o, a, r, f: (o, o, a, r[:2], f, f), ValueError, "from 3 envs; this call has 2"),
    (lambda o, a, r, f: (o, o, a, r, f[:2], f), ValueError, "terminated must be of shape"),
    (lambda o, a, r, f: (o, o[:, :2], a, r, f, f), ValueError, "next_obs must be alike obs"),
    (lambda o, a, r, f: (o, o, a[:2], r, f, f), ValueError, "action must have the 3 envs"),
    (lambda o, a, r, f: (o.astype(np.float64), o.astype(np.float64), a, r, f, f),
     ValueError, "do not match the stored ones"),
    (lambda o, a, r, f: (o, o, a, r.astype(np.float32), f, f), ValueError,
     "do not match the stored ones"),
    (lambda o, a, r, f: (o, o, a, r.reshape(3, 1), f, f), ValueError, "one per env"),
    (lambda o, a, r, f: (o, o, a, np.array(["a", "b", "c"]), f, f), TypeError, "real numbers"),
    (lambda o, a, r, f: (o, o, a, r, np.array([2, 0, 0]), f), ValueError, "bools"),
    (lambda o, a, r, f: (o, o, a, r, np.array([0.5, 0, 0]), f), TypeError, "bools"),
    (lambda o, a, r, f: ({"x": o}, {"x": o}, a, r, f, f), ValueError, "must be an array"),
    (lambda o, a, r, f: (o, o, np.array(["a", "b", "c"]), r, f, f), TypeError, "numbers"),
    (lambda o, a, r, f: (o, o, a, r, f, f, [{}, {}]), TypeError, "infos must be"),
    (lambda o, a, r, f: (o, o, a, r, f, f, {"a": 1}), TypeError, "infos must be"),
    (lambda o, a, r, f: (o, o, [object()] * 3, r, f, f), TypeError, "numbers"),
])
def test_bad_input_is_refused_and_changes_nothing(counted_ids, cls, args, error, words):
    buffer = cls(capacity=100, seed=0)
    obs = np.ones((3, 4), np.float32)
    actions, rewards, flags = np.array([0, 1, 2]), np.zeros(3), np.zeros(3, bool)
    buffer.add_transition(obs, obs, actions, rewards, flags, flags)
    before = _stored(buffer)
    with pytest.raises(error, match=words):
        buffer.add_transition(*args(obs, actions, rewards, flags))
    compare(_stored(buffer), before)
    # The open episodes go on as before the refused call.
    buffer.add_transition(obs, obs, actions, rewards, flags, flags)
    assert [len(e) for e in buffer.episodes] == [2, 2, 2]


def test_nan_rewards_are_numbers():
    buffer = EpisodeReplayBuffer(capacity=100)
    obs = np.zeros((2, 1), np.float32)
    buffer.add_transition(obs, obs, np.array([0, 1]), np.array([np.nan, 1.0]),
                          np.array([True, True]), np.array([False, False]))
    rewards = [e.get_rewards()[0] for e in buffer.episodes]
    assert np.isnan(rewards[0]) and rewards[1] == 1.0


def test_set_state_closes_the_open_episodes(counted_ids):
    buffer = EpisodeReplayBuffer(capacity=100)
    obs = np.zeros((2, 1), np.float32)
    flags = np.zeros(2, bool)
    buffer.add_transition(obs, obs, np.array([0, 1]), np.zeros(2), flags, flags)
    buffer.set_state(buffer.get_state())
    buffer.add_transition(obs + 5, obs + 6, np.array([0, 1]), np.zeros(2), flags, flags)
    assert [(e.id_, len(e)) for e in buffer.episodes] == [("e0", 1), ("e1", 1), ("e2", 1),
                                                          ("e3", 1)]


@pytest.mark.parametrize("cls", [MultiAgentEpisodeReplayBuffer,
                                 MultiAgentPrioritizedEpisodeReplayBuffer])
def test_multi_agent_buffers_refuse_transitions(cls):
    with pytest.raises(TypeError, match="stores MultiAgentEpisodes"):
        cls(capacity=10).add_transition(np.zeros(1), np.zeros(1), 0, 1.0, False, False)


@pytest.mark.parametrize("cls", [EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer])
def test_transitions_into_a_frame_stacked_buffer(monkeypatch, cls):
    """A vector env of stacked frames (each next obs: the last three frames
    and a new one): a frame-stacked buffer fed by add_transition() answers
    as a plain one fed the same steps."""
    rng = np.random.default_rng(5)
    n = 3
    obs = rng.random((n, 4, 2), np.float32)
    steps = []
    for _ in range(60):
        frames = rng.random((n, 1, 2), np.float32)
        next_obs = np.concatenate([obs[:, 1:], frames], axis=1)
        done = rng.random(n) < 0.1
        steps.append((obs, next_obs, rng.integers(0, 2, n), rng.random(n), done,
                      np.zeros(n, bool)))
        # A done env starts over from a fresh stack.
        obs = np.where(done[:, None, None], rng.random((n, 4, 2), np.float32), next_obs)
    buffers = []
    for frame_stack in (4, None):
        counter = itertools.count()
        monkeypatch.setattr(transitions, "_new_id", lambda: f"e{next(counter)}")
        buffer = cls(capacity=200, frame_stack=frame_stack, seed=1)
        for args in steps:
            buffer.add_transition(*args)
        buffers.append(buffer)
    assert buffers[0]._stacked() is not None
    _same_buffers(*buffers, cls is PrioritizedEpisodeReplayBuffer)
    # The compiled step path writes whole rows: a stacked store refuses it.
    store = buffers[0]._store
    layout = store.layout
    assert isinstance(layout["obs"], int)
    with pytest.raises(ValueError, match="frame-stacked"):
        store.add_steps(["x"] * n, ["x"] * n, np.zeros(n, np.int64), [steps[0][0]],
                        [steps[0][1]], [steps[0][2]], [steps[0][3]], steps[0][4], steps[0][5],
                        None, np.arange(n))
