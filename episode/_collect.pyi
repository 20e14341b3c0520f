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
