"""AgentCollector: RLlib's old-stack per-agent trajectory collector.

The same API and results as RLlib 2.60's
`ray.rllib.evaluation.collectors.agent_collector.AgentCollector`, so an
old-stack sampler switches with one import. Each data column is kept as
RLlib keeps it (a list of leaf tracks, dicts and tuples flattened, with the
same rows in front for shifted views), but every track is one of our typed
Columns, and a view is built with one gather over all timesteps instead of
a Python loop per timestep.
"""
from __future__ import annotations

import copy
import math
import sys
from typing import Any, Dict, List, Optional

import gymnasium as gym
import numpy as np

from episode._collect import (FLAT_ACTION, LEAVES, WHOLE, BatchMaker, CollectorCore,
                              InferencePlan, StepLayout)
from episode._column import Column
from episode.spaces import _nested_leaves, _nested_like, fill_batch, is_nesting
from episode.typing import TrainingBatch
from episode.views import check_causal, column_rows, gather_inference, gather_training

__all__ = ["AgentCollector"]

OBS, NEXT_OBS, INFOS = "obs", "new_obs", "infos"
ACTIONS, REWARDS = "actions", "rewards"
PREV_ACTIONS, PREV_REWARDS = "prev_actions", "prev_rewards"
TERMINATEDS, TRUNCATEDS = "terminateds", "truncateds"
T, EPS_ID, UNROLL_ID = "t", "eps_id", "unroll_id"
AGENT_INDEX, ENV_ID, SEQ_LENS = "agent_index", "env_id", "seq_lens"

# The attributes CollectorCore keeps (a step reads and writes them).
_CORE_STATE = ("buffers", "episode_id", "unroll_id", "agent_steps", "_is_training",
               "view_requirements", "_inference")

# Columns whose first row comes with the reset observation (one row before
# the per-step columns' first row).
_INIT_ROW_COLUMNS = (OBS, INFOS, EPS_ID, AGENT_INDEX, ENV_ID, T, UNROLL_ID)


def _tracks(rows: list) -> List[Column]:
    tracks = []
    for row in rows:
        col = Column()
        col.extend(row)
        tracks.append(col)
    return tracks


def _flatten_action(action: Any) -> Any:
    # A struct action as one 1-D array of all its leaves.
    if isinstance(action, (list, tuple, dict)):
        return np.concatenate([np.reshape(leaf, [-1]) for leaf in _nested_leaves(action)],
                              axis=0).flatten()
    return action


def _gather_track(track: Column, shifts: np.ndarray) -> np.ndarray:
    # A track the compiled gather leaves (the object path, no rows yet).
    return gather_inference(column_rows(track), shifts)


def _unflatten_leaves(struct: Any, leaves: list) -> Any:
    return _nested_like(struct, iter(leaves))


def _typed_column(items: list, lead: int) -> Optional[Column]:
    """`items` as one typed Column whose rows batch exactly as np.array(items)
    does (same dtype, shape and values), or None.

    The first `lead` items are the rows a track starts with before its first
    step (zeros of a space, numpy values, where the steps may bring Python
    numbers): they are written in the kind and dtype of the rows after them.
    Checked against np.array(items) here; later rows fold into both the same
    way, numpy's dtype rule being a left fold over the rows."""
    head, body = items[:lead], items[lead:]
    if head:
        like = Column()
        like.extend(body)
        if not like.is_typed or not len(like):
            return None
        first = like.get(0)
        with np.errstate(all="ignore"):
            try:
                casts = [np.asarray(x).astype(like.dtype) for x in head]
            except (TypeError, ValueError):
                return None
        if isinstance(first, np.ndarray):
            head = casts
        elif any(cast.ndim for cast in casts):
            return None
        elif isinstance(first, np.generic):
            head = [cast[()] for cast in casts]
        else:   # a Python bool, int or float
            head = [cast.item() for cast in casts]
    col = Column()
    col.extend(head + body)
    if not col.is_typed:
        return None
    if lead:
        got = col.view()
        try:
            want = np.array(items)
        except (TypeError, ValueError):
            return None
        if (got is None or got.dtype != want.dtype or got.shape != want.shape
                or not np.array_equal(got, want, equal_nan=want.dtype.kind in "fc")):
            return None
    return col


def _count_rows(columns: dict) -> int:
    # SampleBatch's count: the length of the first column that has one
    # (infos and recurrent states not counted).
    for key, value in columns.items():
        if key == INFOS or key.startswith("state_in_") or key.startswith("state_out_"):
            continue
        leaves = _nested_leaves(value) if isinstance(value, (dict, tuple)) else [value]
        first = leaves[0] if leaves else None
        if isinstance(first, (int, float, list)):
            first = np.array(first)
        size = len(first) if hasattr(first, "__len__") and np.ndim(first) > 0 else 0
        if size:
            return size
    return 0


