from typing import Any

import numpy as np

from episode._replay import Store

RUN_DTYPE: np.dtype[Any]
EP_DTYPE: np.dtype[Any]

def store_state(store: Store) -> tuple[dict[str, Any], list[dict[str, Any]]]: ...
def build_store(store: Store, state: dict[str, Any], blocks: list[Any]) -> None: ...
