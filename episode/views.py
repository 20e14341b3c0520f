"""Trajectory views: which data (shifted, stacked, padded) a model reads.

`ViewRequirement` is RLlib 2.60's dataclass of the same name
(`ray.rllib.policy.view_requirement`): one column of a model's input dict,
read from the data column `data_col` at `t + shift` for each timestep `t`.
"""
from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Dict, List, Optional, Union

import gymnasium as gym
import numpy as np

from episode.spaces import space_from_dict, space_to_dict

__all__ = ["ViewRequirement"]


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
