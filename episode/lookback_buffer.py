"""InfiniteLookbackBuffer: RLlib's lookback buffer on the compiled core.

Behaves as ray.rllib.env.utils.infinite_lookback_buffer.InfiniteLookbackBuffer
(RLlib 2.60): same constructor, attributes, methods, return types and errors.
The per-step methods (append, len, get/[] without fill) are inherited from the
compiled BufferCore; this module holds the rest.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Union

import gymnasium as gym
import numpy as np
from gymnasium.utils.env_checker import data_equivalence

from episode._buffer import BufferCore
from episode._column import Column
from episode._episode import _register_facade_class
from episode._index import IndexTypeError, resolve_int, resolve_slice
from episode.spaces import (
    base_struct,
    check_same_nesting,
    empty_batch,
    fill_batch,
    flatten_struct,
    is_struct,
    map_struct,
    one_hot_struct,
    pickled_space,
    space_from_dict,
    space_contains,
    space_to_dict,
    stack,
    stack_leaf,
    unpickled_space,
)
from episode.typing import Batch, Indices

__all__ = ["InfiniteLookbackBuffer"]

def _as_index(idx: Any) -> int:
    """`idx` as a plain int (numpy ints too), or IndexTypeError."""
    if isinstance(idx, (int, np.integer)):
        return int(idx)
    raise IndexTypeError(
        f"indices must be an int, a list of ints, a slice or None; got {type(idx).__name__}"
    )


def _check_assignment(col: Column, value: Any, count: int, single: bool) -> None:
    """Raises what writing `value` into `count` rows of finalized `col` would
    raise (numpy's assignment rules: casts, broadcasting), into scratch rows."""
    scratch = np.empty((count,) + col.row_shape_tuple, dtype=col.dtype)
    if single:
        scratch[0] = value
    else:
        scratch[:] = value


class InfiniteLookbackBuffer(BufferCore):
    """A growing sequence of items whose first `lookback` items are a lookback.

    Index 0 is the first item after the lookback. Negative indices count from
    the end, or with ``neg_index_as_lookback=True`` back into the lookback.
    Until ``finalize()`` the buffer hands back the items as they were given
    (getters return lists for list/slice indices); afterwards it holds numpy
    arrays (a dict/tuple of arrays for Dict/Tuple items) and getters return
    arrays. Numeric items are stored in typed buffers either way, so
    ``finalize()`` costs nothing and appends stay O(1) after it.

    Args:
        data: Initial items: a list (not finalized), or an array or dict/tuple
            of arrays (finalized).
        lookback: How many of the first items form the lookback (at most
            ``len(data)``).
        space: Optional gymnasium space of one item; needed for
            ``one_hot_discrete`` and used to shape ``fill`` values.
    """

    __slots__ = ()

    def __init__(
        self,
        data: Optional[Union[List, np.ndarray]] = None,
        lookback: int = 0,
        space: Optional[gym.Space] = None,
    ):
        self.data = data if data is not None else []
        self.lookback = min(lookback, self.len_incl_lookback())
        self.space = space

    # -- attributes ---------------------------------------------------------

    @property
    def data(self) -> Batch:
        """All items, lookback included: a list before finalize(), arrays after.

        As in RLlib, the list is the buffer's own: changing it changes the
        buffer. (Reading it moves typed storage to a plain list, so code that
        only needs the items should use get().)
        """
        if self.finalized:
            return map_struct(lambda col: col.view(), self._tree)
        self._to_object_path()
        return self._col.live_list()

    @data.setter
    def data(self, value: Any) -> None:
        if isinstance(value, list):
            self._set_storage(Column())
            self._extend_items(value)
        else:
            self._set_storage(_storage_of(value))

    def _snapshot(self) -> Any:
        """The data as `data` shows it, without moving typed storage to a list."""
        return self.data if self.finalized else self._items()

    @property
    def finalized(self) -> bool:
        """True once finalize() turned the data into numpy arrays. Setting it
        True finalizes; setting it False turns arrays back into a list of items."""
        return BufferCore.finalized.__get__(self)

    @finalized.setter
    def finalized(self, value: bool) -> None:
        if value and not self.finalized:
            self.finalize()
        elif not value and self.finalized:
            self.data = _unbatch(self.data)

    @property
    def space(self) -> Optional[gym.Space]:
        """The gymnasium space of one item (or None)."""
        return self._space

    @space.setter
    def space(self, value: Optional[gym.Space]) -> None:
        self._set_space(value, base_struct(value))

    @property
    def space_struct(self) -> Any:
        """The space as a plain dict/tuple of leaf spaces (the space itself if flat)."""
        return self._space_struct

    # -- state --------------------------------------------------------------

    def get_state(self) -> Dict[str, Any]:
        """The buffer as a picklable dict (data, lookback, finalized, space)."""
        return {
            "data": self._snapshot(),
            "lookback": self.lookback,
            "finalized": self.finalized,
            "space": space_to_dict(self.space) if self.space else None,
        }

    @staticmethod
    def from_state(state: Dict[str, Any]) -> "InfiniteLookbackBuffer":
        """A new buffer from a dict made by `get_state` (ours or RLlib's)."""
        buffer = InfiniteLookbackBuffer()
        data = state["data"]
        if (state["finalized"] and not state["space"] and isinstance(data, np.ndarray)
                and data.shape == (0,) and data.dtype == np.float64):
            # What finalize() makes of no rows and no space: the first rows
            # appended decide the row type, after the round trip as before it.
            buffer._set_storage(Column.with_open_row_type())
        else:
            buffer.data = data
        buffer.lookback = state["lookback"]
        buffer.space = space_from_dict(state["space"]) if state["space"] else None
        if state["finalized"] and not buffer.finalized:
            buffer.finalize()
        return buffer

    def __reduce__(self):
        # Columns pickle as whole arrays (out-of-band with protocol 5).
        return (_restore, (type(self), self._tree, self.lookback, pickled_space(self.space)))

    # -- adding and removing --------------------------------------------------

    def _check_struct(self, item: Any) -> list:
        check_same_nesting(self._tree, item)      # dm-tree's errors, as RLlib's append
        pairs = flatten_struct(map_struct(lambda col, x: [col, x], self._tree, item))
        for col, x in pairs:
            col.check_row(x)
        return pairs

    def _append_struct(self, item: Any) -> None:
        for col, x in self._check_struct(item):
            col.append(x)

    def _sub_buffer_general(self, slice_, neg_index_as_lookback, lookback, space):
        return type(self)(data=self.get(slice_, neg_index_as_lookback=neg_index_as_lookback),
                          lookback=lookback, space=space)

    def extend(self, items: Any) -> None:
        """Appends every item in `items` (after finalize(), a list or a batch)."""
        if not self.finalized:
            self._extend_items(_unbatch(items) if is_struct(items) else items)
            return
        if isinstance(items, list):
            if not items:
                return
            items = stack(items) if self._col is None else np.array(items)
        if self._col is not None:
            self._col.extend_rows(items)
            return
        check_same_nesting(self._tree, items)     # dm-tree's errors, as RLlib's extend
        pairs = flatten_struct(map_struct(lambda col, x: [col, np.asarray(x)], self._tree, items))
        for col, x in pairs:
            col.check_rows(x)
        for col, x in pairs:
            col.extend_rows(x)

    def concat(self, other: "InfiniteLookbackBuffer") -> None:
        """Appends the items of `other` after its lookback (one block copy when
        both hold the same kind of typed rows)."""
        if self._col is not None and isinstance(other, BufferCore) and other._col is not None:
            self._col.extend_from(other._col, other.lookback, other.len_incl_lookback())
        else:
            self.extend(other.get())

    def pop(self, index: int = -1) -> None:
        """Removes the item at raw position `index` (lookback included); returns None."""
        if not isinstance(index, (int, np.integer)):
            raise IndexTypeError(f"pop index must be an int, not {type(index).__name__}")
        index = int(index)
        n = self.len_incl_lookback()
        pos = index + n if index < 0 else index
        if not 0 <= pos < n:
            raise IndexError(f"pop index {index} out of range for {n} items")
        for col in self._leaves:
            col.pop(pos)

    def _batched_storage(self) -> Any:
        """The storage finalize() makes for an empty buffer or for items on the
        object path (flat, or some leaves of a tree), batched as RLlib batches
        them; the buffer itself is not changed."""
        if self.len_incl_lookback() == 0:
            if self.space is not None:
                return _storage_of(empty_batch(self.space))
            # No rows and no space: the first rows appended decide the row type.
            return Column.with_open_row_type()
        if self._col is not None:
            storage = stack(self._col.to_list())
            self._check_stacked(storage, self.space)
            return _storage_of(storage)
        stacked = {id(col): stack_leaf(col.to_list()) for col in self._leaves
                   if not col.is_typed}
        if self._space_struct is not None:
            try:
                pairs = flatten_struct(map_struct(lambda col, space: [col, space], self._tree,
                                                  self._space_struct))
            except (ValueError, TypeError):
                pairs = []           # (a space that does not fit the items: no leaf checked)
            for col, space in pairs:
                if id(col) in stacked:
                    self._check_stacked(stacked[id(col)], space)
        return map_struct(
            lambda col: Column.from_array(stacked[id(col)]) if id(col) in stacked else col,
            self._tree)

    @staticmethod
    def _check_stacked(rows: Any, space: Any) -> None:
        # Rows that stack only as objects (ragged rows) under a space of
        # numbers: RLlib's finalize raises ValueError there; so does ours
        # (without a space they stay objects, see docs/differences.md).
        if isinstance(rows, np.ndarray) and rows.dtype == object and isinstance(
                space, (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete,
                        gym.spaces.MultiBinary)):
            shapes = sorted({str(np.shape(row)) for row in rows})
            raise ValueError(f"the items do not stack into the space {space}: rows of shapes "
                             f"{', '.join(shapes)}")

    # -- reading ------------------------------------------------------------

    def _get_general(self, indices, neg_index_as_lookback, fill, one_hot_discrete,
                     _ignore_last_ts, _add_last_ts_value):
        if indices is None:
            data = self[: (-1 if _ignore_last_ts else None)]
            return self._one_hot(data) if one_hot_discrete else data
        args = (bool(neg_index_as_lookback), fill, bool(one_hot_discrete),
                bool(_ignore_last_ts), _add_last_ts_value)
        if isinstance(indices, slice):
            return self._get_slice_general(indices, *args)
        if isinstance(indices, list):
            items = [self._get_int_general(_as_index(i), *args) for i in indices]
            return self._batch_items(items, fill) if self.finalized else items
        return self._get_int_general(_as_index(indices), *args)

    def _fill_item(self, fill: Any, one_hot_discrete: bool) -> Any:
        if self.space is None:
            return fill
        return fill_batch(self.space, fill, 0, one_hot_discrete)

    def _get_int_general(self, idx, neg_index_as_lookback, fill, one_hot_discrete,
                         ignore_last, add_last):
        n = self.len_incl_lookback()
        length = max(n - ignore_last, 0) + (add_last is not None)
        pos = resolve_int(idx, neg_index_as_lookback, self.lookback, length,
                          len(self) + self.lookback - ignore_last)
        if pos < 0:
            if fill is None:
                raise IndexError(
                    f"index {idx} (neg_index_as_lookback={neg_index_as_lookback}) is out "
                    f"of range for a buffer of {n} items ({self.lookback} of them "
                    f"lookback); pass `fill` to pad"
                )
            return self._fill_item(fill, one_hot_discrete)
        if add_last is not None and self.finalized:
            data = map_struct(lambda a: a[0], self._rows(slice(pos, pos + 1), ignore_last,
                                                         add_last))
        elif add_last is not None and pos == length - 1:
            data = add_last
        else:
            data = self._item(pos)
        return self._one_hot(data) if one_hot_discrete else data

    def _rows(self, slice_: slice, ignore_last: bool, add_last: Any) -> Any:
        """data_to_use[slice_], where data_to_use drops/adds a last item as
        asked. A hanging value is a virtual row after the data: only the rows
        the slice picks are read."""
        n = max(self.len_incl_lookback() - ignore_last, 0)
        if not self.finalized:
            if add_last is None:
                return [self._item(p) for p in range(n)[slice_]]
            col = self._col
            if (n == 0 or col is None or not col.is_typed
                    or np.shape(add_last) != col.view().shape[1:]):
                # Items of several types or shapes: RLlib's np.append of them all.
                return _appended([self._item(p) for p in range(n)], add_last)[slice_]
            # Typed rows: np.asarray(items) is the storage's own array.
            return _with_last_row(col.view()[:n], add_last, slice_)

        def rows(col, extra=None):
            data = col.view()
            if add_last is None:
                return data[:n][slice_]
            if len(data) == 0 and col.row_type_open:
                # A leaf without a row type (RLlib cannot finalize one
                # empty): the hanging value's own shape and dtype. (Emptied
                # by pop(), the rows keep their dtype, as RLlib's array.)
                return np.asarray(extra)[None][slice_]
            return _with_last_row(data[:n], extra, slice_)

        if add_last is None:
            return map_struct(rows, self._tree)
        return map_struct(rows, self._tree, add_last)

    def _get_slice_general(self, slice_, neg_index_as_lookback, fill, one_hot_discrete,
                           ignore_last, add_last):
        # RLlib's rules see len - ignore_last (+1 with add_last), even when that is -1.
        total = self.len_incl_lookback() - ignore_last + (add_last is not None)
        start, stop, step, length, fill_left, fill_right = resolve_slice(
            slice_, neg_index_as_lookback, self.lookback, total
        )
        data = self._rows(slice(start, stop, step), ignore_last, add_last)
        if length > 0 and one_hot_discrete:
            data = self._one_hot(data)
        if fill is None or not (fill_left or fill_right):
            return data
        if length <= 0:
            data = None
        if not self.finalized:
            item = self._fill_item(fill, one_hot_discrete)
            # (Rows read with a hanging value come as an array; RLlib adds the
            # fill list to it elementwise, ours joins them as items.)
            data = [] if data is None else list(data)
            return [item] * fill_left + data + [item] * fill_right
        # As RLlib: each side's fill rows are joined to the data leaf by leaf,
        # mapped over the fill rows' struct (so its key order wins).
        if fill_left:
            rows = self._fill_rows(fill, fill_left, one_hot_discrete)
            data = rows if data is None else map_struct(
                lambda f, d: np.concatenate([f, d]), rows, data)
        if fill_right:
            rows = self._fill_rows(fill, fill_right, one_hot_discrete)
            data = rows if data is None else map_struct(
                lambda f, d: np.concatenate([d, f]), rows, data)
        return data

    def _fill_rows(self, fill: Any, count: int, one_hot_discrete: bool) -> Any:
        """`count` fill rows for finalized data: shaped by the space if there is
        one, else by the stored rows (RLlib's np.array([fill] * count) when flat)."""
        if self.space is not None:
            return fill_batch(self.space, fill, count, one_hot_discrete)

        def rows(col):
            batch = np.array([fill] * count)
            shape = (count,) + col.row_shape_tuple
            return batch if batch.shape == shape else np.broadcast_to(
                np.asarray(fill), shape).copy()

        return map_struct(rows, self._tree)

    def _batch_items(self, items: list, fill: Any) -> Any:
        """Items gathered one by one from finalized data as one batch (RLlib's
        `batch`); raw fill values are shaped like the stored rows."""
        if not items:
            raise ValueError("cannot batch the result of an empty list of indices")
        if fill is not None and self.space is None:
            template = next((x for x in items if x is not fill), None)
            if template is not None and is_struct(template):
                shaped = map_struct(lambda x: np.full(np.shape(x), fill), template)
                items = [shaped if x is fill else x for x in items]
        return map_struct(_stack_rows, *items)

    def _one_hot(self, data: Any) -> Any:
        if self.space_struct is None:
            raise ValueError(
                f"Cannot `one_hot` data in `{type(self).__name__}` if a gym.Space was "
                "NOT provided during construction!"
            )
        if isinstance(data, list):
            return [one_hot_struct(item, self.space_struct) for item in data]
        return one_hot_struct(data, self.space_struct)

    # -- writing ------------------------------------------------------------

    def __setitem__(self, key: Indices, value: Any) -> None:
        self.set(value, at_indices=key)

    def set(self, new_data: Any, *, at_indices: Indices = None,
            neg_index_as_lookback: bool = False) -> None:
        """Overwrites the items at `at_indices` (int, list of ints, slice, or None
        for everything after the lookback) with `new_data`.

        The checks run in RLlib's order and raise its exception classes: after
        finalize(), `new_data` must nest like the stored arrays (ValueError or
        TypeError; a list is nesting there, not a row), then an int or list
        index checks the space (AssertionError) before the index (IndexError),
        while a slice reports a row outside the space, or a length mismatch, as
        IndexError. The buffer is unchanged when anything is wrong.
        """
        self._prepare_set(new_data, at_indices, neg_index_as_lookback)()

    def _prepare_set(self, new_data: Any, at_indices: Indices,
                     neg_index_as_lookback: bool) -> Callable[[], None]:
        """Every check of set() (raising as set() raises), and the writes it
        then makes, returned as one function: a caller that sets several
        buffers checks them all before it writes any."""
        neg = bool(neg_index_as_lookback)
        if at_indices is None:
            at_indices, neg = slice(0, None), False
        if isinstance(at_indices, slice):
            return self._prepare_slice(new_data, at_indices, neg)
        if isinstance(at_indices, list):
            writes = []
            for i, idx in enumerate(at_indices):
                value = new_data[i]
                writes.append((self._checked_position(value, _as_index(idx), neg), value))
        else:
            writes = [(self._checked_position(new_data, _as_index(at_indices), neg), new_data)]

        def write() -> None:
            for pos, value in writes:
                self._write(pos, value)

        return write

    def _set_position(self, idx: int, neg_index_as_lookback: bool) -> int:
        n = self.len_incl_lookback()
        pos = resolve_int(idx, neg_index_as_lookback, self.lookback, n, len(self) + self.lookback)
        if pos < 0:
            raise IndexError(
                f"Cannot `set()` value at index {idx} (option neg_index_as_lookback="
                f"{neg_index_as_lookback})! Out of range of buffer data ({n} items, "
                f"{self.lookback} of them lookback)."
            )
        return pos

    def _leaf_pairs(self, value: Any) -> list:
        """(column, part of `value`, leaf space) per leaf, in dm-tree's leaf
        order; raises as dm-tree does when `value` nests otherwise."""
        check_same_nesting(self._tree, value)
        cols = map_struct(lambda col, v: [col, v], self._tree, value)
        spaces = self.space_struct if self.space is not None else map_struct(
            lambda c: None, self._tree)
        return [(c, v, s) for (c, v), s in zip(flatten_struct(cols), flatten_struct(spaces))]

    def _checked_position(self, value: Any, idx: int, neg_index_as_lookback: bool) -> int:
        """The row that set() at int `idx` overwrites with `value`, after every
        check that writing it would fail (nothing is written here)."""
        if not self.finalized:
            return self._set_position(idx, neg_index_as_lookback)
        pairs = self._leaf_pairs(value)
        for _, v, space in pairs:
            if space is not None and not space_contains(space, v):
                raise AssertionError(
                    f"Cannot `set()` {v!r}: it is not in the buffer's space {space}.")
        pos = self._set_position(idx, neg_index_as_lookback)
        for col, v, _ in pairs:
            _check_assignment(col, v, 1, single=True)
        return pos

    def _write(self, pos: int, value: Any) -> None:
        if not self.finalized:
            self._set_item(pos, value)
            return
        for col, v, _ in self._leaf_pairs(value):
            col.set(pos, v)

    def _prepare_slice(self, new_data: Any, slice_: slice,
                       neg_index_as_lookback: bool) -> Callable[[], None]:
        n = self.len_incl_lookback()
        start, stop, step, *_ = resolve_slice(
            slice_, neg_index_as_lookback, self.lookback, len(self) + self.lookback
        )
        rows = slice(start, stop, step)
        count = len(range(n)[rows])

        def mismatch():
            return IndexError(
                f"Cannot `set()` value via at_indices={rows} (option "
                f"neg_index_as_lookback={neg_index_as_lookback})! Slice of data "
                f"({count} items) does NOT have the same size as `new_data`, or "
                f"its first item is not in the buffer's space."
            )

        if not self.finalized:
            if count != len(new_data):
                raise mismatch()
            values = list(new_data)

            def write_items() -> None:
                for pos, value in zip(range(n)[rows], values):
                    self._set_item(pos, value)

            return write_items
        pairs = self._leaf_pairs(new_data)
        for col, v, space in pairs:
            if space is not None and not space_contains(space, v[0]):
                raise mismatch()
            if len(v) != count:
                raise mismatch()
            _check_assignment(col, v, count, single=False)

        def write_rows() -> None:
            for col, v, _ in pairs:
                col.writable_view()[rows] = v

        return write_rows

    # -- comparison and display ---------------------------------------------

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, InfiniteLookbackBuffer)
            and data_equivalence(self._snapshot(), other._snapshot())
            and self.lookback == other.lookback
            and self.finalized == other.finalized
            and self.space_struct == other.space_struct
            and self.space == other.space
        )

    __hash__ = None

    def __add__(self, other: Any) -> "InfiniteLookbackBuffer":
        """A new buffer: this one's items followed by `other`'s (a buffer, after
        its lookback, or a list), or with the number `other` added to each
        numeric item."""
        if self.finalized:
            raise RuntimeError(f"Cannot `add` to a finalized {type(self).__name__}.")
        data = self._snapshot()
        if isinstance(other, (int, float, complex)):
            data = [(d + other) if isinstance(d, (int, float, complex)) else d for d in data]
        elif isinstance(other, InfiniteLookbackBuffer):
            tail = other.get(slice(None))
            data = data + (tail if isinstance(tail, list) else _unbatch(tail))
        else:
            data = data + other
        return InfiniteLookbackBuffer(data=data, lookback=self.lookback, space=self.space)

    def __repr__(self) -> str:
        lb = self.lookback
        data = self._snapshot()
        if is_struct(data):
            head = map_struct(lambda a: a[:lb], data)
            tail = map_struct(lambda a: a[lb:], data)
        else:
            head, tail = data[:lb], data[lb:]
        return f"{type(self).__name__}({head} <- lookback({lb}) | {tail})"


