"""Frame-stacked observations stored once per frame (`frame_stack=`): the
same buffer data with and without the option gives the same answers
(samples, native batches, states, round trips, evictions), and the same as
RLlib 2.60's buffers on the same seeded draws; rows that do not overlap as
a stack does are stored whole; the memory is a frame per step."""
from __future__ import annotations

import gc
import json
import os
import pickle
import subprocess
import sys
import tracemalloc

import gymnasium as gym
import numpy as np
import pytest

from children import UNDER_ASAN
from difftools import compare
from replay_tools import (chunk_episode, chunked_stream, episode_view, module_of, plain_state,
                         single_agent_stream, state_view)

from episode import SingleAgentEpisode
from episode.replay import EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer
from episode.replay.frames import frame_settings, frame_stack_of

KEY_STEP_MASK = (1 << 56) - 1

# (frame shape, dtype, frames per stack, stack axis, the stacked row's axis
# for np.stack/np.concatenate): the layouts of gymnasium's
# FrameStackObservation (axis 0), RLlib's Atari FrameStack (last axis, one
# channel a frame, or several), and a middle axis of float frames.
LAYOUTS = {
    "first_axis": ((6, 5), np.uint8, 4, 0),
    "last_axis": ((6, 5, 1), np.uint8, 4, -1),
    "last_axis_wide": ((8, 9, 1), np.uint8, 4, -1),
    "last_axis_channels": ((6, 5, 2), np.uint8, 4, -1),
    "middle_axis_float": ((3, 2, 5), np.float32, 3, 1),
}


def _stack(frames, axis):
    # Axis 0 of frames without one (FrameStackObservation); else along an
    # axis the frames have (RLlib's FrameStack concatenates channels).
    if frames[0].ndim == 2 and axis == 0:
        return np.stack(frames, axis=0)
    return np.concatenate(frames, axis=axis)


def stacked_stream(seed, layout, *, n_envs=3, calls=14, fragment=(1, 7), max_len=25,
                   glitch=0.06):
    """Per add() call, the chunks of `n_envs` envs (single_agent_stream's
    format) whose observations are frame stacks: each step adds a frame;
    a reset repeats its frame (or pads zeros); with probability `glitch`
    an observation is a fresh random stack that overlaps nothing."""
    shape, dtype, k, axis = LAYOUTS[layout]

    def frame(rng):
        if np.dtype(dtype).kind == "f":
            return rng.normal(size=shape).astype(dtype)
        return rng.integers(0, 256, shape, dtype=dtype)

    def observe(rng, state, first):
        if first:
            new = frame(rng)
            pad = [new] * (k - 1) if rng.random() < 0.7 else [np.zeros(shape, dtype)] * (k - 1)
            state["frames"] = pad + [new]
        elif rng.random() < glitch:
            state["frames"] = [frame(rng) for _ in range(k)]
        else:
            state["frames"] = state["frames"][1:] + [frame(rng)]
        return _stack(state["frames"], axis)

    return single_agent_stream(seed, n_envs=n_envs, calls=calls, fragment=fragment,
                               max_len=max_len, observe=observe, prefix="f")


def _pair(cls, layout, capacity, **kwargs):
    # The same buffer without and with frame stacking, their rngs seeded alike.
    _, _, k, axis = LAYOUTS[layout]
    plain = cls(capacity=capacity, seed=7, **kwargs)
    frames = cls(capacity=capacity, seed=7, frame_stack=k, frame_stack_axis=axis, **kwargs)
    return plain, frames


def _same_batch(a, b, where, keys=True):
    assert list(a) == list(b), where
    for key in a:
        x, y = a[key], b[key]
        if key == "indices" and not keys:
            continue    # (a restored store numbers its steps anew)
        if key == "indices":
            # (Each store tags its keys: the steps they name are the same.)
            x, y = x & KEY_STEP_MASK, y & KEY_STEP_MASK
        compare(y, x, f"{where}: {key}")


def _same_state(a, b, where):
    compare(state_view(b.get_state()), state_view(a.get_state()), f"{where}: state")


def _views(episodes, with_id=True):
    return [episode_view(e, with_id=with_id) for e in episodes]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("numpy", [True, False])
