"""RLlib 2.60's EnvRunners, run with random actions, as plain comparable records.

`single_agent_records()` runs a SingleAgentEnvRunner and
`multi_agent_records()` a MultiAgentEnvRunner for a number of
`sample()` calls in truncate mode; each call gives one dict:

- ``"episodes"``: the returned episodes (done ones and cut chunks, in the
  order RLlib returns them), each as `episode_record()` /
  `ma_episode_record()`: tuples of plain values (arrays as (dtype, shape,
  nested lists)), no episode ids, so that two runs compare with ``==``.
- ``"env_steps"`` / ``"agent_steps"``: what the runner counted in that call
  (its ``num_env_steps_sampled`` and the sum of its per-agent
  ``num_agent_steps_sampled`` metrics).
- ``"episodes_done"``, ``"episode_lengths"``, ``"episode_returns"``: the
  episodes that ended in that call, with length and return summed over all
  the chunks returned for them so far (as the runner's get_metrics() does).

RLlib samples random actions from action spaces that nobody seeds, so its
random actions differ from run to run. To make them reproducible, the
spaces it samples from are seeded here right after the runner is built:

- single-agent: the vector env's batched action space
  (``env.action_space``, one ``sample()`` per vector step for all sub-envs)
  with ``seed`` (`seed_single_agent_actions`);
- multi-agent: in sub-env i, a ``gymnasium.spaces.Dict`` of the per-agent
  action spaces (``get_action_space(aid)`` for each of
  ``possible_agents``) seeded with ``seed + i``, which gives each agent's
  space its own seed (`seed_multi_agent_actions`).

A sampler that draws its random actions from the same spaces seeded the
same way gets the same actions.
"""
from __future__ import annotations

import warnings
from collections import defaultdict
from typing import Any, Callable, Optional

import gymnasium as gym
import numpy as np


