"""A user's script that calls every public method and attribute of
SingleAgentEpisode and InfiniteLookbackBuffer.

tests/test_typing.py runs it (it must work) and type-checks it with mypy
against the installed package (the stubs and inline annotations must cover
every call without errors).
"""
import pickle

import gymnasium as gym
import numpy as np

from episode import InfiniteLookbackBuffer, SingleAgentEpisode

# -- InfiniteLookbackBuffer ----------------------------------------------------

buf = InfiniteLookbackBuffer([1.0, 2.0, 3.0], lookback=1, space=None)
buf.append(4.0)
buf.check_append(5.0)
buf.extend([5.0, 6.0])
n_items: int = len(buf)
n_all: int = buf.len_incl_lookback()
last = buf.get(-1)
window = buf.get(slice(-3, 1), neg_index_as_lookback=True, fill=0.0)
first = buf[0]
buf[0] = 2.5
buf.set(3.5, at_indices=1)
buf.set([7.0, 8.0], at_indices=[0, 1], neg_index_as_lookback=False)
buf.pop()
more = buf + [9.0]
buf.concat(InfiniteLookbackBuffer([10.0, 11.0], lookback=1))
same: bool = buf == more
state = buf.get_state()
restored = InfiniteLookbackBuffer.from_state(state)
piece = buf.sub_buffer(slice(0, 2), False, 0, None)
lookback: int = buf.lookback
data = buf.data
space = buf.space
buf.space = gym.spaces.Box(-np.inf, np.inf, ())
struct = buf.space_struct
was_finalized: bool = buf.finalized
buf.finalize()
buf.finalized = True
copy = pickle.loads(pickle.dumps(buf))

# -- SingleAgentEpisode --------------------------------------------------------

env = gym.make("CartPole-v1")
episode = SingleAgentEpisode(
    observation_space=env.observation_space, action_space=env.action_space
)
obs, info = env.reset(seed=0)
episode.add_env_reset(obs, info)
for _ in range(5):
    action = env.action_space.sample()
    obs, reward, terminated, truncated, info = env.step(action)
    episode.add_env_step(
        obs, action, float(reward), info,
        terminated=terminated, truncated=truncated,
        extra_model_outputs={"logp": 0.0},
    )
episode.validate()
steps: int = len(episode)
observations = episode.get_observations(slice(-4, None), fill=0.0)
actions = episode.get_actions(-1, one_hot_discrete=True)
rewards = episode.get_rewards([0, 1])
infos = episode.get_infos(-1)
logp = episode.get_extra_model_outputs("logp", slice(None), neg_index_as_lookback=False)
episode.set_observations(new_data=obs, at_indices=-1)
episode.set_actions(new_data=0, at_indices=0)
episode.set_rewards(new_data=1.0, at_indices=0)
episode.set_extra_model_outputs(key="logp", new_data=0.5, at_indices=0)
ret: float = episode.get_return()
duration: float = episode.get_duration_s()
env_steps: int = episode.env_steps()
agent_steps: int = episode.agent_steps()
data_dict = episode.get_data_dict()
episode.custom_data["note"] = "kept"
flags = (episode.is_reset, episode.is_numpy, episode.is_done,
         episode.is_terminated, episode.is_truncated)
ids = (episode.id_, episode.agent_id, episode.module_id, episode.multi_agent_episode_id)
times = (episode.t, episode.t_started)
buffers = (episode.observations, episode.actions, episode.rewards, episode.infos,
           episode.extra_model_outputs)
spaces = (episode.observation_space, episode.action_space)
episode.observation_space = env.observation_space
episode.action_space = env.action_space
successor = episode.cut(len_lookback_buffer=1)
part = episode.slice(slice(1, 3), len_lookback_buffer=0)
also_part = episode[1:3]
episode_state = episode.get_state()
clone = SingleAgentEpisode.from_state(episode_state)
successor.add_env_step(obs, 1, 1.0, extra_model_outputs={"logp": 0.0})
episode.concat_episode(successor)
episode.to_numpy()
try:
    batch = episode.get_sample_batch()   # needs ray[rllib]
except ImportError:
    pass
try:
    episode.add_temporary_timestep_data("key", 1)   # removed in RLlib: raises
except ValueError:
    pass
try:
    episode.get_temporary_timestep_data("key")
except ValueError:
    pass
env.close()
