from typing import Any, final

import numpy as np

def gather_next_rows(episodes: list[Any], data_col: str, shifts: Any,
                     zeros_before: bool) -> np.ndarray | None: ...

@final
class InferencePlan:
    view_requirements: Any
    n_views: int
    training: bool
    def __init__(self, view_requirements: Any, training: bool, entries: list[Any],
                 fallback: Any, unflatten: Any) -> None: ...
    def columns(self, buffers: dict[Any, Any]) -> dict[str, Any] | None: ...

@final
class BatchMaker:
    def __init__(self, cls: Any, example: Any) -> None: ...
    def __call__(self, columns: dict[Any, Any]) -> Any: ...
