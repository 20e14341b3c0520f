"""PrioritizedEpisodeReplayBuffer: RLlib's prioritized episode buffer,
with its sum and min trees kept by the Store (the same numbers, the same
draws), and RLlib's tree API over them."""
from __future__ import annotations

import collections
import os
import sys
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from episode import _gather, _picks
from episode._priority import pack_runs, pack_values, unpack_runs, unpack_values
from episode._replay import Store, episode_fields, step_order
from episode.single_agent_episode import SingleAgentEpisode
from episode.replay.draws import (_batch_size, _check_capacity, _check_gamma,
                                  _check_not_empty, _checked_n_step, _transitions,
                                  _warn_misspelt)
from episode.replay.frames import store_args
from episode.replay.metrics import _AddCounts
from episode.replay.stored import (_as_ours, _episode_indices, _force_list,
                                    _numbers_as_numbers)
from episode.replay.uniform import EpisodeReplayBuffer, _env_numbers


class PrioritizedEpisodeReplayBuffer(EpisodeReplayBuffer):
    """RLlib's PrioritizedEpisodeReplayBuffer on the compiled store: each
    stored timestep has a priority (`alpha`-scaled) in RLlib's sum and min
    trees, computed with the same numbers; `sample()` draws n-step
    transitions by priority with importance weights (`beta`), and
    `update_priorities()` sets the last draw's priorities."""

    _STATE_KEYS = EpisodeReplayBuffer._STATE_KEYS + (
        "_sum_segment", "_min_segment", "_free_nodes", "_max_priority", "_max_idx",
        "_tree_idx_to_sample_idx", "_last_sampled_indices")

    def __init__(self, capacity: int = 10000, *, batch_size_B: int = 16,
                 batch_length_T: int = 1, alpha: float = 1.0,
                 metrics_num_episodes_for_smoothing: int = 100, storage=None, seed=None,
                 frame_stack=None, frame_stack_axis=None, **kwargs):
        _warn_misspelt(self, PrioritizedEpisodeReplayBuffer.__init__, kwargs)
        if not alpha >= 0:
            raise AssertionError(f"alpha must be >= 0, not {alpha}")
        self._alpha = alpha
        self._max_priority = 1.0
        # The last draw (since the last update): its tree leaves (None:
        # found from the keys when asked for) and its steps' keys, by which
        # update_priorities() finds the steps (one evicted since is skipped:
        # RLlib's priority lands on the freed or reused leaf). Keys are
        # public (the `indices` sample_batch() hands out) or the trees' own.
        self._last_leaves: Optional[list] = []
        self._last_keys: Any = []
        self._last_keys_public = False
        super().__init__(capacity=capacity, batch_size_B=batch_size_B,
                         batch_length_T=batch_length_T,
                         metrics_num_episodes_for_smoothing=metrics_num_episodes_for_smoothing,
                         storage=storage, seed=seed, frame_stack=frame_stack,
                         frame_stack_axis=frame_stack_axis)

    def _new_store(self, capacity, storage) -> Store:
        if storage is not None and not isinstance(storage, int):
            os.makedirs(storage, exist_ok=True)     # (FileExistsError for a file)
        _check_capacity(capacity, prioritized=True)
        return Store(capacity, prioritized=True, tree_size=_tree_size(capacity),
                     storage=storage, **store_args(self._frames))

    def _settings(self) -> Dict[str, Any]:
        return super()._settings() | {"alpha": self._alpha}

    @property
    def _max_idx(self) -> int:
        return self._store.priorities.max_idx

    @property
    def _free_nodes(self) -> collections.deque:
        size = self._store.priorities.size
        return collections.deque(self._store.priorities.free_nodes(), maxlen=size)

    @property
    def _sum_segment(self):
        return _TreeView(self._store.priorities, True)

    @property
    def _min_segment(self):
        return _TreeView(self._store.priorities, False)

    @property
    def _tree_idx_to_sample_idx(self) -> Dict[int, int]:
        return {leaf: i for i, (_, _, leaf) in enumerate(step_order(self._store))}

    @property
    def _indices(self) -> list:
        index = _episode_indices(self._store)
        return [(index[slot], ts, leaf) for slot, ts, leaf in step_order(self._store)]

    @property
    def _last_sampled_indices(self) -> list:
        """RLlib's list of the tree leaves drawn since the last update
        (-1 for a step of a sample_batch() evicted since)."""
        if self._last_leaves is None:
            self._last_leaves = self._store.leaves_of(self._last_keys)
        return self._last_leaves

    def add(self, episodes, weight: Optional[float] = None) -> None:
        """Adds episodes as RLlib's prioritized buffer does: first the oldest
        episodes are evicted until the new timesteps fit (a new chunk of an
        evicted episode is dropped with it), then the rest is stored, each
        timestep with priority `weight` (default: the highest so far) **
        alpha."""
        if weight is None:
            weight = self._max_priority
        episodes = [_numbers_as_numbers(_as_ours(e)) for e in _force_list(episodes)]
        pending: dict = {}
        for episode in episodes:
            self._store.check(episode, pending)
        leaf_value = weight ** self._alpha
        store = self._store
        counts = _AddCounts()
        evicted_ids = self._evict_for([e.id_ for e in episodes], [len(e) for e in episodes],
                                      counts)
        for episode in episodes:
            if episode.id_ in evicted_ids:
                continue
            _, is_new, _, steps = store.add(episode, leaf_value)
            if is_new:
                counts.episodes_added += 1
            counts.env_steps_added += steps
            counts.agent_steps_added += steps
        self._log_add(counts)

    def _add_steps(self, ids, t, obs, next_obs, actions, rewards, terminated, truncated,
                   infos, first_infos, counts: "_AddCounts") -> bool:
        # add_transition()'s checked steps (one per env), as add() of their
        # chunks: the oldest episodes evicted first (a step of an evicted
        # episode dropped with it), each stored step at the highest
        # priority so far. False, with nothing changed, where the arrays
        # are unlike the stored leaves.
        store = self._store
        n = len(ids)
        leaf_value = self._max_priority ** self._alpha
        if self._num_timesteps + n <= self.capacity:
            # Nothing to evict: the call checks everything before it stores.
            try:
                new = store.add_steps(ids, ids, t, obs, next_obs, actions, rewards, terminated,
                                      truncated, infos, _env_numbers(0, n), leaf_value,
                                      first_infos)
            except (TypeError, ValueError):
                return False
            self._evict_for(ids, [1] * n, counts)       # (counts the steps)
            envs = n
        else:
            try:      # (no envs: only the arrays are checked)
                store.add_steps(ids, ids, t, obs, next_obs, actions, rewards, terminated,
                                truncated, infos, _NO_ENVS, 1.0)
            except (TypeError, ValueError):
                return False
            evicted = self._evict_for(ids, [1] * n, counts)
            kept = np.array([i for i, id_ in enumerate(ids) if id_ not in evicted], np.int64)
            new = store.add_steps(ids, ids, t, obs, next_obs, actions, rewards, terminated,
                                  truncated, infos, kept, leaf_value, first_infos)
            envs = len(kept)
        counts.episodes_added += new
        counts.env_steps_added += envs
        counts.agent_steps_added += envs
        return True

    def _evict_for(self, new_ids: list, lengths: list, counts: "_AddCounts") -> list:
        """Counts the new timesteps (of the episodes or chunks `new_ids`,
        `lengths` steps each), then evicts as RLlib's prioritized buffer does
        before storing them; returns the evicted ids."""
        store = self._store
        self._num_timesteps += sum(lengths)
        self._num_timesteps_added += sum(lengths)
        evicted_ids: list = []
        evict = 0
        # RLlib's count of the episodes left: stored or new, not evicted.
        remaining = store.num_episodes + len({i for i in new_ids if i not in store})
        # (RLlib's loop pops from an empty deque once the stored episodes run
        # out; here the new ones then stay over capacity until the next add.)
        while self._num_timesteps > self.capacity and evict < store.num_episodes and \
                remaining - evict != 1:
            fields = episode_fields(store, store.oldest(evict))
            id_, length = fields[0], fields[3]
            evicted_ids.append(id_)
            evict += 1
            counts.episodes_evicted += 1
            counts.env_steps_evicted += length
            counts.agent_steps_evicted += length
            if id_ in new_ids:
                dropped = lengths[new_ids.index(id_)]
                self._num_timesteps -= dropped
                self._num_timesteps_added -= dropped
            self._num_timesteps -= length
        if evict:
            store.evict_oldest(evict)
        return evicted_ids

    def sample(self, num_items: Optional[int] = None, *, batch_size_B: Optional[int] = None,
               batch_length_T: Optional[int] = None, n_step: Optional[Union[int, Tuple]] = None,
               beta: float = 0.0, gamma: float = 0.99, include_infos: bool = False,
               include_extra_model_outputs: bool = False, to_numpy: bool = False,
               **kwargs) -> List[SingleAgentEpisode]:
        """n-step transitions drawn by priority, as RLlib's sample(): a list
        of one-step episodes whose rewards are the discounted n-step sums,
        with `weights` (importance weights, normalized by the largest) and
        `n_step` among their extra model outputs."""
        _check_gamma(gamma)
        if not beta >= 0.0:
            raise AssertionError(f"beta must be >= 0, not {beta}")
        batch_size_B = _batch_size(num_items, batch_size_B) or self.batch_size_B
        n_step = _checked_n_step(n_step or 1)
        store = self._store
        _check_not_empty(store, ZeroDivisionError)     # (RLlib's: its p_min / 0.0)
        picks = _picks.draw_prioritized(store, self._draws(), batch_size_B, n_step, beta)
        self._last_leaves = picks.leaves
        self._last_keys = store.priorities.keys_of(picks.leaves)
        self._last_keys_public = False
        slots, ts, ns, ends = _gather.pick_fields(store, picks)
        _gather.locate_ends(store, picks)
        episodes = _transitions(store, picks, slots, ts, ns, ends, gamma,
                                include_infos=include_infos, stored_ids=False,
                                extras=include_extra_model_outputs, weights=picks.weights)
        if to_numpy:
            for episode in episodes:
                episode.to_numpy()
        self._after_reads(len(episodes))
        self.sampled_timesteps += batch_size_B
        steps_seen = {(int(s), int(t)) for s, t in zip(slots, ts)}
        self._log_sample(batch_size_B, len(set(slots.tolist())), len(steps_seen),
                         sum(ns.tolist()) / batch_size_B, picks.resamples)
        return episodes

    def update_priorities(self, priorities, module_id=None, *, indices=None) -> None:
        """Sets the priorities of the last sample()'s (or sample_batch()'s)
        timesteps, in its order: max(p, 1e-12) ** alpha; or, with `indices`
        (the `indices` of a sample_batch()), of those timesteps. A timestep
        evicted since it was drawn is skipped.

        `priorities`: B numbers, as a list, a numpy array of shape (B,) or
        (B, 1), a torch tensor or anything numpy takes as an array (float32
        ones compute in float32, as RLlib's trees do with a learner's
        float32 TD errors). Checked before anything changes: AssertionError
        for a wrong count, ValueError for a negative, NaN or infinite
        priority, or for indices this buffer never handed out."""
        if indices is None:
            keys, public = self._last_keys, self._last_keys_public
        else:
            keys, public = _indices_array(indices), True
        self._max_priority = _set_priorities(self._store, keys, priorities, self._alpha,
                                             self._max_priority, public)
        if indices is None:
            if self._last_leaves is None:
                self._last_leaves = []
            self._last_leaves.clear()
            self._last_keys = []
            self._last_keys_public = False

    def get_state(self) -> Dict[str, Any]:
        return super().get_state() | self._priority_state()

    def _pickled_state(self) -> Dict[str, Any]:
        return _packed_state(self.get_state())

    def _priority_state(self) -> Dict[str, Any]:
        # The prioritized buffers' keys of the env-step trees.
        trees = self._store.priorities
        return {
            "_sum_segment": trees.sum_values(),
            "_min_segment": trees.min_values(),
            "_free_nodes": trees.free_nodes(),
            "_max_priority": self._max_priority,
            "_max_idx": trees.max_idx,
            "_tree_idx_to_sample_idx": list(self._tree_idx_to_sample_idx.items()),
            "_last_sampled_indices": self._last_sampled_indices,
        }

    def _kept_state(self) -> Dict[str, Any]:
        # The last draw's steps by the store's own keys (public ones carry
        # this store's tag, which the opened store has not: it tags them
        # with its own).
        keys = self._last_keys
        if self._last_keys_public:
            keys = [k & _KEY_STEP_MASK for k in np.asarray(keys, np.int64).tolist()]
        return super()._kept_state() | {
            "_max_priority": self._max_priority,
            "_last_leaves": None if self._last_leaves is None else list(self._last_leaves),
            "_last_keys": list(keys), "_last_keys_public": bool(self._last_keys_public)}

    def _restore_kept(self, state: Dict[str, Any]) -> None:
        leaves, keys, public = state["_last_leaves"], state["_last_keys"], \
            state["_last_keys_public"]
        if leaves is not None:
            leaves = [-1 if leaf == -1 else _sampled_leaves([leaf], self._store.priorities)[0]
                      for leaf in leaves]
        if type(keys) is not list or not all(type(k) is int and -1 <= k < 1 << 56
                                             for k in keys) or type(public) is not bool \
                or (leaves is not None and len(leaves) != len(keys)) \
                or (leaves is None and not public):
            raise ValueError("the last draw's steps are not a draw's")
        max_priority = _max_priority(state["_max_priority"])
        super()._restore_kept(state)
        self._max_priority = max_priority
        self._last_leaves = leaves
        if public:
            tag = self._store.key_tag << 56
            keys = np.array([k | tag if k >= 0 else k for k in keys], np.int64)
        self._last_keys = keys
        self._last_keys_public = public

    def set_state(self, state) -> None:
        self._check_state(state)
        store = self._restored_store(state, weights=(
            state["_sum_segment"], state["_min_segment"], state["_free_nodes"],
            state["_max_idx"]))
        mapping = dict(state["_tree_idx_to_sample_idx"])
        if mapping != {triple[2]: i for i, triple in enumerate(state["_indices"])}:
            raise ValueError("_tree_idx_to_sample_idx must map each stored timestep's tree "
                             "leaf to its place in _indices")
        last = _sampled_leaves(state["_last_sampled_indices"], store.priorities)
        max_priority = _max_priority(state["_max_priority"])
        self._store = store
        self._num_timesteps = state["_num_timesteps"]
        self._num_timesteps_added = state["_num_timesteps_added"]
        self.sampled_timesteps = state["sampled_timesteps"]
        self._max_priority = max_priority
        self._last_leaves = last
        self._last_keys = store.priorities.keys_of(last)
        self._last_keys_public = False
        self.__dict__.pop("_open_episodes", None)     # (add_transition()'s)


