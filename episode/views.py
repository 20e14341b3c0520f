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
import itertools
import numbers
from typing import TYPE_CHECKING, Any, Dict, Literal, Optional, Sequence, overload

import gymnasium as gym
import numpy as np

from episode._extras import rllib_missing
from episode._views import gather_next_rows
from episode.spaces import empty_batch, map_struct, space_from_dict, space_to_dict
from episode.typing import Shift, TrainingBatch

if TYPE_CHECKING:
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

__all__ = ["ViewRequirement", "build_training_batch", "build_inference_batch"]


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
    space: Optional[gym.Space] = None
    shift: Shift = 0
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
            forms = (f"invalid shift {shift!r}: a range string is 'from:to' or "
                     f"'from:to:step' with int bounds (such as '-3:0'); a shift can also "
                     f"be an int or a list of ints")
            parts = shift.split(":")
            if len(parts) not in (2, 3):
                # RLlib's class (an assertion), raised explicitly.
                raise AssertionError(forms)
            try:
                self.shift_from, self.shift_to = int(parts[0]), int(parts[1])
                self.shift_step = int(parts[2]) if len(parts) == 3 else 1
            except ValueError:
                raise ValueError(forms) from None
            if self.shift_step == 0:
                raise ZeroDivisionError(f"shift {shift!r}: a range step cannot be 0")
            # Both ends included (for step 1), as RLlib counts them.
            self.shift_arr = np.arange(self.shift_from, self.shift_to + 1, self.shift_step)
        elif isinstance(shift, numbers.Integral):
            self.shift_arr = np.array([shift])
        elif isinstance(shift, (list, tuple)):
            self.shift_arr = np.array(shift)
        else:
            raise ValueError(f"invalid shift {shift!r}: expected an int, a list of ints or a "
                             f"range string 'from:to' or 'from:to:step' (such as '-3:0')")

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
    if track.dtype.kind in "OUS":
        return _gather_items(track, positions)
    if positions.max() < n:
        out = track[positions]
    else:
        out = track[np.minimum(positions, n - 1)]
        out[positions >= n] = 0
    return out[:, 0] if positions.shape[1] == 1 else out


def _gather_items(track: np.ndarray, positions: np.ndarray) -> np.ndarray:
    # Rows of objects or strings, as RLlib's collector gathers them: each
    # timestep's rows (one shift: its item) stacked by numpy, which makes
    # an array of numbers of 0-d arrays and fits strings to the longest one
    # gathered; past the end, the last item with each leaf zeroed.
    if positions.max() < len(track):
        out = track[positions]
        if positions.shape[1] > 1:
            return out
        return _stacked(out[:, 0])
    pad = _zeros_like_leaves(track[-1])
    rows = []
    for pos in positions:
        if pos.max() < len(track):
            row = track[pos]
        else:
            row = np.stack([track[p] if p < len(track) else pad for p in pos])
        rows.append(row[0] if len(pos) == 1 else row)
    return np.stack(rows, 0)


def _stacked(items: np.ndarray) -> np.ndarray:
    """A view's items of objects or strings (one shift) as RLlib's collector
    stacks them, item by item: 0-d arrays among objects make an array of
    numbers, strings take the longest one's width."""
    if not len(items) or (items.dtype == object and all(type(x) is dict for x in items)):
        return items          # (dicts, infos' items, stack as themselves)
    return np.stack(list(items), 0)


def _zeros_like_leaves(item: Any) -> Any:
    if isinstance(item, dict):
        return type(item)((k, _zeros_like_leaves(v)) for k, v in item.items())
    if isinstance(item, (list, tuple)) and not hasattr(item, "_fields"):
        return type(item)(_zeros_like_leaves(v) for v in item)
    return np.zeros_like(item)


def check_causal(view_col: str, vr: "ViewRequirement") -> None:
    """ValueError (RLlib's collector's class) for a view used for computing
    actions that reads timesteps after the current one."""
    if np.any(vr.shift_arr > 0):
        raise ValueError(
            f"view {view_col!r} reads future timesteps (shift {vr.shift_arr}) but is used "
            f"for computing actions, which can only see the past: set "
            f"used_for_compute_actions=False or use shifts <= 0")


def gather_inference(track: np.ndarray, shift_arr: np.ndarray) -> np.ndarray:
    """The view at the track's last row (shifts <= 0), with a batch axis of
    one: (1, *row) for one shift, (1, len(shifts), *row) for several."""
    rows = track[shift_arr + len(track) - 1]
    return rows if rows.shape[0] == 1 else rows[None]