def _range_slice(r: range) -> slice:
    """The slice that picks range `r` out of a sequence of `len(r)` or more."""
    if len(r) == 0:
        return slice(0, 0)
    return slice(r.start, r.stop if r.stop >= 0 else None, r.step)


def _with_last_row(base: np.ndarray, extra: Any, slice_: slice) -> np.ndarray:
    """np.concatenate([base, extra as one more row])[slice_] (RLlib's read
    with a hanging value, whose dtype both decide), copying only the rows the
    slice picks."""
    last = np.asarray(extra)[None]
    n = len(base)
    if last.shape[1:] != base.shape[1:]:
        if n == 0:
            return last[slice_]           # rows of the value's own shape
        return np.concatenate([base, last])[slice_]     # numpy's error, as before
    picked = range(n + 1)[slice_]
    if n not in picked:
        return np.array(base[_range_slice(picked)], dtype=np.result_type(base, last))
    if picked.step > 0:
        return np.concatenate([base[_range_slice(picked[:-1])], last])
    return np.concatenate([last, base[_range_slice(picked[1:])]])


def _appended(items: list, last: Any) -> Any:
    """List-mode items with a hanging value after them, as RLlib reads them:
    np.append(items, last), an ndarray. Rows keep their shape, where
    np.append would flatten them; items that do not stack stay a list."""
    data = np.asarray(items)
    if np.ndim(last) == 0 and data.ndim <= 1:
        return np.append(data, last)
    try:
        return np.asarray([*items, last])
    except ValueError:
        return [*items, last]