_NO_ENVS = np.zeros(0, np.int64)
# A public step key (sample_batch()'s `indices`) without its store's tag.
_KEY_STEP_MASK = (1 << 56) - 1


def _packed_state(state: Dict[str, Any]) -> Dict[str, Any]:
    """A prioritized checkpoint as a buffer's pickle holds it: its trees'
    lists (and the modules' trees) pickle packed, so that an empty buffer of
    capacity 1M pickles to bytes, not 86 MB. (get_state() itself returns
    RLlib's plain lists.)"""
    state = dict(state, _sum_segment=_SumValues(state["_sum_segment"]),
                 _min_segment=_MinValues(state["_min_segment"]),
                 _free_nodes=_FreeLeaves(state["_free_nodes"]))
    for key, cls in (("_module_to_sum_segment", _SumValues),
                     ("_module_to_min_segment", _MinValues)):
        if key in state:
            for _, tree in state[key]:
                tree.value = cls(tree.value)     # (objects made for this state)
    if "_module_to_free_nodes" in state:
        state["_module_to_free_nodes"] = [(m, _FreeQueue(q, q.maxlen))
                                          for m, q in state["_module_to_free_nodes"]]
    return state


class _NodeValues(list):
    """A segment tree's node values in a buffer's pickle: RLlib's list,
    pickled packed (the values that are not the tree's neutral one, with
    their types); unpickled, a list of the same values again."""

    __slots__ = ()
    NEUTRAL = 0.0

    def __reduce_ex__(self, protocol):
        packed = pack_values(self, self.NEUTRAL) if _is_power_of_2(len(self)) else None
        if packed is None:       # (values of other types: as a list)
            return type(self), (list(self),)
        return _unpacked_values, (type(self), len(self), len(self)) + packed


