"""A user's script that calls every public method and attribute of the
public classes: InfiniteLookbackBuffer, SingleAgentEpisode,
MultiAgentEpisode, VectorEpisodes, Sampler, ViewRequirement, AgentCollector,
the views functions, and (type-checked, not run: they start Ray or write
files) DistributedSampler and the offline layer's writer and dataset.

tests/test_typing.py runs it (it must work) and type-checks it with mypy
--strict against the installed package: no errors, and no call in it may
give `Any` (each call's type is revealed). It uses no gymnasium env object,
whose methods are typed with Any.
"""
from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from episode import (AgentCollector, InfiniteLookbackBuffer, MultiAgentEpisode, Sampler,
                     SingleAgentEpisode, VectorEpisodes, ViewRequirement)
from episode.offline import EpisodeDataset, EpisodeWriter, read_episodes, write_episodes
from episode.replay import EpisodeReplayBuffer
from episode.sampling import default_view_requirements
from episode.typing import AgentID, Batch, Column, Item, TrainingBatch
from episode.views import build_inference_batch, build_training_batch

if TYPE_CHECKING:
    from episode.distributed import DistributedSampler

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACT_SPACE: gym.spaces.Discrete[np.int64] = gym.spaces.Discrete(2)


def obs(t: int) -> npt.NDArray[np.float32]:
    return np.full(4, t / 100, np.float32)


# -- InfiniteLookbackBuffer ----------------------------------------------------

buf = InfiniteLookbackBuffer([1.0, 2.0, 3.0], lookback=1, space=None)
buf.append(4.0)
buf.check_append(5.0)
buf.extend([5.0, 6.0])
n_items: int = len(buf)
n_all: int = buf.len_incl_lookback()
last: Item = buf.get(-1)
last_np: Item = buf.get(np.int64(-1))
window: Batch = buf.get(slice(-3, 1), neg_index_as_lookback=True, fill=0.0)
picked: Batch = buf.get([0, np.int32(1)])
everything: Batch = buf.get()
first: Item = buf[0]
head: Batch = buf[0:2]
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
data: Batch = buf.data
space = buf.space
buf.space = gym.spaces.Box(-np.inf, np.inf, ())
struct = buf.space_struct
was_finalized: bool = buf.finalized
prepared = buf.prepare_finalize()
buf.commit_finalize(prepared)
buf.finalize()
buf.finalized = True
copy = pickle.loads(pickle.dumps(buf))

# -- SingleAgentEpisode --------------------------------------------------------

episode = SingleAgentEpisode(observation_space=OBS_SPACE, action_space=ACT_SPACE)
episode.add_env_reset(obs(0), {})
for t in range(5):
    episode.add_env_step(obs(t + 1), t % 2, 1.0, {}, terminated=False, truncated=False,
                         extra_model_outputs={"logp": 0.0})
episode.validate()
steps: int = len(episode)
observations: Batch = episode.get_observations(slice(-4, None), fill=0.0)
one_obs: Item = episode.get_observations(np.int64(-1))
action: Item = episode.get_actions(-1, one_hot_discrete=True)
rewards: Batch = episode.get_rewards([0, 1])
infos: Item = episode.get_infos(-1)
logp: Batch = episode.get_extra_model_outputs("logp", slice(None), neg_index_as_lookback=False)
episode.set_observations(new_data=obs(9), at_indices=-1)
episode.set_actions(new_data=0, at_indices=np.int64(0))
episode.set_rewards(new_data=np.zeros(2), at_indices=slice(0, 2))
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
episode.observation_space = OBS_SPACE
episode.action_space = ACT_SPACE
successor = episode.cut(len_lookback_buffer=1)
part = episode.slice(slice(1, 3), len_lookback_buffer=0)
also_part = episode[1:3]
episode_state = episode.get_state()
clone = SingleAgentEpisode.from_state(episode_state)
successor.add_env_step(obs(7), 1, 1.0, extra_model_outputs={"logp": 0.0})
episode.concat_episode(successor)
numpy_episode = episode.to_numpy()
try:
    episode.get_sample_batch()   # needs ray[rllib]
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

# -- MultiAgentEpisode ---------------------------------------------------------

ma = MultiAgentEpisode(id_="ma", observation_space={"a0": OBS_SPACE, "a1": OBS_SPACE},
                       action_space={"a0": ACT_SPACE, "a1": ACT_SPACE})
ma.add_env_reset(observations={"a0": obs(0), "a1": obs(0)}, infos={"a0": {}})
for t in range(4):
    ma.add_env_step({"a0": obs(t + 1), "a1": obs(t + 1)}, {"a0": 1, "a1": 0},
                    {"a0": 1.0, "a1": 0.5}, {"a0": {}}, terminateds={}, truncateds={},
                    extra_model_outputs={"a0": {"logp": 0.1}, "a1": {"logp": 0.2}})
