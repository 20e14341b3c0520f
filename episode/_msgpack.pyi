from collections.abc import Iterable
from typing import Any, TypeVar

import numpy as np

_E = TypeVar("_E")

def unpack_episode(data: Any, cls: type[_E]) -> _E: ...
def unpack_episodes(blobs: Iterable[Any], cls: type[_E]) -> list[_E]: ...
def unpack_episodes_arrow(data: Any, offsets: np.ndarray, cls: type[_E]) -> list[_E]: ...
