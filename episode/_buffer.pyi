from typing import Any

import gymnasium as gym
from typing_extensions import Self, disjoint_base

from episode._column import Column

SCALAR_FILLS: frozenset[type]
FLAT_SPACES: tuple[type[gym.Space[Any]], ...]

@disjoint_base
class BufferCore:
    """The compiled half of InfiniteLookbackBuffer."""
    @property
    def _col(self) -> Column | None: ...
    @property
    def _tree(self) -> Any: ...
    @property
    def lookback(self) -> int: ...
    @lookback.setter
    def lookback(self, value: int) -> None: ...
    def _set_storage(self, col: Column | None, tree: Any) -> None: ...
    _space: gym.Space[Any] | None
    _space_struct: Any
    @property
    def finalized(self) -> bool: ...
    def append(self, item: Any) -> None: ...
    def check_append(self, item: Any) -> None: ...
    def __len__(self) -> int: ...
    def len_incl_lookback(self) -> int: ...
    def get(
        self,
        indices: int | slice | list[int] | None = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        _ignore_last_ts: bool = False,
        _add_last_ts_value: Any = None,
    ) -> Any: ...
    def __getitem__(self, item: int | slice | list[int], /) -> Any: ...
    def sub_buffer(
        self, slice_: slice, neg_index_as_lookback: bool, lookback: int,
        space: gym.Space[Any] | None,
    ) -> Self: ...
