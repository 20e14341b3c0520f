import builtins
from typing import Any, TypeVar, overload

import gymnasium as gym
from typing_extensions import Self, disjoint_base

from episode._buffer import BufferCore
from episode._column import Column
from episode.lookback_buffer import InfiniteLookbackBuffer
from episode.typing import Batch, Index, IndexBatch, Item

_E = TypeVar("_E", bound="EpisodeCore")

class BufferTypeError(TypeError, AssertionError): ...

REWARDS_SPACE: gym.spaces.Box

@disjoint_base
class EpisodeCore:
    """The compiled half of SingleAgentEpisode."""
    id_: str
    agent_id: Any
    module_id: Any
    multi_agent_episode_id: Any
    # The facade always stores InfiniteLookbackBuffers in these.
    observations: InfiniteLookbackBuffer
    actions: InfiniteLookbackBuffer
    rewards: InfiniteLookbackBuffer
    infos: InfiniteLookbackBuffer
    extra_model_outputs: dict[Any, InfiniteLookbackBuffer]
    is_terminated: bool
    is_truncated: bool
    t: int
    t_started: int
    _observation_space: gym.Space[Any] | None
    _action_space: gym.Space[Any] | None
    _custom_data: dict[Any, Any]
    _start_time: float | None
    _last_step_time: float | None
    _last_added_observation: Any
    _last_added_infos: Any
    def add_env_step(
        self,
        observation: Any,
        action: Any,
        reward: Any,
        infos: dict[Any, Any] | None = None,
        *,
        terminated: bool = False,
        truncated: bool = False,
        extra_model_outputs: dict[Any, Any] | None = None,
    ) -> None: ...
    def validate(self) -> None: ...
    def __len__(self) -> int: ...
    def add_env_reset(self, observation: Any, infos: dict[Any, Any] | None = None) -> None: ...
    def to_numpy(self) -> Self: ...
    def get_return(self) -> float: ...
    def cut(self, len_lookback_buffer: int = 0) -> Self: ...
    def slice(self, slice_: builtins.slice, *, len_lookback_buffer: int | None = None) -> Self: ...
    @overload
    def get_observations(
        self,
        indices: Index,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
    ) -> Item: ...
    @overload
    def get_observations(
        self,
        indices: IndexBatch = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
    ) -> Batch: ...
    @overload
    def get_infos(
        self,
        indices: Index,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
    ) -> Item: ...
    @overload
    def get_infos(
        self,
        indices: IndexBatch = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
    ) -> Batch: ...
    @overload
    def get_actions(
        self,
        indices: Index,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
    ) -> Item: ...
    @overload
    def get_actions(
        self,
        indices: IndexBatch = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
    ) -> Batch: ...
    @overload
    def get_rewards(
        self,
        indices: Index,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
    ) -> Item: ...
    @overload
    def get_rewards(
        self,
        indices: IndexBatch = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
    ) -> Batch: ...
    @overload
    def get_extra_model_outputs(
        self,
        key: Any,
        indices: Index,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
    ) -> Item: ...
    @overload
    def get_extra_model_outputs(
        self,
        key: Any,
        indices: IndexBatch = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
    ) -> Batch: ...

def episode_id() -> str: ...
def _register_facade_class(cls: type) -> None: ...
def check_step_extras(episode: EpisodeCore, outputs: Any, agent_id: Any) -> None: ...
def make_episode(
    cls: type[_E], id_: Any, observations: Any, infos: Column, actions: Any, rewards: Any,
    extra_model_outputs: dict[Any, Any], lookbacks: tuple[int, int, int, int, int],
    terminated: Any, truncated: Any, t_started: int, observation_space: Any,
    action_space: Any, agent_id: Any = ..., module_id: Any = ...,
    multi_agent_episode_id: Any = ..., start_time: float | None = ...,
    last_step_time: float | None = ..., custom_data: Any = ...,
    defaultdict_extras: bool = ..., last_added: Any = ...,
) -> _E: ...
def last_added(episode: EpisodeCore) -> Any: ...
def assemble(
    cls: type[_E], id_: Any, observations: BufferCore, infos: BufferCore,
    actions: BufferCore, rewards: BufferCore, extra_model_outputs: dict[Any, Any],
    terminated: Any, truncated: Any, t_started: int | None,
) -> _E: ...
def init_without_data(
    episode: EpisodeCore, id_: Any, observations: Any, observation_space: Any, infos: Any,
    actions: Any, action_space: Any, rewards: Any, terminated: Any, truncated: Any,
    extra_model_outputs: Any, t_started: Any, len_lookback_buffer: Any, agent_id: Any,
    module_id: Any, multi_agent_episode_id: Any,
) -> bool: ...
def started_episode(cls: type[_E], observation_space: Any, action_space: Any,
                    observation: Any, infos: Any) -> _E: ...
def new_episode(cls: type[_E], id_: Any) -> _E: ...
def buffer_of(items: list[Any]) -> InfiniteLookbackBuffer: ...
def infos_state(infos: Any) -> dict[str, Any]: ...
def infos_from_state(state: Any) -> InfiniteLookbackBuffer: ...
