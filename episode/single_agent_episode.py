"""SingleAgentEpisode: RLlib's single-agent episode on the compiled core.

Behaves as ray.rllib.env.single_agent_episode.SingleAgentEpisode (RLlib 2.60):
same constructor, attributes, methods, return types and errors. The per-step
methods (add_env_step, the getters, len, validate) are inherited from the
compiled EpisodeCore; this module holds the rest.
"""
from __future__ import annotations

import functools
import operator
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Union

import gymnasium as gym
import numpy as np

from episode._extras import rllib_missing
from episode._episode import REWARDS_SPACE as _REWARDS_SPACE
from episode._episode import (
    EpisodeCore,
    _register_facade_class,
    buffer_of,
    episode_id,
    infos_from_state,
    infos_state,
    init_without_data,
    new_episode,
)
from episode.lookback_buffer import InfiniteLookbackBuffer
from episode.spaces import (
    check_same_nesting,
    flatten_struct,
    pickled_space,
    share_space,
    space_from_dict,
    space_to_dict,
    unpickled_space,
)
from episode.typing import Indices

if TYPE_CHECKING:
    from ray.rllib.policy.sample_batch import SampleBatch

__all__ = ["SingleAgentEpisode"]

# Unpickled rewards buffers get the same space object as new ones.
share_space(_REWARDS_SPACE)



class EpisodeIndexError(TypeError, NotImplementedError):
    """Raised for episode[x] with x not a slice: only slices index an episode.

    A TypeError by meaning; also a NotImplementedError because that is the
    class RLlib raises here, so code catching RLlib's error keeps working.
    """


def _as_buffer(data: Any, lookback: int, space: Any = None) -> InfiniteLookbackBuffer:
    if isinstance(data, InfiniteLookbackBuffer):
        return data
    if hasattr(data, "get_state") and hasattr(data, "lookback"):
        # Another implementation's buffer (RLlib's): same state format.
        return InfiniteLookbackBuffer.from_state(data.get_state())
    return InfiniteLookbackBuffer(data=data, lookback=lookback, space=space)