class _SumValues(_NodeValues):
    """A sum tree's node values (neutral: 0.0)."""

    __slots__ = ()


class _MinValues(_NodeValues):
    """A min tree's node values (neutral: inf)."""

    __slots__ = ()
    NEUTRAL = float("inf")


def _unpacked_values(cls, n, n_again, positions, numbers, tags):
    return cls(unpack_values(n, n_again, cls.NEUTRAL, positions, numbers, tags))


def _is_power_of_2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class _FreeLeaves(list):
    """The free tree leaves in a checkpoint: RLlib's `_free_nodes`, which
    pickles as runs of consecutive leaves (one run in an empty buffer)."""

    __slots__ = ()

    def __reduce_ex__(self, protocol):
        packed = pack_runs(self)
        if packed is None:
            return type(self), (list(self),)
        return _unpacked_leaves, (type(self), len(self), len(self)) + packed


def _unpacked_leaves(cls, n, n_again, starts, lengths):
    return cls(unpack_runs(n, n_again, starts, lengths))


class _FreeQueue(collections.deque):
    """A module's free tree leaves in a multi-agent checkpoint (RLlib's
    deque of them), pickled as runs as _FreeLeaves is."""

    def __reduce_ex__(self, protocol):
        packed = pack_runs(self)
        if packed is None:
            return type(self), (list(self), self.maxlen)
        return _unpacked_queue, (len(self), len(self)) + packed + (self.maxlen,)


