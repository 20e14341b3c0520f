"""Type aliases of episode's public API, for annotating code that uses it
(as numpy.typing does for numpy).

The getters return an `Item` for an int index and a `Batch` for a list, a
slice or None (`return_list=True`: a list of per-env-step dicts); samplers
return `TrainingBatch` dicts of columns.
"""
from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Dict, List, Literal, Tuple, Union

import numpy as np
import numpy.typing as npt

__all__ = ["AgentID", "Batch", "BatchMode", "Column", "CountStepsBy", "Index", "IndexBatch",
           "Indices", "Item", "ModuleID", "Shift", "TrainingBatch"]

AgentID = Hashable
"""An agent's id in a multi-agent env (any hashable, a str usually)."""

ModuleID = Hashable
"""The id of the module (policy) an agent's data trains: a training batch's key."""

Index = Union[int, np.integer[Any]]
"""One position: an int or a numpy integer."""

IndexBatch = Union[List[Index], slice, None]
"""Several positions: a list of them, a slice, or None (all, after the lookback)."""

Indices = Union[Index, IndexBatch]
"""What the getters and setters take as `indices` / `at_indices`."""

Item = object
"""One stored item: what was appended (before `to_numpy()`), a numpy scalar
or array (after it), a dict or tuple of those for Dict/Tuple data, or a fill
value. Narrow it (`isinstance`, `np.asarray`) where a type is needed."""

Batch = Union[List[object], npt.NDArray[Any], Dict[str, "Batch"], Tuple["Batch", ...]]
"""Several items: a list of them before `to_numpy()`, an array after it (a
dict or tuple of arrays for Dict/Tuple data)."""

Column = Union[npt.NDArray[Any], Dict[str, "Column"], Tuple["Column", ...]]
"""One column of a training batch: an array with a row per timestep (a dict
or tuple of such arrays for Dict/Tuple data)."""

TrainingBatch = Dict[str, Column]
"""A training batch: columns by name. A multi-agent sampler's is one such
dict per module id (each a `Column` dict in turn)."""

BatchMode = Literal["truncate_episodes", "complete_episodes"]
"""How a Sampler cuts rollouts (RLlib's `batch_mode`)."""

CountStepsBy = Literal["env_steps", "agent_steps"]
"""What a multi-agent rollout's length counts (RLlib's `count_steps_by`)."""

Shift = Union[int, np.integer[Any], str, List[int], Tuple[int, ...]]
"""A ViewRequirement's shift: an int, a range string such as "-3:0", or
a list or tuple of ints."""
