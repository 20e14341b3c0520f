"""Pickling moves whole buffers: numeric tracks travel as out-of-band buffers."""
import pickle

import gymnasium as gym
import numpy as np

from episode import SingleAgentEpisode


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


def test_in_band_round_trip_of_a_list_mode_episode_keeps_types():
    episode = make_episode(10)
    again = pickle.loads(pickle.dumps(episode, protocol=5))
    assert type(again.get_actions(-1)) is int and type(again.get_rewards(-1)) is float
    assert again.get_state()["observations"]["data"][3].tolist() == \
        episode.get_state()["observations"]["data"][3].tolist()
    again.add_env_step(np.ones(4, np.float32), 0, 2.0, extra_model_outputs={"vf": np.float32(0)})
    assert len(again) == 11 and not again.is_numpy
