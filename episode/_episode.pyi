from typing import Any

import gymnasium as gym

from episode._buffer import BufferCore

REWARDS_SPACE: gym.spaces.Box

class EpisodeCore:
    """The compiled half of SingleAgentEpisode."""
    id_: Any
    agent_id: Any
    module_id: Any
    multi_agent_episode_id: Any
    observations: BufferCore
    actions: BufferCore
    rewards: BufferCore
    infos: BufferCore
    extra_model_outputs: dict
    is_terminated: Any
    is_truncated: Any
    t: int
    t_started: int
    _observation_space: Any
    _action_space: Any
    _custom_data: Any
    _start_time: float | None
    _last_step_time: float | None
    _last_added_observation: Any
    _last_added_infos: Any
    def add_env_step(
        self,
        observation: Any,
        action: Any,
        reward: Any,
        infos: dict | None = None,
        *,
        terminated: bool = False,
        truncated: bool = False,
        extra_model_outputs: dict | None = None,
    ) -> None: ...
    def validate(self) -> None: ...
    def __len__(self) -> int: ...
    def cut(self, len_lookback_buffer: int = 0) -> Any: ...
    def slice(self, slice_: slice, *, len_lookback_buffer: int | None = None) -> Any: ...
    def get_observations(self, indices: Any = None, *, neg_index_as_lookback: bool = False,
                         fill: Any = None, one_hot_discrete: bool = False) -> Any: ...
    def get_infos(self, indices: Any = None, *, neg_index_as_lookback: bool = False,
                  fill: Any = None) -> Any: ...
    def get_actions(self, indices: Any = None, *, neg_index_as_lookback: bool = False,
                    fill: Any = None, one_hot_discrete: bool = False) -> Any: ...
    def get_rewards(self, indices: Any = None, *, neg_index_as_lookback: bool = False,
                    fill: Any = None) -> Any: ...
    def get_extra_model_outputs(self, key: Any, indices: Any = None, *,
                                neg_index_as_lookback: bool = False, fill: Any = None) -> Any: ...

def assemble(cls: type, id_: Any, observations: BufferCore, infos: BufferCore,
             actions: BufferCore, rewards: BufferCore, extra_model_outputs: dict,
             terminated: Any, truncated: Any, t_started: int) -> Any: ...
