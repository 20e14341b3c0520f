from typing import Any

import numpy as np

from episode._replay import Store

RUN_DTYPE: np.dtype[Any]
EP_DTYPE: np.dtype[Any]

def store_state(store: Store) -> tuple[dict[str, Any], list[dict[str, Any]]]: ...
def plain_dtype(dtype: Any) -> np.dtype[Any] | None: ...
def frame_pools(store: Store) -> list[tuple[dict[str, int], list[Any]] | None]: ...
def build_store(store: Store, state: dict[str, Any], blocks: list[Any],
                pools: list[Any] | None = None) -> None: ...
