"""MultiAgentEpisode: RLlib's multi-agent episode, one SingleAgentEpisode per agent.

Each agent's data lives in its own `SingleAgentEpisode` (`agent_episodes`).
`env_t_to_agent_t` maps every env step to the agent's own step, or to the
skip tag "S" where the agent received no observation. Actions, rewards and
extra model outputs that an agent produced after its last observation are
"hanging": they join its episode with its next observation.

Where RLlib iterates a set of agent ids (so the order of agents in results
changes from one process to the next), ours iterates the same set, so results
list agents in RLlib's order within a process.
"""
from __future__ import annotations

import copy
import sys
import time
import uuid
from collections import defaultdict, deque
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Set

import numpy as np

from episode._episode import check_step_extras
from episode._extras import rllib_missing
from episode._multi import (SKIP_ENV_TS_TAG, SKIP_STEP, AgentStepsCore, MultiAgentCore,
                            _register_facade)
from episode.lookback_buffer import InfiniteLookbackBuffer
from episode.single_agent_episode import EpisodeIndexError, SingleAgentEpisode
from episode.spaces import check_same_nesting, flatten_struct, map_struct
from episode.typing import AgentID, ModuleID

if TYPE_CHECKING:
    from ray.rllib.policy.sample_batch import MultiAgentBatch

DEFAULT_MODULE_ID = "default_policy"


# A multi-agent episode's fields kept as data as they are, and those that
# are defaultdicts in a live episode (with their factories).
_DATA_FIELDS = ("_agent_to_module_mapping", "env_t_started", "env_t", "is_terminated",
                "is_truncated", "_hanging_actions_end", "_start_time", "_last_step_time")
_DATA_DEFAULTS = {"agent_t_started": int, "_hanging_extra_model_outputs_end": dict,
                  "_hanging_rewards_end": float, "_hanging_rewards_begin": float}


def default_agent_to_module_mapping_fn(agent_id: Any, episode: Any) -> str:
    """Every agent to RLlib's default module id."""
    return DEFAULT_MODULE_ID


class MultiAgentEnvError(Exception):
    """An env handed the episode data that no multi-agent env may produce."""


class SliceStepError(ValueError, NotImplementedError):
    """Raised for a slice with a step other than 1: a ValueError by meaning;
    also a NotImplementedError because that is the class RLlib raises."""


_error_classes: dict = {}


def env_error(message: str) -> Exception:
    """Our MultiAgentEnvError; when RLlib's error module is loaded, one that
    is also RLlib's, so code catching RLlib's class keeps working."""
    rllib = sys.modules.get("ray.rllib.utils.error")
    theirs = getattr(rllib, "MultiAgentEnvError", None)
    if not isinstance(theirs, type) or not issubclass(theirs, Exception):
        return MultiAgentEnvError(message)
    cls = _error_classes.get(theirs)
    if cls is None:
        cls = _error_classes[theirs] = type(
            "MultiAgentEnvError", (MultiAgentEnvError, theirs), {"__module__": __name__})
    return cls(message)


def _truncated_without_observation(agent_id: Any) -> Exception:
    return env_error(f"Agent {agent_id} acted and then got truncated, but did NOT receive a "
                     f"last (truncation) observation, required for e.g. value function "
                     f"bootstrapping!")


def _check_agent_concat(episode: Any, successor: Any) -> None:
    """Raises what an agent's SingleAgentEpisode.concat_episode() of its
    `successor` would raise (AssertionError), before anything changes. An
    agent with no action yet may take new extra-output keys (it starts them
    empty)."""
    if successor.id_ != episode.id_:
        raise AssertionError(f"concat_episode() expects a chunk of agent episode "
                             f"{episode.id_!r}, got id_ {successor.id_!r}")
    if episode.t != successor.t_started:
        raise AssertionError(f"concat_episode() expects agent {episode.agent_id!r}'s chunk "
                             f"to start at t={episode.t!r}, it starts at "
                             f"{successor.t_started!r}")
    episode.validate()
    successor.validate()
    first, last = successor.observations[0], episode.observations[-1]
    check_same_nesting(first, last)
    if not all(np.array_equal(a, b) for a, b in zip(flatten_struct(first),
                                                    flatten_struct(last))):
        raise AssertionError(f"concat_episode() expects agent {episode.agent_id!r}'s chunk "
                             f"to start with its last observation")
    if len(episode.actions) or episode.actions.lookback:
        missing = [k for k in successor.extra_model_outputs
                   if k not in episode.extra_model_outputs]
        if missing:
            raise AssertionError(f"concat_episode() expects agent {episode.agent_id!r}'s "
                                 f"extra model outputs {missing} in this chunk too")
    if len(successor):
        # (The concatenation would leave these keys a step behind each of
        # the chunk's steps: its validation fails.)
        lacking = [k for k in episode.extra_model_outputs
                   if k not in successor.extra_model_outputs]
        if lacking:
            raise AssertionError(f"concat_episode() expects agent {episode.agent_id!r}'s "
                                 f"extra model outputs {lacking} in the chunk too")


def _repeats_last_observation(episode: Any) -> bool:
    """Whether an agent terminated without an observation gets its last step,
    repeating its last observation: whenever it has one."""
    return episode is not None and episode.observations.len_incl_lookback() > 0


def _last_observation(episode: Any) -> tuple:
    """The observation and infos an agent that ends without a new one
    repeats: the ones it added last, or, in an episode built from lists or
    restored from a state (which knows none), its last stored ones. (RLlib's
    has none there: it drops the agent's last step and the agent's end.)"""
    if episode._last_added_observation is not None:
        return episode._last_added_observation, episode._last_added_infos
    return (copy.deepcopy(episode.observations.get(-1, neg_index_as_lookback=False)),
            copy.deepcopy(episode.infos.get(-1, neg_index_as_lookback=False)))


def batch_like_rllib(items: list) -> Any:
    """Items (of one structure) stacked leaf by leaf as RLlib's `batch` does
    it: a leaf whose first item is an ndarray takes that item's dtype and
    shape (a float32 fill value makes float32 rows); other leaves are
    np.array() of their items."""
    def leaf(*values):
        first = values[0]
        if not isinstance(first, np.ndarray):
            return np.array(values)
        out = np.empty((len(values), *first.shape), dtype=first.dtype)
        for i, value in enumerate(values):
            out[i] = value
        return out

    return map_struct(leaf, *items)


def _as_step(item: Any) -> Any:
    return SKIP_STEP if type(item) is str and item == SKIP_ENV_TS_TAG else item


class AgentSteps(AgentStepsCore, InfiniteLookbackBuffer):
    """One agent's env_t -> agent_t mapping: RLlib's lookback buffer of agent
    steps and "S" tags, stored as int64 (the tag as SKIP_STEP). Its `data` is
    a list made on each read (RLlib's is the buffer's own list)."""

    __slots__ = ()

    def append(self, item: Any) -> None:
        """Appends an agent step or SKIP_ENV_TS_TAG."""
        InfiniteLookbackBuffer.append(self, _as_step(item))

    def extend(self, items: Any) -> None:
        """Appends each agent step or SKIP_ENV_TS_TAG of `items`."""
        for item in items:
            InfiniteLookbackBuffer.append(self, _as_step(item))

    def _items(self) -> list:
        return [self._item(pos) for pos in range(self.len_incl_lookback())]

    @property
    def data(self) -> list:
        """The agent steps and "S" tags, lookback included (a new list)."""
        return self._items()

    @data.setter
    def data(self, value: Any) -> None:
        if isinstance(value, list):
            value = [_as_step(item) for item in value]
        InfiniteLookbackBuffer.data.fset(self, value)

    @staticmethod
    def of(buffer: Any) -> "AgentSteps":
        """`buffer` (RLlib's lookback buffer or ours, of steps and tags) as AgentSteps."""
        if type(buffer) is AgentSteps:
            return buffer
        return AgentSteps(data=list(buffer.data), lookback=buffer.lookback)




def _extras_buffer(outputs: dict, key: Any) -> Any:
    """An agent's extra-output buffer `key`. After from_state() the outputs
    are a defaultdict: a missing key reads as the empty buffer RLlib's would
    add there, but nothing is added. Else KeyError for a missing key."""
    if key not in outputs and isinstance(outputs, defaultdict):
        return outputs.default_factory()
    return outputs[key]


def _hanging_of_key(hanging: Optional[dict], key: Any) -> Optional[dict]:
    """An agent's hanging extra outputs narrowed to `key` (None without it):
    a read of all keys takes each key's hanging value where there is one."""
    return {key: hanging[key]} if hanging and key in hanging else None