def _unpacked_queue(n, n_again, starts, lengths, maxlen):
    return _FreeQueue(unpack_runs(n, n_again, starts, lengths), maxlen)


class _SavedTree:
    """A module's segment tree in a multi-agent checkpoint where RLlib is not
    loaded: its node values (RLlib's tree API for reading them)."""

    def __init__(self, value: list):
        self.value = value
        self.capacity = len(value) // 2

    def get_state(self) -> list:
        return self.value


def _tree_state(trees, of_sum: bool):
    """A module's sum or min tree as RLlib's multi-agent checkpoint holds
    it: RLlib's tree object (with RLlib loaded, so that its buffer can load
    and run on the state), else a _SavedTree; both pickle."""
    values = trees.sum_values() if of_sum else trees.min_values()
    module = sys.modules.get("ray.rllib.execution.segment_tree")
    if module is None and "ray.rllib" in sys.modules:
        import importlib

        module = importlib.import_module("ray.rllib.execution.segment_tree")
    if module is None:
        return _SavedTree(values)
    tree = (module.SumSegmentTree if of_sum else module.MinSegmentTree)(trees.size)
    tree.value = values
    return tree


class _TreeView:
    """RLlib's SumSegmentTree/MinSegmentTree API over the store's trees."""

    def __init__(self, trees, of_sum: bool):
        self._trees = trees
        self._of_sum = of_sum
        self.capacity = trees.size

    def __getitem__(self, idx: int):
        if not 0 <= idx < self.capacity:
            raise AssertionError(f"idx={idx} capacity={self.capacity}")
        return self._trees.leaf_value(idx)[0 if self._of_sum else 1]

    def sum(self, start: int = 0, end=None):
        if start != 0 or end is not None:
            raise ValueError("only the whole tree's sum is kept")
        return self._trees.sum()

    def min(self, start: int = 0, end=None):
        if start != 0 or end is not None:
            raise ValueError("only the whole tree's minimum is kept")
        return self._trees.min()

    def find_prefixsum_idx(self, prefixsum: float) -> int:
        return self._trees.find_prefixsum_idx(prefixsum)

    def get_state(self):
        return self._trees.sum_values() if self._of_sum else self._trees.min_values()

    @property
    def value(self) -> list:
        """RLlib's `value` list of node values."""
        return self.get_state()