def test_uniform_same_answers_with_and_without_frames(layout, numpy):
    plain, frames = _pair(EpisodeReplayBuffer, layout, capacity=120)
    for i, call in enumerate(stacked_stream(3, layout, calls=20)):
        for buffer in (plain, frames):
            buffer.add([chunk_episode(SingleAgentEpisode, c, numpy=numpy, extras=True,
                                      lookback=True) for c in call])
        where = f"{layout} call {i}"
        for name in ("get_num_timesteps", "get_num_episodes", "get_num_episodes_evicted",
                     "get_added_timesteps"):
            assert getattr(frames, name)() == getattr(plain, name)(), (where, name)
        assert frames._indices == plain._indices, where
        compare(_views(frames.episodes), _views(plain.episodes), f"{where}: episodes")
        n_step = 1 + i % 3 if i % 2 else (1, 4)
        compare(_views(frames.sample(16, sample_episodes=True, n_step=n_step, lookback=i % 2,
                                     include_extra_model_outputs=True)),
                _views(plain.sample(16, sample_episodes=True, n_step=n_step, lookback=i % 2,
                                    include_extra_model_outputs=True)), f"{where}: sample")
        compare(_views(frames.sample(4, sample_episodes=True, n_step=1, batch_length_T=5)),
                _views(plain.sample(4, sample_episodes=True, n_step=1, batch_length_T=5)),
                f"{where}: sequences")
        compare(frames.sample(2, batch_length_T=3), plain.sample(2, batch_length_T=3),
                f"{where}: B x T")
        _same_batch(plain.sample_batch(32, n_step=n_step, gamma=0.9),
                    frames.sample_batch(32, n_step=n_step, gamma=0.9), where)
        _same_batch(plain.sample_batch(8, batch_length_T=4, lookback=2),
                    frames.sample_batch(8, batch_length_T=4, lookback=2), f"{where} T=4")
        _same_state(plain, frames, where)
        assert plain.rng.bit_generator.state == frames.rng.bit_generator.state
    assert frames.get_num_episodes_evicted() > 0


@pytest.fixture
def without_avx2():
    from episode import _frames

    was = _frames._use_avx2(False)
    yield
    _frames._use_avx2(was)


def test_the_loops_without_avx2_give_the_same_rows(without_avx2):
    test_uniform_same_answers_with_and_without_frames("last_axis_wide", True)


@pytest.mark.parametrize("layout", ["first_axis", "last_axis"])
def test_prioritized_same_answers_with_and_without_frames(layout):
    plain, frames = _pair(PrioritizedEpisodeReplayBuffer, layout, capacity=100, alpha=0.6)
    rng = np.random.default_rng(2)
    for i, call in enumerate(stacked_stream(4, layout)):
        for buffer in (plain, frames):
            buffer.add([chunk_episode(SingleAgentEpisode, c, numpy=True, extras=True,
                                      lookback=True) for c in call])
        where = f"{layout} call {i}"
        assert frames._indices == plain._indices, where
        n_step = 3 if i % 2 else (1, 3)
        got = frames.sample(16, n_step=n_step, beta=0.4, include_infos=True,
                            include_extra_model_outputs=True)
        want = plain.sample(16, n_step=n_step, beta=0.4, include_infos=True,
                            include_extra_model_outputs=True)
        compare(_views(got, with_id=False), _views(want, with_id=False), f"{where}: sample")
        priorities = np.abs(rng.normal(size=len(got))).astype(np.float32)
        plain.update_priorities(priorities)
        frames.update_priorities(priorities)
        a = plain.sample_batch(32, n_step=3, beta=0.4, gamma=0.99)
        b = frames.sample_batch(32, n_step=3, beta=0.4, gamma=0.99)
        _same_batch(a, b, where)
        p = np.abs(rng.normal(size=32))
        plain.update_priorities(p, a["indices"])
        frames.update_priorities(p, b["indices"])
        _same_state(plain, frames, where)
    assert frames.get_num_episodes_evicted() > 0