# -- views over episodes ------------------------------------------------------
#
# An episode's track of a data column holds its rows with timestep 0 at
# position `lookback` (obs and infos: the observation the first action was
# taken on), so the view at timestep t reads positions lookback + t + shift.
# Training batches take t = 0, r, 2r, ... (r the batch_repeat_value) of each
# episode; the inference input takes t = len(episode), the next action's.

_unroll_ids = itertools.count()
_SAMPLER_COLUMNS = ("terminateds", "truncateds", "t", "eps_id", "env_id", "agent_index",
                    "unroll_id")


def column_rows(col: Any) -> np.ndarray:
    """A Column's rows as one array (a view of typed storage), float64
    narrowed to float32."""
    if col.is_typed and len(col):
        view = col.view()
        if view is not None:
            return as_float32(view)
    return as_float32(col.to_list())


class _Tracks:
    """The data tracks of one single-agent episode, made once per build."""

    def __init__(self, episode: Any, agent_index: int, env_id: Any, unroll_id: Any,
                 next_row: bool):
        self.episode = episode
        self.steps = len(episode)
        # Inference reads the sampler columns one row past the last step.
        self.next_row = next_row
        self.constants = {"eps_id": episode.id_, "agent_index": agent_index,
                          "env_id": env_id, "unroll_id": unroll_id}
        self.cache: dict = {}

    def get(self, data_col: str) -> Optional[tuple]:
        """(struct of row arrays, lookback) of a data column; None if the
        episode has no such column."""
        if data_col not in self.cache:
            self.cache[data_col] = self._find(data_col)
        return self.cache[data_col]

    def _find(self, data_col: str) -> Optional[tuple]:
        e = self.episode
        buffer = {"obs": e.observations, "infos": e.infos, "actions": e.actions,
                  "rewards": e.rewards}.get(data_col)
        if buffer is None and data_col in e.extra_model_outputs:
            buffer = e.extra_model_outputs[data_col]
        if data_col == "infos":
            # Whole items (RLlib's collector does not take infos apart).
            items = [buffer._item(p) for p in range(buffer.len_incl_lookback())]
            return as_float32(items), buffer.lookback
        if buffer is not None:
            if buffer.len_incl_lookback() == 0:
                # No rows yet: none of the space's shape and dtype.
                return map_struct(as_float32, empty_batch(buffer.space)), 0
            return map_struct(column_rows, buffer._tree), buffer.lookback
        if data_col not in _SAMPLER_COLUMNS:
            return None
        lookback = e.actions.lookback
        rows = lookback + self.steps + self.next_row
        if data_col in ("terminateds", "truncateds"):
            flags = np.zeros(rows, bool)
            if self.steps and not self.next_row:
                flags[-1] = e.is_terminated if data_col == "terminateds" else e.is_truncated
            return flags, lookback
        # t and the constant columns start one row earlier, at the reset
        # (t: one less than the first step's), as in RLlib's collector.
        if data_col == "t":
            return np.arange(e.t_started - lookback - 1, e.t_started - lookback + rows), lookback + 1
        value = self.constants[data_col]
        if value is None:
            return None
        return as_float32([value] * (rows + 1)), lookback + 1


def _gather(track: np.ndarray, positions: np.ndarray, zeros_before: bool) -> np.ndarray:
    """Rows of `track` at `positions` (timesteps x shifts), padded: before
    the first row the first row again (zeros if `zeros_before`), past the
    last row zeros; one shift drops the shift axis."""
    n = len(track)
    if n == 0:
        out = np.zeros(positions.shape + track.shape[1:], track.dtype)
    elif track.dtype == object:
        out = np.empty(positions.shape, object)
        pad = _zeros_like_leaves(track[-1])
        for index, p in np.ndenumerate(positions):
            out[index] = (pad if p >= n or (p < 0 and zeros_before)
                          else track[max(p, 0)])
    else:
        out = track[np.clip(positions, 0, n - 1)]
        outside = (positions >= n) | (positions < 0) if zeros_before else positions >= n
        if outside.any():
            out[outside] = np.zeros((), track.dtype)      # ('' for strings)
    if positions.shape[1] > 1:
        return out
    return _stacked(out[:, 0]) if track.dtype.kind in "OUS" else out[:, 0]