def _set_priorities(store: Store, keys, priorities, alpha, max_priority, public: bool = False):
    """update_priorities(): max(p, 1e-12) ** alpha on the tree leaves of
    the steps `keys` (those still stored), everything checked before any is
    set; returns the new highest priority (RLlib's running max over all)."""
    values = _priority_values(priorities)
    if len(values) != len(keys):
        raise AssertionError(f"{len(values)} priorities for {len(keys)} sampled timesteps")
    return store.set_priorities(keys, values, alpha, max_priority, public)


# The types of numbers the trees compute with (as RLlib's objects do).
_TREE_NUMBERS = {float, int, bool, np.float64, np.float32}


def _priority_values(priorities):
    """update_priorities()' priorities as the store takes them: a list of
    Python or numpy float32/float64 numbers as it is (each keeps its type,
    as in RLlib's loop over them), anything else as a 1-d float32 or
    float64 array: a numpy array of shape (B,) or (B, 1), a torch tensor, a
    list of other numbers or of one-number rows. Integers and bools count
    as float64, float16 as float32 (exactly); TypeError for what is no array
    of real numbers."""
    if isinstance(priorities, (list, tuple)) and all(type(p) in _TREE_NUMBERS
                                                      for p in priorities):
        return priorities
    if hasattr(priorities, "detach") and hasattr(priorities, "cpu"):
        priorities = priorities.detach().cpu().numpy()     # a torch tensor
    try:
        values = np.asarray(priorities)
    except Exception as error:       # noqa: BLE001 - what numpy does not take
        raise TypeError(f"priorities must be numbers, not {type(priorities).__name__}") \
            from error
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim != 1:
        raise ValueError(f"priorities must be B numbers, of shape (B,) or (B, 1), not of "
                         f"shape {values.shape}")
    if values.dtype.kind == "f" and values.dtype.itemsize <= 4:
        return values.astype(np.float32, copy=False)
    if values.dtype.kind in "biuf":
        return values.astype(np.float64, copy=False)
    if values.dtype == object:
        return list(values)
    raise TypeError(f"priorities must be real numbers, not {values.dtype}")


