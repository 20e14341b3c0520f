"""Trajectory views: which data (shifted, stacked, padded) a model reads.

`ViewRequirement` is RLlib 2.60's dataclass of the same name
(`ray.rllib.policy.view_requirement`): one column of a model's input dict,
read from the data column `data_col` at `t + shift` for each timestep `t`.

The gathers below turn one data track (an array of rows, padded in front
as the collector pads it) into a view column with one fancy index over all
timesteps. The padding rule is RLlib's AgentCollector's: rows before the
start are whatever the track holds there (the first value repeated, or
zeros for prev_actions / prev_rewards), rows past the end are zeros.
"""
from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Dict, List, Optional, Union

import gymnasium as gym
import numpy as np

from episode.spaces import space_from_dict, space_to_dict

__all__ = ["ViewRequirement", "as_float32", "gather_training", "gather_inference"]


@dataclasses.dataclass
class ViewRequirement:
    """One view column: `data_col` (None: the column's own name) at the
    timestep offsets `shift`.

    Args:
        data_col: The data column the view reads (None: the key under which
            this requirement is stored).
        space: The space of one item, which shapes padding outside the
            trajectory (default: a scalar float32 Box).
        shift: The offsets from the current timestep: an int, a list of ints,
            or a range string "from:to" or "from:to:step" (both ends included
            for step 1: "-3:0" is [-3, -2, -1, 0]).
        index: An absolute position in the trajectory (negative: from its end).
        batch_repeat_value: Every how many timesteps the view is taken once
            (recurrent state inputs: the sequence length).
        used_for_compute_actions: Whether action computation reads the view.
        used_for_training: Whether training batches include the view.

    `shift_arr` is the offsets as an int array; a range string also sets
    `shift_from`, `shift_to` and `shift_step` (None otherwise).
    """

    data_col: Optional[str] = None
    space: gym.Space = None
    shift: Union[int, str, List[int]] = 0
    index: Optional[int] = None
    batch_repeat_value: int = 1
    used_for_compute_actions: bool = True
    used_for_training: bool = True
    shift_arr: Optional[np.ndarray] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        if self.space is None:
            self.space = gym.spaces.Box(float("-inf"), float("inf"), shape=())
        self.shift_from = self.shift_to = self.shift_step = None
        shift = self.shift
        if isinstance(shift, str):
            parts = shift.split(":")
            if len(parts) not in (2, 3):
                # RLlib's class (an assertion), raised explicitly.
                raise AssertionError(f"Invalid shift str format: {shift}")
            self.shift_from, self.shift_to = int(parts[0]), int(parts[1])
            self.shift_step = int(parts[2]) if len(parts) == 3 else 1
            if self.shift_step == 0:
                raise ZeroDivisionError(f"shift {shift!r}: a range step cannot be 0")
            # Both ends included (for step 1), as RLlib counts them.
            self.shift_arr = np.arange(self.shift_from, self.shift_to + 1, self.shift_step)
        elif isinstance(shift, numbers.Integral):
            self.shift_arr = np.array([shift])
        elif isinstance(shift, (list, tuple)):
            self.shift_arr = np.array(shift)
        else:
            raise ValueError(f"unrecognized shift type: {shift!r} (expected an int, a list "
                             f"of ints or a range string such as '-3:0')")

    def to_dict(self) -> Dict[str, Any]:
        """The requirement as a JSON-serializable dict (the space described)."""
        return {
            "data_col": self.data_col,
            "space": space_to_dict(self.space),
            "shift": self.shift,
            "index": self.index,
            "batch_repeat_value": self.batch_repeat_value,
            "used_for_training": self.used_for_training,
            "used_for_compute_actions": self.used_for_compute_actions,
        }

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ViewRequirement":
        """The requirement a to_dict() dict describes. (As RLlib's, it
        replaces d["space"] with the space it describes.)"""
        d["space"] = space_from_dict(d["space"])
        return cls(**d)


def as_float32(rows: list | np.ndarray) -> np.ndarray:
    """Rows as one array, float64 narrowed to float32 (as RLlib's collector
    stores them, to save memory)."""
    arr = np.asarray(rows) if isinstance(rows, np.ndarray) else np.array(rows)
    return arr.astype(np.float32) if arr.dtype == np.float64 else arr


def gather_training(track: np.ndarray, first: int, shift_arr: np.ndarray, repeat: int,
                    count: int) -> np.ndarray:
    """Timesteps i = 0, repeat, 2*repeat, ... (`count` of them) of a view on
    `track`: row `first + i + shift` for each shift, zeros past the end.

    One shift gives a (count, *row) array, several a (count, len(shifts),
    *row) one; no timesteps give float64 (0,), as RLlib's collector does."""
    if count <= 0:
        return np.array([])
    positions = (first + np.arange(0, count * repeat, repeat))[:, None] + shift_arr[None, :]
    n = len(track)
    if track.dtype == object and positions.max() >= n:
        return _gather_padded_objects(track, positions)
    if positions.max() < n:
        out = track[positions]
    else:
        out = track[np.minimum(positions, n - 1)]
        out[positions >= n] = 0
    return out[:, 0] if positions.shape[1] == 1 else out


def _gather_padded_objects(track: np.ndarray, positions: np.ndarray) -> np.ndarray:
    # Object rows (infos) padded past the end: the pad is the last item with
    # each leaf zeroed, stacked with the others as numpy stacks objects.
    pad = _zeros_like_leaves(track[-1])
    rows = []
    for pos in positions:
        if pos.max() < len(track):
            row = track[pos]
        else:
            row = np.stack([track[p] if p < len(track) else pad for p in pos])
        rows.append(row[0] if len(pos) == 1 else row)
    return np.stack(rows, 0)


def _zeros_like_leaves(item: Any) -> Any:
    if isinstance(item, dict):
        return type(item)((k, _zeros_like_leaves(v)) for k, v in item.items())
    if isinstance(item, (list, tuple)) and not hasattr(item, "_fields"):
        return type(item)(_zeros_like_leaves(v) for v in item)
    return np.zeros_like(item)


def gather_inference(track: np.ndarray, shift_arr: np.ndarray) -> np.ndarray:
    """The view at the track's last row (shifts <= 0), with a batch axis of
    one: (1, *row) for one shift, (1, len(shifts), *row) for several."""
    rows = track[shift_arr + len(track) - 1]
    return rows if rows.shape[0] == 1 else rows[None]
