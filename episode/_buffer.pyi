from typing import Any, overload

import gymnasium as gym
from typing_extensions import Self, disjoint_base

from episode._column import Column
from episode.typing import Batch, Index, IndexBatch, Item

SCALAR_FILLS: frozenset[type]
FLAT_SPACES: tuple[type[gym.Space[Any]], ...]

@disjoint_base
class StateWriter:
    """How one pickled state is written (raw rows, the spaces described so
    far); made as StateWriter(raw)."""
    @property
    def raw(self) -> bool: ...

@disjoint_base
class StateReader:
    """How one pickled state is read (the spaces made so far)."""

def _describe_once(space: Any) -> None: ...

@disjoint_base
class FillPlan:
    """How a finalized Column's rows and a scalar fill combine."""

@disjoint_base
class FillState:
    """A buffer's fill plans and leaf spaces."""

@disjoint_base
class BufferCore:
    """The compiled half of InfiniteLookbackBuffer."""
    @property
    def _tree(self) -> Any: ...
    @property
    def _col(self) -> Column | None: ...
    @property
    def _leaves(self) -> list[Column]: ...
    @property
    def lookback(self) -> int: ...
    @lookback.setter
    def lookback(self, value: int) -> None: ...
    def _set_storage(self, tree: Any) -> None: ...
    def _extend_items(self, items: Any) -> None: ...
    def _to_object_path(self) -> None: ...
    def _matches(self, item: Any) -> bool: ...
    def _set_item(self, pos: int, item: Any) -> None: ...
    def _item(self, pos: int) -> Any: ...
    def _items(self) -> list[Any]: ...
    _space: gym.Space[Any] | None
    _space_struct: Any
    @property
    def finalized(self) -> bool: ...
    def append(self, item: Any) -> None: ...
    def finalize(self) -> None: ...
    def prepare_finalize(self) -> object: ...
    def commit_finalize(self, storage: object) -> None: ...
    def check_append(self, item: Any) -> None: ...
    def __len__(self) -> int: ...
    def len_incl_lookback(self) -> int: ...
    @overload
    def get(
        self,
        indices: Index,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        _ignore_last_ts: bool = False,
        _add_last_ts_value: Any = None,
    ) -> Item: ...
    @overload
    def get(
        self,
        indices: IndexBatch = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        _ignore_last_ts: bool = False,
        _add_last_ts_value: Any = None,
    ) -> Batch: ...
    @overload
    def __getitem__(self, item: Index, /) -> Item: ...
    @overload
    def __getitem__(self, item: slice | list[Index], /) -> Batch: ...
    def sub_buffer(
        self, slice_: slice, neg_index_as_lookback: bool, lookback: int,
        space: gym.Space[Any] | None,
    ) -> Self: ...
