from typing import Any, final

from typing_extensions import disjoint_base

from episode._column import Column
from episode.typing import TrainingBatch

LEAVES: int
WHOLE: int
FLAT_ACTION: int

@disjoint_base
class CollectorCore:
    buffers: Any
    episode_id: Any
    unroll_id: Any
    agent_steps: Any
    _is_training: Any
    view_requirements: Any
    _inference: Any
    def add_action_reward_next_obs(self, input_values: dict[str, Any]) -> None: ...
    def build_for_inference(self) -> TrainingBatch: ...
    def _set_layout(self, layout: StepLayout | None) -> None: ...
    @property
    def _has_layout(self) -> bool: ...
    @property
    def _step_layout(self) -> StepLayout | None: ...

@final
class StepLayout:
    @property
    def keys(self) -> tuple[Any, ...]: ...
    def __init__(self, collector: CollectorCore, example: dict[Any, Any],
                 entries: list[tuple[int, str, bool]], stand_ins: list[Column],
                 flatten: Any, t_dummy: bool) -> None: ...

@final
class InferencePlan:
    view_requirements: Any
    n_views: int
    training: bool
    def __init__(self, view_requirements: Any, training: bool, entries: list[Any],
                 fallback: Any, unflatten: Any) -> None: ...
    def fits(self, view_requirements: Any, training: bool) -> bool: ...
    def set_batches(self, batch_module: Any, maker: BatchMaker | None) -> None: ...
    def columns(self, buffers: dict[Any, Any]) -> dict[str, Any] | None: ...

@final
class BatchMaker:
    def __init__(self, cls: type[dict[Any, Any]], example: Any) -> None: ...
