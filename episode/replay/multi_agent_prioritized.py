"""MultiAgentPrioritizedEpisodeReplayBuffer: the multi-agent buffer with
a prioritized Store per module."""
from __future__ import annotations

import collections
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from episode import _picks
from episode._replay import Store, step_order
from episode.replay.draws import _batch_size, _check_gamma, _warn_misspelt
from episode.replay.frames import store_args
from episode.replay.multi_agent import MultiAgentEpisodeReplayBuffer
from episode.replay.prioritized import (PrioritizedEpisodeReplayBuffer, _indices_array,
                                        _max_priority, _sampled_leaves, _set_priorities,
                                        _tree_size, _tree_state, _tree_values)
from episode.replay.stored import _as_ours_multi, _force_list

# The step part of a sample_batch() index (below the store's tag, bits 56-62).
_STEP_KEY_MASK = (1 << 56) - 1


class MultiAgentPrioritizedEpisodeReplayBuffer(MultiAgentEpisodeReplayBuffer,
                                               PrioritizedEpisodeReplayBuffer):
    """RLlib's MultiAgentPrioritizedEpisodeReplayBuffer on the compiled
    store: per module, RLlib's priority trees over its agents' steps (and
    its `_max_priority`); `sample()` draws each module's transitions by
    priority, `update_priorities(priorities, module_id)` sets the last
    draw's priorities of that module."""

    _STATE_KEYS = PrioritizedEpisodeReplayBuffer._STATE_KEYS + \
        MultiAgentEpisodeReplayBuffer._STATE_KEYS[7:] + (
            "_module_to_max_priority", "_module_to_sum_segment", "_module_to_min_segment",
            "_module_to_free_nodes", "_module_to_max_idx", "_module_to_tree_idx_to_sample_idx",
            "_module_to_last_sampled_indices")

    def __init__(self, capacity: int = 10000, *, batch_size_B: int = 16,
                 batch_length_T: int = 1, alpha: float = 1.0,
                 metrics_num_episodes_for_smoothing: int = 100, storage=None, seed=None,
                 frame_stack=None, frame_stack_axis=None, **kwargs):
        _warn_misspelt(self, MultiAgentPrioritizedEpisodeReplayBuffer.__init__, kwargs)
        if not alpha >= 0:
            raise AssertionError(f"alpha must be >= 0, not {alpha}")
        # (Through the prioritized buffer's __init__, which sets the rest.)
        MultiAgentEpisodeReplayBuffer.__init__(
            self, capacity=capacity, batch_size_B=batch_size_B, batch_length_T=batch_length_T,
            metrics_num_episodes_for_smoothing=metrics_num_episodes_for_smoothing,
            storage=storage, seed=seed, frame_stack=frame_stack,
            frame_stack_axis=frame_stack_axis)
        self._alpha = alpha
        self._module_to_max_priority = collections.defaultdict(lambda: 1.0)
        self._module_to_last_sampled_indices = collections.defaultdict(list)
        self._module_to_last_sampled_keys = collections.defaultdict(list)
        self._weight_per_module: dict = {}

    def _new_store(self, capacity, storage) -> Store:
        return PrioritizedEpisodeReplayBuffer._new_store(self, capacity, storage)

    def _new_module_store(self) -> Store:
        return Store(self.capacity, prioritized=True, tree_size=_tree_size(self.capacity),
                     storage=self._storage, **store_args(self._module_frames))

    def add(self, episodes, weight=None) -> None:
        """As MultiAgentEpisodeReplayBuffer.add(); each env step gets the
        priority `weight` (default: the highest so far) ** alpha, each agent
        step its module's highest priority ** alpha (or `weight[module]`
        with a dict of weights)."""
        per_module = {}
        if weight is None:
            weight = self._max_priority
        elif isinstance(weight, dict):
            per_module = weight
            weight = np.mean(list(weight.values()))
        episodes = [_as_ours_multi(e) for e in _force_list(episodes)]
        self._check_multi(episodes)
        self._weight_per_module = per_module
        try:
            self._add_multi(episodes, weight ** self._alpha)
        finally:
            self._weight_per_module = {}

    def _agent_order(self, episode):
        # RLlib's prioritized buffer iterates the set of agent ids.
        return list(episode.agent_ids)

    def _module_weight(self, module_id):
        return self._weight_per_module.get(
            module_id, self._module_to_max_priority[module_id]) ** self._alpha

    def sample(self, num_items: Optional[int] = None, *, batch_size_B: Optional[int] = None,
               batch_length_T: Optional[int] = None, n_step: Optional[Union[int, Tuple]] = 1,
               gamma: float = 0.99, include_infos: bool = False,
               include_extra_model_outputs: bool = False, replay_mode: str = "independent",
               modules_to_sample: Optional[List[Any]] = None, beta: float = 0.0, **kwargs):
        """As MultiAgentEpisodeReplayBuffer.sample(), drawn by priority per
        module with importance weights (`beta`) in the independent mode."""
        _check_gamma(gamma)
        if not beta >= 0.0:
            raise AssertionError(f"beta must be >= 0, not {beta}")
        batch_size_B = _batch_size(num_items, batch_size_B) or self.batch_size_B
        batch_length_T = batch_length_T or self.batch_length_T
        if replay_mode == "independent":
            return self._sample_independent(
                batch_size_B=batch_size_B, batch_length_T=batch_length_T, n_step=n_step,
                gamma=gamma, include_infos=include_infos,
                include_extra_model_outputs=include_extra_model_outputs,
                modules_to_sample=modules_to_sample, beta=beta)
        return self._sample_synchonized(
            batch_size_B=batch_size_B, batch_length_T=batch_length_T, n_step=n_step,
            gamma=gamma, include_infos=include_infos,
            include_extra_model_outputs=include_extra_model_outputs,
            modules_to_sample=modules_to_sample)

    def _draw_module(self, module_id, store, draws, batch_size_B, n_step, beta):
        picks = _picks.draw_prioritized(store, draws, batch_size_B, n_step, beta,
                                       self.get_num_timesteps(module_id))
        self._module_to_last_sampled_indices[module_id].extend(picks.leaves)
        self._module_to_last_sampled_keys[module_id].extend(
            store.priorities.keys_of(picks.leaves))
        return picks, picks.weights

    def _prioritized(self) -> bool:
        return True

    def _drawn_natively(self, module_id, store: Store, indices) -> None:
        # As a sample() of the module does: its draws' leaves and keys wait
        # for update_priorities() (the keys without the store's tag).
        self._module_to_last_sampled_indices[module_id].extend(store.leaves_of(indices))
        self._module_to_last_sampled_keys[module_id].extend(
            (np.asarray(indices) & _STEP_KEY_MASK).tolist())

    def update_priorities(self, priorities, module_id, *, indices=None) -> None:
        """Sets the priorities of `module_id`'s timesteps drawn since the
        last update (in their order, by sample() or sample_batch()):
        max(p, 1e-12) ** alpha; or, with `indices` (the `indices` of the
        module's batch of a sample_batch()), of those timesteps. A timestep
        evicted since it was drawn is skipped. `priorities`: B numbers in
        any array-like (a list, a (B,) or (B, 1) array, a torch tensor).
        Checked first: AssertionError for a wrong count, ValueError for a
        negative, NaN or infinite priority or indices this module's store
        never handed out."""
        if indices is not None:
            store = self._modules.get(module_id)
            if store is None:
                raise ValueError(f"no module {module_id!r} in this buffer (modules: "
                                 f"{list(self._modules)})")
            self._module_to_max_priority[module_id] = _set_priorities(
                store, _indices_array(indices), priorities, self._alpha,
                self._module_to_max_priority[module_id], True)
            return
        keys = self._module_to_last_sampled_keys[module_id]
        self._module_to_max_priority[module_id] = _set_priorities(
            self._module_store(module_id), keys, priorities, self._alpha,
            self._module_to_max_priority[module_id])
        self._module_to_last_sampled_indices[module_id].clear()
        keys.clear()

    def _module_entries(self, module_id, store: Store) -> list:
        index = self._ma_index()
        keys = {slot: store_key for store_key, slot in store.stored_keys().items()}
        return [(index[keys[slot][0]], keys[slot][1], ts, leaf)
                for slot, ts, leaf in step_order(store)]

    @property
    def _indices(self) -> list:
        return PrioritizedEpisodeReplayBuffer._indices.fget(self)

    def get_state(self) -> Dict[str, Any]:
        modules = {m: store.priorities for m, store in self._modules.items()}
        return self._plain_state(self._multi_episodes) | self._priority_state() | \
            self._multi_state() | {
            "_module_to_max_priority": list(self._module_to_max_priority.items()),
            "_module_to_sum_segment": [(m, _tree_state(t, True)) for m, t in modules.items()],
            "_module_to_min_segment": [(m, _tree_state(t, False)) for m, t in modules.items()],
            "_module_to_free_nodes": [(m, collections.deque(t.free_nodes(), maxlen=t.size))
                                      for m, t in modules.items()],
            "_module_to_max_idx": [(m, t.max_idx) for m, t in modules.items()],
            "_module_to_tree_idx_to_sample_idx": [
                (m, {leaf: i for i, (_, _, leaf) in enumerate(step_order(store))})
                for m, store in self._modules.items()],
            "_module_to_last_sampled_indices": list(
                self._module_to_last_sampled_indices.items()),
        }

    def _kept_state(self) -> Dict[str, Any]:
        # Per module: its highest priority and its last draw's tree leaves
        # and steps (by the store's own keys, which the opened store keeps).
        return super()._kept_state() | {
            "_module_to_max_priority": list(self._module_to_max_priority.items()),
            "_module_to_last_sampled_indices": [
                (m, [int(leaf) for leaf in leaves])
                for m, leaves in self._module_to_last_sampled_indices.items()],
            "_module_to_last_sampled_keys": [
                (m, [int(k) for k in keys])
                for m, keys in self._module_to_last_sampled_keys.items()]}

    def _restore_kept(self, state: Dict[str, Any]) -> None:
        maxima = [(m, _max_priority(p)) for m, p in _by_module(
            state["_module_to_max_priority"], "_module_to_max_priority")]
        leaves = _by_module(state["_module_to_last_sampled_indices"],
                            "_module_to_last_sampled_indices")
        keys = _by_module(state["_module_to_last_sampled_keys"], "_module_to_last_sampled_keys")
        for name, drawn in (("leaves", leaves), ("keys", keys)):
            for module_id, values in drawn:
                store = self._modules.get(module_id)
                if type(values) is not list or (values and store is None):
                    raise ValueError(f"the last draw's {name} of module {module_id!r} are not "
                                     f"its store's")
                if name == "leaves":     # (-1: a step of a sample_batch() evicted since)
                    _sampled_leaves([v for v in values if v != -1],
                                    store.priorities if values else None)
                elif not all(type(k) is int and -1 <= k <= _STEP_KEY_MASK for k in values):
                    raise ValueError(f"the last draw's keys of module {module_id!r} are not "
                                     f"keys")
        super()._restore_kept(state)
        self._module_to_max_priority = collections.defaultdict(lambda: 1.0, maxima)
        self._module_to_last_sampled_indices = collections.defaultdict(list, leaves)
        self._module_to_last_sampled_keys = collections.defaultdict(list, keys)

    def _global_weights(self, state):
        return (state["_sum_segment"], state["_min_segment"], state["_free_nodes"],
                state["_max_idx"])

    def _module_weights(self, module_id, state):
        def of(key):
            value = dict(state[key]).get(module_id)
            if value is None:
                raise ValueError(f"{key} has nothing for module {module_id!r}")
            return value

        return (_tree_values(of("_module_to_sum_segment")),
                _tree_values(of("_module_to_min_segment")),
                list(of("_module_to_free_nodes")), of("_module_to_max_idx"))

    def _restore_priorities(self, state, store: Store, modules: Dict[Any, Store]) -> None:
        # RLlib's maps of leaves to places (rebuilt from _indices here) are
        # part of its checkpoint: one without them is RLlib's KeyError.
        state["_tree_idx_to_sample_idx"], state["_module_to_tree_idx_to_sample_idx"]
        maxima = {m: _max_priority(p) for m, p in dict(state["_module_to_max_priority"]).items()}
        max_priority = _max_priority(state["_max_priority"])
        last = {}
        for module_id, leaves in dict(state["_module_to_last_sampled_indices"]).items():
            if module_id not in modules:
                raise ValueError(f"_module_to_last_sampled_indices names module {module_id!r}, "
                                 f"which has no steps")
            last[module_id] = _sampled_leaves(leaves, modules[module_id].priorities)
        self._max_priority = max_priority
        self._last_leaves = _sampled_leaves(state["_last_sampled_indices"], store.priorities)
        self._last_keys = store.priorities.keys_of(self._last_leaves)
        self._last_keys_public = False
        self._module_to_max_priority = collections.defaultdict(lambda: 1.0, maxima)
        self._module_to_last_sampled_indices = collections.defaultdict(list, last)
        self._module_to_last_sampled_keys = collections.defaultdict(list, {
            m: modules[m].priorities.keys_of(leaves) for m, leaves in last.items()})


def _by_module(items, what: str) -> list:
    # A saved list of (module id, value) pairs.
    if type(items) is not list or not all(type(i) is tuple and len(i) == 2 for i in items):
        raise ValueError(f"the saved {what} are not by module")
    return items
