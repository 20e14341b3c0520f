from typing import Any

from episode._column import Column

class BufferCore:
    """The compiled half of InfiniteLookbackBuffer."""
    _col: Column | None
    _tree: Any
    lookback: int
    _space: Any
    _space_struct: Any
    @property
    def finalized(self) -> bool: ...
    def append(self, item: Any, /) -> None: ...
    def check_append(self, item: Any) -> None: ...
    def __len__(self) -> int: ...
    def len_incl_lookback(self) -> int: ...
    def get(
        self,
        indices: Any = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        _ignore_last_ts: bool = False,
        _add_last_ts_value: Any = None,
    ) -> Any: ...
    def __getitem__(self, item: Any) -> Any: ...
    def sub_buffer(
        self, slice_: slice, neg_index_as_lookback: bool, lookback: int, space: Any
    ) -> BufferCore: ...