ma.add_env_step({"a0": obs(9)}, {"a0": 1, "a1": 0}, {"a0": 1.0, "a1": 0.5},
                extra_model_outputs={"a0": {"logp": 0.1}, "a1": {"logp": 0.2}})
ma.validate()
ma_last: dict[AgentID, Item] = ma.get_observations(-1)
ma_window = ma.get_observations(slice(-2, None), agent_ids=["a0"], fill=0.0)
ma_steps = ma.get_actions(env_steps=False)
ma_rows = ma.get_rewards([-2, -1], return_list=True)
ma_infos = ma.get_infos(np.int64(-1), agent_ids="a0")
ma_logp = ma.get_extra_model_outputs("logp", -1, fill=0.0)
ma_logp_kw = ma.get_extra_model_outputs(key="logp", indices=slice(None))
ma_all_outputs = ma.get_extra_model_outputs(indices=-1, env_steps=False)
ma.set_observations(new_data={"a0": obs(5)}, at_indices=-1)
ma.set_actions(new_data={"a0": 0}, at_indices=0)
ma.set_rewards(new_data={"a0": 2.0}, at_indices=0)
ma.set_extra_model_outputs(key="logp", new_data={"a0": 0.3}, at_indices=0)
terminateds = ma.get_terminateds()
truncateds = ma.get_truncateds()
to_act = ma.get_agents_to_act()
stepped = ma.get_agents_that_stepped()
ma_return: float = ma.get_return(include_hanging_rewards=True)
ma_duration: float = ma.get_duration_s()
ma_env_steps: int = ma.env_steps()
ma_agent_steps: int = ma.agent_steps()
module = ma.module_for("a0")
agent_episode: SingleAgentEpisode = ma.agent_episodes["a0"]
ma_fields = (ma.id_, ma.env_t, ma.env_t_started, ma.agent_ids, ma.agent_episode_ids,
             ma.agent_t_started, ma.env_t_to_agent_t, ma.agent_to_module_mapping_fn,
             ma.observation_space, ma.action_space, ma.custom_data, ma.SKIP_ENV_TS_TAG)
ma_flags = (ma.is_reset, ma.is_numpy, ma.is_done, ma.is_terminated, ma.is_truncated)
ma_len: int = len(ma)
ma.print()
ma_next = ma.cut(len_lookback_buffer=1)
ma_piece = ma.slice(slice(0, 2), len_lookback_buffer=0)
ma_piece2 = ma[1:3]
ma_next.add_env_step({"a1": obs(8)}, {"a0": 1}, {"a0": 1.0},
                     extra_model_outputs={"a0": {"logp": 0.1}})
ma.concat_episode(ma_next)
ma_state = ma.get_state()
ma_clone = MultiAgentEpisode.from_state(ma_state)
ma_numpy = ma.to_numpy()
try:
    ma.get_sample_batch()   # needs ray[rllib]
except ImportError:
    pass
for removed in (ma.add_temporary_timestep_data, ma.get_temporary_timestep_data):
    try:
        removed("key")
    except ValueError:
        pass

# -- views and the collector ---------------------------------------------------

views = default_view_requirements(OBS_SPACE, ACT_SPACE)
views["frames"] = ViewRequirement("obs", shift="-3:0", space=OBS_SPACE)
views["prev_actions"] = ViewRequirement("actions", shift=np.int64(-1), space=ACT_SPACE)
views["pair"] = ViewRequirement("obs", shift=(-1, 0), used_for_compute_actions=False)
described = views["frames"].to_dict()
again = ViewRequirement.from_dict(described)
vr_fields = (again.data_col, again.space, again.shift, again.index, again.batch_repeat_value,
             again.used_for_compute_actions, again.used_for_training)
training: TrainingBatch = build_training_batch([clone], views)
inference: TrainingBatch = build_inference_batch([clone], views)

collector = AgentCollector(views, max_seq_len=1, is_training=True)
collector.add_init_obs(episode_id=1, agent_index=0, env_id=0, init_obs=obs(0),
                       init_infos={}, t=-1)
for t in range(3):
    collector.add_action_reward_next_obs({"new_obs": obs(t + 1), "actions": t % 2,
                                          "rewards": 1.0, "terminateds": False,
                                          "truncateds": False, "infos": {}, "t": t,
                                          "eps_id": 1, "env_id": 0, "agent_index": 0})
collector_inputs: TrainingBatch = collector.build_for_inference()
collector_batch: TrainingBatch = collector.build_for_training(views)
collector_flags = (collector.is_empty(), collector.training)
collector_state = (collector.buffers, collector.episode_id, collector.unroll_id,
                   collector.agent_steps)
