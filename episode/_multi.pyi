from collections import defaultdict
from collections.abc import Collection
from typing import Any, Literal, overload

from typing_extensions import disjoint_base

from episode._buffer import BufferCore
from episode.single_agent_episode import SingleAgentEpisode
from episode.typing import AgentID, Batch, Index, IndexBatch, Indices, Item

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
    agent_t_started: defaultdict[AgentID, int]
    env_t_to_agent_t: defaultdict[Any, Any]
    _hanging_actions_end: dict[Any, Any]
    _hanging_extra_model_outputs_end: defaultdict[Any, Any]
    _hanging_rewards_end: defaultdict[Any, float]
    _hanging_rewards_begin: defaultdict[Any, float]
    is_terminated: bool
    is_truncated: bool
    agent_episodes: dict[AgentID, SingleAgentEpisode]
    _len_lookback_buffers: int
    _custom_data: dict[Any, Any]
    _start_time: float | None
    _last_step_time: float | None
    def _stepped(self) -> None: ...
    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]: ...
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
    @overload
    def get_observations(
        self,
        indices: Index,
        agent_ids: AgentID | Collection[AgentID] | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: Literal[False] = False,
    ) -> dict[AgentID, Item]: ...
    @overload
    def get_observations(
        self,
        indices: IndexBatch = None,
        agent_ids: AgentID | Collection[AgentID] | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: Literal[False] = False,
    ) -> dict[AgentID, Batch]: ...
    @overload
    def get_observations(
        self,
        indices: Indices = None,
        agent_ids: AgentID | Collection[AgentID] | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: Literal[True],
    ) -> list[dict[AgentID, Item]]: ...
    @overload
    def get_infos(
        self,
        indices: Index,
        agent_ids: AgentID | Collection[AgentID] | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: Literal[False] = False,
    ) -> dict[AgentID, Item]: ...
    @overload
    def get_infos(
        self,
        indices: IndexBatch = None,
        agent_ids: AgentID | Collection[AgentID] | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: Literal[False] = False,
    ) -> dict[AgentID, Batch]: ...
    @overload
    def get_infos(
        self,
        indices: Indices = None,
        agent_ids: AgentID | Collection[AgentID] | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: Literal[True],
    ) -> list[dict[AgentID, Item]]: ...
    @overload
    def get_rewards(
        self,
        indices: Index,
        agent_ids: AgentID | Collection[AgentID] | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: Literal[False] = False,
    ) -> dict[AgentID, Item]: ...
    @overload
    def get_rewards(
        self,
        indices: IndexBatch = None,
        agent_ids: AgentID | Collection[AgentID] | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: Literal[False] = False,
    ) -> dict[AgentID, Batch]: ...
    @overload
    def get_rewards(
        self,
        indices: Indices = None,
        agent_ids: AgentID | Collection[AgentID] | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: Literal[True],
    ) -> list[dict[AgentID, Item]]: ...
    @overload
    def get_extra_model_outputs(
        self,
        key: Any,
        indices: Index,
        agent_ids: AgentID | Collection[AgentID] | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: Literal[False] = False,
    ) -> dict[AgentID, Item]: ...
    @overload
    def get_extra_model_outputs(
        self,
        key: Any = None,
        *,
        indices: Index,
        agent_ids: AgentID | Collection[AgentID] | None = None,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: Literal[False] = False,
    ) -> dict[AgentID, Item]: ...
    @overload
    def get_extra_model_outputs(
        self,
        key: Any = None,
        indices: IndexBatch = None,
        agent_ids: AgentID | Collection[AgentID] | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: Literal[False] = False,
    ) -> dict[AgentID, Batch]: ...
    @overload
    def get_extra_model_outputs(
        self,
        key: Any = None,
        indices: Indices = None,
        agent_ids: AgentID | Collection[AgentID] | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: Literal[True],
    ) -> list[dict[AgentID, Item]]: ...
    @overload
    def get_actions(
        self,
        indices: Index,
        agent_ids: AgentID | Collection[AgentID] | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: Literal[False] = False,
    ) -> dict[AgentID, Item]: ...
    @overload
    def get_actions(
        self,
        indices: IndexBatch = None,
        agent_ids: AgentID | Collection[AgentID] | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: Literal[False] = False,
    ) -> dict[AgentID, Batch]: ...
    @overload
    def get_actions(
        self,
        indices: Indices = None,
        agent_ids: AgentID | Collection[AgentID] | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: Literal[True],
    ) -> list[dict[AgentID, Item]]: ...

MA_FORMAT: int

def _restore_multi_agent(version: Any, cls: Any, state: Any) -> MultiAgentCore: ...
def _register_facade(episode_cls: type, agent_steps_cls: type, mapping_fn: Any) -> None: ...
