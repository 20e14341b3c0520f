"""Pickling moves whole buffers: numeric tracks travel as out-of-band buffers."""
import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest

from episode import InfiniteLookbackBuffer, SingleAgentEpisode


def make_episode(steps=50):
    episode = SingleAgentEpisode(observation_space=gym.spaces.Box(-1, 1, (4,), np.float32),
                                 action_space=gym.spaces.Discrete(2))
    episode.add_env_reset(np.zeros(4, np.float32))
    for t in range(steps):
        episode.add_env_step(np.full(4, t / steps, np.float32), t % 2, float(t),
                             extra_model_outputs={"vf": np.float32(t)})
    return episode


def test_out_of_band_round_trip_of_a_numpy_episode():
    episode = make_episode().to_numpy()
    buffers = []
    data = pickle.dumps(episode, protocol=5, buffer_callback=buffers.append)
    raw = sum(memoryview(b).nbytes for b in buffers)
    # The observations, actions, rewards and vf arrays went out of band ...
    assert raw >= episode.get_observations().nbytes + 3 * 50 * 4
    # ... and the in-band part holds no per-step data.
    assert len(data) < raw
    again = pickle.loads(data, buffers=buffers)
    assert again.is_numpy and len(again) == 50 and again.id_ == episode.id_
    np.testing.assert_array_equal(again.get_observations(), episode.get_observations())
    np.testing.assert_array_equal(again.get_rewards(), episode.get_rewards())
    again.add_env_step(np.ones(4, np.float32), 1, 1.0, extra_model_outputs={"vf": np.float32(1)})
    assert len(again) == 51 and len(episode) == 50


def _read_only_round_trip(episode):
    # What Ray's object store hands back: the out-of-band buffers, read-only.
    buffers = []
    data = pickle.dumps(episode, protocol=5, buffer_callback=buffers.append)
    raw = [bytes(b.raw()) for b in buffers]
    return pickle.loads(data, buffers=raw), raw


def test_numpy_episode_reads_read_only_buffers_in_place():
    """A numpy'ized episode unpickled from read-only out-of-band buffers
    (the object store's memory) reads its rows there, without a copy: its
    arrays are read-only views of the buffers, as RLlib's are."""
    episode = make_episode().to_numpy()
    again, raw = _read_only_round_trip(episode)
    obs = again.get_observations()
    assert not obs.flags.writeable
    # The very bytes of one of the buffers (no copy was made).
    assert any(np.shares_memory(obs, np.frombuffer(b, np.uint8)) for b in raw)
    np.testing.assert_array_equal(obs, episode.get_observations())
    assert not again.get_observations(-1).flags.writeable
    with pytest.raises(ValueError):
        obs[0, 0] = 1.0
    # A cut's lookback still reads the same memory.
    successor = again.cut(len_lookback_buffer=2)
    np.testing.assert_array_equal(successor.get_observations(-1), obs[-1])


def test_read_only_rows_are_copied_on_the_first_write():
    episode = make_episode().to_numpy()
    again, raw = _read_only_round_trip(episode)
    before = [bytes(b) for b in raw]
    shared = again.get_observations()
    again.set_observations(new_data=np.full(4, 0.5, np.float32), at_indices=3)
    again.set_rewards(new_data=-1.0, at_indices=0)
    again.add_env_step(np.ones(4, np.float32), 1, 1.0,
                       extra_model_outputs={"vf": np.float32(1)})
    assert [bytes(b) for b in raw] == before      # the shared buffers are untouched
    assert again.get_observations(3).tolist() == [0.5] * 4 and again.get_rewards(0) == -1.0
    assert again.get_observations().flags.writeable and len(again) == 51
    np.testing.assert_array_equal(shared, episode.get_observations())
    buffer = InfiniteLookbackBuffer([1.0, 2.0, 3.0], lookback=1)
    buffer.finalize()
    buffer, _ = _read_only_round_trip(buffer)
    buffer.append(4.0)
    assert buffer.get(slice(None)).tolist() == [2.0, 3.0, 4.0]


def test_in_band_round_trip_of_a_list_mode_episode_keeps_types():
    episode = make_episode(10)
    again = pickle.loads(pickle.dumps(episode, protocol=5))
    assert type(again.get_actions(-1)) is int and type(again.get_rewards(-1)) is float
    assert again.get_state()["observations"]["data"][3].tolist() == \
        episode.get_state()["observations"]["data"][3].tolist()
    again.add_env_step(np.ones(4, np.float32), 0, 2.0, extra_model_outputs={"vf": np.float32(0)})
    assert len(again) == 11 and not again.is_numpy


# -- spaces: plain ones travel as short descriptions ---------------------------

def round_trip(x):
    return pickle.loads(pickle.dumps(x, protocol=5))


def test_unpickled_episodes_share_one_space_object_per_description():
    first, second = round_trip(make_episode(3)), round_trip(make_episode(4))
    assert first.observation_space == gym.spaces.Box(-1, 1, (4,), np.float32)
    assert first.action_space == gym.spaces.Discrete(2)
    # As the episodes of one env runner share the env's spaces.
    assert first.observation_space is second.observation_space
    assert first.observations.space is first.observation_space
    # Rewards keep the one space every episode's rewards buffer has.
    assert first.rewards.space is SingleAgentEpisode().rewards.space


@pytest.mark.parametrize("space", [
    gym.spaces.Box(np.array([-1.0, 0.0]), np.array([1.0, 5.0]), (2,), np.float64),
    gym.spaces.Box(0, 255, (3, 2), np.uint8),
    gym.spaces.Discrete(5, start=-2),
    gym.spaces.Discrete(3, dtype=np.int32),
    gym.spaces.MultiDiscrete([3, 4], start=[1, -1]),
    gym.spaces.MultiBinary(3),
    gym.spaces.MultiBinary([2, 2]),
], ids=repr)
def test_plain_spaces_come_back_equal(space):
    buffer = InfiniteLookbackBuffer([space.sample()], space=space)
    again = round_trip(buffer)
    assert again.space == space and type(again.space) is type(space)
    assert again.space.dtype == space.dtype and again.space.shape == space.shape


def test_a_space_with_rng_state_pickles_as_itself():
    space = gym.spaces.Box(-1, 1, (4,), np.float32, seed=7)
    episode = SingleAgentEpisode(observation_space=space)
    first, second = round_trip(episode), round_trip(episode)
    assert first.observation_space is not second.observation_space
    np.testing.assert_array_equal(first.observation_space.sample(), space.sample())


def test_copy_and_deepcopy_keep_spaces_and_data():
    episode = make_episode(5).to_numpy()
    for again in (copy.copy(episode), copy.deepcopy(episode)):
        assert again.observation_space == episode.observation_space
        assert again.observations.space == episode.observation_space
        np.testing.assert_array_equal(again.get_observations(), episode.get_observations())
    deep = copy.deepcopy(episode)
    deep.set_rewards(new_data=-1.0, at_indices=0)
    assert episode.get_rewards(0) == 0.0