class SingleAgentEpisode(EpisodeCore):
    """The trajectory of one agent: observations, actions, rewards, infos and
    extra model outputs, each in a lookback buffer.

    An episode chunk starts with a reset observation (or with the last
    observation of the previous chunk as lookback) and grows by one
    observation, action and reward per ``add_env_step``. Until ``to_numpy()``
    getters return the items as given (lists for list/slice indices); after it
    they return numpy arrays. ``cut()`` starts the next chunk of the same
    episode, ``concat_episode()`` joins chunks, ``slice()``/``episode[a:b]``
    take a piece.

    Args:
        id_: Unique id (when empty, a new random one formatted as uuid4().hex).
        observations, infos, actions, rewards: Initial data, as lists or
            InfiniteLookbackBuffers; there is one more observation/info than
            actions/rewards.
        observation_space, action_space: Optional gymnasium spaces.
        terminated, truncated: Done flags.
        extra_model_outputs: Dict of key -> list (or buffer) of per-step outputs.
        t_started: The global env step this chunk starts at.
        len_lookback_buffer: How many of the initial items are lookback; "auto"
            means all of the given rewards (so the chunk starts empty).
        agent_id, module_id, multi_agent_episode_id: Multi-agent bookkeeping.
    """

    __slots__ = ()

    def __init__(
        self,
        id_: Optional[str] = None,
        *,
        observations: Optional[Union[List, InfiniteLookbackBuffer]] = None,
        observation_space: Optional[gym.Space] = None,
        infos: Optional[Union[List[Dict], InfiniteLookbackBuffer]] = None,
        actions: Optional[Union[List, InfiniteLookbackBuffer]] = None,
        action_space: Optional[gym.Space] = None,
        rewards: Optional[Union[List, InfiniteLookbackBuffer]] = None,
        terminated: bool = False,
        truncated: bool = False,
        extra_model_outputs: Optional[Dict[str, Any]] = None,
        t_started: Optional[int] = None,
        len_lookback_buffer: Union[int, str] = "auto",
        agent_id: Any = None,
        module_id: Any = None,
        multi_agent_episode_id: Any = None,
    ):
        # The usual calls (no data) are done in C; the rest below.
        if init_without_data(self, id_, observations, observation_space, infos, actions,
                             action_space, rewards, terminated, truncated, extra_model_outputs,
                             t_started, len_lookback_buffer, agent_id, module_id,
                             multi_agent_episode_id):
            return
        self.id_ = id_ or episode_id()
        self.agent_id = agent_id
        self.module_id = module_id
        self.multi_agent_episode_id = multi_agent_episode_id
        n_rewards = len(rewards) if rewards is not None else 0
        if len_lookback_buffer == "auto" or len_lookback_buffer > n_rewards:
            len_lookback_buffer = n_rewards
        lb = len_lookback_buffer
        # As RLlib: no (or empty) infos -> one empty dict per observation
        # (after the lookback). len(), not truthiness: arrays have no truth value.
        if infos is None or len(infos) == 0:
            infos = [{} for _ in range(len(observations) if observations is not None else 0)]
        self.observations = _as_buffer(observations, lb)
        self._observation_space = None
        self.observation_space = observation_space
        self.infos = _as_buffer(infos, lb)
        self.actions = _as_buffer(actions, lb)
        self._action_space = None
        self.action_space = action_space
        self.rewards = _as_buffer(rewards, lb, _REWARDS_SPACE)
        self.is_terminated = terminated
        self.is_truncated = truncated
        self.extra_model_outputs = {
            k: _as_buffer(v, lb) for k, v in (extra_model_outputs or {}).items()
        }
        self.t_started = t_started or 0
        self.t = len(self.rewards) + self.t_started
        self._start_time = None
        self._last_step_time = None
        self._last_added_observation = None
        self._last_added_infos = None
        self.validate()

    def _new_buffer(self, items: list) -> InfiniteLookbackBuffer:
        return buffer_of(items)

    # -- building -------------------------------------------------------------

    def concat_episode(self, other: "SingleAgentEpisode") -> None:
        """Appends the next chunk `other` of this episode (as `cut()` made it).

        Raises AssertionError, with this episode unchanged, when `other` has
        another id, does not start at this episode's `t`, or does not start
        with this episode's last observation.
        """
        if other.id_ != self.id_:
            raise AssertionError(f"concat_episode() expects a chunk of this episode (id_ "
                                 f"{self.id_!r}), got id_ {other.id_!r}")
        if self.is_done:
            raise AssertionError("concat_episode() expects an episode that is not done")
        if self.t != other.t_started:
            raise AssertionError(f"concat_episode() expects the chunk to start at this "
                                 f"episode's t={self.t!r}, it starts at {other.t_started!r}")
        self.validate()
        other.validate()
        first, last = other.observations[0], self.observations[-1]
        check_same_nesting(first, last)
        if not all(np.array_equal(a, b) for a, b in
                   zip(flatten_struct(first), flatten_struct(last))):
            raise AssertionError("concat_episode() expects the chunk's first observation to be "
                                 "this episode's last observation")
        missing = [k for k in other.extra_model_outputs if k not in self.extra_model_outputs]
        if missing:
            raise AssertionError(f"concat_episode() expects the chunk's extra model outputs "
                                 f"in this episode too; {missing} are not")

        self.observations.pop()
        self.infos.pop()
        self.observations.concat(other.observations)
        self.actions.concat(other.actions)
        self.rewards.concat(other.rewards)
        self.infos.concat(other.infos)
        self.t = other.t
        if other.is_terminated:
            self.is_terminated = True
        elif other.is_truncated:
            self.is_truncated = True
        for key in other.extra_model_outputs.keys():
            self.extra_model_outputs[key].concat(other.extra_model_outputs[key])
        self.custom_data.update(other.custom_data)
        self.validate()

    def __getitem__(self, item: slice) -> "SingleAgentEpisode":
        if isinstance(item, slice):
            return self.slice(item)
        raise EpisodeIndexError(
            f"SingleAgentEpisode does not support getting item {item!r}! Only slice "
            "objects allowed with the syntax: `episode[a:b]`."
        )

    # -- setters --------------------------------------------------------------

    def set_observations(self, *, new_data: Any, at_indices: Indices = None,
                         neg_index_as_lookback: bool = False) -> None:
        """Overwrites observations at `at_indices` (see InfiniteLookbackBuffer.set)."""
        self._prepare_set("observations", new_data, at_indices, neg_index_as_lookback)()

    def set_actions(self, *, new_data: Any, at_indices: Indices = None,
                    neg_index_as_lookback: bool = False) -> None:
        """Overwrites actions at `at_indices` (see InfiniteLookbackBuffer.set)."""
        self._prepare_set("actions", new_data, at_indices, neg_index_as_lookback)()

    def set_rewards(self, *, new_data: Any, at_indices: Indices = None,
                    neg_index_as_lookback: bool = False) -> None:
        """Overwrites rewards at `at_indices` (see InfiniteLookbackBuffer.set)."""
        self._prepare_set("rewards", new_data, at_indices, neg_index_as_lookback)()

    def set_extra_model_outputs(self, *, key: Any, new_data: Any, at_indices: Indices = None,
                                neg_index_as_lookback: bool = False) -> None:
        """Overwrites extra model output `key` at `at_indices`."""
        self._prepare_set("extra_model_outputs", new_data, at_indices, neg_index_as_lookback,
                          key)()

    def _prepare_set(self, what: str, new_data: Any, at_indices: Indices,
                     neg_index_as_lookback: bool, key: Any = None) -> Callable[[], None]:
        """The checks of set_<what>() (raising as it raises) and, returned as
        one function, its writes: the multi-agent episode checks every
        agent's before it writes any."""
        if what == "extra_model_outputs":
            if key not in self.extra_model_outputs:
                raise AssertionError(f"set_extra_model_outputs() expects a key of "
                                     f"extra_model_outputs {list(self.extra_model_outputs)}, "
                                     f"got {key!r}")
            buffer = self.extra_model_outputs[key]
        else:
            buffer = getattr(self, what)
        write = buffer._prepare_set(new_data, at_indices, neg_index_as_lookback)
        if what != "observations":
            return write

        def write_observations() -> None:
            # The last added observation stays the one added (as RLlib keeps
            # the object), even when it was a batch's row, read back on demand.
            self._last_added_observation = self._last_added_observation
            write()

        return write_observations

    # -- properties -----------------------------------------------------------

    @property
    def custom_data(self) -> dict:
        """A dict for the user's own per-episode data."""
        return self._custom_data

    @property
    def is_reset(self) -> bool:
        """True once there is a (reset) observation."""
        return len(self.observations) > 0

    @property
    def is_numpy(self) -> bool:
        """True once to_numpy() turned the data into arrays."""
        return self.rewards.finalized

    @property
    def is_done(self) -> bool:
        """Terminated or truncated."""
        return self.is_terminated or self.is_truncated

    @property
    def observation_space(self) -> Optional[gym.Space]:
        return self._observation_space

    @observation_space.setter
    def observation_space(self, value: Optional[gym.Space]) -> None:
        self._observation_space = self.observations.space = value

    @property
    def action_space(self) -> Optional[gym.Space]:
        return self._action_space

    @action_space.setter
    def action_space(self, value: Optional[gym.Space]) -> None:
        self._action_space = self.actions.space = value

    # -- summaries ------------------------------------------------------------

    def get_data_dict(self) -> dict:
        """The chunk's data by RLlib column name (obs without the last one)."""
        n = len(self)
        t = list(range(self.t_started, self.t))
        terminateds = [False] * (n - 1) + [self.is_terminated]
        truncateds = [False] * (n - 1) + [self.is_truncated]
        eps_id = [self.id_] * n
        if self.is_numpy:
            t, terminateds, truncateds, eps_id = (
                np.array(t), np.array(terminateds), np.array(truncateds), np.array(eps_id))
        data = {
            "terminateds": terminateds,
            "truncateds": truncateds,
            "t": t,
            "eps_id": eps_id,
            "obs": self.get_observations(slice(None, -1)),
            "infos": self.get_infos(slice(None, -1)),
            "actions": self.get_actions(),
            "rewards": self.get_rewards(),
        }
        data.update({k: self.get_extra_model_outputs(k) for k in self.extra_model_outputs})
        return data

    def get_sample_batch(self) -> "SampleBatch":
        """The data dict as RLlib's SampleBatch (needs ray[rllib])."""
        try:
            from ray.rllib.policy.sample_batch import SampleBatch
        except ModuleNotFoundError as e:
            raise rllib_missing(e, "get_sample_batch(), which returns RLlib's "
                                   "SampleBatch,") from e
        return SampleBatch(self.get_data_dict())

    def get_duration_s(self) -> float:
        """Seconds from the first to the last added step (0.0 before any step)."""
        if self._last_step_time is None:
            return 0.0
        return self._last_step_time - self._start_time

    def env_steps(self) -> int:
        """Env steps in this chunk (= len)."""
        return len(self)

    def agent_steps(self) -> int:
        """Agent steps in this chunk (= env steps for a single agent)."""
        return self.env_steps()

    # -- state ----------------------------------------------------------------

    def get_state(self) -> Dict[str, Any]:
        """The episode as a dict of plain data (RLlib's format); see from_state."""
        return {
            "id_": self.id_,
            "agent_id": self.agent_id,
            "module_id": self.module_id,
            "multi_agent_episode_id": self.multi_agent_episode_id,
            "observations": self.observations.get_state(),
            "actions": self.actions.get_state(),
            "rewards": self.rewards.get_state(),
            # (With no infos, one shared empty dict stands for all of them.)
            "infos": infos_state(self.infos),
            # Always a state (RLlib keeps an all-lookback buffer as the object
            # itself, which its from_state() cannot read).
            "extra_model_outputs": {k: v.get_state()
                                    for k, v in self.extra_model_outputs.items()}
            if len(self.extra_model_outputs) > 0 else None,
            "is_terminated": self.is_terminated,
            "is_truncated": self.is_truncated,
            "t_started": self.t_started,
            "t": self.t,
            "_observation_space": space_to_dict(self._observation_space)
            if self._observation_space else None,
            "_action_space": space_to_dict(self._action_space) if self._action_space else None,
            "_start_time": self._start_time,
            "_last_step_time": self._last_step_time,
            "custom_data": self.custom_data,
        }

    @staticmethod
    def from_state(state: Dict[str, Any]) -> "SingleAgentEpisode":
        """A new episode from `get_state()`'s dict (ours or RLlib's).

        Raises AssertionError when the state's tracks have inconsistent lengths.
        """
        episode = new_episode(SingleAgentEpisode, state["id_"])
        episode.agent_id = state["agent_id"]
        episode.module_id = state["module_id"]
        episode.multi_agent_episode_id = state["multi_agent_episode_id"]
        episode.observations = InfiniteLookbackBuffer.from_state(state["observations"])
        episode.actions = InfiniteLookbackBuffer.from_state(state["actions"])
        episode.rewards = InfiniteLookbackBuffer.from_state(state["rewards"])
        episode.infos = infos_from_state(state["infos"])
        factory = functools.partial(InfiniteLookbackBuffer, lookback=episode.observations.lookback)
        episode.extra_model_outputs = defaultdict(factory, {
            k: InfiniteLookbackBuffer.from_state(v) if isinstance(v, dict) else _as_buffer(v, 0)
            for k, v in (state["extra_model_outputs"] or {}).items()
        })
        episode.is_terminated = state["is_terminated"]
        episode.is_truncated = state["is_truncated"]
        episode.t_started = state["t_started"]
        episode.t = state["t"]
        episode._observation_space = space_from_dict(state["_observation_space"]) \
            if state["_observation_space"] else None
        episode._action_space = space_from_dict(state["_action_space"]) \
            if state["_action_space"] else None
        episode._start_time = state["_start_time"]
        episode._last_step_time = state["_last_step_time"]
        episode._custom_data = state.get("custom_data", {})
        episode.validate()
        return episode

    def __reduce__(self):
        # The buffers pickle as whole arrays (out-of-band with protocol 5), the
        # spaces by description (see spaces.pickled_space).
        return (_restore, (type(self), _get_fields(self),
                           pickled_space(self._observation_space),
                           pickled_space(self._action_space)))

    def __repr__(self) -> str:
        return (f"SAEps(len={len(self)} done={self.is_done} R={self.get_return()} "
                f"id_={self.id_})")

    # -- removed in RLlib (they raise there too) -------------------------------

    def add_temporary_timestep_data(self, *args: Any, **kwargs: Any) -> None:
        """Removed: use `custom_data[key] = ...`."""
        raise ValueError("`add_temporary_timestep_data` has been deprecated. Use "
                         "`SingleAgentEpisode.custom_data[some-key] = ...` instead.")

    def get_temporary_timestep_data(self, *args: Any, **kwargs: Any) -> None:
        """Removed: use `custom_data[key]`."""
        raise ValueError("`get_temporary_timestep_data` has been deprecated. Use "
                         "`SingleAgentEpisode.custom_data[some-key]` instead.")


_FIELDS = (
    "id_", "agent_id", "module_id", "multi_agent_episode_id", "observations", "actions",
    "rewards", "infos", "extra_model_outputs", "is_terminated", "is_truncated", "t",
    "t_started", "_custom_data", "_start_time", "_last_step_time",
    "_last_added_observation", "_last_added_infos",
)
_get_fields = operator.attrgetter(*_FIELDS)


def _restore(cls, values, observation_space, action_space):
    episode = cls.__new__(cls)
    for name, value in zip(_FIELDS, values):
        setattr(episode, name, value)
    episode._observation_space = unpickled_space(observation_space)
    episode._action_space = unpickled_space(action_space)
    return episode


_register_facade_class(SingleAgentEpisode)