@pytest.mark.parametrize("cls", [EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer])
def test_states_round_trip_across_the_option(cls):
    # A checkpoint of either buffer loads into the other and into a pickle:
    # the same samples follow.
    plain, frames = _pair(cls, "last_axis", capacity=80)
    for call in stacked_stream(5, "last_axis", calls=10):
        for buffer in (plain, frames):
            buffer.add([chunk_episode(SingleAgentEpisode, c, numpy=True, extras=False,
                                      lookback=True) for c in call])
    into_frames = cls(capacity=80, frame_stack=4, frame_stack_axis=-1)
    into_frames.set_state(plain.get_state())
    into_plain = cls(capacity=80)
    into_plain.set_state(frames.get_state())
    unpickled = pickle.loads(pickle.dumps(frames))
    assert unpickled._store.frame_stack == 4 and unpickled._store.frame_axis == -1
    for buffer in (into_frames, into_plain, unpickled, plain):
        buffer.rng = np.random.default_rng(11)
    want = plain.sample_batch(64, n_step=2)
    for buffer in (into_frames, into_plain, unpickled):
        _same_batch(want, buffer.sample_batch(64, n_step=2), type(buffer).__name__,
                    keys=False)
        _same_state(plain, buffer, "round trip")


def test_rows_that_do_not_overlap_are_stored_whole():
    # Every observation a fresh stack: four new frames a row, the same rows back.
    rng = np.random.default_rng(0)
    obs = [rng.integers(0, 256, (4, 3, 3), dtype=np.uint8) for _ in range(9)]
    episode = SingleAgentEpisode(observations=obs, actions=[0] * 8, rewards=[1.0] * 8,
                                 len_lookback_buffer=0)
    buffer = EpisodeReplayBuffer(capacity=100, frame_stack=4)
    buffer.add(episode)
    (stats,) = buffer._store.frame_stats().values()
    assert stats["frames"] == 9 * 4
    stored = buffer.episodes[0].get_observations()
    np.testing.assert_array_equal(stored, np.stack(obs))


def test_overlapping_rows_take_a_frame_each():
    # A reset repeating its frame is one frame; each step then adds one.
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (3, 3), dtype=np.uint8) for _ in range(10)]
    stacks = [np.stack([frames[max(0, t - 3 + j)] for j in range(4)]) for t in range(10)]
    episode = SingleAgentEpisode(observations=stacks, actions=[0] * 9, rewards=[1.0] * 9,
                                 len_lookback_buffer=0)
    buffer = EpisodeReplayBuffer(capacity=100, frame_stack=4)
    buffer.add(episode)
    assert buffer._store.frame_stats()[0]["frames"] == 10
    np.testing.assert_array_equal(buffer.episodes[0].get_observations(), np.stack(stacks))


def test_a_chunk_whose_first_row_differs_in_bytes_keeps_its_own():
    # -0.0 == 0.0 joins the chunk (numpy's ==), but the rows are the chunk's
    # bytes, as without the option.
    first = SingleAgentEpisode(id_="e", observations=[np.zeros((2, 3), np.float32)] * 2,
                               actions=[0], rewards=[1.0], len_lookback_buffer=0)
    second = SingleAgentEpisode(id_="e", observations=[np.full((2, 3), -0.0, np.float32),
                                                       np.ones((2, 3), np.float32)],
                                actions=[1], rewards=[2.0], t_started=1,
                                len_lookback_buffer=0)
    plain, frames = EpisodeReplayBuffer(capacity=10), EpisodeReplayBuffer(capacity=10,
                                                                          frame_stack=2)
    for buffer in (plain, frames):
        buffer.add(first)
        buffer.add(second)
    got, want = frames.episodes[0].get_observations(), plain.episodes[0].get_observations()
    assert np.signbit(np.asarray(want[1])).all()
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()


def test_dict_observations_stack_the_leaves_that_stack():
    rng = np.random.default_rng(0)

    def obs(t):
        return {"pixels": np.stack([np.full((3, 3), max(0, t - 1 + j), np.uint8)
                                    for j in range(2)]),
                "speed": rng.normal(size=3).astype(np.float32)}

    episode = SingleAgentEpisode(observations=[obs(t) for t in range(6)], actions=[0] * 5,
                                 rewards=[1.0] * 5, len_lookback_buffer=0)
    plain = EpisodeReplayBuffer(capacity=20, seed=1)
    frames = EpisodeReplayBuffer(capacity=20, seed=1, frame_stack=2)
    for buffer in (plain, frames):
        buffer.add(episode)
    assert list(frames._store.frame_stats()) == [0]      # the pixels' leaf only
    compare(frames.get_state()["episodes"], plain.get_state()["episodes"])
    _same_batch(plain.sample_batch(8, n_step=2), frames.sample_batch(8, n_step=2), "dict")


