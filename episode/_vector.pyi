from typing import Any

import numpy as np
from typing_extensions import Self, disjoint_base

from episode.single_agent_episode import SingleAgentEpisode

@disjoint_base
class PendingRows:
    """The latest steps of a vector env's sub-envs, written into their
    episodes a few dozen steps at a time."""
    capacity: int
    filled: int
    n: int
    def __new__(cls, capacity: int | None = None) -> Self: ...
    def add(self, episodes: list[Any], observations: Any, actions: Any, rewards: Any,
            terminateds: Any, truncateds: Any, resetting: Any, same_step: bool = ...,
            final_obs_given: bool = ...,
            start: tuple[type, Any, Any] | None = ...,
            extra_model_outputs: dict[Any, Any] | None = ...,
            defer: bool = ...) -> tuple[list[int], list[int]] | None: ...
    def flush_all(self, episodes: list[Any]) -> None: ...
    def take_ended(self, episodes: list[Any]) -> tuple[list[SingleAgentEpisode], list[int]]: ...
    def __setstate__(self, state: list[tuple[int, SingleAgentEpisode]]) -> None: ...

@disjoint_base
class VectorCore:
    """The fields of VectorEpisodes and its usual step, compiled."""
    num_envs: int
    observation_space: Any
    action_space: Any
    autoreset_mode: str
    _episodes: list[Any]
    _pending: PendingRows
    _resetting: np.ndarray[Any, Any]
    _episode_class: type
    steps_added: int
    ended_envs: list[int]
    writer: Any
    def add_step(self, observations: Any, actions: Any, rewards: Any, terminateds: Any,
                 truncateds: Any, infos: dict[Any, Any] | list[dict[Any, Any]] | None = None, *,
                 extra_model_outputs: dict[Any, Any] | None = None) -> list[SingleAgentEpisode]: ...
    def record_step(self, observations: Any, actions: Any, rewards: Any, terminateds: Any,
                    truncateds: Any,
                    infos: dict[Any, Any] | list[dict[Any, Any]] | None = None, *,
                    extra_model_outputs: dict[Any, Any] | None = None) -> int: ...
    def take_ended(self) -> tuple[list[SingleAgentEpisode], list[int]]: ...
    def _add_rows(self, episodes: list[Any], observations: Any, actions: Any, rewards: Any,
                  terminateds: Any, truncateds: Any, resetting: Any, same_step: bool,
                  final_obs_given: bool,
                  start: tuple[type, Any, Any] | None = None,
                  extra_model_outputs: dict[Any, Any] | None = None, defer: bool = False
                  ) -> tuple[list[int], list[int]] | None: ...