def _indices_array(indices) -> np.ndarray:
    """update_priorities(indices=...): the `indices` a sample_batch() handed
    out, as int64 (any sequence or array of ints, (B,) or (B, 1))."""
    if hasattr(indices, "detach") and hasattr(indices, "cpu"):
        indices = indices.detach().cpu().numpy()
    array = np.asarray(indices)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise TypeError(f"indices must be the integer `indices` of a sample_batch(), not "
                        f"{array.dtype} of shape {array.shape}")
    if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
        raise ValueError("indices must be the `indices` of a sample_batch() of this buffer")
    return array.astype(np.int64, copy=False)


def _sampled_leaves(leaves, trees) -> list:
    # A checkpoint's last sampled leaves (free ones too: RLlib keeps those
    # of steps evicted since; their priorities are skipped).
    leaves = list(leaves)
    if any(type(leaf) is not int or not 0 <= leaf < trees.size for leaf in leaves):
        raise ValueError("the last sampled indices must be tree leaves")
    return leaves


def _max_priority(value):
    # A checkpoint's highest priority: it weighs every step added next.
    if type(value) not in (float, int, np.float64, np.float32) or not 0 < value < float("inf"):
        raise ValueError(f"_max_priority must be a positive finite number, not {value!r}")
    return value


def _tree_size(capacity: int) -> int:
    # RLlib's trees: 2 * (the capacity rounded up to a power of two) leaves.
    return 2 * int(2 ** np.ceil(np.log2(capacity)))


def _tree_values(tree) -> list:
    """A segment tree's node values from its state: a list, or RLlib's tree
    object (what its multi-agent buffer puts in its state) or ours."""
    if isinstance(tree, list):
        return tree
    if hasattr(tree, "get_state"):
        return tree.get_state()
    raise ValueError(f"a segment tree's state is a list of values, not {type(tree).__name__}")