collector.is_training(False)

# -- VectorEpisodes ------------------------------------------------------------

vec = VectorEpisodes(2, observation_space=OBS_SPACE, action_space=ACT_SPACE,
                     autoreset_mode="NextStep")
vec.add_reset(np.zeros((2, 4), np.float32), {})
for t in range(3):
    ended: list[SingleAgentEpisode] = vec.add_step(
        np.full((2, 4), t / 10, np.float32), np.array([0, 1]), np.ones(2),
        np.zeros(2, bool), np.zeros(2, bool), {})
recorded: int = vec.record_step(np.ones((2, 4), np.float32), np.array([1, 0]), np.ones(2),
                                np.array([True, False]), np.zeros(2, bool), {})
waited: tuple[list[SingleAgentEpisode], list[int]] = vec.take_ended()
running: list[SingleAgentEpisode | None] = vec.episodes
chunks: list[SingleAgentEpisode] = vec.cut(len_lookback_buffer=1)
vec_fields = (vec.num_envs, vec.observation_space, vec.action_space, vec.autoreset_mode,
              vec.steps_added, vec.ended_envs, vec.writer)


def for_env(env: gym.vector.VectorEnv[Any, Any, Any]) -> VectorEpisodes:   # (type-checked only)
    return VectorEpisodes.for_env(env)


# -- Sampler -------------------------------------------------------------------

def policy(inputs: TrainingBatch) -> tuple[npt.NDArray[np.int64], dict[str, Column]]:
    n = len(inputs["obs"])
    return np.zeros(n, np.int64), {"vf_preds": np.zeros(n, np.float32)}


sampler = Sampler("CartPole-v1", policy, view_requirements=default_view_requirements(),
                  batch_mode="truncate_episodes", rollout_fragment_length=5,
                  count_steps_by="env_steps", num_envs=2, seed=0)
sampled = sampler.sample_episodes()
batch: TrainingBatch = sampler.sample()
metrics = sampler.get_metrics()
ongoing = sampler.ongoing_episodes()
pending: list[SingleAgentEpisode | MultiAgentEpisode] = sampler.take_pending()
sampler_fields = (sampler.batch_mode, sampler.count_steps_by, sampler.rollout_fragment_length,
                  sampler.num_envs, sampler.seed, sampler.policy, sampler.view_requirements,
                  sampler.multi_agent, sampler.writer)
sampler.close()


# -- recorded experience ---------------------------------------------------------


def record_and_read(folder: str) -> None:   # (type-checked only: it writes files)
    with EpisodeWriter(folder, format="arrow", compression=None, rows_per_file=1000) as writer:
        writer.check_spaces(sampled[0].observation_space, sampled[0].action_space)
        writer.write(sampled)
        writer.flush()
    files: list[str] = write_episodes(sampled, folder, format="parquet") + writer.files
    dataset: EpisodeDataset = read_episodes(folder, columns=["infos"])
    dataset.check()
    first: SingleAgentEpisode | MultiAgentEpisode = dataset[0]
    some: list[SingleAgentEpisode | MultiAgentEpisode] = dataset[1:3]
    n: int = len(dataset) + dataset.num_steps
    drawn: dict[str, Any] = dataset.sample_batch(32, n_step=3)
    buffer: EpisodeReplayBuffer = dataset.replay_buffer()
    items: list[tuple[str, Any]] = dataset.replay_items()
    EpisodeReplayBuffer(capacity=dataset.num_steps).add_dataset(dataset)
    generator: np.random.Generator = dataset.rng
    table: dict[str, npt.NDArray[Any]] = dataset.episode_table()
    spaces: dict[str, list[str | None]] = dataset.spaces()
    agents: list[Any] = dataset.agent_ids()
    where = (dataset.format, dataset.files, dataset.num_chunks, dataset.path)
    for read in dataset:
        print(read, first, some, n, drawn, buffer, generator, files, writer.closed, table,
              spaces, agents, where, items)


def distributed() -> None:   # (type-checked only: it starts Ray)
    with DistributedSampler("CartPole-v1", policy, num_actors=2, num_envs=2,
                            rollout_fragment_length=5, batch_mode="complete_episodes",
                            seed=0) as remote:
        remote_episodes = remote.sample_episodes()
        remote_batch: TrainingBatch = remote.sample()
        per_actor = remote.sample(concat=False)
        remote.set_policy(policy)
        remote.policy = policy
        remote.set_weights(np.ones(2))
        remote_metrics = remote.get_metrics()
        remote_ongoing = remote.ongoing_episodes()
        seeds = (remote.actor_seed(0), remote.actor_seeds, remote.actors)
        print(remote_episodes, remote_batch, per_actor, remote_metrics, remote_ongoing, seeds)
        remote.close()