def test_frames_are_freed_with_their_episodes():
    buffer = EpisodeReplayBuffer(capacity=2000, frame_stack=4)
    rng = np.random.default_rng(0)
    for e in range(40):
        frames = [rng.integers(0, 256, (8, 8), dtype=np.uint8) for _ in range(201)]
        stacks = [np.stack([frames[max(0, t - 3 + j)] for j in range(4)]) for t in range(201)]
        buffer.add(SingleAgentEpisode(observations=stacks, actions=[0] * 200,
                                      rewards=[0.0] * 200, terminated=True,
                                      len_lookback_buffer=0))
    stats = buffer._store.frame_stats()[0]
    assert stats["frames"] == 40 * 201
    # 2000 steps stored (ten episodes); their frames held, in chunks of at
    # most 2000 // 16 frames, one partly used at either end.
    chunk_frames = stats["bytes"] // stats["chunks"] // 64
    assert stats["chunks"] * chunk_frames <= 10 * 201 + 2 * chunk_frames


# -- arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize("shape, kwargs, message", [
    ((3,), dict(frame_stack=4), "no observation has an axis of length 4"),
    ((4, 4, 8), dict(frame_stack=4), "2 axes of length 4"),
    ((6, 5), dict(frame_stack=4, frame_stack_axis=1), "axis 1 of a length divisible by 4"),
    ((4,), dict(frame_stack=4), "no observation has an axis of length 4"),
])
def test_observations_that_do_not_stack_are_refused_unchanged(shape, kwargs, message):
    buffer = EpisodeReplayBuffer(capacity=10, **kwargs)
    episode = SingleAgentEpisode(observations=[np.zeros(shape, np.uint8)] * 3, actions=[0, 1],
                                 rewards=[0.0, 1.0], len_lookback_buffer=0)
    with pytest.raises(ValueError, match=message):
        buffer.add(episode)
    assert len(buffer) == 0 and buffer.get_num_episodes() == 0


def test_string_observations_are_refused_unchanged():
    buffer = PrioritizedEpisodeReplayBuffer(capacity=10, frame_stack=2)
    episode = SingleAgentEpisode(observations=["a", "b"], actions=[0], rewards=[0.0],
                                 len_lookback_buffer=0)
    with pytest.raises(ValueError, match="no observation has an axis of length 2"):
        buffer.add(episode)
    assert len(buffer) == 0


@pytest.mark.parametrize("frame_stack, axis, error", [
    (1, None, ValueError), (-4, None, ValueError), (2000, None, ValueError),
    (True, None, TypeError), ("4", None, TypeError), (4.0, None, TypeError),
    (4, 1.5, TypeError), (4, True, TypeError), (None, 0, ValueError), (0, -1, ValueError),
    (np.bool_(True), None, TypeError), (np.int8(1), None, ValueError),
])
def test_bad_frame_arguments(frame_stack, axis, error):
    with pytest.raises(error):
        EpisodeReplayBuffer(capacity=10, frame_stack=frame_stack, frame_stack_axis=axis)
    with pytest.raises(error):
        PrioritizedEpisodeReplayBuffer(capacity=10, frame_stack=frame_stack,
                                       frame_stack_axis=axis)


def test_off_by_default():
    assert frame_settings(None, None) is None and frame_settings(0, None) is None
    buffer = EpisodeReplayBuffer(capacity=10)
    assert buffer._store.frame_stack == 0 and buffer._store.frame_stats() == {}


