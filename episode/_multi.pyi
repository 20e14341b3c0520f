import builtins
from collections import defaultdict
from typing import Any, TypeAlias

from typing_extensions import disjoint_base

from episode._buffer import BufferCore
from episode._episode import EpisodeCore

_Indices: TypeAlias = int | builtins.slice | list[int] | None

SKIP_ENV_TS_TAG: str
SKIP_STEP: int

class AgentStepsCore(BufferCore):
    """The compiled half of an agent's env_t -> agent_t mapping."""
    def _push_step(self, step: int | str) -> None: ...

@disjoint_base
class MultiAgentCore:
    """The compiled half of MultiAgentEpisode."""
    id_: str
    agent_to_module_mapping_fn: Any
    _agent_to_module_mapping: dict[Any, Any]
    observation_space: Any
    action_space: Any
    env_t_started: int
    env_t: int
    agent_t_started: defaultdict[Any, int]
    env_t_to_agent_t: defaultdict[Any, Any]
    _hanging_actions_end: dict[Any, Any]
    _hanging_extra_model_outputs_end: defaultdict[Any, Any]
    _hanging_rewards_end: defaultdict[Any, float]
    _hanging_rewards_begin: defaultdict[Any, float]
    is_terminated: bool
    is_truncated: bool
    agent_episodes: dict[Any, EpisodeCore]
    _len_lookback_buffers: int
    _custom_data: dict[Any, Any]
    _start_time: float | None
    _last_step_time: float | None
    def _stepped(self) -> None: ...
    def add_env_step(
        self,
        observations: dict[Any, Any],
        actions: dict[Any, Any],
        rewards: dict[Any, Any],
        infos: dict[Any, Any] | None = None,
        *,
        terminateds: dict[Any, Any] | None = None,
        truncateds: dict[Any, Any] | None = None,
        extra_model_outputs: dict[Any, Any] | None = None,
    ) -> None: ...
    def _cut_at_last_observations(self) -> Any: ...
    def get_observations(
        self,
        indices: _Indices = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: bool = False,
    ) -> Any: ...
    def get_infos(
        self,
        indices: _Indices = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> Any: ...
    def get_rewards(
        self,
        indices: _Indices = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> Any: ...
    def get_extra_model_outputs(
        self,
        key: Any = None,
        indices: _Indices = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> Any: ...
    def get_actions(
        self,
        indices: _Indices = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: bool = False,
    ) -> Any: ...

def _register_agent_steps(cls: type) -> None: ...