def _gather_episodes(leaves: tuple, lookbacks: np.ndarray, steps: np.ndarray,
                     shift_arr: np.ndarray, repeat: int, zeros_before: bool) -> np.ndarray:
    """The rows of a view over several episodes in one gather: timesteps 0,
    repeat, 2*repeat, ... of each episode, read from its own track (leaf) at
    lookback + t + shift and padded at its own ends, as _gather pads one."""
    sizes = np.array([len(leaf) for leaf in leaves])
    counts = -(-steps // repeat)
    if not sizes.all() or any(leaf.dtype == object for leaf in leaves):
        # Tracks without rows, or of objects: episode by episode.
        return np.concatenate([
            _gather(leaf, (lookback + np.arange(0, n, repeat))[:, None] + shift_arr[None, :],
                    zeros_before)
            for leaf, lookback, n in zip(leaves, lookbacks.tolist(), steps.tolist())])
    track = leaves[0] if len(leaves) == 1 else np.concatenate(leaves)
    starts = np.cumsum(sizes) - sizes
    episode = np.repeat(np.arange(len(leaves)), counts)
    first_row = np.cumsum(counts) - counts
    t = (np.arange(len(episode)) - first_row[episode]) * repeat
    low = starts[episode][:, None]
    high = (starts + sizes)[episode][:, None]
    positions = (low + lookbacks[episode][:, None] + t[:, None]) + shift_arr[None, :]
    out = track[np.minimum(np.maximum(positions, low), high - 1)]
    outside = positions >= high
    if zeros_before:
        outside |= positions < low
    if outside.any():
        out[outside] = np.zeros((), track.dtype)          # ('' for strings)
    if positions.shape[1] > 1:
        return out
    return _stacked(out[:, 0]) if track.dtype.kind in "US" else out[:, 0]


def _episode_view(tracks: _Tracks, data_col: str, vr: "ViewRequirement",
                  timesteps: np.ndarray, zero_cols: frozenset) -> Any:
    found = tracks.get(data_col)
    if found is None:
        return None
    rows, lookback = found
    positions = (lookback + timesteps)[:, None] + vr.shift_arr[None, :]
    zeros = data_col in zero_cols
    return map_struct(lambda track: _gather(track, positions, zeros), rows)


def _single_agent_parts(episodes: Sequence[Any], env_ids: Optional[Sequence[Any]]) -> list:
    """(module id, episode, agent index, env id) of each single-agent
    episode, multi-agent episodes broken into their agents'."""
    parts = []
    for i, e in enumerate(episodes):
        env_id = env_ids[i] if env_ids is not None else None
        agent_episodes = getattr(e, "agent_episodes", None)
        if agent_episodes is None:
            parts.append((None, e, 0, env_id))
            continue
        for index, (agent_id, sa) in enumerate(agent_episodes.items()):
            module = sa.module_id if sa.module_id is not None else agent_id
            parts.append((module, sa, index, env_id))
    return parts


def _zero_cols(view_requirements: Dict[str, "ViewRequirement"]) -> frozenset:
    # RLlib's collector pads actions / rewards with zeros (not the first
    # value) when the model reads prev_actions / prev_rewards.
    return frozenset(col for col, prev in (("actions", "prev_actions"),
                                           ("rewards", "prev_rewards"))
                     if prev in view_requirements)


def _concat(pieces: list) -> Any:
    if len(pieces) == 1:
        return pieces[0]
    return map_struct(lambda *leaves: np.concatenate(leaves), *pieces)


@overload
def build_training_batch(episodes: Sequence[Any],
                         view_requirements: Dict[str, "ViewRequirement"], *,
                         env_ids: Optional[Sequence[Any]] = None,
                         max_seq_len: Optional[int] = None,
                         sample_batch: Literal[False] = False) -> TrainingBatch: ...
@overload
def build_training_batch(episodes: Sequence[Any],
                         view_requirements: Dict[str, "ViewRequirement"], *,
                         env_ids: Optional[Sequence[Any]] = None,
                         max_seq_len: Optional[int] = None,
                         sample_batch: Literal[True]) -> "SampleBatch | MultiAgentBatch": ...
def build_training_batch(episodes: Sequence[Any],
                         view_requirements: Dict[str, "ViewRequirement"], *,
                         env_ids: Optional[Sequence[Any]] = None,
                         max_seq_len: Optional[int] = None,
                         sample_batch: bool = False) -> Any:
    """The training batch of `episodes`: every timestep of each, each view
    gathered at its shifts with RLlib's collector padding (first value
    repeated before the start, zeros for prev_actions / prev_rewards, zeros
    past the end; float64 stored as float32).

    Single-agent episodes give one dict of columns, rows ordered by episode.
    Multi-agent episodes give a dict of such dicts, one per module id (the
    agent id where an agent has none). Besides the episodes' own data the
    views can read "terminateds", "truncateds", "t", "eps_id",
    "agent_index", "unroll_id" and (with `env_ids`, one per episode)
    "env_id". Views of columns no episode has are left out, as RLlib's
    collector leaves out what postprocessing adds later. `max_seq_len`
    adds "seq_lens" (each episode cut into sequences of at most that many
    timesteps). `sample_batch=True` returns RLlib's SampleBatch /
    MultiAgentBatch (needs ray).
    """
    parts = _single_agent_parts(episodes, env_ids)
    zero_cols = _zero_cols(view_requirements)
    by_module: Dict[Any, list] = {}
    for module, e, agent_index, env_id in parts:
        if len(e):
            by_module.setdefault(module, []).append(
                _Tracks(e, agent_index, env_id, next(_unroll_ids), False))
    batches = {}
    for module, tracks in by_module.items():
        columns = batches[module] = {}
        steps = np.array([t.steps for t in tracks])
        for view_col, vr in view_requirements.items():
            data_col = vr.data_col or view_col
            found = [t.get(data_col) for t in tracks]
            missing = [t.episode.id_ for t, f in zip(tracks, found) if f is None]
            if len(missing) == len(found):
                continue
            if missing:
                raise ValueError(
                    f"view {view_col!r} reads {data_col!r}, which episodes {missing} do not "
                    f"have (others do): the view's rows would not line up")
            lookbacks = np.array([f[1] for f in found])
            columns[view_col] = map_struct(
                lambda *leaves: _gather_episodes(leaves, lookbacks, steps, vr.shift_arr,
                                                 vr.batch_repeat_value, data_col in zero_cols),
                *[f[0] for f in found])
        if max_seq_len is not None:
            columns["seq_lens"] = np.array([min(max_seq_len, n - k) for n in steps.tolist()
                                            for k in range(0, n, max_seq_len)], np.int32)
    multi_agent = any(module is not None for module, *_ in parts)
    if not multi_agent:
        batch = batches.get(None, {})
        return _sample_batch(batch) if sample_batch else batch
    if not sample_batch:
        return batches
    env_steps = sum(e.env_steps() for e in episodes)
    return _batch_classes()[1]({m: _sample_batch(b) for m, b in batches.items()}, env_steps)


def _batch_classes() -> tuple:
    """RLlib's SampleBatch and MultiAgentBatch."""
    try:
        from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    except ModuleNotFoundError as e:
        raise rllib_missing(e, "sample_batch=True, which returns RLlib's batches,") from e
    return SampleBatch, MultiAgentBatch


def _sample_batch(columns: dict) -> Any:
    return _batch_classes()[0](columns)


@overload
def build_inference_batch(episodes: Sequence[Any],
                          view_requirements: Dict[str, "ViewRequirement"], *,
                          env_ids: Optional[Sequence[Any]] = None,
                          sample_batch: Literal[False] = False) -> TrainingBatch: ...
@overload
def build_inference_batch(episodes: Sequence[Any],
                          view_requirements: Dict[str, "ViewRequirement"], *,
                          env_ids: Optional[Sequence[Any]] = None,
                          sample_batch: Literal[True]) -> "SampleBatch": ...
def build_inference_batch(episodes: Sequence[Any],
                          view_requirements: Dict[str, "ViewRequirement"], *,
                          env_ids: Optional[Sequence[Any]] = None,
                          sample_batch: bool = False) -> Any:
    """The input for the next action of each of `episodes` (single-agent
    episodes, e.g. a multi-agent episode's agents that act next), one row
    per episode: each view used for computing actions, read at timestep
    len(episode) with the same padding as training batches, so that a
    training batch's row t is the input the action at t was computed from.
    Views with positive shifts cannot be used for computing actions
    (ValueError, as RLlib's collector)."""
    zero_cols = _zero_cols(view_requirements)
    episodes = list(episodes)
    tracks = None
    columns = {}
    for view_col, vr in view_requirements.items():
        if not vr.used_for_compute_actions:
            continue
        check_causal(view_col, vr)
        data_col = vr.data_col or view_col
        # Flat typed tracks: one compiled pass over all episodes.
        rows = gather_next_rows(episodes, data_col, vr.shift_arr, data_col in zero_cols)
        if rows is not None:
            columns[view_col] = as_float32(rows[:, 0] if rows.shape[1] == 1 else rows)
            continue
        if tracks is None:
            tracks = [_Tracks(e, 0, env_ids[i] if env_ids is not None else None, None, True)
                      for i, e in enumerate(episodes)]
        pieces = []
        for t in tracks:
            piece = _episode_view(t, data_col, vr, np.array([t.steps]), zero_cols)
            if piece is None:
                # Not recorded yet (e.g. a model output before the first
                # action): zeros of its space, as RLlib's collector gives.
                space = view_requirements[data_col].space \
                    if data_col in view_requirements else vr.space
                no_rows = np.full((1, len(vr.shift_arr)), -1)
                piece = map_struct(lambda track: _gather(as_float32(track), no_rows, False),
                                   empty_batch(space))
            pieces.append(piece)
        if pieces:
            columns[view_col] = _concat(pieces)
    return _sample_batch(columns) if sample_batch else columns