def test_frame_stack_of_a_wrapped_env():
    env = gym.wrappers.FrameStackObservation(gym.make("CartPole-v1"), stack_size=3)
    assert frame_stack_of(env) == (3, 0)
    assert frame_settings(env, None) == (3, 0)
    assert frame_settings(env, -1) == (3, -1)
    buffer = EpisodeReplayBuffer(capacity=10, frame_stack=env)
    assert buffer._store.frame_stack == 3 and buffer._store.frame_axis == 0
    with pytest.raises(ValueError, match="no frame-stacking wrapper"):
        frame_stack_of(gym.make("CartPole-v1"))
    with pytest.raises(ValueError, match="no frame-stacking wrapper"):
        EpisodeReplayBuffer(capacity=10, frame_stack=gym.make("CartPole-v1"))


def test_frame_stack_of_rllibs_atari_wrapper():
    wrappers = pytest.importorskip("ray.rllib.env.wrappers.atari_wrappers")

    class Frames(gym.Env):
        observation_space = gym.spaces.Box(0, 255, (6, 5, 1), np.uint8)
        action_space = gym.spaces.Discrete(2)

    assert frame_stack_of(wrappers.FrameStack(Frames(), 4)) == (4, -1)


def test_a_gymnasium_frame_stack_stored_once():
    # Episodes of FrameStackObservation's observations (CartPole, 4 deep):
    # one frame a step, the same samples as without the option.
    env = gym.wrappers.FrameStackObservation(gym.make("CartPole-v1"), stack_size=4)
    plain = EpisodeReplayBuffer(capacity=500, seed=0)
    frames = EpisodeReplayBuffer(capacity=500, seed=0, frame_stack=env)
    obs, _ = env.reset(seed=0)
    episode = SingleAgentEpisode(observations=[obs])
    steps = 0
    while steps < 300:
        obs, reward, term, trunc, _ = env.step(env.action_space.sample())
        episode.add_env_step(obs, 0, float(reward), terminated=term, truncated=trunc)
        steps += 1
        if term or trunc:
            for buffer in (plain, frames):
                buffer.add(episode)
            obs, _ = env.reset()
            episode = SingleAgentEpisode(observations=[obs])
    stats = frames._store.frame_stats()[0]
    assert stats["frames"] <= len(frames) + frames.get_num_episodes() + 1
    _same_batch(plain.sample_batch(64, n_step=3), frames.sample_batch(64, n_step=3), "cartpole")
    _same_state(plain, frames, "cartpole")


# -- memory ----------------------------------------------------------------------------------