def _storage_of(data: Any) -> Any:
    """Finalized data (an array, or a dict/tuple of arrays) as storage."""
    if is_struct(data):
        return map_struct(lambda a: Column.from_array(np.asarray(a)), data)
    return Column.from_array(np.asarray(data))


def _restore(cls, tree, lookback, space):
    if not (isinstance(cls, type) and issubclass(cls, InfiniteLookbackBuffer)):
        raise TypeError(f"cannot restore a lookback buffer as {cls!r}")
    buffer = cls.__new__(cls)
    buffer._set_storage(tree)
    buffer.lookback = lookback
    buffer.space = unpickled_space(space)
    return buffer


def _stack_rows(*items: Any) -> np.ndarray:
    """RLlib's batching of items read from finalized data: the first item's
    dtype when it is an array, numpy's promotion otherwise; a scalar fill
    among array rows is broadcast into a row."""
    first = items[0]
    template = first if isinstance(first, np.ndarray) else next(
        (x for x in items if isinstance(x, np.ndarray) and x.ndim > 0), None)
    if template is None:
        return np.array(items)
    out = np.empty((len(items),) + template.shape, dtype=template.dtype)
    for i, x in enumerate(items):
        out[i] = x
    return out


def _unbatch(batch: Any) -> list:
    """A (nested) batch of arrays as a list of items."""
    leaves = flatten_struct(batch)
    n = len(leaves[0]) if leaves else 0
    return [map_struct(lambda a: a[i], batch) for i in range(n)]


# The core makes its buffers of this class.
_register_facade_class(InfiniteLookbackBuffer)