class AgentCollector(CollectorCore):
    """One agent's trajectory in one episode, and the batches its views give.

    Args:
        view_reqs: The view requirements (column name -> ViewRequirement).
        max_seq_len: The sequence length of recurrent policies.
        disable_action_flattening: False stores struct actions as one 1-D
            array of their leaves.
        intial_states: The policy's initial recurrent states (RLlib's
            spelling of the keyword).
        is_policy_recurrent: Whether batches get "seq_lens".
        is_training: False keeps only the rows the next inference needs.

    Batches are RLlib's `SampleBatch` when RLlib's sample_batch module is
    loaded in this process, else plain dicts of the same columns.

    A step whose keys (in their order) and nesting are those of the step
    before is appended by the compiled base (CollectorCore) along a layout
    decided once (_offer_layout); any other step takes the Python path
    (_add_step), which decides the layout anew. Whatever changes what the
    layout assumed drops it (_set_layout(None)).
    """

    _next_unroll_id = 0  # unroll ids are unique across collectors

    def __init__(self, view_reqs: Dict[str, Any], *, max_seq_len: int = 1,
                 disable_action_flattening: bool = True,
                 intial_states: Optional[List[Any]] = None,
                 is_policy_recurrent: bool = False, is_training: bool = True,
                 _enable_new_api_stack: bool = False):
        self.max_seq_len = max_seq_len
        self.disable_action_flattening = disable_action_flattening
        self.view_requirements = view_reqs
        self.initial_states = intial_states if intial_states is not None else []
        self.is_policy_recurrent = is_policy_recurrent
        self._is_training = is_training
        self._enable_new_api_stack = _enable_new_api_stack
        # Rows kept in front of the trajectory, enough for the most negative
        # shift (obs and infos count one row earlier: their track starts
        # with the reset observation).
        self.shift_before = -min(
            min(vr.shift_arr) - int((vr.data_col or k) in (OBS, INFOS))
            for k, vr in view_reqs.items())
        self.buffers: Dict[str, List[Column]] = {}
        # An example item of each flattened column, to unflatten batches.
        self.buffer_structs: Dict[str, Any] = {}
        self.episode_id = None
        self.unroll_id = None
        self.agent_steps = 0
        # Columns that only inference fills (state outs): their tracks hold
        # one placeholder row at the end that training batches leave out.
        self.data_cols_with_dummy_values = set()
        # Zero rows still in front of each column's tracks (inference pops
        # them, a continuing training batch keeps only the last rows).
        self._pads: Dict[str, int] = {}
        # Columns whose tracks hold their leading rows and no step's row yet.
        self._fresh: set = set()
        # Leading rows written in the kind of the steps' rows (_typed_column),
        # each [track, column, track index, original leading rows]: put back
        # if the track leaves the typed path.
        self._stand_ins: List[list] = []
        # build_for_inference's resolved views.
        self._inference: Optional[InferencePlan] = None

    def __getstate__(self) -> dict:
        # The inference plan and the step layout are caches of compiled
        # references: rebuilt when next needed, never pickled or copied.
        state = dict(self.__dict__)
        state.update((name, getattr(self, name)) for name in _CORE_STATE)
        state["_inference"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    @property
    def training(self) -> bool:
        return self._is_training

    def is_training(self, is_training: bool) -> None:
        self._is_training = is_training
        self._set_layout(None)

    def is_empty(self) -> bool:
        """Whether no data has been added."""
        return not self.buffers or all(len(tracks) == 0 for tracks in self.buffers.values())

    def _new_unroll(self) -> None:
        if self.unroll_id is None:
            self.unroll_id = AgentCollector._next_unroll_id
            AgentCollector._next_unroll_id += 1

    # -- adding ---------------------------------------------------------------

    def add_init_obs(self, episode_id: Any, agent_index: int, env_id: Any, init_obs: Any,
                     init_infos: Optional[dict] = None, t: int = -1) -> None:
        """Starts the trajectory with the reset observation (at timestep t)."""
        self.episode_id = episode_id
        self._new_unroll()
        self._set_layout(None)
        if isinstance(init_obs, list):
            init_obs = np.array(init_obs)
        if OBS not in self.buffers:
            first_row = {OBS: init_obs, INFOS: init_infos or {}, AGENT_INDEX: agent_index,
                         ENV_ID: env_id, T: t, EPS_ID: self.episode_id,
                         UNROLL_ID: self.unroll_id}
            # prev_actions / prev_rewards read zeros before the start.
            if PREV_REWARDS in self.view_requirements:
                first_row[REWARDS] = fill_batch(self.view_requirements[REWARDS].space, 0.0, 0)
            if PREV_ACTIONS in self.view_requirements:
                zeros = fill_batch(self.view_requirements[ACTIONS].space, 0.0, 0)
                first_row[ACTIONS] = (zeros if self.disable_action_flattening
                                      else _flatten_action(zeros))
            self._build_buffers(first_row)
        leaves = _nested_leaves(init_obs)
        for i, track in enumerate(self.buffers[OBS]):
            track.append(leaves[i])
        self.buffers[INFOS][0].append(init_infos or {})
        self.buffers[AGENT_INDEX][0].append(agent_index)
        self.buffers[ENV_ID][0].append(env_id)
        self.buffers[T][0].append(t)
        self.buffers[EPS_ID][0].append(self.episode_id)
        self.buffers[UNROLL_ID][0].append(self.unroll_id)

    def _add_step(self, input_values: Dict[str, Any]) -> None:
        # add_action_reward_next_obs of a step the compiled layout does not
        # take: the general path, after which steps like this one take the
        # layout it leaves.
        self._set_layout(None)
        self._new_unroll()
        values = copy.copy(input_values)
        if OBS in values:
            raise AssertionError(f"a step's values carry the next observation as "
                                 f"{NEXT_OBS!r}, not {OBS!r}")
        values[OBS] = values.pop(NEXT_OBS)
        if isinstance(values[OBS], list):
            values[OBS] = np.array(values[OBS])
        if T not in input_values:
            values[T] = self.buffers[T][0].get(-1) + 1
        for key, own in ((EPS_ID, self.episode_id), (UNROLL_ID, self.unroll_id)):
            if key in values:
                if values.pop(key) != own:
                    raise AssertionError(f"{key} of a step must stay {own!r}")
            self.buffers[key][0].append(own)

        for key, value in values.items():
            if key not in self.buffers:
                if self.training and key.startswith("state_out"):
                    vr = self.view_requirements[key]
                    self._fill_buffer_with_initial_values(vr.data_col or key, vr)
                else:
                    self._build_buffers({key: value})
            if self._whole_items(key):
                if key == ACTIONS and not self.disable_action_flattening:
                    value = _flatten_action(value)
                self._append(key, self.buffers[key][0], value)
            else:
                leaves = _nested_leaves(value)
                for i, track in enumerate(self.buffers[key]):
                    self._append(key, track, leaves[i])

        # Inference only needs the last rows: drop the oldest.
        if not self.training:
            for key, tracks in self.buffers.items():
                for track in tracks:
                    if len(track):
                        track.pop(0)
                if self._pads.get(key):
                    self._pads[key] -= 1
                    if not self._pads[key]:
                        self._settle(key)
        if self._fresh:
            for key in self._fresh.intersection(values):
                self._fresh.discard(key)
                self._settle(key)
        for entry in self._stand_ins:
            if not entry[0].is_typed:
                self._keep_stand_ins()
                break
        self.agent_steps += 1
        self._offer_layout(input_values)

    def _offer_layout(self, step: Any) -> None:
        # The layout of steps like `step` (just taken, or the StepLayout of
        # the steps before a fragment's end), for the compiled base: the same
        # keys in the same order, the same state around them. Steps that
        # check ids or carry what the general path rejects, and inference
        # while zero rows are still in front, keep the general path.
        if isinstance(step, StepLayout):
            step = dict.fromkeys(step.keys, step)
        if (type(step) is not dict or EPS_ID in step or UNROLL_ID in step or OBS in step
                or (not self.training and any(self._pads.values()))):
            return
        entries = []
        for key in step:
            col = OBS if key == NEXT_OBS else key
            if col not in self.buffers or col in self._fresh:
                return
            if not self._whole_items(col):
                way = LEAVES
            elif col == ACTIONS and not self.disable_action_flattening:
                way = FLAT_ACTION
            else:
                way = WHOLE
            entries.append((way, col, col in self.data_cols_with_dummy_values))
        if T not in step and T in self._fresh:
            return
        self._set_layout(StepLayout(self, step, entries,
                                    [entry[0] for entry in self._stand_ins], _flatten_action,
                                    T in self.data_cols_with_dummy_values))

    def _settle(self, key: str) -> None:
        # The rows in front (often numpy zeros before the steps' Python
        # numbers) put a column's tracks on the object path, where each
        # build converts the whole track: typed again (_typed_column), the
        # compiled gather reads just the rows a view needs.
        self._set_layout(None)
        lead = self._pads.get(key, 0)
        tracks = self.buffers[key]
        for i, track in enumerate(tracks):
            if track.is_typed or not len(track):
                continue
            items = track.to_list()
            typed = _typed_column(items, lead)
            if typed is not None:
                tracks[i] = typed
                if lead:
                    self._stand_ins.append([typed, key, i, items[:lead]])
        self._keep_stand_ins()

    def _keep_stand_ins(self) -> None:
        # A track whose leading rows stand in for the original ones and that
        # left the typed path since (a row of another kind) gets the original
        # rows back, so that np.array of its items is RLlib's again. Entries
        # whose rows are gone (or whose track was replaced) are dropped.
        self._set_layout(None)
        kept = []
        for entry in self._stand_ins:
            track, key, i, head = entry
            lead = self._pads.get(key, 0)
            tracks = self.buffers.get(key, [])
            if not lead or i >= len(tracks) or tracks[i] is not track:
                continue
            if track.is_typed:
                kept.append(entry)
                continue
            items = track.to_list()
            items[:lead] = head[len(head) - lead:]
            tracks[i] = Column()
            tracks[i].extend(items)
        self._stand_ins = kept

    def _append(self, key: str, track: Column, value: Any) -> None:
        if key in self.data_cols_with_dummy_values:
            # The placeholder stays the last row.
            placeholder = track.get(-1)
            track.pop(len(track) - 1)
            track.append(value)
            track.append(placeholder)
        else:
            track.append(value)

    def _whole_items(self, key: str) -> bool:
        # Infos, old-stack state outs and (when flattened) actions are kept
        # as whole items: their structure may change from step to step.
        return (key == INFOS
                or (key.startswith("state_out") and not self._enable_new_api_stack)
                or (key == ACTIONS and not self.disable_action_flattening))

    def _build_buffers(self, first_row: Dict[str, Any]) -> None:
        self._set_layout(None)
        for key, item in first_row.items():
            if key in self.buffers:
                continue
            pad = self.shift_before - (1 if key in _INIT_ROW_COLUMNS else 0)
            self._pads[key] = max(pad, 0)
            if pad > 0 and key not in _INIT_ROW_COLUMNS:
                self._fresh.add(key)
            if self._whole_items(key):
                if key == ACTIONS and not self.disable_action_flattening:
                    item = _flatten_action(item)
                self.buffers[key] = _tracks([[item] * max(pad, 0)])
            else:
                self.buffers[key] = _tracks([[leaf] * max(pad, 0)
                                             for leaf in _nested_leaves(item)])
                self.buffer_structs[key] = item

    def _fill_buffer_with_initial_values(self, data_col: str, view_requirement: Any,
                                         build_for_inference: bool = False) -> bool:
        """Starts the tracks of a column no step has added yet: recurrent
        state outs from the initial states, others (for inference only) from
        zeros of the space. Returns whether the column is a state."""
        try:
            space = self.view_requirements[data_col].space
        except KeyError:
            space = view_requirement.space
        if data_col.startswith("state_out"):
            if self._enable_new_api_stack:
                self._build_buffers({data_col: self.initial_states})
            else:
                if not self.is_policy_recurrent:
                    raise ValueError(
                        f"{data_col} is not available: the policy is not recurrent "
                        f"(is_policy_recurrent=False, no initial states)")
                state_index = int(data_col.split("_")[-1])
                self._build_buffers({data_col: self.initial_states[state_index]})
            return True
        if build_for_inference:
            zeros = fill_batch(space, 0.0, 0) if isinstance(space, gym.Space) else space
            self._build_buffers({data_col: zeros})
        return False

    # -- building -------------------------------------------------------------

    def _arrays(self, cache: dict, data_col: str) -> List[np.ndarray]:
        if data_col not in cache:
            cache[data_col] = [column_rows(track) for track in self.buffers[data_col]]
        return cache[data_col]

    def _unflatten(self, data: list, data_col: str) -> Any:
        if data_col not in self.buffer_structs:
            return data[0]
        return _unflatten_leaves(self.buffer_structs[data_col], data)

    def _build_for_inference(self) -> TrainingBatch:
        # build_for_inference where the plan cannot answer alone (the
        # compiled base asked it first): the plan is checked, made anew if
        # the views or tracks changed, and told how batches are made.
        plan = self._inference
        columns = None
        if plan is not None and plan.fits(self.view_requirements, self._is_training):
            columns = plan.columns(self.buffers)
        if columns is None:
            plan = self._inference = self._plan_inference()
            columns = plan.columns(self.buffers)
        batch = self._batch(columns)
        if not self.is_policy_recurrent:
            # The next batches are made like this one, if SampleBatch's
            # constructor kept the columns as they were (plain dicts are the
            # columns themselves).
            sample_batch = sys.modules.get("ray.rllib.policy.sample_batch")
            if sample_batch is None:
                plan.set_batches(None, None)
            elif (dict.keys(batch) == columns.keys()
                  and all(dict.get(batch, k) is v for k, v in columns.items())):
                plan.set_batches(sample_batch, BatchMaker(sample_batch.SampleBatch, batch))
        return batch

    def _plan_inference(self) -> InferencePlan:
        entries = []
        for view_col, vr in self.view_requirements.items():
            data_col = vr.data_col or view_col
            if not vr.used_for_compute_actions:
                continue
            check_causal(view_col, vr)
            if data_col not in self.buffers:
                self._fill_buffer_with_initial_values(data_col, vr, build_for_inference=True)
                self.data_cols_with_dummy_values.add(data_col)
                self._set_layout(None)
                for track in self.buffers[data_col]:
                    track.append(track.get(-1))
            struct = self.buffer_structs.get(data_col)
            entries.append((view_col, data_col, self.buffers[data_col], vr.shift_arr,
                            struct if is_nesting(struct) else None))
        return InferencePlan(self.view_requirements, self._is_training, entries,
                             _gather_track, _unflatten_leaves)

    def build_for_training(self, view_requirements: Dict[str, Any]) -> TrainingBatch:
        """Every timestep collected so far, each view of `view_requirements`
        gathered at its shifts. A trajectory that has not ended keeps its
        last rows for the views of the next batch."""
        # Pads, tracks and the unroll id change below: the steps' layout is
        # decided again at the end (a sampler's next fragment takes the
        # same steps).
        layout = self._step_layout
        self._set_layout(None)
        columns = {}
        cache: dict = {}
        for view_col, vr in view_requirements.items():
            data_col = vr.data_col or view_col
            if data_col not in self.buffers:
                # Columns that postprocessing adds later are left out.
                if not self._fill_buffer_with_initial_values(data_col, vr):
                    continue
            first = self.shift_before - (1 if data_col in (OBS, INFOS) else 0)
            placeholder = int(data_col in self.data_cols_with_dummy_values)
            data = []
            for track in self._arrays(cache, data_col):
                count = int(math.ceil((len(track) - placeholder - self.shift_before)
                                      / vr.batch_repeat_value))
                data.append(gather_training(track, first, vr.shift_arr,
                                            vr.batch_repeat_value, count))
            columns[view_col] = self._unflatten(data, data_col)
        batch = self._batch(columns)
        self.unroll_id = None

        if (TERMINATEDS in self.buffers and not self.buffers[TERMINATEDS][0].get(-1)
                and TRUNCATEDS in self.buffers and not self.buffers[TRUNCATEDS][0].get(-1)):
            # Not done: the next batch starts after this one, its shifted
            # views reading the rows kept here (in the same lists: the
            # inference plan holds them).
            if self.shift_before > 0:
                for key, tracks in self.buffers.items():
                    old = list(tracks)
                    dropped = max(len(old[0]) - self.shift_before, 0) if old else 0
                    if self._pads.get(key):
                        self._pads[key] = max(self._pads[key] - dropped, 0)
                    tracks[:] = [self._tail(track) for track in old]
                    for entry in self._stand_ins:
                        if entry[1] == key and entry[2] < len(old) and old[entry[2]] is entry[0]:
                            entry[0] = tracks[entry[2]]
                self._keep_stand_ins()
            self.agent_steps = 0
            if layout is not None:
                self._offer_layout(layout)
        return batch

    def _tail(self, track: Column) -> Column:
        n = len(track)
        tail = Column()
        tail.extend_from(track, max(n - self.shift_before, 0), n)
        return tail

    def _batch(self, columns: dict) -> Any:
        sample_batch = sys.modules.get("ray.rllib.policy.sample_batch")
        if sample_batch is not None:
            batch = sample_batch.SampleBatch(columns, is_training=self.training)
            count = batch.count
        else:
            batch = columns
            count = _count_rows(columns)
        if self.is_policy_recurrent:
            lengths = []
            while count > 0:
                lengths.append(min(count, self.max_seq_len))
                count -= self.max_seq_len
            batch[SEQ_LENS] = np.array(lengths)
            if sample_batch is not None:
                batch.max_seq_len = self.max_seq_len
        return batch