def _traced_bytes_of_filled_buffer(frame_stack, steps=2400, episode_len=600):
    # Memory held by a buffer of `steps` 84x84x4 uint8 observations (traced
    # numpy allocations), episodes built and dropped one at a time.
    rng = np.random.default_rng(0)
    gc.collect()
    tracemalloc.start()
    try:
        buffer = EpisodeReplayBuffer(capacity=steps, frame_stack=frame_stack,
                                     frame_stack_axis=-1 if frame_stack else None)
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(steps // episode_len):
            frames = rng.integers(0, 256, (episode_len + 1, 84, 84, 1), dtype=np.uint8)
            episode = SingleAgentEpisode(observations=[
                np.concatenate([frames[max(0, t - 3 + j)] for j in range(4)], axis=-1)
                for t in range(episode_len + 1)], actions=[0] * episode_len,
                rewards=[0.0] * episode_len, terminated=True, len_lookback_buffer=0)
            buffer.add(episode)
            del episode, frames
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(buffer) == steps
    return held


def test_a_frame_stacked_atari_buffer_holds_a_frame_a_step():
    row = 84 * 84 * 4
    held = _traced_bytes_of_filled_buffer(4)
    # A frame (a quarter row) per step, with room for the partly used chunks
    # and the per-step numbers; whole rows would take four times as much.
    assert held < 2400 * row * 0.3, held
    assert held > 2400 * row * 0.25 * 0.9, held


def test_whole_rows_take_four_times_the_memory():
    # (The figure the frame-stacked buffer is measured against.)
    assert _traced_bytes_of_filled_buffer(None) > 2400 * 84 * 84 * 4 * 0.95


# The resident size of a frame-stacked Atari buffer, in a process of its own:
# random 84x84 frames, a fresh one a step, stacked 4 deep on the last axis
# (the reset observation repeats its frame, as RLlib's FrameStack does);
# episode lengths drawn around `length` (half to one and a half times it);
# each episode's arrays alive while add() runs, as a sampler's are. Prints
# the resident bytes added by the fill (after one episode was made and
# dropped: the allocator's state once it has seen one), the steps and the
# episodes.
_RESIDENT_CHILD = """
import gc, json, os, sys
import numpy as np
from episode import SingleAgentEpisode
from episode.replay import EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer

def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def episode(rng, length):
    frames = rng.integers(0, 256, (length + 1, 84, 84, 1), dtype=np.uint8)
    padded = np.concatenate([frames[:1]] * 3 + [frames])
    obs = np.concatenate([padded[j:j + length + 1] for j in range(4)], axis=-1)
    return obs, SingleAgentEpisode(observations=list(obs), actions=[1] * length,
                                   rewards=[0.5] * length, terminated=True,
                                   len_lookback_buffer=0).to_numpy()

length, steps, prioritized = (int(a) for a in sys.argv[1:])
rng = np.random.default_rng(0)
cls = PrioritizedEpisodeReplayBuffer if prioritized else EpisodeReplayBuffer
buffer = cls(capacity=steps, frame_stack=4)
episode(rng, length)
gc.collect()
base, added, episodes = resident(), 0, 0
while added < steps:
    obs, ep = episode(rng, min(int(rng.integers(length // 2, length * 3 // 2 + 1)),
                               steps - added))
    buffer.add(ep)
    added, episodes = added + len(ep), episodes + 1
    del obs, ep
gc.collect()
print(json.dumps([resident() - base, len(buffer), episodes]))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm") or UNDER_ASAN,
                    reason="reads /proc/self/statm; measures the C allocator's heap")
@pytest.mark.parametrize("length,prioritized,steps", [
    (100, False, 60_000), (1_000, False, 240_000), (1_000, True, 240_000),
    (10_000, False, 60_000)])
def test_a_frame_stacked_atari_buffer_is_resident_as_its_data(length, prioritized, steps):
    # Each episode's frames (its steps and its first observation: the reset
    # repeats its frame) and the per-step action and reward, within 5%,
    # plus the free pages glibc's heap keeps from the episodes that passed
    # through: a constant, about 110 MB with 1,000-step episodes (their
    # arrays are about 70 MB each) at 60k, 120k and 1M steps alike, 1.020x
    # at 1M. The buffer's own storage is mapped page by page: from the heap,
    # it was laid among the episodes' freed arrays and kept 1-2 MB of them
    # resident per 1,000-step episode (1.24-1.26x at 120k steps, over this
    # bound; 1.31-1.36x at 60k).
    # (Run in tests/: from the checkout's root the source folder would
    # shadow the installed package.)
    out = subprocess.run([sys.executable, "-c", _RESIDENT_CHILD, str(length), str(steps),
                          str(int(prioritized))], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.abspath(__file__)))
    resident, stored, episodes = json.loads(out.stdout)
    assert stored == steps
    data = (steps + episodes) * 84 * 84 + steps * (8 + 8)
    assert resident <= 1.05 * data + (128 << 20), (resident / steps, data / steps)


def test_mapped_pages_are_zeroed_writable_and_traced():
    # (The store's memory: tracemalloc sees it as it sees numpy's arrays.)
    from episode._pages import Pages
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        pages = np.frombuffer(Pages(1 << 20), np.uint8)
        assert tracemalloc.get_traced_memory()[0] - before >= 1 << 20
        assert not pages.any() and pages.flags.writeable
        pages[-1] = 7
        assert pages[-1] == 7
        del pages
        assert tracemalloc.get_traced_memory()[0] - before < 1 << 10
    finally:
        tracemalloc.stop()
    with pytest.raises(ValueError):
        Pages(-1)


# -- RLlib's buffers ---------------------------------------------------------------------


@pytest.mark.rllib
@pytest.mark.parametrize("prioritized", [False, True])
def test_against_rllib_with_frames(prioritized):
    pytest.importorskip("ray.rllib")
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode as TheirEpisode
    from ray.rllib.utils.replay_buffers import (EpisodeReplayBuffer as TheirERB,
                                                PrioritizedEpisodeReplayBuffer as TheirPERB)

    if prioritized:
        theirs = TheirPERB(capacity=50, alpha=0.6)
        ours = PrioritizedEpisodeReplayBuffer(capacity=50, alpha=0.6, frame_stack=4,
                                              frame_stack_axis=-1)
    else:
        theirs = TheirERB(capacity=50)
        ours = EpisodeReplayBuffer(capacity=50, frame_stack=4, frame_stack_axis=-1)
    theirs.rng, ours.rng = np.random.default_rng(5), np.random.default_rng(5)
    rng = np.random.default_rng(6)
    for i, call in enumerate(stacked_stream(8, "last_axis", calls=10)):
        theirs.add([chunk_episode(TheirEpisode, c, numpy=True, extras=False, lookback=True)
                    for c in call])
        ours.add([chunk_episode(SingleAgentEpisode, c, numpy=True, extras=False, lookback=True)
                  for c in call])
        assert ours._indices == theirs._indices
        assert ours.get_num_episodes_evicted() == theirs.get_num_episodes_evicted()
        if prioritized:
            kwargs = dict(n_step=3, beta=0.4, gamma=0.9)
            a, b = theirs.sample(8, **kwargs), ours.sample(8, **kwargs)
            compare(_views(b, with_id=False), _views(a, with_id=False), f"call {i}")
            priorities = np.abs(rng.normal(size=len(a))).astype(np.float32)
            theirs.update_priorities(priorities)
            ours.update_priorities(priorities)
        else:
            kwargs = dict(n_step=(1, 3) if i % 2 else 2, gamma=0.9, sample_episodes=True)
            a, b = theirs.sample(8, **kwargs), ours.sample(8, **kwargs)
            compare(_views(b), _views(a), f"call {i}")
        compare(state_view(ours.get_state()), state_view(theirs.get_state()), f"state {i}")
    assert ours.get_num_episodes_evicted() > 0


# -- multi-agent buffers -----------------------------------------------------------------


def _multi_stream(seed, *, calls=10, n_envs=2):
    """Per add() call, chunks of multi-agent episodes whose agents (a0, a1
    on module m0, a2 on m1) observe frame stacks (4 frames of 3x3 along
    axis 0; a step adds a frame, now and then a fresh stack)."""
    from episode import MultiAgentEpisode

    rng = np.random.default_rng(seed)
    agents = ("a0", "a1", "a2")

    def frame():
        return rng.integers(0, 256, (3, 3), dtype=np.uint8)

    def start(made):
        stacks = {a: [frame()] * 4 for a in agents}
        episode = MultiAgentEpisode(id_=f"m{seed}_{made}", agent_to_module_mapping_fn=module_of)
        episode.add_env_reset(observations={a: np.stack(f) for a, f in stacks.items()})
        return dict(episode=episode, stacks=stacks, left=int(rng.integers(2, 12)))

    def advance(s):
        for _ in range(int(min(rng.integers(1, 5), s["left"]))):
            s["left"] -= 1
            for a in agents:
                s["stacks"][a] = [frame() for _ in range(4)] if rng.random() < 0.1 \
                    else s["stacks"][a][1:] + [frame()]
            s["episode"].add_env_step(
                observations={a: np.stack(f) for a, f in s["stacks"].items()},
                actions={a: int(rng.integers(3)) for a in agents},
                rewards={a: float(np.round(rng.normal(), 2)) for a in agents},
                terminateds={"__all__": s["left"] == 0})

    return chunked_stream(calls, n_envs, start, advance)


@pytest.mark.parametrize("prioritized", [False, True])
def test_multi_agent_same_answers_with_and_without_frames(prioritized):
    from episode.replay import (MultiAgentEpisodeReplayBuffer,
                                MultiAgentPrioritizedEpisodeReplayBuffer)

    cls = MultiAgentPrioritizedEpisodeReplayBuffer if prioritized \
        else MultiAgentEpisodeReplayBuffer
    plain = cls(capacity=30, seed=3)
    frames = cls(capacity=30, seed=3, frame_stack=4)
    for i, call in enumerate(_multi_stream(2, calls=14)):
        for buffer in (plain, frames):
            buffer.add([pickle.loads(pickle.dumps(e)) for e in call])
        where = f"call {i}"
        assert frames.get_num_timesteps() == plain.get_num_timesteps(), where
        assert frames.get_num_episodes_evicted() == plain.get_num_episodes_evicted(), where
        kwargs = dict(n_step=2, gamma=0.9)
        if prioritized:
            kwargs["beta"] = 0.4
        compare(_views(frames.sample(8, **kwargs), with_id=False),
                _views(plain.sample(8, **kwargs), with_id=False), f"{where}: sample")
        if prioritized:
            for buffer in (plain, frames):
                for module, leaves in sorted(buffer._module_to_last_sampled_indices.items()):
                    buffer.update_priorities(np.linspace(0.5, 2.0, len(leaves)), module)
        compare(plain_state(state_view(frames.get_state())),
                plain_state(state_view(plain.get_state())), f"{where}: state")
    assert frames.get_num_episodes_evicted() > 0
    stats = [store.frame_stats() for store in frames._modules.values()]
    assert all(list(s) == [0] for s in stats)
    again = pickle.loads(pickle.dumps(frames))
    assert all(store.frame_stack == 4 for store in again._modules.values())


# -- file-backed storage, datasets ----------------------------------------------------------


def _atari_like_episodes(seed, count=6, shape=(7, 9, 1), k=4):
    rng = np.random.default_rng(seed)
    out = []
    for e in range(count):
        length = int(rng.integers(5, 30))
        frames = rng.integers(0, 256, (length + k, *shape), dtype=np.uint8)
        obs = np.concatenate([frames[j:j + length + 1] for j in range(k)], axis=-1)
        out.append(SingleAgentEpisode(
            id_=f"a{seed}_{e}", observations=list(obs), actions=list(rng.integers(0, 4, length)),
            rewards=list(rng.normal(size=length)), terminated=bool(e % 2),
            truncated=not e % 2, len_lookback_buffer=0).to_numpy())
    return out


def test_file_backed_frames(tmp_path):
    episodes = _atari_like_episodes(0, count=12)
    plain = PrioritizedEpisodeReplayBuffer(capacity=150, seed=4)
    frames = PrioritizedEpisodeReplayBuffer(capacity=150, seed=4, storage=tmp_path,
                                            frame_stack=4, frame_stack_axis=-1)
    for episode in episodes:
        for buffer in (plain, frames):
            buffer.add(episode)
    frames._store.release_pages()      # the frames go back to their files, and come back
    assert frames.get_num_episodes_evicted() > 0
    assert os.listdir(tmp_path) == []  # (the files are unlinked, their mappings kept)
    _same_batch(plain.sample_batch(64, n_step=3, beta=0.4),
                frames.sample_batch(64, n_step=3, beta=0.4), "file-backed")
    _same_state(plain, frames, "file-backed")


def test_a_dataset_into_a_frame_stacked_buffer(tmp_path):
    pytest.importorskip("pyarrow")
    pytest.importorskip("msgpack")
    from episode.offline import read_episodes, write_episodes

    episodes = _atari_like_episodes(1, count=8)
    write_episodes(episodes, tmp_path, format="arrow")
    dataset = read_episodes(tmp_path)
    for capacity in (dataset.num_steps, dataset.num_steps // 2):
        plain = EpisodeReplayBuffer(capacity=capacity, seed=2)
        frames = EpisodeReplayBuffer(capacity=capacity, seed=2, frame_stack=4,
                                     frame_stack_axis=-1)
        plain.add(list(dataset))
        frames.add_dataset(dataset)
        assert frames.get_num_episodes_evicted() == plain.get_num_episodes_evicted()
        (stats,) = frames._store.frame_stats().values()
        assert stats["frames"] == dataset.num_steps + 4 * len(episodes)
        _same_batch(plain.sample_batch(32, n_step=2), frames.sample_batch(32, n_step=2),
                    f"dataset {capacity}")
        _same_state(plain, frames, f"dataset {capacity}")


def test_numpy_integers_are_numbers_of_frames():
    buffer = EpisodeReplayBuffer(capacity=10, frame_stack=np.int64(4), frame_stack_axis=np.int8(0))
    assert buffer._store.frame_stack == 4 and buffer._store.frame_axis == 0
    assert type(pickle.loads(pickle.dumps(buffer))._store.frame_axis) is int
