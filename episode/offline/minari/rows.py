"""What every backend's reader does with the rows it reads: the checks that
find a damaged file, the infos, the episode built over the checked arrays,
and the size from which rows are viewed in a memory map rather than read."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from episode._column import KINDS, Column
from episode._episode import make_episode
from episode.offline.minari.layout import _Metadata
from episode.offline.minari.spaces import _kinds, _tree
from episode.single_agent_episode import SingleAgentEpisode


_EMPTY_DICT = KINDS["empty_dict"]
_PYTHON_NUMBER_DTYPES = (np.dtype(np.float64), np.dtype(np.int64), np.dtype(np.bool_))


class _Damaged(Exception):
    """A storage file that does not hold what its metadata says (raised as a
    ValueError naming the file by from_minari)."""


def _check_numeric(arr: np.ndarray, rows: int, shape: tuple, kinds: str,
                   what: str) -> np.ndarray:
    """`arr` if it is `rows` rows of `shape` with a dtype of `kinds`."""
    if arr.dtype.kind not in kinds:
        raise _Damaged(f"{what} holds {arr.dtype} data, not {_kinds(kinds)} as its space says")
    if arr.shape != (rows,) + shape:
        raise _Damaged(f"{what} has shape {arr.shape}, not {(rows,) + shape}")
    return arr


def _flag(arr: np.ndarray, what: str) -> bool:
    """The episode's flag from its per-step terminations or truncations (a
    checked 1-D array): only the last step may carry it."""
    if arr.dtype != np.bool_ and not ((arr == 0) | (arr == 1)).all():
        raise _Damaged(f"{what} holds values other than 0 and 1")
    if len(arr) == 0:
        return False
    last = bool(arr[-1])
    if np.count_nonzero(arr) != last:
        first = int(np.flatnonzero(arr[:-1])[0])
        raise _Damaged(f"{what} ends the episode at step {first} of {len(arr)}: an episode "
                       f"ends at its last step only")
    return last


def _texts(items: Sequence, rows: int, what: str) -> np.ndarray:
    """Strings as a numpy'd episode holds them: one unicode array."""
    if len(items) != rows:
        raise _Damaged(f"{what} has {len(items)} strings, not {rows}")
    out = []
    for item in items:
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError:
                raise _Damaged(f"{what} holds a string that is not UTF-8") from None
        if not isinstance(item, str):
            raise _Damaged(f"{what} holds {type(item).__name__}, not strings")
        out.append(item)
    return np.array(out, dtype=np.str_)


def _step_values(values: Any) -> list:
    """One info leaf's values, one per row: Python numbers for float64,
    int64 and bool arrays (what Python's numbers are stored as), numpy
    scalars for other dtypes, array rows, and strings or objects as they are."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind == "O":
            return [v.decode("utf-8") if isinstance(v, bytes) else v for v in values.tolist()]
        if values.ndim == 1 and values.dtype in _PYTHON_NUMBER_DTYPES:
            return values.tolist()
        return list(values)
    return list(values)


def _info_column(tree: Optional[dict], rows: int, what: str) -> Column:
    """The infos Column (`rows` dicts) of a dict of per-row leaves. A leaf
    with one row less than the observations has no value at the reset
    (older datasets did not record the reset's info)."""
    if not tree:
        return Column.from_rows(rows, _EMPTY_DICT)
    steps = [{} for _ in range(rows)]
    _fill_infos(steps, tree, rows, what)
    return Column.from_list(steps)


def _fill_infos(steps: list, tree: dict, rows: int, what: str) -> None:
    for key, value in tree.items():
        if isinstance(value, dict):
            subs = [{} for _ in range(rows)]
            _fill_infos(subs, value, rows, f"{what}[{key!r}]")
            for step, sub in zip(steps, subs):
                step[key] = sub
            continue
        values = _step_values(value)
        first = rows - len(values)
        if first not in (0, 1):
            raise _Damaged(f"{what}[{key!r}] has {len(values)} rows; the episode has "
                           f"{rows} observations")
        for step, v in zip(steps[first:], values):
            step[key] = v


def _build(index: int, id_: Optional[str], obs: dict, actions: dict, rewards: np.ndarray,
           terminated: bool, truncated: bool, infos: Column, extras: dict,
           meta: _Metadata) -> SingleAgentEpisode:
    """The episode over checked arrays: one Column per leaf, no copies."""
    obs_space, action_space = meta.observation_space, meta.action_space
    col = Column.from_array
    if meta.flat_obs:
        obs_tree = col(obs[()])
    else:
        obs_tree = _tree(obs_space, {p: col(a) for p, a in obs.items()})
    if meta.flat_actions:
        action_tree = col(actions[()])
    else:
        action_tree = _tree(action_space, {p: col(a) for p, a in actions.items()})
    return make_episode(SingleAgentEpisode, str(index) if id_ is None else id_, obs_tree,
                        infos, action_tree, Column.from_array(rewards),
                        {k: Column.from_array(v) for k, v in extras.items()},
                        (0, 0, 0, 0, 0), terminated, truncated, 0, obs_space, action_space)


# Arrow files and HDF5 arrays of at least this size are memory-mapped
# (their arrays view the file's pages); smaller ones are read, which costs
# less than a map.
_MAPPED_BYTES = 1 << 16