def plain(value: Any) -> Any:
    """Arrays (and lists of array rows) as (dtype, shape, nested lists);
    dicts, lists and tuples recursively; numpy scalars as (type name,
    Python value)."""
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tolist())
    if isinstance(value, np.generic):
        return (type_name(value), value.item())
    if isinstance(value, dict):
        return tuple(sorted(((repr(k), plain(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(plain(v) for v in value))
    return value


def buffer_record(buffer: Any) -> tuple:
    """A lookback buffer's lookback size and its whole data (lookback
    included)."""
    return (buffer.lookback, plain(buffer.data))


def type_name(value: Any) -> str:
    """The full name of value's type (numpy 2 names its bool type "bool" too)."""
    return f"{type(value).__module__}.{type(value).__qualname__}"


def flag(value: Any) -> tuple:
    """A done flag with its type (RLlib keeps the env's numpy bools)."""
    return (type_name(value), bool(value))


def episode_record(episode: Any) -> tuple:
    """A SingleAgentEpisode (ours or RLlib's) as a tuple of plain values:
    len, t_started, is_numpy, the observations, actions, rewards and infos
    buffers (lookback and data), is_terminated, is_truncated."""
    return (len(episode), episode.t_started, episode.is_numpy,
            buffer_record(episode.observations), buffer_record(episode.actions),
            buffer_record(episode.rewards), buffer_record(episode.infos),
            flag(episode.is_terminated), flag(episode.is_truncated))


def ma_episode_record(episode: Any) -> tuple:
    """A MultiAgentEpisode (ours or RLlib's) as a tuple of plain values:
    env_t_started, env_t, is_terminated, is_truncated, per agent (in sorted
    order) its SingleAgentEpisode's record, and per agent its env-step to
    agent-step mapping (lookback and data)."""
    agents = tuple((repr(aid), episode_record(episode.agent_episodes[aid]))
                   for aid in sorted(episode.agent_episodes, key=repr))
    # Kept apart: RLlib's runner drops the episodes of agents without steps
    # in a returned episode, but not their mappings.
    mappings = tuple((repr(aid), buffer_record(episode.env_t_to_agent_t[aid]))
                     for aid in sorted(episode.env_t_to_agent_t, key=repr))
    return (episode.env_t_started, episode.env_t, bool(episode.is_terminated),
            bool(episode.is_truncated), agents, mappings)


class DoneEpisodes:
    """Length and return of each episode, summed over its returned chunks
    by episode id, the way the runners' get_metrics() sums them."""

    def __init__(self) -> None:
        self.lengths: dict = defaultdict(int)
        self.returns: dict = defaultdict(float)

    def add(self, episodes: list) -> tuple:
        """Adds one call's episodes; returns (lengths, returns) of those that
        ended in it, in the order they were returned."""
        lengths, returns = [], []
        for episode in episodes:
            self.lengths[episode.id_] += len(episode)
            self.returns[episode.id_] += float(episode.get_return())
            if episode.is_done:
                lengths.append(self.lengths.pop(episode.id_))
                returns.append(self.returns.pop(episode.id_))
        return lengths, returns


def seed_single_agent_actions(vector_env: Any, seed: int) -> None:
    """Seeds the batched action space a vector env's random actions are
    drawn from."""
    vector_env.action_space.seed(seed)


def seed_multi_agent_actions(sub_envs: list, seed: int) -> None:
    """Seeds the per-agent action spaces of each multi-agent sub-env: sub-env
    i's as one Dict space seeded with seed + i."""
    for i, env in enumerate(sub_envs):
        gym.spaces.Dict({aid: env.get_action_space(aid)
                         for aid in env.possible_agents}).seed(seed + i)


SHORT_CARTPOLE = "EpisodeShortCartPole-v0"


def short_cartpole() -> str:
    """Registers (once) and returns the id of CartPole truncated after 10
    steps, so that runs have truncated episodes."""
    if SHORT_CARTPOLE not in gym.registry:
        gym.register(SHORT_CARTPOLE,
                     entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
                     max_episode_steps=10)
    return SHORT_CARTPOLE


def turn_taking_class() -> type:
    """An RLlib MultiAgentEnv whose two agents take turns ("a" first): only
    the agent to move gets an observation, so each agent's first
    observation comes in a step it did not act in. Episodes end after 3 to
    8 moves, terminated for both agents; all randomness comes from the
    env's seeded np_random."""
    from ray.rllib.env.multi_agent_env import MultiAgentEnv

    class TurnTaking(MultiAgentEnv):
        def __init__(self, config: Optional[dict] = None):
            super().__init__()
            self.possible_agents = ["a", "b"]
            self.agents = list(self.possible_agents)
            box = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
            self.observation_spaces = {aid: box for aid in self.possible_agents}
            self.action_spaces = {aid: gym.spaces.Discrete(3) for aid in self.possible_agents}

        def _obs(self) -> np.ndarray:
            return self.np_random.random(2).astype(np.float32)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.moves, self.length, self.turn = 0, int(self.np_random.integers(3, 9)), 0
            return {"a": self._obs()}, {"a": {}}

        def step(self, action_dict):
            mover = self.possible_agents[self.turn]
            reward = float(action_dict[mover])
            self.moves += 1
            self.turn = 1 - self.turn
            if self.moves >= self.length:
                obs = {aid: self._obs() for aid in self.possible_agents}
                rewards = {aid: reward if aid == mover else 0.0 for aid in obs}
                done = {aid: True for aid in obs}
                return (obs, rewards, {**done, "__all__": True},
                        {aid: False for aid in [*obs, "__all__"]}, {})
            other = self.possible_agents[self.turn]
            return ({other: self._obs()}, {mover: reward}, {"__all__": False},
                    {"__all__": False}, {})

    return TurnTaking


def _quiet_ray() -> None:
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*Overriding environment.*")


def _peek(metrics: dict, key: str) -> Any:
    stat = metrics.get(key)
    if stat is None:
        return 0
    if isinstance(stat, dict):
        return sum(_peek(stat, k) for k in stat)
    value = stat.peek() if hasattr(stat, "peek") else stat
    # A stat logged in an earlier call but not in this one peeks as NaN.
    return 0 if value != value else value


def _call_record(runner: Any, episodes: list, done: DoneEpisodes, record: Callable) -> dict:
    from ray.rllib.utils.metrics import (NUM_AGENT_STEPS_SAMPLED, NUM_ENV_STEPS_SAMPLED,
                                         NUM_EPISODES)
    records = [record(e) for e in episodes]
    lengths, returns = done.add(episodes)
    metrics = runner.get_metrics()
    return {
        "episodes": records,
        "env_steps": int(_peek(metrics, NUM_ENV_STEPS_SAMPLED)),
        "agent_steps": int(_peek(metrics, NUM_AGENT_STEPS_SAMPLED)),
        "episodes_done": int(_peek(metrics, NUM_EPISODES)),
        "episode_lengths": lengths,
        "episode_returns": returns,
    }


def single_agent_runner(env: Any, num_envs: int, rollout_fragment_length: int,
                        seed: Optional[int]) -> Any:
    """RLlib's SingleAgentEnvRunner on `env` (a gymnasium id), truncate
    mode, its random actions seeded with `seed`."""
    _quiet_ray()
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    config = (PPOConfig().environment(env)
              .env_runners(num_envs_per_env_runner=num_envs,
                           rollout_fragment_length=rollout_fragment_length,
                           batch_mode="truncate_episodes")
              .debugging(seed=seed))
    runner = SingleAgentEnvRunner(config=config)
    if seed is not None:
        seed_single_agent_actions(runner.env, seed)
    return runner


def single_agent_records(env: Any, num_envs: int, rollout_fragment_length: int,
                         seed: int, calls: int) -> list:
    """One record dict per `sample(random_actions=True)` call of RLlib's
    SingleAgentEnvRunner (see the module docstring)."""
    runner = single_agent_runner(env, num_envs, rollout_fragment_length, seed)
    done = DoneEpisodes()
    try:
        return [_call_record(runner, runner.sample(random_actions=True), done,
                             episode_record) for _ in range(calls)]
    finally:
        runner.stop()


def multi_agent_runner(env_class: Any, env_config: dict, num_envs: int,
                       rollout_fragment_length: int, seed: Optional[int],
                       count_steps_by: str = "env_steps") -> Any:
    """RLlib's MultiAgentEnvRunner on `env_class(env_config)` (a
    MultiAgentEnv class), truncate mode, one policy for all agents, its
    random actions seeded with `seed`."""
    _quiet_ray()
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner

    config = (PPOConfig().environment(env_class, env_config=dict(env_config))
              .env_runners(num_envs_per_env_runner=num_envs,
                           rollout_fragment_length=rollout_fragment_length,
                           batch_mode="truncate_episodes")
              .multi_agent(policies={"p0"},
                           policy_mapping_fn=lambda agent_id, episode, **kwargs: "p0",
                           count_steps_by=count_steps_by)
              .debugging(seed=seed))
    runner = MultiAgentEnvRunner(config=config)
    if seed is not None:
        seed_multi_agent_actions([env.unwrapped for env in runner.env.envs], seed)
    return runner


def multi_agent_records(env_class: Any, env_config: dict, num_envs: int,
                        rollout_fragment_length: int, seed: int, count_steps_by: str,
                        calls: int) -> list:
    """One record dict per `sample(random_actions=True)` call of RLlib's
    MultiAgentEnvRunner (see the module docstring)."""
    runner = multi_agent_runner(env_class, env_config, num_envs, rollout_fragment_length,
                                seed, count_steps_by)
    done = DoneEpisodes()
    try:
        return [_call_record(runner, runner.sample(random_actions=True), done,
                             ma_episode_record) for _ in range(calls)]
    finally:
        runner.stop()