class _EmptyHistory:
    """What an agent has stored under an extra-output key it produced only
    as a hanging value (or never): no rows, as many of them as the actions
    have, and the hanging value as the row after them."""

    __slots__ = ("lookback", "_rows")

    def __init__(self, actions: InfiniteLookbackBuffer):
        self.lookback = actions.lookback
        self._rows = actions.len_incl_lookback()

    def len_incl_lookback(self) -> int:
        return self._rows

    def get(self, indices: Any, *, neg_index_as_lookback: bool, fill: Any,
            _add_last_ts_value: Any = None, **one_hot: Any) -> Any:
        if isinstance(indices, list):
            values = [self.get(i, neg_index_as_lookback=neg_index_as_lookback, fill=fill,
                               _add_last_ts_value=_add_last_ts_value) for i in indices]
            return [v for v in values if v is not None]
        if indices + self.lookback == self._rows and _add_last_ts_value is not None:
            return _add_last_ts_value
        return fill


class MultiAgentEpisode(MultiAgentCore):
    """A multi-agent episode (chunk): the same API and behaviour as RLlib
    2.60's `MultiAgentEpisode`, storing each agent's data in our compiled
    `SingleAgentEpisode`. The fields, the usual add_env_step and the
    latest-observation read are compiled (MultiAgentCore)."""

    __slots__ = ()

    SKIP_ENV_TS_TAG = SKIP_ENV_TS_TAG

    def __init__(
        self,
        id_: Optional[str] = None,
        *,
        observations: Optional[list] = None,
        observation_space: Any = None,
        infos: Optional[list] = None,
        actions: Optional[list] = None,
        action_space: Any = None,
        rewards: Optional[list] = None,
        terminateds: Any = False,
        truncateds: Any = False,
        extra_model_outputs: Optional[list] = None,
        env_t_started: Optional[int] = None,
        agent_t_started: Optional[dict] = None,
        len_lookback_buffer: Any = "auto",
        agent_episode_ids: Optional[dict] = None,
        agent_module_ids: Optional[dict] = None,
        agent_to_module_mapping_fn: Optional[Callable] = None,
    ):
        self.id_ = id_ or uuid.uuid4().hex
        self.agent_to_module_mapping_fn = (
            agent_to_module_mapping_fn or default_agent_to_module_mapping_fn)
        self._agent_to_module_mapping = agent_module_ids or {}
        if len_lookback_buffer == "auto":
            len_lookback_buffer = len(rewards or [])
        self._len_lookback_buffers = len_lookback_buffer
        self.observation_space = observation_space or {}
        self.action_space = action_space or {}
        terminateds = terminateds or {}
        truncateds = truncateds or {}
        self.env_t_started = env_t_started or 0
        self.env_t = (len(rewards) if rewards is not None else 0) \
            - self._len_lookback_buffers + self.env_t_started
        self.agent_t_started = defaultdict(int, agent_t_started or {})
        self.env_t_to_agent_t = defaultdict(AgentSteps)
        self._hanging_actions_end = {}
        self._hanging_extra_model_outputs_end = defaultdict(dict)
        self._hanging_rewards_end = defaultdict(float)
        self._hanging_rewards_begin = defaultdict(float)
        self.is_terminated = terminateds if isinstance(terminateds, bool) \
            else terminateds.get("__all__", False)
        self.is_truncated = truncateds if isinstance(truncateds, bool) \
            else truncateds.get("__all__", False)
        self.agent_episodes = {}
        self._init_agent_episodes(
            agent_module_ids=agent_module_ids, agent_episode_ids=agent_episode_ids,
            observations=observations, infos=infos, actions=actions, rewards=rewards,
            terminateds=terminateds, truncateds=truncateds,
            extra_model_outputs=extra_model_outputs)
        self._custom_data = {}
        self._start_time = None
        self._last_step_time = None
        self.validate()

    # -- building from lists ------------------------------------------------------

    def _init_agent_episodes(self, *, agent_module_ids, agent_episode_ids, observations,
                             infos, actions, rewards, terminateds, truncateds,
                             extra_model_outputs):
        """Splits the constructor's per-env-step dicts into one single-agent
        episode per agent (and the hanging values after each agent's last
        observation), as RLlib does."""
        if observations is None:
            return
        if actions is None:
            if rewards or extra_model_outputs:
                raise AssertionError("rewards and extra_model_outputs need actions")
            actions, rewards, extra_model_outputs = [], [], []
        if infos is None:
            infos = [{} for _ in observations]
        if extra_model_outputs is None:
            extra_model_outputs = [{} for _ in actions]
        lookback = self._len_lookback_buffers
        obs_of = defaultdict(list)
        infos_of = defaultdict(list)
        actions_of = defaultdict(list)
        rewards_of = defaultdict(list)
        outputs_of = defaultdict(list)
        done = defaultdict(bool)
        lookback_of = defaultdict(lambda: lookback)
        all_agents = set(agent_episode_ids or ())
        agent_module_ids = agent_module_ids or {}

        # Each agent's step counter starts so that its first observation after
        # the lookback is step agent_t_started.
        in_lookback, total = defaultdict(int), defaultdict(int)
        for i, obs in enumerate(observations):
            for agent_id in obs:
                total[agent_id] += 1
                if i < lookback:
                    in_lookback[agent_id] += 1
        agent_t = {}
        for agent_id, n in in_lookback.items():
            first = self.agent_t_started[agent_id] - n
            agent_t[agent_id] = first if total[agent_id] > n else first + 1

        for i, (obs, info) in enumerate(zip(observations, infos)):
            act = actions[i] if i < len(actions) else {}
            outs = extra_model_outputs[i] if i < len(extra_model_outputs) else {}
            rew = rewards[i] if i < len(rewards) else {}
            for agent_id, value in obs.items():
                all_agents.add(agent_id)
                obs_of[agent_id].append(value)
                infos_of[agent_id].append(info.get(agent_id, {}))
                if len(obs_of[agent_id]) > 1:
                    actions_of[agent_id].append(self._hanging_actions_end.pop(agent_id))
                    outputs_of[agent_id].append(
                        self._hanging_extra_model_outputs_end.pop(agent_id))
                    rewards_of[agent_id].append(self._hanging_rewards_end.pop(agent_id))
                elif agent_id not in self.env_t_to_agent_t:
                    self.env_t_to_agent_t[agent_id].extend([SKIP_ENV_TS_TAG] * i)
                    lookback_of[agent_id] -= i
                if agent_id in act:
                    self._hanging_actions_end[agent_id] = act[agent_id]
                    self._hanging_extra_model_outputs_end[agent_id] = outs.get(agent_id, {})
                    self._hanging_rewards_end[agent_id] += rew.get(agent_id, 0.0)
                elif terminateds.get(agent_id) or truncateds.get(agent_id):
                    done[agent_id] = True
                elif i < len(observations) - 1:
                    done[agent_id] = terminateds[agent_id] = True
                if agent_id not in agent_t:
                    agent_t[agent_id] = self.agent_t_started.get(agent_id, 0)
                self.env_t_to_agent_t[agent_id].append(agent_t[agent_id])
                agent_t[agent_id] += 1
            for agent_id in all_agents:
                if agent_id not in obs and agent_id not in done:
                    self.env_t_to_agent_t[agent_id].append(SKIP_ENV_TS_TAG)
                    if len(self.env_t_to_agent_t[agent_id]) - lookback <= 0:
                        lookback_of[agent_id] -= 1
                    self._hanging_rewards_end[agent_id] += rew.get(agent_id, 0.0)

        for agent_id in list(self.env_t_to_agent_t):
            if agent_id not in obs_of:
                del self.env_t_to_agent_t[agent_id]
                continue
            n = len(obs_of[agent_id])
            if not (len(infos_of[agent_id]) == n and len(actions_of[agent_id]) + 1 == n
                    and len(outputs_of[agent_id]) + 1 == n
                    and len(rewards_of[agent_id]) + 1 == n):
                raise AssertionError(
                    f"agent {agent_id!r}: {n} observations need {n} infos and {n - 1} "
                    f"actions, rewards and extra model outputs")
            self.env_t_to_agent_t[agent_id].lookback = lookback

        for agent_id, agent_obs in obs_of.items():
            if len(agent_obs) == 1 and done.get(agent_id):
                self._del_agent(agent_id)
                continue
            module_id = agent_module_ids.get(
                agent_id, self.agent_to_module_mapping_fn(agent_id, self))
            outputs = outputs_of[agent_id]
            self.agent_episodes[agent_id] = SingleAgentEpisode(
                id_=agent_episode_ids.get(agent_id) if agent_episode_ids is not None else None,
                agent_id=agent_id,
                module_id=module_id,
                multi_agent_episode_id=self.id_,
                observations=agent_obs,
                observation_space=self.observation_space.get(agent_id),
                infos=infos_of[agent_id],
                actions=actions_of[agent_id],
                action_space=self.action_space.get(agent_id),
                rewards=rewards_of[agent_id],
                extra_model_outputs=(
                    {k: [o[k] for o in outputs] for k in outputs[0]} if outputs else None),
                terminated=terminateds.get(agent_id, False),
                truncated=truncateds.get(agent_id, False),
                t_started=self.agent_t_started[agent_id],
                len_lookback_buffer=max(lookback_of[agent_id], 0),
            )

    # -- stepping -------------------------------------------------------------------

    def _new_agent_episode(self, agent_id: Any) -> SingleAgentEpisode:
        return SingleAgentEpisode(
            agent_id=agent_id,
            module_id=self.module_for(agent_id),
            multi_agent_episode_id=self.id_,
            observation_space=self.observation_space.get(agent_id),
            action_space=self.action_space.get(agent_id),
        )

    def add_env_reset(self, *, observations: dict, infos: Optional[dict] = None) -> None:
        """Adds the env's reset observations (and infos) of the agents that
        have one."""
        if self.is_done:
            raise AssertionError("add_env_reset() on an episode that is done")
        if not self.env_t == self.env_t_started == 0:
            raise AssertionError(
                f"add_env_reset() expects env_t == env_t_started == 0, got env_t="
                f"{self.env_t}, env_t_started={self.env_t_started}")
        infos = infos or {}
        for agent_id, obs in observations.items():
            self.env_t_to_agent_t[agent_id].append(0)
            if agent_id not in self.agent_episodes:
                self.agent_episodes[agent_id] = self._new_agent_episode(agent_id)
            self.agent_episodes[agent_id].add_env_reset(
                observation=obs, infos=infos.get(agent_id))
        self.validate()
        self._start_time = time.perf_counter()

    def _check_step(self, observations, actions, rewards, infos, terminateds, truncateds,
                    extra_model_outputs, agents, all_done):
        """Raises what add_env_step would raise part-way, before anything
        changes: each agent's error in RLlib's order, then (RLlib validates
        the episode last) an agent step that would misalign its extra outputs."""
        steps = []     # (agent, its episode, the extra outputs its step appends)
        for agent_id in agents:
            episode = self.agent_episodes.get(agent_id)
            # (Read as RLlib reads them, so that a container without get()
            # fails here, before anything changes.)
            obs, act = observations.get(agent_id), actions.get(agent_id)
            reward, info = rewards.get(agent_id), infos.get(agent_id)
            terminated = terminateds.get(agent_id, False) or all_done[0]
            truncated = truncateds.get(agent_id, False) or all_done[1]
            outputs = extra_model_outputs.get(agent_id)
            hanging = self._hanging_actions_end.get(agent_id)
            if episode is not None and episode.is_done and any(
                    v is not None for v in (obs, act, reward, info, outputs)):
                raise env_error(
                    f"Agent {agent_id} already had its `SingleAgentEpisode.is_done` set to "
                    f"True, but still received data in a following step! obs={obs} act={act} "
                    f"rew={reward} info={info} extra_model_outputs={outputs}.")
            if obs is not None and act is not None:
                if agent_id not in rewards:
                    raise env_error(f"Agent {agent_id} acted (and received next obs), but "
                                    f"did NOT receive any reward from the env!")
                steps.append((agent_id, episode, outputs))
            elif obs is not None:
                if hanging is not None:
                    steps.append((agent_id, episode,
                                  self._hanging_extra_model_outputs_end.get(agent_id)))
                elif (agent_id not in self._hanging_actions_end
                      and not (terminated or truncated) and agent_id in self.env_t_to_agent_t):
                    raise AssertionError(
                        f"agent {agent_id!r} received a first observation, but it has "
                        f"stepped in this episode before")
            elif act is not None:
                if truncated:
                    raise _truncated_without_observation(agent_id)
                if not terminated and agent_id in self._hanging_actions_end:
                    raise AssertionError(
                        f"agent {agent_id!r} acted again without an observation in between")
                if terminated and _repeats_last_observation(episode):
                    steps.append((agent_id, episode, outputs))
            elif (terminated or truncated) and hanging is not None:
                if truncated:
                    raise _truncated_without_observation(agent_id)
                if _repeats_last_observation(episode):
                    steps.append((agent_id, episode,
                                  self._hanging_extra_model_outputs_end.get(agent_id)))
        for agent_id, episode, outputs in steps:
            if episode is not None:
                check_step_extras(episode, outputs, agent_id)

    def _add_env_step_general(self, observations: dict, actions: dict, rewards: dict,
                              infos: Optional[dict] = None, *,
                              terminateds: Optional[dict] = None,
                              truncateds: Optional[dict] = None,
                              extra_model_outputs: Optional[dict] = None) -> None:
        """add_env_step() for every step the compiled path declines (new
        agents, done flags, refused steps)."""
        if self.is_done:
            raise env_error("Cannot call `add_env_step` on a MultiAgentEpisode that is "
                            "already done!")
        infos = infos or {}
        terminateds = terminateds or {}
        truncateds = truncateds or {}
        extra_model_outputs = extra_model_outputs or {}
        is_terminated = terminateds.get("__all__", False)
        is_truncated = truncateds.get("__all__", False)
        done_agents = {aid for aid, ep in self.agent_episodes.items() if ep.is_done}
        done_agents.update(aid for aid in terminateds if terminateds[aid])
        done_agents.update(aid for aid in truncateds if truncateds[aid])
        if all(aid in done_agents for aid in self.agent_episodes):
            is_terminated = True
        # A set, as RLlib's: its order decides the order new agents join in.
        agents = (set(observations) | set(actions) | set(rewards) | set(terminateds)
                  | set(truncateds)
                  | (set(self.agent_episodes)
                     if terminateds.get("__all__") or truncateds.get("__all__") else set())
                  ) - {"__all__"}
        self._check_step(observations, actions, rewards, infos, terminateds, truncateds,
                         extra_model_outputs, agents, (is_terminated, is_truncated))

        self.env_t += 1
        self.is_terminated, self.is_truncated = is_terminated, is_truncated
        for agent_id, steps in self.env_t_to_agent_t.items():
            if agent_id not in observations:
                steps.append(SKIP_ENV_TS_TAG)
        for agent_id in agents:
            self._step_agent(agent_id, observations, actions, rewards, infos, terminateds,
                             truncateds, extra_model_outputs)
        self.validate()
        self._stepped()

    def _step_agent(self, agent_id, observations, actions, rewards, infos, terminateds,
                    truncateds, extra_model_outputs):
        episode = self.agent_episodes.get(agent_id)
        if episode is None:
            episode = self._new_agent_episode(agent_id)
        obs, act = observations.get(agent_id), actions.get(agent_id)
        info = infos.get(agent_id)
        terminated = terminateds.get(agent_id, False) or self.is_terminated
        truncated = truncateds.get(agent_id, False) or self.is_truncated
        outputs = extra_model_outputs.get(agent_id)
        reward = rewards.get(agent_id) or 0.0
        if obs is not None and act is None:
            act = self._hanging_actions_end.pop(agent_id, None)
            if act is not None:
                outputs = self._hanging_extra_model_outputs_end.pop(agent_id, None)
                reward = self._hanging_rewards_end.pop(agent_id, 0.0) + reward
            elif terminated or truncated:
                self._del_hanging(agent_id)
                return
            else:
                # The agent's first observation: its reset.
                steps = self.env_t_to_agent_t[agent_id]
                steps.extend([SKIP_ENV_TS_TAG] * self.env_t + [0])
                steps.lookback = self._len_lookback_buffers
                episode.add_env_reset(observation=obs, infos=info)
                self._hanging_rewards_begin[agent_id] += reward
                self.agent_episodes[agent_id] = episode
                return
        elif obs is None and act is not None:
            if terminated:
                obs, info = _last_observation(episode)
            else:
                self._hanging_actions_end[agent_id] = act
                self._hanging_rewards_end[agent_id] = reward
                self._hanging_extra_model_outputs_end[agent_id] = outputs
        elif obs is None:
            act = self._hanging_actions_end.get(agent_id)
            if terminated or truncated:
                if act is None:
                    self._del_hanging(agent_id)
                    return
                obs, info = _last_observation(episode)
                outputs = self._hanging_extra_model_outputs_end.pop(agent_id, None)
                reward = self._hanging_rewards_end.pop(agent_id, 0.0) + reward
            elif agent_id not in self.agent_episodes:
                self._hanging_rewards_begin[agent_id] += reward
            else:
                self._hanging_rewards_end[agent_id] += reward
        if obs is not None:
            episode.add_env_step(observation=obs, action=act, reward=reward, infos=info,
                                 terminated=terminated, truncated=truncated,
                                 extra_model_outputs=outputs)
            self.env_t_to_agent_t[agent_id].append(
                len(episode) + self.agent_t_started[agent_id])
        if terminated or truncated:
            self._del_hanging(agent_id)

    def validate(self) -> None:
        """Checks every agent's episode (see SingleAgentEpisode.validate)."""
        for episode in self.agent_episodes.values():
            episode.validate()

    # -- properties -------------------------------------------------------------------

    @property
    def custom_data(self) -> Dict[Any, Any]:
        """A dict for the user's own per-episode data."""
        return self._custom_data

    @property
    def is_reset(self) -> bool:
        """True once add_env_reset() gave some agent an observation."""
        return any(len(ep.observations) > 0 for ep in self.agent_episodes.values())

    @property
    def is_numpy(self) -> bool:
        """True once to_numpy() made every agent's data numpy arrays; False
        without agents (RLlib raises StopIteration there)."""
        episodes = iter(self.agent_episodes.values())
        first = next(episodes, None)
        if first is None:
            return False
        is_numpy = first.is_numpy
        if any(ep.is_numpy is not is_numpy for ep in episodes):
            raise RuntimeError(f"Only some SingleAgentEpisode objects in {self} are "
                               f"converted to numpy, others are not!")
        return is_numpy

    @property
    def is_done(self) -> bool:
        """True once the episode is terminated or truncated (for all agents)."""
        return self.is_terminated or self.is_truncated

    @property
    def agent_ids(self) -> Set[AgentID]:
        """The ids of the agents that have an episode here."""
        return set(self.agent_episodes)

    @property
    def agent_episode_ids(self) -> Dict[AgentID, str]:
        """Each agent's SingleAgentEpisode id."""
        return {agent_id: ep.id_ for agent_id, ep in self.agent_episodes.items()}

    def module_for(self, agent_id: AgentID) -> ModuleID:
        """The module id of `agent_id`, mapped once per episode."""
        if agent_id not in self._agent_to_module_mapping:
            self._agent_to_module_mapping[agent_id] = \
                self.agent_to_module_mapping_fn(agent_id, self)
        return self._agent_to_module_mapping[agent_id]

    def get_terminateds(self) -> Dict[AgentID, bool]:
        """Each agent's terminated flag, and "__all__"."""
        flags = {aid: self.agent_episodes[aid].is_terminated for aid in self.agent_ids}
        flags["__all__"] = self.is_terminated
        return flags

    def get_truncateds(self) -> Dict[AgentID, bool]:
        """Each agent's truncated flag, and "__all__"."""
        flags = {aid: self.agent_episodes[aid].is_truncated for aid in self.agent_ids}
        flags["__all__"] = self.is_truncated
        return flags

    def __len__(self) -> int:
        return self.env_t - self.env_t_started

    def __repr__(self) -> str:
        returns = {aid: ep.get_return() for aid, ep in self.agent_episodes.items()}
        return f"MAEps(len={len(self)} done={self.is_done} Rs={returns} id_={self.id_})"

    def env_steps(self) -> int:
        """The env steps in this chunk (its length)."""
        return len(self)

    def agent_steps(self) -> int:
        """The agent steps in this chunk: the sum of the agents' lengths."""
        return sum(len(ep) for ep in self.agent_episodes.values())

    def get_duration_s(self) -> float:
        """Seconds between the first and the last step (0.0 before a step)."""
        if self._last_step_time is None:
            return 0.0
        return self._last_step_time - self._start_time

    def get_agents_to_act(self) -> Set[AgentID]:
        """The agents that received an observation in the last env step and
        are not done: those that send the next actions."""
        return {aid for aid in self.get_agents_that_stepped()
                if not self.agent_episodes[aid].is_done}

    def get_agents_that_stepped(self) -> Set[AgentID]:
        """The agents that received an observation in the last env step (done
        ones included)."""
        return {aid for aid in self.agent_episodes
                if self.env_t_to_agent_t[aid].get(-1) != SKIP_ENV_TS_TAG}

    def get_return(self, include_hanging_rewards: bool = False) -> float:
        """The sum of all agents' rewards in this chunk (and, if asked, the
        rewards still hanging before or after an agent's observations)."""
        total = sum(ep.get_return() for ep in self.agent_episodes.values())
        if include_hanging_rewards:
            for reward in (*self._hanging_rewards_begin.values(),
                           *self._hanging_rewards_end.values()):
                total += reward
        return total

    def to_numpy(self) -> "MultiAgentEpisode":
        """Turns every agent's data (infos aside) into numpy arrays; returns self."""
        for episode in list(self.agent_episodes.values()):
            episode.to_numpy()
            if not episode.is_numpy:
                # No step yet (a reset, maybe a hanging action): the
                # single-agent to_numpy() leaves all but the observations as
                # they are; here every agent is numpy'ized (RLlib leaves the
                # episode half-converted, and is_numpy then raises).
                for buffer in (episode.actions, episode.rewards,
                               *episode.extra_model_outputs.values()):
                    buffer.finalize()
        return self

    # -- reading ---------------------------------------------------------------------

    def _requested(self, agent_ids: Any) -> set:
        """The agents a getter asks for: RLlib's force_list of `agent_ids`
        (a list, set, tuple or deque of ids, or one id), all agents if none."""
        if agent_ids is None:
            ids: Any = ()
        elif type(agent_ids) in (list, set, tuple, deque):
            ids = agent_ids
        else:
            ids = (agent_ids,)
        return set(ids) or self.agent_ids

    def _hanging(self, what: str, agent_id: Any) -> Any:
        """The action, reward or extra model outputs (dict) an agent produced
        after its last observation, or None."""
        if what == "actions":
            return self._hanging_actions_end.get(agent_id)
        if what == "rewards":
            return self._hanging_rewards_end.get(agent_id)
        if what == "extra_model_outputs":
            return self._hanging_extra_model_outputs_end.get(agent_id)
        return None

    def _get_by_agent_steps(self, what: str, indices: Any, agent_ids: set,
                            neg_index_as_lookback: bool, fill: Any, one_hot: dict,
                            key: Any) -> dict:
        """Each requested agent's data on its own time scale, with its hanging
        value as the step after its last one. Agents with nothing there are
        left out. Extra model outputs without a key come as a dict of keys
        (RLlib fails there)."""
        result = {}
        for agent_id, episode in self.agent_episodes.items():
            if agent_id not in agent_ids:
                continue
            hanging = self._hanging(what, agent_id)
            if what == "extra_model_outputs" and key is None:
                value = {
                    k: buffer.get(indices, neg_index_as_lookback=neg_index_as_lookback,
                                  fill=fill, _add_last_ts_value=None if hanging is None
                                  else hanging.get(k), **one_hot)
                    for k, buffer in episode.extra_model_outputs.items()}
            else:
                buffer = getattr(episode, what)
                if key is not None:
                    buffer = _extras_buffer(buffer, key)
                    hanging = None if hanging is None else hanging[key]
                value = buffer.get(indices, neg_index_as_lookback=neg_index_as_lookback,
                                   fill=fill, _add_last_ts_value=hanging, **one_hot)
            if value is None or (isinstance(value, list) and value == []):
                continue
            result[agent_id] = value
        return result

    def _positions(self, agent_id: Any, what: str, key: Any, steps: Any,
                   hanging: Any, per_row: bool = False) -> Any:
        """Agent steps (or skip tags) as positions in `buffer` (lookback
        included). For actions, rewards and extra outputs, the row one past
        the stored ones is the hanging value when there is one; a step past
        that has nothing yet (the agent's latest observation awaits its
        action) and becomes a skip. (RLlib compares that boundary with the
        agent step itself, which is wrong once a chunk's agent_t_started
        differs from its lookback, e.g. after cut(1).) `per_row`: positions
        for the getters' return_list path."""
        buffer = self._reference(agent_id, what, key)
        episode = self.agent_episodes[agent_id]
        offset = buffer.lookback - self.agent_t_started[agent_id]
        limit = buffer.len_incl_lookback() + (hanging is not None) \
            if what not in ("observations", "infos") else None
        limit_offset = offset      # (the boundary is told by the position)
        if what == "extra_model_outputs" and key is not None \
                and key not in episode.extra_model_outputs and key not in (hanging or ()):
            # A key the agent lacks (after from_state(): an empty buffer, see
            # _extras_buffer), read as RLlib reads it: steps placed by the
            # observations' lookback, the boundary told by the position in
            # the return_list path and by the agent step in the others.
            offset = episode.observations.lookback - self.agent_t_started[agent_id]
            limit_offset = offset if per_row else 0

        def position(t):
            if t == SKIP_ENV_TS_TAG:
                return t
            return SKIP_ENV_TS_TAG if t + limit_offset == limit else t + offset

        return [position(t) for t in steps] if isinstance(steps, list) else position(steps)

    def _reference(self, agent_id: Any, what: str, key: Any) -> Any:
        """The buffer whose lookback and length place an agent's steps:
        extra outputs without a key use their first buffer, or the actions
        when none is stored yet (they would have the same rows)."""
        buffers = self._leaf_buffers(agent_id, what, key)
        if isinstance(buffers, dict):
            return next(iter(buffers.values()), None) or self.agent_episodes[agent_id].actions
        return buffers

    def _leaf_buffers(self, agent_id: Any, what: str, key: Any) -> Any:
        """The buffer a getter reads for one agent: a dict of buffers for
        extra outputs without a key."""
        episode = self.agent_episodes[agent_id]
        buffer = getattr(episode, what)
        if what != "extra_model_outputs" or key is None:
            return buffer
        if key in buffer:
            return buffer[key]
        if key in (self._hanging_extra_model_outputs_end.get(agent_id) or ()):
            # Only a hanging value so far (RLlib fails here): an empty history
            # as long as the actions', without adding the key.
            return _EmptyHistory(episode.actions)
        return _extras_buffer(buffer, key)

    def _read_at(self, agent_id: Any, what: str, key: Any, position: Any, fill: Any,
                 one_hot: dict, hanging: Any) -> Any:
        """One agent's value at one position (lookback included); None for a
        skipped step without `fill`, else the fill value."""
        buffers = self._leaf_buffers(agent_id, what, key)
        if position == SKIP_ENV_TS_TAG and (fill is None or not isinstance(buffers, dict)):
            # Far past the end: the fill value as the buffer makes it.
            return None if fill is None else buffers.get(
                10 ** 12, neg_index_as_lookback=False, fill=fill, **one_hot)
        if isinstance(buffers, dict):
            keys = dict.fromkeys([*buffers, *(hanging or ())])
            return {k: self._read_at(agent_id, what, k, position, fill, one_hot,
                                     _hanging_of_key(hanging, k)) for k in keys}
        if key is not None and isinstance(hanging, dict):
            hanging = hanging[key]     # (KeyError where it lacks the key, as RLlib's)
        return buffers.get(position - buffers.lookback, neg_index_as_lookback=True,
                           fill=fill, _add_last_ts_value=hanging, **one_hot)

    def _agent_steps_at(self, agent_id: Any, what: str, indices: Any,
                        neg_index_as_lookback: bool, fill: Any) -> Any:
        """The agent steps (or skip tags) at env-step `indices`."""
        return self.env_t_to_agent_t[agent_id].get(
            indices, neg_index_as_lookback=neg_index_as_lookback, fill=fill,
            _ignore_last_ts=what not in ("observations", "infos"))

    def _get_by_env_steps(self, what: str, indices: Any, agent_ids: set,
                          neg_index_as_lookback: bool, fill: Any, one_hot: dict,
                          key: Any) -> dict:
        """Each requested agent's data at env-step `indices`: agents that did
        not step there are left out (or filled, with `fill`)."""
        result = {}
        for agent_id in self.agent_episodes:
            if agent_id not in agent_ids:
                continue
            hanging = self._hanging(what, agent_id)
            steps = self._agent_steps_at(agent_id, what, indices, neg_index_as_lookback,
                                         SKIP_ENV_TS_TAG if fill is not None else None)
            positions = self._positions(agent_id, what, key, steps, hanging)
            if not isinstance(positions, list):
                value = self._read_at(agent_id, what, key, positions, fill, one_hot, hanging)
                if value is not None:
                    result[agent_id] = value
                continue
            values = self._read_list(agent_id, what, key, positions, fill, one_hot, hanging)
            if isinstance(values, dict) and all(len(v) == 0 for v in values.values()):
                continue
            if len(values) > 0:
                result[agent_id] = values
        return result

    def _read_list(self, agent_id: Any, what: str, key: Any, positions: list, fill: Any,
                   one_hot: dict, hanging: Any) -> Any:
        """One agent's values at a list of positions: skips are dropped, or
        filled (then batched once numpy'ized), as RLlib does."""
        buffers = self._leaf_buffers(agent_id, what, key)
        if isinstance(buffers, dict):
            return {k: self._read_list(agent_id, what, k, positions, fill, one_hot,
                                       _hanging_of_key(hanging, k)) for k in buffers}
        if key is not None and isinstance(hanging, dict):
            hanging = hanging[key]     # (KeyError where it lacks the key, as RLlib's)
        if SKIP_ENV_TS_TAG in positions and fill is not None:
            filler = buffers.get(10 ** 12, neg_index_as_lookback=False, fill=fill, **one_hot)
            values = [filler if p == SKIP_ENV_TS_TAG else
                      buffers.get(p - buffers.lookback, neg_index_as_lookback=True, fill=fill,
                                  _add_last_ts_value=hanging, **one_hot)
                      for p in positions]
            return batch_like_rllib(values) if self.agent_episodes[agent_id].is_numpy \
                else values
        kept = [p - buffers.lookback for p in positions if p != SKIP_ENV_TS_TAG]
        if not kept:
            return []
        return buffers.get(kept, neg_index_as_lookback=True, fill=fill,
                           _add_last_ts_value=hanging, **one_hot)

    def _get_by_env_steps_as_list(self, what: str, indices: Any, agent_ids: set,
                                  neg_index_as_lookback: bool, fill: Any, one_hot: dict,
                                  key: Any) -> list:
        """One multi-agent dict per env step in `indices`."""
        columns = {}
        for agent_id in self.agent_episodes:
            if agent_id not in agent_ids:
                continue
            steps = self._agent_steps_at(agent_id, what, indices, neg_index_as_lookback,
                                         SKIP_ENV_TS_TAG)
            columns[agent_id] = steps if isinstance(steps, list) else [steps]
        if not columns:
            return []
        result = []
        for i in range(len(next(iter(columns.values())))):
            row = {}
            for agent_id, steps in columns.items():
                hanging = self._hanging(what, agent_id)
                buffers = self._leaf_buffers(agent_id, what, key)
                if isinstance(buffers, dict) and not buffers and not hanging:
                    continue
                position = self._positions(agent_id, what, key, steps[i], hanging,
                                           per_row=True)
                value = self._read_at(agent_id, what, key, position, fill, one_hot, hanging)
                if value is not None:
                    row[agent_id] = value
            result.append(row)
        return result

    def _get(self, what: str, indices: Any, agent_ids: Any, env_steps: bool,
             neg_index_as_lookback: bool, fill: Any, one_hot_discrete: bool,
             return_list: bool, key: Any = None) -> Any:
        agents = self._requested(agent_ids)
        one_hot = {"one_hot_discrete": one_hot_discrete} if one_hot_discrete else {}
        args = (what, indices, agents, neg_index_as_lookback, fill, one_hot, key)
        if not env_steps:
            if return_list:
                raise ValueError(f"`MultiAgentEpisode.get_{what}()` can't be called with "
                                 f"both `env_steps=False` and `return_list=True`!")
            return self._get_by_agent_steps(*args)
        if return_list:
            return self._get_by_env_steps_as_list(*args)
        return self._get_by_env_steps(*args)

    # -- writing ----------------------------------------------------------------------

    def set_observations(self, *, new_data: dict, at_indices: Any = None,
                         neg_index_as_lookback: bool = False) -> None:
        """Overwrites each named agent's observations at `at_indices` (its own
        steps). Each agent is checked in turn (KeyError for an unknown one,
        else the single-agent episode's checks) before anything changes."""
        self._set("observations", new_data, at_indices, neg_index_as_lookback)

    def set_actions(self, *, new_data: dict, at_indices: Any = None,
                    neg_index_as_lookback: bool = False) -> None:
        """Overwrites each named agent's actions (see set_observations)."""
        self._set("actions", new_data, at_indices, neg_index_as_lookback)

    def set_rewards(self, *, new_data: dict, at_indices: Any = None,
                    neg_index_as_lookback: bool = False) -> None:
        """Overwrites each named agent's rewards (see set_observations)."""
        self._set("rewards", new_data, at_indices, neg_index_as_lookback)

    def set_extra_model_outputs(self, *, key: Any, new_data: dict, at_indices: Any = None,
                                neg_index_as_lookback: bool = False) -> None:
        """Overwrites each named agent's extra output `key` (see set_observations)."""
        self._set("extra_model_outputs", new_data, at_indices, neg_index_as_lookback, key)

    def _set(self, what: str, new_data: dict, at_indices: Any, neg_index_as_lookback: bool,
             key: Any = None) -> None:
        # RLlib sets agent by agent and raises the first failing agent's error
        # (in new_data's order); the same error here, but before any write.
        writes = []
        for agent_id, data in new_data.items():
            if agent_id not in self.agent_episodes:
                raise KeyError(f"AgentID '{agent_id}' not found in this episode.")
            writes.append(self.agent_episodes[agent_id]._prepare_set(
                what, data, at_indices, neg_index_as_lookback, key))
        for write in writes:
            write()

    # -- pieces -----------------------------------------------------------------------

    def cut(self, len_lookback_buffer: int = 0) -> "MultiAgentEpisode":
        """The next chunk of this episode: it starts at env_t, with the last
        `len_lookback_buffer` env steps (at least back to each hanging
        agent's last observation) as lookback."""
        if not len_lookback_buffer >= 0:
            raise AssertionError(f"cut() expects len_lookback_buffer >= 0, got "
                                 f"{len_lookback_buffer!r}")
        if self.is_done:
            raise RuntimeError(
                "Can't call `MultiAgentEpisode.cut()` when the episode is already done!")
        successor = None
        if len_lookback_buffer == 0 and not self._hanging_actions_end:
            successor = self._cut_at_last_observations()     # (compiled)
        if successor is None:
            successor = self._cut_general(len_lookback_buffer)
        # Each agent goes on from its last observation: one that then ends
        # without a new one repeats it, as in the uncut episode (RLlib's
        # successor, built from lists, has none and drops that last step).
        for agent_id, episode in successor.agent_episodes.items():
            mine = self.agent_episodes.get(agent_id)
            if mine is not None and mine._last_added_observation is not None:
                episode._last_added_observation = mine._last_added_observation
                episode._last_added_infos = mine._last_added_infos
        return successor

    def _cut_general(self, len_lookback_buffer: int) -> "MultiAgentEpisode":
        lookback = len_lookback_buffer
        for agent_id in self._hanging_actions_end:
            steps = self.env_t_to_agent_t[agent_id]
            # The agent's last observation must come along, for its hanging
            # action to join it. (RLlib starts this search at -0, i.e. at the
            # first step, and so drops such an agent with a lookback of 0.)
            for i in range(max(len_lookback_buffer, 1), len(steps.data) + 1):
                if steps.get(-i) != SKIP_ENV_TS_TAG:
                    lookback = max(lookback, i - 1)
                    break
        obs_indices = slice(-lookback - 1, None)
        rest = slice(-lookback, None) if lookback > 0 else slice(None, 0)
        successor = type(self)(
            id_=self.id_,
            observations=self.get_observations(indices=obs_indices, return_list=True),
            observation_space=self.observation_space,
            infos=self.get_infos(indices=obs_indices, return_list=True),
            actions=self.get_actions(indices=rest, return_list=True),
            action_space=self.action_space,
            rewards=self.get_rewards(indices=rest, return_list=True),
            extra_model_outputs=self.get_extra_model_outputs(
                key=None, indices=rest, return_list=True),
            terminateds=self.get_terminateds(),
            truncateds=self.get_truncateds(),
            env_t_started=self.env_t,
            agent_t_started={aid: self.agent_episodes[aid].t for aid in self.agent_ids
                             if not self.agent_episodes[aid].is_done},
            agent_episode_ids=self.agent_episode_ids,
            agent_module_ids={aid: self.agent_episodes[aid].module_id
                              for aid in self.agent_ids},
            agent_to_module_mapping_fn=self.agent_to_module_mapping_fn,
            len_lookback_buffer="auto",
        )
        successor._hanging_rewards_begin = self._hanging_rewards_end.copy()
        successor._custom_data = copy.deepcopy(self.custom_data)
        return successor

    def concat_episode(self, other: "MultiAgentEpisode") -> None:
        """Appends `other`, the chunk that follows this one (same id, starting
        at this one's env_t), to this episode: the chunks of an episode,
        concatenated, are the episode that was never cut. Raises
        AssertionError, with this episode unchanged, for a chunk that does
        not follow it."""
        if other.id_ != self.id_:
            raise AssertionError(f"concat_episode() expects the same id: {other.id_!r} "
                                 f"vs {self.id_!r}")
        if self.is_done:
            raise AssertionError("concat_episode() on an episode that is done")
        if self.env_t != other.env_t_started:
            raise AssertionError(f"concat_episode() expects the successor to start at "
                                 f"env_t={self.env_t}, not {other.env_t_started}")
        other.validate()
        agents = set(self.agent_episodes) | set(other.agent_episodes)    # (RLlib's order)
        for agent_id in agents:
            # Every agent's concatenation is checked before any is made.
            episode = self.agent_episodes.get(agent_id)
            if episode is not None and not episode.is_done and agent_id in other.agent_episodes:
                _check_agent_concat(episode, other.agent_episodes[agent_id])
        steps = other.env_t - self.env_t
        extended = set()      # the agents whose env-step mapping other's extends
        observed = set(self.agent_episodes)
        rewards_begin = dict(self._hanging_rewards_begin)
        for agent_id in agents:
            episode = self.agent_episodes.get(agent_id)
            if episode is None:
                self.agent_episodes[agent_id] = other.agent_episodes[agent_id]
                self.agent_t_started[agent_id] = other.agent_t_started[agent_id]
                if agent_id not in self.env_t_to_agent_t:
                    self.env_t_to_agent_t[agent_id] = self._mapping_from(
                        other.env_t_to_agent_t[agent_id])
                else:
                    for step in other.env_t_to_agent_t[agent_id][1:]:
                        self.env_t_to_agent_t[agent_id].append(step)
                extended.add(agent_id)
                self._copy_hanging(agent_id, other)
            elif episode.is_done:
                continue
            elif agent_id in other.agent_episodes:
                successor = other.agent_episodes[agent_id]
                if len(episode.actions) == 0 and episode.actions.lookback == 0:
                    # An agent with no action yet has no extra outputs either:
                    # it starts the successor's keys empty (RLlib's
                    # single-agent concat refuses the new keys).
                    for key in successor.extra_model_outputs:
                        if key not in episode.extra_model_outputs:
                            episode.extra_model_outputs[key] = InfiniteLookbackBuffer()
                episode.concat_episode(successor)
                # Both flags of the agent's end (RLlib's single-agent concat
                # keeps one), and the observation it goes on from.
                episode.is_terminated = successor.is_terminated
                episode.is_truncated = successor.is_truncated
                if successor._last_added_observation is not None:
                    episode._last_added_observation = successor._last_added_observation
                    episode._last_added_infos = successor._last_added_infos
                if agent_id in other._hanging_actions_end or \
                        agent_id in self._hanging_actions_end:
                    # The successor's hanging values (none, where it took this
                    # chunk's hanging action into a step: RLlib keeps that
                    # one hanging). Without a hanging action on either side,
                    # this chunk's hanging reward stays, as RLlib's does.
                    for cache in ("_hanging_actions_end", "_hanging_rewards_end",
                                  "_hanging_extra_model_outputs_end"):
                        theirs = getattr(other, cache)
                        if agent_id in theirs:
                            getattr(self, cache)[agent_id] = copy.deepcopy(theirs[agent_id])
                        else:
                            getattr(self, cache).pop(agent_id, None)
                for step in other.env_t_to_agent_t[agent_id][1:]:
                    self.env_t_to_agent_t[agent_id].append(step)
                extended.add(agent_id)
        # Every agent of this chunk has an entry per env step, as in the uncut
        # episode: one done here, or without data in other, skipped other's
        # steps (RLlib leaves its mapping short).
        for agent_id, mapping in self.env_t_to_agent_t.items():
            if agent_id not in extended:
                for _ in range(steps):
                    mapping.append(SKIP_ENV_TS_TAG)
        # Rewards an agent got before its first observation: this chunk's and
        # then other's (RLlib keeps only other's). For an agent observed here,
        # other's are a copy of this chunk's hanging ones (cut() made them).
        for agent_id, reward in other._hanging_rewards_begin.items():
            if agent_id not in observed:
                before = rewards_begin.get(agent_id)
                self._hanging_rewards_begin[agent_id] = \
                    reward if before is None else before + reward
        for agent_id in rewards_begin:
            # One that other mapped to a module (it had data there) but
            # holds no values of: it ended there (as one ends before its
            # first observation), and its rewards went with it.
            if (agent_id not in observed and agent_id in other._agent_to_module_mapping
                    and agent_id not in other.agent_episodes
                    and agent_id not in other._hanging_rewards_begin):
                self._hanging_rewards_begin.pop(agent_id, None)
        # An agent that ended in other has no hanging values left (RLlib
        # keeps this chunk's), and the agents other mapped to modules keep
        # their modules (RLlib forgets them).
        for agent_id, episode in self.agent_episodes.items():
            if episode.is_done:
                self._del_hanging(agent_id)
        for agent_id, module_id in other._agent_to_module_mapping.items():
            self._agent_to_module_mapping.setdefault(agent_id, module_id)
        self.env_t = other.env_t
        # Both flags, as the uncut episode has them (RLlib's concat takes
        # is_truncated only where other is not terminated).
        if other.is_terminated:
            self.is_terminated = True
        if other.is_truncated:
            self.is_truncated = True
        self.custom_data.update(other.custom_data)
        self.validate()

    def _mapping_from(self, steps: Any) -> "AgentSteps":
        """The env-step mapping of an agent new in the chunk that follows
        this one, laid over this chunk's env steps and lookback. Such an
        agent joined by add_env_step(), which gives it one skip per env step
        before its first observation from env step 0 on (RLlib's layout,
        whatever the chunk's start): the steps before this chunk's first
        (lookback included) are cut off. RLlib keeps the mapping as it is."""
        reference = next(iter(self.env_t_to_agent_t.values()), None)
        lookback = reference.lookback if reference is not None else self._len_lookback_buffers
        items = steps.data
        first = self.env_t_started - lookback     # the env step this chunk's mappings start at
        items = [SKIP_ENV_TS_TAG] * -first + items if first <= 0 else items[first:]
        return AgentSteps(data=items, lookback=lookback)

    def slice(self, slice_: slice, *, len_lookback_buffer: Optional[int] = None
              ) -> "MultiAgentEpisode":
        """A new episode with the env steps in `slice_` (step 1 only) and a
        lookback of `len_lookback_buffer` env steps (default: this one's). A
        piece up to the end keeps the hanging actions (the lookback reaches
        back to each such agent's last observation): like cut()'s successor,
        it can be stepped on and concatenated to this episode."""
        if slice_.step not in (1, None):
            raise SliceStepError(f"Slicing MultiAgentEnv with a step other than 1 (you used "
                                 f"{slice_.step}) is not supported!")
        n = len(self)
        start, stop = slice_.start, slice_.stop
        start = 0 if start is None else max(n + start, 0) if start < 0 else min(start, n)
        stop = n if stop is None else max(n + stop, 0) if stop < 0 else min(stop, n)
        # Each agent's mapping read with one entry per env step, counted back
        # from the last (RLlib reads them from the first, and misplaces): an
        # agent terminated without an observation has a skip and then its last
        # step at that env step (RLlib's layout), read as its last step there;
        # one that joined by add_env_step() in a chunk with fewer lookback steps
        # than env steps before it has fewer skips before its first observation
        # (also RLlib's layout), read as skips.
        relaid = {}
        for agent_id, steps in self.env_t_to_agent_t.items():
            items = steps.data
            want = steps.lookback + n + 1
            last = max((i for i, t in enumerate(items) if t != SKIP_ENV_TS_TAG), default=0)
            episode = self.agent_episodes.get(agent_id)
            if len(items) > want and last and items[last - 1] == SKIP_ENV_TS_TAG \
                    and episode is not None and episode.is_terminated:
                items = items[:last - 1] + items[last:]
            if len(items) < want:
                items = [SKIP_ENV_TS_TAG] * (want - len(items)) + items
            if len(items) != len(steps.data):
                relaid[agent_id] = steps
                self.env_t_to_agent_t[agent_id] = AgentSteps(data=items, lookback=steps.lookback)
        try:
            return self._slice(start, stop, n, len_lookback_buffer)
        finally:
            self.env_t_to_agent_t.update(relaid)

    def _slice(self, start: int, stop: int, n: int, len_lookback_buffer: Optional[int]
               ) -> "MultiAgentEpisode":
        lookbacks = {b.lookback for ep in self.agent_episodes.values()
                     for b in (ep.observations, ep.actions, ep.rewards,
                               *ep.extra_model_outputs.values())}
        if len(lookbacks) > 1:
            raise ValueError("Can only slice a MultiAgentEpisode if all lookback buffers in "
                             "this episode have the exact same size!")
        ref_lookback = next(iter(lookbacks), None)
        terminateds, truncateds, agent_t_started = {}, {}, {}
        for agent_id, episode in self.agent_episodes.items():
            steps = self.env_t_to_agent_t[agent_id]
            # Done where the piece ends with the agent's last step. (RLlib
            # compares that step with the agent's length, which misses it in
            # a chunk that starts after the agent's first step.)
            items = steps.data
            first = len(items) - 1 - n      # where env step 0 is (see slice())
            if 0 <= first + stop < len(items) and items[first + stop] != SKIP_ENV_TS_TAG \
                    and episode.t == items[first + stop]:
                terminateds[agent_id] = episode.is_terminated
                truncateds[agent_id] = episode.is_truncated
            # The agent's step at the piece's first observation of it, or, with
            # none there, at its last one before (RLlib's piece counts that
            # agent's steps from 0 again).
            before = [t for t in items[:max(first + start, 0)] if t != SKIP_ENV_TS_TAG]
            after = [t for t in items[max(first + start, 0):] if t != SKIP_ENV_TS_TAG]
            if after or before:
                agent_t_started[agent_id] = after[0] if after else before[-1]
        terminateds["__all__"] = all(terminateds.get(aid) for aid in self.agent_episodes)
        truncateds["__all__"] = all(truncateds.get(aid) for aid in self.agent_episodes)
        lookback = len_lookback_buffer if len_lookback_buffer is not None else ref_lookback
        if start - lookback < 0 and ref_lookback < lookback - start:
            lookback = ref_lookback + start
        if stop == n and self.env_t_to_agent_t:
            # A piece up to the end keeps the hanging actions: each such agent's
            # last observation comes along, as in cut(). (RLlib's piece drops an
            # agent whose last observation lies before it, and its hanging action.)
            available = start + next(iter(self.env_t_to_agent_t.values())).lookback
            for agent_id in self._hanging_actions_end:
                items = self.env_t_to_agent_t[agent_id].data
                back = next((i for i, t in enumerate(reversed(items))
                             if t != SKIP_ENV_TS_TAG), len(items))
                lookback = max(lookback, min(back - (n - start), available))
        # (Counted back from the last env step: see slice().)
        observed = slice(start - lookback - n - 1, (stop - n) or None)
        acted = slice(start - lookback - n, (stop - n) or None) if start - lookback < n \
            else slice(0, 0)
        piece = type(self)(
            id_=self.id_,
            observations=self.get_observations(observed, return_list=True),
            observation_space=self.observation_space,
            # (RLlib's slice passes no infos: its pieces hold {} for each.)
            infos=self.get_infos(observed, return_list=True),
            actions=self.get_actions(acted, return_list=True),
            action_space=self.action_space,
            rewards=self.get_rewards(acted, return_list=True),
            extra_model_outputs=self.get_extra_model_outputs(indices=acted, return_list=True),
            terminateds=terminateds,
            truncateds=truncateds,
            len_lookback_buffer=lookback,
            env_t_started=self.env_t_started + start,
            agent_episode_ids=self.agent_episode_ids,
            agent_t_started=agent_t_started,
            # (A copy: RLlib hands its own dict on, which the piece then changes.)
            agent_module_ids=dict(self._agent_to_module_mapping),
            agent_to_module_mapping_fn=self.agent_to_module_mapping_fn,
        )
        if self.agent_episodes and self.is_numpy:
            piece.to_numpy()
        return piece

    def __getitem__(self, item: slice) -> "MultiAgentEpisode":
        """episode[a:b] is episode.slice(slice(a, b)); nothing else indexes it."""
        if isinstance(item, slice):
            return self.slice(slice_=item)
        raise EpisodeIndexError(
            f"MultiAgentEpisode does not support getting item '{item}'! Only slice "
            f"objects allowed with the syntax: `episode[a:b]`.")

    # -- state ------------------------------------------------------------------------

    def get_state(self) -> Dict[str, Any]:
        """Everything needed to rebuild this episode (see from_state)."""
        return {
            "id_": self.id_,
            "agent_to_module_mapping_fn": self.agent_to_module_mapping_fn,
            "_agent_to_module_mapping": self._agent_to_module_mapping,
            "observation_space": self.observation_space,
            "action_space": self.action_space,
            "env_t_started": self.env_t_started,
            "env_t": self.env_t,
            "agent_t_started": self.agent_t_started,
            "env_t_to_agent_t": self.env_t_to_agent_t,
            "_hanging_actions_end": self._hanging_actions_end,
            "_hanging_extra_model_outputs_end": self._hanging_extra_model_outputs_end,
            "_hanging_rewards_end": self._hanging_rewards_end,
            "_hanging_rewards_begin": self._hanging_rewards_begin,
            "is_terminated": self.is_terminated,
            "is_truncated": self.is_truncated,
            "agent_episodes": [(aid, ep.get_state())
                               for aid, ep in self.agent_episodes.items()],
            "_start_time": self._start_time,
            "_last_step_time": self._last_step_time,
            "custom_data": self.custom_data,
        }

    # -- as data (files: datasets, kept replay buffers) -------------------------------

    def _data_state(self) -> Dict[str, Any]:
        """The episode's own fields (not its agents' episodes) as plain data
        (episode.values packs it): the env-step to agent-step mappings as
        int64 arrays (lookback and all), the hanging actions, rewards and
        outputs, the spaces. Its agent-to-module mapping function is code,
        not data: the resolved agent-to-module mapping is kept instead."""
        from episode._column import KINDS

        state = {name: getattr(self, name) for name in _DATA_FIELDS}
        state.update({name: dict(getattr(self, name)) for name in _DATA_DEFAULTS})
        mappings = {}
        for agent_id, steps in self.env_t_to_agent_t.items():
            col = steps._leaves[0] if len(steps._leaves) == 1 else None
            if col is not None and not col.finalized and col.kind == KINDS["int"]:
                mappings[agent_id] = (steps.lookback, col.view())
            else:
                mappings[agent_id] = (steps.lookback, list(steps.data))
        state["env_t_to_agent_t"] = mappings
        state["agents"] = list(self.agent_episodes)
        state["spaces"] = [self.observation_space, self.action_space]
        state["custom_data"] = dict(self.custom_data)
        state["len_lookback_buffers"] = self._len_lookback_buffers
        return state

    @staticmethod
    def _from_data_state(id_: Any, state: Dict[str, Any],
                         agent_episodes: dict) -> "MultiAgentEpisode":
        """_data_state's episode back, with id `id_`, over its agents'
        episodes (made already), with the default mapping function; checked
        as from_state checks a state (ValueError, TypeError, KeyError)."""
        from episode._column import Column, KINDS

        if not isinstance(state, dict):
            raise ValueError("a multi-agent episode's fields are not a dict")
        agents = state["agents"]
        if not isinstance(agents, list) or sorted(map(repr, agents)) != \
                sorted(map(repr, agent_episodes)):
            raise ValueError("its agents are not the ones stored with it")
        fields = {name: state[name] for name in _DATA_FIELDS}
        for name, factory in _DATA_DEFAULTS.items():
            if not isinstance(state[name], dict):
                raise ValueError(f"{name} is not a dict")
            fields[name] = defaultdict(factory, state[name])
        mappings = {}
        if not isinstance(state["env_t_to_agent_t"], dict):
            raise ValueError("env_t_to_agent_t is not a dict")
        for agent_id, (lookback, steps) in state["env_t_to_agent_t"].items():
            buf = AgentSteps()
            if isinstance(steps, np.ndarray):
                if steps.dtype != np.int64 or steps.ndim != 1:
                    raise ValueError("an env-step mapping is not int64 steps")
                buf._set_storage(Column.from_rows(np.array(steps), KINDS["int"]))
            else:
                buf.data = steps
            buf.lookback = lookback
            mappings[agent_id] = buf
        fields["env_t_to_agent_t"] = mappings
        observation_space, action_space = state["spaces"]
        fields.update(id_=id_, agent_to_module_mapping_fn=default_agent_to_module_mapping_fn,
                      observation_space=observation_space, action_space=action_space,
                      custom_data=state["custom_data"])
        episode = MultiAgentEpisode._from_parts(
            fields, {agent_id: agent_episodes[agent_id] for agent_id in agents})
        episode._len_lookback_buffers = state["len_lookback_buffers"]
        return episode

    @staticmethod
    def from_state(state: Dict[str, Any]) -> "MultiAgentEpisode":
        """The episode a get_state() dict describes."""
        return MultiAgentEpisode._from_parts(
            state, {aid: SingleAgentEpisode.from_state(agent_state)
                    for aid, agent_state in state["agent_episodes"]})

    @staticmethod
    def _from_parts(state: Dict[str, Any], agent_episodes: dict) -> "MultiAgentEpisode":
        """The episode of a get_state() dict whose agents' episodes are
        already made (`agent_episodes`; the state's own are not read)."""
        episode = MultiAgentEpisode(id_=state["id_"])
        for name in ("agent_to_module_mapping_fn", "_agent_to_module_mapping",
                     "observation_space", "action_space", "env_t_started", "env_t",
                     "agent_t_started", "env_t_to_agent_t", "_hanging_actions_end",
                     "_hanging_extra_model_outputs_end", "_hanging_rewards_end",
                     "_hanging_rewards_begin", "is_terminated", "is_truncated",
                     "_start_time", "_last_step_time"):
            setattr(episode, name, state[name])
        mapping = state["env_t_to_agent_t"]
        episode.env_t_to_agent_t = defaultdict(
            AgentSteps, {aid: AgentSteps.of(steps) for aid, steps in mapping.items()})
        episode.agent_episodes = agent_episodes
        episode._custom_data = state.get("custom_data", {})
        episode.validate()
        return episode

    def get_sample_batch(self) -> "MultiAgentBatch":
        """The agents' data as RLlib's MultiAgentBatch (needs ray[rllib])."""
        try:
            from ray.rllib.policy.sample_batch import MultiAgentBatch
        except ModuleNotFoundError as e:
            raise rllib_missing(e, "get_sample_batch(), which returns RLlib's "
                                   "MultiAgentBatch,") from e
        return MultiAgentBatch(
            policy_batches={aid: ep.get_sample_batch()
                            for aid, ep in self.agent_episodes.items()
                            if ep.t - ep.t_started > 0},
            env_steps=self.env_t - self.env_t_started)

    def print(self) -> None:
        """Prints which agent stepped at which env step, as a grid."""
        width = max(steps.len_incl_lookback() for steps in self.env_t_to_agent_t.values())
        lookback = next(iter(self.env_t_to_agent_t.values())).lookback
        name_width = max(len(aid) for aid in self.agent_ids)
        header = "ts" + " " * name_width + "   ".join(
            str(i) for i in range(-lookback, width - lookback)) + "\n"
        rows = []
        for agent_id, steps in self.env_t_to_agent_t.items():
            row = f"{agent_id}  " + " " * (name_width - len(agent_id))
            row += "".join("    " if t == SKIP_ENV_TS_TAG else " x  " for t in steps.data)
            rows.append(row.rstrip())
        print(header + "\n".join(rows))

    def add_temporary_timestep_data(self, *args: Any, **kwargs: Any) -> None:
        """Removed: use `custom_data[key] = ...`."""
        raise ValueError("`add_temporary_timestep_data` has been deprecated. Use "
                         "`MultiAgentEpisode.custom_data[some-key] = ...` instead.")

    def get_temporary_timestep_data(self, *args: Any, **kwargs: Any) -> None:
        """Removed: use `custom_data[key]`."""
        raise ValueError("`get_temporary_timestep_data` has been deprecated. Use "
                         "`MultiAgentEpisode.custom_data[some-key]` instead.")

    # -- hanging values ----------------------------------------------------------------

    def _copy_hanging(self, agent_id: Any, other: "MultiAgentEpisode") -> None:
        """Takes the values `other` holds for an agent after its last
        observation (a reward may hang without an action: RLlib's copy then
        fails with KeyError)."""
        for cache in ("_hanging_actions_end", "_hanging_rewards_end",
                      "_hanging_extra_model_outputs_end"):
            theirs = getattr(other, cache)
            if agent_id in theirs:
                getattr(self, cache)[agent_id] = copy.deepcopy(theirs[agent_id])

    def _del_hanging(self, agent_id: Any) -> None:
        self._hanging_rewards_begin.pop(agent_id, None)
        self._hanging_actions_end.pop(agent_id, None)
        self._hanging_extra_model_outputs_end.pop(agent_id, None)
        self._hanging_rewards_end.pop(agent_id, None)

    def _del_agent(self, agent_id: Any) -> None:
        self._del_hanging(agent_id)
        self.agent_episodes.pop(agent_id, None)
        self.env_t_to_agent_t.pop(agent_id, None)
        self._agent_to_module_mapping.pop(agent_id, None)
        self.agent_t_started.pop(agent_id, None)


_register_facade(MultiAgentEpisode, AgentSteps, default_agent_to_module_mapping_fn)
