"""Replay buffers on the compiled store: RLlib's four episode buffers as
drop-ins, and a native batch sampler.

`EpisodeReplayBuffer`, `PrioritizedEpisodeReplayBuffer`,
`MultiAgentEpisodeReplayBuffer` and `MultiAgentPrioritizedEpisodeReplayBuffer`
have RLlib 2.60's constructor arguments, methods, counters, metrics and
`get_state()` keys. They keep their episodes' rows in a `Store` (typed
Columns, each observation once, the oldest episodes evicted whole) instead
of deep-copied episode objects, and draw with the same calls on the same
`rng` (a numpy Generator) as RLlib's buffers: the same seed gives the same
samples, so an algorithm trains with RLlib's curve.

`sample_batch()` (on the single-agent buffers) is the path that builds no
episode objects: a dict of arrays per call (uniform or prioritized,
n-step returns, sequences with a mask).

Importing this module does not import ray; RLlib's MetricsLogger is used
for the metrics when ray is installed (else a small logger of ours).
"""
from __future__ import annotations

import collections
import copy
import sys
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from episode._episode import EpisodeCore
from episode._replay import (Draws, Store, episode_fields, live_slots, make_transitions,
                              rows_of, shares_batch, step_order)
from episode.lookback_buffer import InfiniteLookbackBuffer
from episode.single_agent_episode import SingleAgentEpisode

__all__ = [
    "EpisodeReplayBuffer",
    "MultiAgentEpisodeReplayBuffer",
    "MultiAgentPrioritizedEpisodeReplayBuffer",
    "PrioritizedEpisodeReplayBuffer",
]

DEFAULT_AGENT_ID = "default_agent"
DEFAULT_MODULE_ID = "default_policy"


# -- metrics --------------------------------------------------------------------------


class _Stats:
    """One metric of _Logger: RLlib's reduce="mean" (windowed), "sum" (since
    the last reduce) or "lifetime_sum"."""

    __slots__ = ("reduce", "values", "lifetime")

    def __init__(self, reduce: str, window: Optional[int]):
        self.reduce = reduce
        self.values = collections.deque(maxlen=window) if reduce == "mean" else []
        self.lifetime = 0


class _Logger:
    """The part of RLlib's MetricsLogger the buffers use, for when ray is not
    installed: log_value(key, value, reduce, window) and reduce(), which
    returns the reduced values in a nested dict (plain numbers)."""

    def __init__(self):
        self.stats: Dict[Any, _Stats] = {}

    def log_value(self, key, value, reduce="mean", window=None, **kwargs):
        key = key if isinstance(key, tuple) else (key,)
        stats = self.stats.get(key)
        if stats is None:
            stats = self.stats[key] = _Stats(reduce, window)
        stats.values.append(value)

    def peek(self, key, default=None):
        key = key if isinstance(key, tuple) else (key,)
        stats = self.stats.get(key)
        return default if stats is None else self._value(stats)

    @staticmethod
    def _value(stats: _Stats):
        if stats.reduce == "mean":
            return float(np.mean(stats.values)) if stats.values else float("nan")
        if stats.reduce == "lifetime_sum":
            return stats.lifetime + sum(stats.values)
        return sum(stats.values)

    def reduce(self):
        out: Dict[Any, Any] = {}
        for key, stats in self.stats.items():
            value = self._value(stats)
            if stats.reduce == "lifetime_sum":
                stats.lifetime = value
                stats.values = []
            elif stats.reduce == "sum":
                stats.values = []
            node = out
            for part in key[:-1]:
                node = node.setdefault(part, {})
            node[key[-1]] = value
        return out


_FOLDABLE = (int, np.int64)


class _Unlogged:
    """The values add() and sample() logged since the metrics were last
    read, folded as they come: counts summed, windowed means cut to their
    window. Handing them to the logger in bulk reduces to the same metrics
    as logging each value (RLlib's sums add pushes up, its windowed means
    keep the last `window`), for a few calls per key instead of ~26 per
    add(); RLlib's log_value() costs microseconds."""

    __slots__ = ("entries",)

    def __init__(self):
        # key -> (reduce, window, values), keys in the order first logged
        self.entries: Dict[Any, tuple] = {}

    def log(self, key, value, reduce="mean", window=None) -> None:
        entry = self.entries.get(key)
        if entry is None:
            values = collections.deque(maxlen=window) if reduce == "mean" else []
            entry = self.entries[key] = (reduce, window, values)
        values = entry[2]
        if (reduce != "mean" and type(value) is int and values
                and type(values[-1]) in _FOLDABLE):
            # Integer sums are exact in any order. RLlib's "sum" turns two
            # or more pushes into a numpy int64 (np.nansum), its
            # "lifetime_sum" adds them to a float whatever their type.
            values[-1] = values[-1] + value if reduce != "sum" else np.int64(values[-1] + value)
        else:
            values.append(value)

    def flush(self, logger) -> None:
        entries, self.entries = self.entries, {}
        for key, (reduce, window, values) in entries.items():
            for value in values:
                logger.log_value(key, value, reduce=reduce, window=window)


def _metrics_logger():
    # RLlib's own logger where RLlib is loaded (its algorithms aggregate the
    # buffer's metrics); importing ray only for it would cost seconds.
    module = sys.modules.get("ray.rllib.utils.metrics.metrics_logger")
    if module is None and "ray.rllib" in sys.modules:
        import importlib

        module = importlib.import_module("ray.rllib.utils.metrics.metrics_logger")
    return module.MetricsLogger(root=False) if module is not None else _Logger()


# -- episodes in and out ----------------------------------------------------------------


def _as_ours(episode) -> SingleAgentEpisode:
    """Our episode for RLlib's (same state), ours as it is."""
    if isinstance(episode, EpisodeCore):
        return episode
    if hasattr(episode, "get_state") and hasattr(episode, "extra_model_outputs"):
        return SingleAgentEpisode.from_state(episode.get_state())
    raise TypeError(f"a replay buffer stores SingleAgentEpisodes, not {type(episode).__name__}")


def _episode_indices(store: Store) -> Dict[int, int]:
    """slot -> RLlib's episode index of the stored episodes (they are
    evicted oldest first: the index is the evicted count plus the place)."""
    first = store.num_evicted
    return {slot: first + i for i, slot in enumerate(live_slots(store))}


def _force_list(episodes) -> list:
    if isinstance(episodes, (list, tuple)):
        return list(episodes)
    return [episodes]


def _buffer(storage, lookback: int, space=None) -> InfiniteLookbackBuffer:
    buf = InfiniteLookbackBuffer.__new__(InfiniteLookbackBuffer)
    buf._set_storage(storage)
    buf.lookback = lookback
    if space is not None:
        buf.space = space
    return buf


def _stored_episode(store: Store, slot: int, start: Optional[int] = None,
                    stop: Optional[int] = None, lookback: Optional[int] = None
                    ) -> SingleAgentEpisode:
    """The stored episode in `slot` (steps start .. stop - 1, with `lookback`
    steps before them; by default all of it) as a SingleAgentEpisode of its
    own data: what RLlib's `episode.slice(slice(start, stop),
    len_lookback_buffer=lookback)` of its stored episode gives."""
    (id_, meta, t_started, length, stored_lookback, terminated, truncated, numpy,
     start_time, last_step_time) = episode_fields(store, slot)
    whole = start is None
    start = 0 if start is None else start
    stop = length if stop is None else stop
    lb = stored_lookback if lookback is None else min(lookback, stored_lookback + start)
    first = start - lb
    episode = SingleAgentEpisode(id_=id_, agent_id=meta.agent_id, module_id=meta.module_id,
                                 multi_agent_episode_id=meta.multi_agent_episode_id,
                                 observation_space=meta.observation_space,
                                 action_space=meta.action_space)
    episode.observations = _buffer(rows_of(store, slot, "obs", first, stop + 1, numpy), lb,
                                   meta.observation_space)
    episode.infos = InfiniteLookbackBuffer(rows_of(store, slot, "infos", first, stop + 1,
                                                   False), lookback=lb)
    episode.actions = _buffer(rows_of(store, slot, "actions", first, stop, numpy), lb,
                              meta.action_space)
    episode.rewards = _buffer(rows_of(store, slot, "rewards", first, stop, numpy), lb,
                              episode.rewards.space)
    extras = {key: _buffer(rows_of(store, slot, ("extras", key), first, stop, numpy), lb)
              for key in meta.extra_keys}
    if meta.defaultdict_extras:
        extras = collections.defaultdict(
            lambda: InfiniteLookbackBuffer(lookback=lb), extras)
    episode.extra_model_outputs = extras
    keep_done = stop == length
    episode.is_terminated = terminated if keep_done else False
    episode.is_truncated = truncated if keep_done else False
    episode.t_started = t_started + start
    episode.t = t_started + stop
    if whole:
        episode._start_time = start_time
        episode._last_step_time = last_step_time
        if meta.custom_data:
            episode._custom_data = copy.deepcopy(meta.custom_data)
    episode.validate()
    return episode


# -- the single-agent buffers -----------------------------------------------------------


class _BufferClass(type):
    """The buffers' metaclass: RLlib's Algorithm asks `"EpisodeReplayBuffer"
    in config["replay_buffer_config"]["type"]`, which a class cannot answer
    (RLlib's own fail there): ours answer from their name, so that
    `replay_buffer_config={"type": PrioritizedEpisodeReplayBuffer}` works."""

    def __contains__(cls, name) -> bool:
        return isinstance(name, str) and name in cls.__name__


class EpisodeReplayBuffer(metaclass=_BufferClass):
    """RLlib's EpisodeReplayBuffer on the compiled store.

    Stores episodes (ours or RLlib's SingleAgentEpisodes) by id, up to
    `capacity` timesteps; a chunk of a stored episode (same id, continued by
    `cut()`) is joined to it. Evicts the oldest episodes first. `sample()`
    returns RLlib's batch of `batch_size_B` rows of `batch_length_T` steps,
    or with `sample_episodes=True` a list of episodes: n-step transitions or
    sequences. `storage`, a folder, keeps the rows in files there.
    """

    def __init__(self, capacity: int = 10000, *, batch_size_B: int = 16,
                 batch_length_T: int = 64, metrics_num_episodes_for_smoothing: int = 100,
                 storage=None, **kwargs):
        self.capacity = capacity
        self.batch_size_B = batch_size_B
        self.batch_length_T = batch_length_T
        self._store = self._new_store(capacity, storage)
        self._num_timesteps = 0
        self._num_timesteps_added = 0
        self.sampled_timesteps = 0
        self.rng = np.random.default_rng(seed=None)
        self._logger = _metrics_logger()
        self._unlogged = _Unlogged()
        self._metrics_num_episodes_for_smoothing = metrics_num_episodes_for_smoothing

    @property
    def metrics(self):
        """RLlib's MetricsLogger of the buffer, every add() and sample() logged."""
        self._unlogged.flush(self._logger)
        return self._logger

    @metrics.setter
    def metrics(self, logger) -> None:
        self._unlogged = _Unlogged()
        self._logger = logger

    def _new_store(self, capacity, storage) -> Store:
        _check_capacity(capacity)
        return Store(capacity, storage=storage)

    def _draws(self) -> Draws:
        # Draws from self.rng (kept while rng stays the same object).
        draws = self.__dict__.get("_draws_of")
        if draws is None or draws[0] is not self.rng:
            draws = self.__dict__["_draws_of"] = (self.rng, Draws(self.rng))
        return draws[1]

    # -- RLlib's attributes, read from the store ----------------------------------------

    @property
    def episodes(self) -> collections.deque:
        """The stored episodes, oldest first (each a new SingleAgentEpisode)."""
        return collections.deque(_stored_episode(self._store, slot)
                                 for slot in live_slots(self._store))

    @property
    def episode_id_to_index(self) -> Dict[Any, int]:
        """Stored episode id -> its episode index (RLlib's counting)."""
        first = self._store.num_evicted
        return {episode_fields(self._store, slot)[0]: first + i
                for i, slot in enumerate(live_slots(self._store))}

    @property
    def _num_episodes_evicted(self) -> int:
        return self._store.num_evicted

    @property
    def _indices(self) -> list:
        index = _episode_indices(self._store)
        return [(index[slot], ts) for slot, ts, _ in step_order(self._store)]

    def __len__(self) -> int:
        return self.get_num_timesteps()

    # -- adding --------------------------------------------------------------------------

    def add(self, episodes) -> None:
        """Adds episodes (a list, or one), evicting the oldest ones while the
        buffer holds more than `capacity` timesteps (and more than one
        episode). Checked first: a bad episode changes nothing."""
        episodes = [_as_ours(e) for e in _force_list(episodes)]
        pending: dict = {}
        for episode in episodes:
            self._store.check(episode, pending)
        counts = _AddCounts()
        for episode in episodes:
            steps = len(episode)
            self._num_timesteps += steps
            self._num_timesteps_added += steps
            counts.env_steps_added += steps
            counts.agent_steps_added += steps
            _, is_new, _, _ = self._store.add(episode)
            if is_new:
                counts.episodes_added += 1
            while self._num_timesteps > self.capacity and self.get_num_episodes() > 1:
                (_, evicted_steps), = self._store.evict_oldest(1)
                counts.episodes_evicted += 1
                counts.env_steps_evicted += evicted_steps
                counts.agent_steps_evicted += evicted_steps
                self._num_timesteps -= evicted_steps
        self._log_add(counts)

    def _log_add(self, counts: "_AddCounts") -> None:
        self._update_add_metrics(
            num_episodes_added=counts.episodes_added,
            num_env_steps_added=counts.env_steps_added,
            num_episodes_evicted=counts.episodes_evicted,
            num_env_steps_evicted=counts.env_steps_evicted,
            agent_to_num_episodes_added={DEFAULT_AGENT_ID: counts.episodes_added},
            agent_to_num_steps_added={DEFAULT_AGENT_ID: counts.agent_steps_added},
            agent_to_num_episodes_evicted={DEFAULT_AGENT_ID: counts.episodes_evicted},
            agent_to_num_steps_evicted={DEFAULT_AGENT_ID: counts.agent_steps_evicted},
            module_to_num_episodes_added={DEFAULT_MODULE_ID: counts.episodes_added},
            module_to_num_steps_added={DEFAULT_MODULE_ID: counts.agent_steps_added},
            module_to_num_episodes_evicted={DEFAULT_MODULE_ID: counts.episodes_evicted},
            module_to_num_steps_evicted={DEFAULT_MODULE_ID: counts.agent_steps_evicted},
        )

    def _update_add_metrics(self, *, num_episodes_added, num_env_steps_added,
                            num_episodes_evicted, num_env_steps_evicted,
                            agent_to_num_episodes_added, agent_to_num_steps_added,
                            agent_to_num_episodes_evicted, agent_to_num_steps_evicted,
                            module_to_num_steps_added, module_to_num_episodes_added,
                            module_to_num_episodes_evicted, module_to_num_steps_evicted,
                            **kwargs) -> None:
        """Logs an add() call's counts (RLlib's keys and reductions)."""
        log = self._unlogged.log
        window = self._metrics_num_episodes_for_smoothing
        log("num_episodes_stored", self.get_num_episodes(), reduce="mean", window=window)
        _log_pair(log, "num_episodes_added", num_episodes_added)
        _log_pair(log, "num_episodes_evicted", num_episodes_evicted)
        log("num_env_steps_stored", self.get_num_timesteps(), reduce="mean", window=window)
        _log_pair(log, "num_env_steps_added", num_env_steps_added)
        _log_pair(log, "num_env_steps_evicted", num_env_steps_evicted)
        for aid in agent_to_num_episodes_added:
            _log_pair(log, "num_agent_episodes_added", agent_to_num_episodes_added[aid], aid)
            _log_pair(log, "num_agent_steps_added", agent_to_num_steps_added[aid], aid)
        for aid in agent_to_num_episodes_evicted:
            _log_pair(log, "num_agent_episodes_evicted", agent_to_num_episodes_evicted[aid], aid)
            _log_pair(log, "num_agent_steps_evicted", agent_to_num_steps_evicted[aid], aid)
        for mid in module_to_num_episodes_added:
            _log_pair(log, "num_module_episodes_added", module_to_num_episodes_added[mid], mid)
            _log_pair(log, "num_module_steps_added", module_to_num_steps_added[mid], mid)
        for mid in module_to_num_episodes_evicted:
            _log_pair(log, "num_module_episodes_evicted",
                      module_to_num_episodes_evicted[mid], mid)
            _log_pair(log, "num_module_steps_evicted", module_to_num_steps_evicted[mid], mid)

    # -- sampling -------------------------------------------------------------------------

    def sample(self, num_items: Optional[int] = None, *, batch_size_B: Optional[int] = None,
               batch_length_T: Optional[int] = None, n_step: Optional[Union[int, Tuple]] = None,
               beta: float = 0.0, gamma: float = 0.99, include_infos: bool = False,
               include_extra_model_outputs: bool = False,
               sample_episodes: Optional[bool] = False, to_numpy: bool = False,
               lookback: int = 0, min_batch_length_T: int = 0, **kwargs):
        """RLlib's sample(): with `sample_episodes`, a list of episodes
        (n-step transitions, or sequences of `batch_length_T`); otherwise a
        dict of (batch_size_B, batch_length_T) arrays: obs, actions,
        rewards, is_first, is_last, is_terminated, is_truncated."""
        if sample_episodes:
            _check_gamma(gamma)
            return self._sample_episodes(
                num_items=num_items, batch_size_B=batch_size_B, batch_length_T=batch_length_T,
                n_step=n_step, beta=beta, gamma=gamma, include_infos=include_infos,
                include_extra_model_outputs=include_extra_model_outputs, to_numpy=to_numpy,
                lookback=lookback, min_batch_length_T=min_batch_length_T)
        return self._sample_batch(num_items=num_items, batch_size_B=batch_size_B,
                                  batch_length_T=batch_length_T)

    def _sample_batch(self, num_items=None, *, batch_size_B=None, batch_length_T=None):
        batch_size_B = _batch_size(num_items, batch_size_B) or self.batch_size_B
        T_max = batch_length_T or self.batch_length_T
        store = self._store
        observations = [[] for _ in range(batch_size_B)]
        actions = [[] for _ in range(batch_size_B)]
        rewards = [[] for _ in range(batch_size_B)]
        flags = {k: [[False] * T_max for _ in range(batch_size_B)]
                 for k in ("is_first", "is_last", "is_terminated", "is_truncated")}
        slots_seen, steps_seen = set(), set()
        B = T = 0
        draws = self._draws()
        while B < batch_size_B:
            slot, ts = store.uniform_step(draws)
            episode = _stored_episode(store, slot)
            flags["is_first"][B][T] = True
            if not rewards[B]:
                rewards[B].append(0.0 if ts == 0 else episode.rewards[ts - 1])
            else:
                ts = 0
                rewards[B].append(0.0)
            observations[B].extend(episode.observations[ts:])
            actions[B].extend(episode.actions[ts:])
            actions[B].append(episode.actions[-1])
            rewards[B].extend(episode.rewards[ts:])
            T = min(len(observations[B]), T_max)
            flags["is_last"][B][T - 1] = True
            if episode.is_terminated and T == len(observations[B]):
                flags["is_terminated"][B][T - 1] = True
            elif episode.is_truncated and T == len(observations[B]):
                flags["is_truncated"][B][T - 1] = True
            if T == T_max:
                del observations[B][T_max:], actions[B][T_max:], rewards[B][T_max:]
                B += 1
                T = 0
            slots_seen.add(slot)
            steps_seen.add((episode.id_, ts))
        self.sampled_timesteps += batch_size_B * T_max
        sampled = batch_size_B * T_max
        self._log_sample(sampled, len(slots_seen), len(steps_seen), None, 0)
        out = {"obs": np.array(observations), "actions": np.array(actions),
               "rewards": np.array(rewards)}
        out.update((k, np.array(v)) for k, v in flags.items())
        return out

    def _sample_episodes(self, num_items=None, *, batch_size_B=None, batch_length_T=None,
                         n_step=None, gamma=0.99, include_infos=False,
                         include_extra_model_outputs=False, to_numpy=False, lookback=1,
                         min_batch_length_T=0, **kwargs) -> List[SingleAgentEpisode]:
        batch_size_B = _batch_size(num_items, batch_size_B) or self.batch_size_B
        if n_step is None:
            raise AssertionError("When sampling episodes, `n_step` must be provided, but "
                                 "`n_step` is `None`.")
        if batch_length_T and (isinstance(n_step, tuple) or n_step != 1):
            raise AssertionError("When sampling sequences n-step must be 1.")
        n_step = _checked_n_step(n_step)
        store = self._store
        picks = store.draw_uniform(self._draws(), batch_size_B, batch_length_T or 0, n_step,
                                   min_batch_length_T)
        slots, ts, ns, ends = store.pick_fields(picks)
        if batch_length_T:
            episodes = [_stored_episode(store, int(s), int(t), int(e), lookback)
                        for s, t, e in zip(slots.tolist(), ts.tolist(), ends.tolist())]
            for episode, n in zip(episodes, ns):
                rows = len(episode) + lookback
                episode.extra_model_outputs["n_step"] = InfiniteLookbackBuffer(
                    np.full((rows,), int(n)), lookback=lookback)
                episode.extra_model_outputs["weights"] = InfiniteLookbackBuffer(
                    np.ones((rows,)), lookback=lookback)
        else:
            store.locate_ends(picks)
            episodes = _transitions(store, picks, slots, ts, ns, ends, gamma,
                                    include_infos=True, stored_ids=True,
                                    extras=include_extra_model_outputs, weights=None,
                                    exact_end=True, outputs_lookback=lookback)
        self._after_reads(len(episodes))
        self.sampled_timesteps += batch_size_B
        steps_seen = {(int(s), int(t)) for s, t in zip(slots, ts)}
        self._log_sample(batch_size_B, len(set(slots.tolist())), len(steps_seen),
                         sum(ns.tolist()) / batch_size_B, 0)
        return episodes

    # -- the native sampler ----------------------------------------------------------------

    def sample_batch(self, batch_size: int, *, n_step: Union[int, Tuple[int, int]] = 1,
                     gamma: float = 0.99, beta: Optional[float] = None,
                     batch_length_T: Optional[int] = None, lookback: int = 0,
                     min_batch_length_T: int = 0, include_extra_model_outputs: bool = False
                     ) -> Dict[str, Any]:
        """A training batch of `batch_size` items as a dict of arrays,
        without episode objects (uniform draws here; by priority on the
        prioritized buffer, which then takes update_priorities() for them).

        Transitions (the default): `obs`, `actions`, `rewards` (the
        discounted sum over `n_step` steps, an int or drawn per item from a
        (low, high) range, cut at the episode's end), `new_obs` (the
        observation after those steps), `terminateds`/`truncateds` (the
        transition reaches the end of a terminated/truncated episode),
        `n_step` (the steps summed: bootstrap with gamma ** n_step),
        `weights` (importance weights; ones when uniform), `indices`.

        Sequences (`batch_length_T=T`): (B, lookback + T, ...) arrays of up
        to T steps from each drawn step on, after `lookback` steps before
        it, never crossing into another episode and zero-padded: `obs`,
        `new_obs`, `actions`, `rewards` (one step each), `terminateds`,
        `truncateds` (at an episode's last step), `mask` (the rows that hold
        data), `lengths` (steps from the drawn one on), `weights`,
        `indices`. Steps within `min_batch_length_T` of their episode's end
        are not drawn.

        `include_extra_model_outputs` adds each extra model output (at the
        drawn step, or per row)."""
        prioritized = self._store.priorities is not None
        if beta is not None and not prioritized:
            raise ValueError("beta weights a prioritized draw; this buffer draws uniformly")
        beta = 0.0 if beta is None else beta
        if not beta >= 0.0:
            raise ValueError(f"beta must be >= 0, not {beta}")
        _check_gamma(gamma)
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must lie in [0, 1], not {gamma}")
        batch_size = _int(batch_size, "batch_size")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {batch_size}")
        T = _int(batch_length_T or 0, "batch_length_T")
        lookback = _int(lookback, "lookback")
        min_T = _int(min_batch_length_T, "min_batch_length_T")
        if T < 0 or lookback < 0 or min_T < 0:
            raise ValueError("batch_length_T, lookback and min_batch_length_T must be >= 0")
        if T and n_step != 1:
            raise ValueError("sequences are of single steps: n_step must be 1")
        n_step = _checked_n_step(n_step)
        store = self._store
        picks = store.draw_native(self._draws(), batch_size, n_step, prioritized, float(beta),
                                  T, min_T)
        if T:
            steps, weights, indices, _, _ = store.native_fields(picks)
            batch = self._sequence_batch(picks, store.layout, lookback, T,
                                         include_extra_model_outputs)
            batch["lengths"] = steps
            batch["weights"] = weights
            batch["indices"] = indices
        else:
            batch = store.native_transitions(picks, float(gamma), include_extra_model_outputs)
        if prioritized:
            self._last_sampled_keys = batch["indices"].tolist()
            self._last_sampled_indices = store.leaves_of(self._last_sampled_keys)
        self._after_reads(batch_size)
        return batch

    def _sequence_batch(self, picks, layout, lookback, T, extras) -> Dict[str, Any]:
        store = self._store
        masks = []

        def rows(leaf, next_rows=False):
            values, mask = store.gather_sequences(picks, leaf, lookback, T, next_rows)
            masks.append(mask)
            return values

        batch = {"obs": _track(layout["obs"], rows),
                 "new_obs": _track(layout["obs"], lambda leaf: rows(leaf, True)),
                 "actions": _track(layout["actions"], rows),
                 "rewards": _track(layout["rewards"], rows)}
        if extras:
            for key, structure in layout["extras"].items():
                batch[key] = _track(structure, rows)
        mask = masks[0]
        slots, ts, _, ends = store.pick_fields(picks)
        terminateds = np.zeros(mask.shape, np.bool_)
        truncateds = np.zeros(mask.shape, np.bool_)
        for i, (slot, t, end) in enumerate(zip(slots.tolist(), ts.tolist(), ends.tolist())):
            fields = episode_fields(store, slot)
            if end == fields[3] and end > t:
                row = lookback + end - t - 1
                terminateds[i, row] = fields[5]
                truncateds[i, row] = fields[6] and not fields[5]
        batch["terminateds"], batch["truncateds"], batch["mask"] = terminateds, truncateds, mask
        return batch

    def _after_reads(self, rows: int) -> None:
        # File-backed storage: the pages a draw mapped in (a read maps up to
        # 64 KB around a row: the kernel's fault-around) go back to the files
        # after the draw, so the resident size stays bounded however large
        # the files grow.
        if self._store.storage is not None:
            self._store.release_pages()

    def _log_sample(self, sampled, episodes_per_sample, steps_per_sample, sampled_n_step,
                    resamples) -> None:
        single = {DEFAULT_AGENT_ID: None}
        self._update_sample_metrics(
            num_env_steps_sampled=sampled, num_episodes_per_sample=episodes_per_sample,
            num_env_steps_per_sample=steps_per_sample, sampled_n_step=sampled_n_step,
            num_resamples=resamples,
            agent_to_num_steps_sampled={DEFAULT_AGENT_ID: sampled},
            agent_to_num_episodes_per_sample={DEFAULT_AGENT_ID: episodes_per_sample},
            agent_to_num_steps_per_sample={DEFAULT_AGENT_ID: steps_per_sample},
            agent_to_sampled_n_step=None if sampled_n_step is None
            else dict.fromkeys(single, sampled_n_step),
            agent_to_num_resamples={DEFAULT_AGENT_ID: resamples},
            module_to_num_steps_sampled={DEFAULT_MODULE_ID: sampled},
            module_to_num_episodes_per_sample={DEFAULT_MODULE_ID: episodes_per_sample},
            module_to_num_steps_per_sample={DEFAULT_MODULE_ID: steps_per_sample},
            module_to_sampled_n_step=None if sampled_n_step is None
            else {DEFAULT_MODULE_ID: sampled_n_step},
            module_to_num_resamples={DEFAULT_MODULE_ID: resamples})

    def _update_sample_metrics(self, *, num_env_steps_sampled, num_episodes_per_sample,
                               num_env_steps_per_sample, sampled_n_step, num_resamples,
                               agent_to_num_steps_sampled, agent_to_num_episodes_per_sample,
                               agent_to_num_steps_per_sample, agent_to_sampled_n_step,
                               agent_to_num_resamples, module_to_num_steps_sampled,
                               module_to_num_episodes_per_sample,
                               module_to_num_steps_per_sample, module_to_sampled_n_step,
                               module_to_num_resamples, **kwargs) -> None:
        """Logs a sample() call's counts (RLlib's keys and reductions)."""
        log = self._unlogged.log
        window = self._metrics_num_episodes_for_smoothing
        log("num_episodes_per_sample", num_episodes_per_sample, reduce="sum")
        log("num_env_steps_per_sample", num_env_steps_per_sample, reduce="sum")
        log("num_env_steps_per_sample_lifetime", num_env_steps_per_sample,
            reduce="lifetime_sum")
        _log_pair(log, "num_env_steps_sampled", num_env_steps_sampled)
        log("env_step_utilization", num_env_steps_per_sample / num_env_steps_sampled,
            reduce="mean", window=window)
        if sampled_n_step:
            log("actual_n_step", sampled_n_step, reduce="mean", window=window)
            for aid in agent_to_sampled_n_step:
                log(("agent_actual_n_step", aid), agent_to_sampled_n_step[aid], reduce="mean",
                    window=window)
            for mid in module_to_sampled_n_step:
                log(("module_actual_n_step", mid), module_to_sampled_n_step[mid],
                    reduce="mean", window=window)
        log("num_resamples", num_resamples, reduce="sum")
        for aid in agent_to_num_steps_sampled:
            _log_pair(log, "num_agent_steps_sampled", agent_to_num_steps_sampled[aid], aid)
            log(("num_agent_episodes_per_sample", aid), agent_to_num_episodes_per_sample[aid],
                reduce="sum")
            _log_pair(log, "num_agent_steps_per_sample", agent_to_num_steps_per_sample[aid],
                      aid, lifetime="num_agent_steps_per_sample_lifetime")
            log(("agent_step_utilization", aid),
                agent_to_num_steps_per_sample[aid] / agent_to_num_steps_sampled[aid],
                reduce="mean", window=window)
            log(("num_agent_resamples", aid), agent_to_num_resamples[aid], reduce="sum")
        for mid in module_to_num_steps_sampled:
            _log_pair(log, "num_module_steps_sampled", module_to_num_steps_sampled[mid], mid)
            log(("num_module_episodes_per_sample", mid),
                module_to_num_episodes_per_sample[mid], reduce="sum")
            _log_pair(log, "num_module_steps_per_sample", module_to_num_steps_per_sample[mid],
                      mid, lifetime="num_module_steps_per_sample_lifetime")
            log(("module_step_utilization", mid),
                module_to_num_steps_per_sample[mid] / module_to_num_steps_sampled[mid],
                reduce="mean", window=window)
            log(("num_module_resamples", mid), module_to_num_resamples[mid], reduce="sum")

    # -- counters ------------------------------------------------------------------------

    def get_num_episodes(self, module_id=None) -> int:
        """Stored episodes."""
        return self._store.num_episodes

    def get_num_episodes_evicted(self, module_id=None) -> int:
        """Episodes evicted so far."""
        return self._store.num_evicted

    def get_num_timesteps(self, module_id=None) -> int:
        """Stored (sampleable) timesteps."""
        return self._store.live_steps

    def get_sampled_timesteps(self, module_id=None) -> int:
        """Timesteps sampled so far."""
        return self.sampled_timesteps

    def get_added_timesteps(self, module_id=None) -> int:
        """Timesteps added so far."""
        return self._num_timesteps_added

    def get_metrics(self):
        """The logged metrics, reduced (RLlib's MetricsLogger.reduce())."""
        return self.metrics.reduce()

    # -- state ---------------------------------------------------------------------------

    def get_state(self) -> Dict[str, Any]:
        """RLlib's checkpoint of the buffer (its keys and formats)."""
        return self._plain_state(self.episodes)

    def _plain_state(self, episodes) -> Dict[str, Any]:
        # The plain buffer's keys (the multi-agent buffers' too, over theirs).
        return {
            "episodes": [e.get_state() for e in episodes],
            "episode_id_to_index": list(self.episode_id_to_index.items()),
            "_num_episodes_evicted": self._num_episodes_evicted,
            "_indices": self._indices,
            "_num_timesteps": self._num_timesteps,
            "_num_timesteps_added": self._num_timesteps_added,
            "sampled_timesteps": self.sampled_timesteps,
        }

    def set_state(self, state) -> None:
        """Restores get_state()'s checkpoint (ours or RLlib's). The state is
        checked first: a bad one raises and leaves the buffer unchanged."""
        store = self._restored_store(state)
        self._store = store
        self._num_timesteps = state["_num_timesteps"]
        self._num_timesteps_added = state["_num_timesteps_added"]
        self.sampled_timesteps = state["sampled_timesteps"]

    def __reduce__(self):
        # A pickle is the checkpoint (get_state(); arrays travel out-of-band
        # with protocol 5), restored into a new buffer of the same settings.
        return (_unpickled, (type(self), self._settings(), self.get_state(), self.rng))

    def _settings(self) -> Dict[str, Any]:
        return {"capacity": self.capacity, "batch_size_B": self.batch_size_B,
                "batch_length_T": self.batch_length_T,
                "metrics_num_episodes_for_smoothing": self._metrics_num_episodes_for_smoothing,
                "storage": self._store.storage}

    def _restored_store(self, state, weights=None) -> Store:
        episodes = [SingleAgentEpisode.from_state(s) for s in state["episodes"]]
        evicted = _int(state["_num_episodes_evicted"], "_num_episodes_evicted")
        for key in ("_num_timesteps", "_num_timesteps_added", "sampled_timesteps"):
            _int(state[key], key)
        id_to_index = dict(state["episode_id_to_index"])
        if list(id_to_index) != [e.id_ for e in episodes] or \
                list(id_to_index.values()) != list(range(evicted, evicted + len(episodes))):
            raise ValueError("episode_id_to_index must list the stored episodes in order, "
                             "indexed from _num_episodes_evicted on")
        store = self._new_store(self.capacity, self._store.storage)
        store.restore(episodes, [tuple(i) for i in state["_indices"]], evicted, weights)
        return store


def _unpickled(cls, settings: Dict[str, Any], state: Dict[str, Any], rng):
    buffer = cls(**settings)
    buffer.set_state(state)
    buffer.rng = rng
    return buffer


class PrioritizedEpisodeReplayBuffer(EpisodeReplayBuffer):
    """RLlib's PrioritizedEpisodeReplayBuffer on the compiled store: each
    stored timestep has a priority (`alpha`-scaled) in RLlib's sum and min
    trees, computed with the same numbers; `sample()` draws n-step
    transitions by priority with importance weights (`beta`), and
    `update_priorities()` sets the last draw's priorities."""

    def __init__(self, capacity: int = 10000, *, batch_size_B: int = 16,
                 batch_length_T: int = 1, alpha: float = 1.0,
                 metrics_num_episodes_for_smoothing: int = 100, storage=None, **kwargs):
        if not alpha >= 0:
            raise AssertionError(f"alpha must be >= 0, not {alpha}")
        self._alpha = alpha
        self._max_priority = 1.0
        self._last_sampled_indices: list = []
        # Their steps' keys: a priority set after an add() evicted its step
        # is dropped (RLlib's lands on the freed or reused leaf).
        self._last_sampled_keys: list = []
        super().__init__(capacity=capacity, batch_size_B=batch_size_B,
                         batch_length_T=batch_length_T,
                         metrics_num_episodes_for_smoothing=metrics_num_episodes_for_smoothing,
                         storage=storage)

    def _new_store(self, capacity, storage) -> Store:
        _check_capacity(capacity, prioritized=True)
        return Store(capacity, prioritized=True, tree_size=_tree_size(capacity),
                     storage=storage)

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

    def add(self, episodes, weight: Optional[float] = None) -> None:
        """Adds episodes as RLlib's prioritized buffer does: first the oldest
        episodes are evicted until the new timesteps fit (a new chunk of an
        evicted episode is dropped with it), then the rest is stored, each
        timestep with priority `weight` (default: the highest so far) **
        alpha."""
        if weight is None:
            weight = self._max_priority
        episodes = [_as_ours(e) for e in _force_list(episodes)]
        pending: dict = {}
        for episode in episodes:
            self._store.check(episode, pending)
        leaf_value = weight ** self._alpha
        store = self._store
        counts = _AddCounts()
        new_ids = [e.id_ for e in episodes]
        for episode in episodes:
            self._num_timesteps += len(episode)
            self._num_timesteps_added += len(episode)
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
                dropped = len(episodes[new_ids.index(id_)])
                self._num_timesteps -= dropped
                self._num_timesteps_added -= dropped
            self._num_timesteps -= length
        if evict:
            store.evict_oldest(evict)
        for episode in episodes:
            if episode.id_ in evicted_ids:
                continue
            _, is_new, _, steps = store.add(episode, leaf_value)
            if is_new:
                counts.episodes_added += 1
            counts.env_steps_added += steps
            counts.agent_steps_added += steps
        self._log_add(counts)

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
        picks = store.draw_prioritized(self._draws(), batch_size_B, n_step, beta)
        self._last_sampled_indices = picks.leaves
        self._last_sampled_keys = store.priorities.keys_of(picks.leaves)
        slots, ts, ns, ends = store.pick_fields(picks)
        store.locate_ends(picks)
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
        evicted since it was drawn is skipped. Checked first (AssertionError
        for a wrong count, ValueError for a negative, NaN or infinite
        priority)."""
        if indices is None:
            keys = self._last_sampled_keys
        else:
            keys = [int(i) for i in indices]
        self._max_priority = _set_priorities(self._store, keys, priorities, self._alpha,
                                             self._max_priority)
        if indices is None:
            self._last_sampled_indices.clear()
            keys.clear()

    def get_state(self) -> Dict[str, Any]:
        return super().get_state() | self._priority_state()

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

    def set_state(self, state) -> None:
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
        self._last_sampled_indices = last
        self._last_sampled_keys = store.priorities.keys_of(last)


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


# -- helpers ---------------------------------------------------------------------------------


class _AddCounts:
    __slots__ = ("episodes_added", "env_steps_added", "agent_steps_added", "episodes_evicted",
                 "env_steps_evicted", "agent_steps_evicted")

    def __init__(self):
        self.episodes_added = self.env_steps_added = self.agent_steps_added = 0
        self.episodes_evicted = self.env_steps_evicted = self.agent_steps_evicted = 0


def _log_pair(log, name: str, value, key=None, *, lifetime: Optional[str] = None) -> None:
    # RLlib logs most counts twice: summed per reduce, and over the lifetime.
    life = lifetime or f"{name}_lifetime"
    log(name if key is None else (name, key), value, reduce="sum")
    log(life if key is None else (life, key), value, reduce="lifetime_sum")


def _set_priorities(store: Store, keys: list, priorities, alpha, max_priority):
    """update_priorities(): max(p, 1e-12) ** alpha on the tree leaves of
    the steps `keys` (those still stored), everything checked before any is
    set; returns the new highest priority (RLlib's running max over all)."""
    if len(priorities) != len(keys):
        raise AssertionError(f"{len(priorities)} priorities for {len(keys)} sampled timesteps")
    clamped = []
    for p in priorities:
        if not 0 <= p < float("inf"):
            raise ValueError(f"priorities must be finite and >= 0, not {p}")
        clamped.append(max(p, 1e-12))
    values = [p ** alpha for p in clamped]
    store.priorities.update_many(store.leaves_of(keys), values)
    return max([max_priority] + clamped)


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


def _check_gamma(gamma) -> None:
    # Checked before drawing: RLlib's n-step sums fail on a non-number only
    # after its draws (any real number is used as given, as RLlib's).
    if type(gamma) is float:
        return
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.integer, np.floating)):
        raise TypeError(f"gamma must be a number, not {type(gamma).__name__}")


def _batch_size(num_items, batch_size_B):
    if num_items is not None:
        if batch_size_B is not None:
            raise AssertionError("Cannot call `sample()` with both `num_items` and "
                                 "`batch_size_B` provided! Use either one.")
        return num_items
    return batch_size_B


def _checked_n_step(n_step):
    """An n-step as the draws take it: a positive int, or a (low, high)
    range drawn from as Generator.integers(low, high)."""
    if type(n_step) is int and n_step >= 1:
        return n_step
    if isinstance(n_step, (tuple, list)):
        if len(n_step) != 2:
            raise ValueError(f"an n-step range is (low, high), not {n_step!r}")
        low, high = (_int(x, "n_step") for x in n_step)
        if low < 1 or high <= low:
            raise ValueError(f"an n-step range needs 1 <= low < high, not {n_step!r}")
        return (low, high)
    n = _int(n_step, "n_step")
    if n < 1:
        raise ValueError(f"n_step must be >= 1, not {n_step!r}")
    return n


def _int(value, name: str) -> int:
    if type(value) is int:
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    return int(value)


def _check_capacity(capacity, prioritized: bool = False) -> None:
    if isinstance(capacity, (bool, np.bool_)) or not isinstance(capacity, (int, np.integer)):
        raise TypeError(f"capacity must be an int, not {type(capacity).__name__}")
    if capacity == 0 and prioritized:
        # (RLlib's prioritized buffer asserts on its trees' size.)
        raise AssertionError("capacity must be a positive number of timesteps, not 0")
    if capacity <= 0:
        raise ValueError(f"capacity must be a positive number of timesteps, not {capacity}")


def _tree_size(capacity: int) -> int:
    # RLlib's trees: 2 * (the capacity rounded up to a power of two) leaves.
    return 2 * int(2 ** np.ceil(np.log2(capacity)))


def _transitions(store: Store, picks, slots, ts, ns, ends, gamma, *, include_infos: bool,
                 stored_ids: bool, extras: bool, weights, exact_end: bool = False,
                 outputs_lookback: int = -1) -> List[SingleAgentEpisode]:
    """One-step episodes for n-step transitions, as RLlib's buffers build
    them: observations [obs(ts), obs(end)], the action at ts, the discounted
    reward sum, the done flags of a transition that reaches its episode's
    end (`exact_end`: only one that ends exactly there, as a plain buffer's
    episode slice decides), `weights` and `n_step` in the constructor's
    extra model outputs (the prioritized and multi-agent buffers'), the
    stored episode's ids with `stored_ids`. Their data are read in place
    from one batch array per leaf."""
    layout = store.layout
    obs_pairs = {leaf: store.gather_pairs(picks, leaf) for leaf in _leaves_of(layout["obs"])}
    actions = {leaf: store.gather(picks, leaf) for leaf in _leaves_of(layout["actions"])}
    extra_arrays = {}
    if extras:
        for key, structure in layout["extras"].items():
            extra_arrays[key] = {leaf: store.gather(picks, leaf) for leaf in _leaves_of(structure)}
    infos = None
    if include_infos:
        first, last = store.gather_infos(picks), store.gather_infos(picks, True)
        infos = [x for pair in zip(first, last) for x in pair]
    returns = store.returns(picks, float(gamma))
    episodes = make_transitions(SingleAgentEpisode, store, picks, obs_pairs, actions, returns,
                                extra_arrays, infos, weights, stored_ids, exact_end,
                                outputs_lookback)
    _RECENT.append(_Replayed(episodes, layout, obs_pairs, actions, returns, extra_arrays))
    return episodes


class _Replayed:
    """A drawn batch of transitions and the episodes made of it (their data
    read in place from these arrays): what the learner's fast path builds a
    train batch from, as long as the episodes are unchanged."""

    def __init__(self, episodes, layout, obs_pairs, actions, returns, extras):
        self.episodes = episodes
        self.layout = layout
        self.obs_pairs = obs_pairs
        self.actions = actions
        self.returns = returns
        self.extras = extras

    def unchanged(self) -> bool:
        return shares_batch(self.episodes, self.layout, self.obs_pairs, self.actions,
                            self.returns, self.extras)

    def columns(self) -> Dict[str, Any]:
        """The train batch RLlib's default learner connectors build of these
        episodes (before their NumpyToTensor): obs, new_obs, actions,
        rewards, terminateds, truncateds, then the extra model outputs in the
        episodes' order."""
        layout, episodes = self.layout, self.episodes
        columns = {
            "obs": _track(layout["obs"], lambda leaf: np.ascontiguousarray(self.obs_pairs[leaf][0::2])),
            "new_obs": _track(layout["obs"],
                              lambda leaf: np.ascontiguousarray(self.obs_pairs[leaf][1::2])),
            "actions": _track(layout["actions"], lambda leaf: self.actions[leaf]),
            "rewards": self.returns,
            "terminateds": np.array([bool(e.is_terminated) for e in episodes]),
            "truncateds": np.array([bool(e.is_truncated) for e in episodes]),
        }
        for key in episodes[0].extra_model_outputs:
            if key in columns:
                continue
            if key in self.extras:
                columns[key] = _track(layout["extras"][key], lambda leaf: self.extras[key][leaf])
            else:
                columns[key] = _stacked([e.extra_model_outputs[key].get(0) for e in episodes])
        return columns


def _stacked(items: list) -> np.ndarray:
    # What RLlib's batching makes of one item per episode (np.stack's dtype).
    return np.stack([np.asarray(item) for item in items])


# The latest drawn batches (the learner asks for the one it was handed).
_RECENT: collections.deque = collections.deque(maxlen=4)


def replayed_columns(episodes: list) -> Optional[Dict[str, Any]]:
    """RLlib's default learner-connector columns for `episodes`, built from
    the arrays they were drawn into, when they are exactly the episodes of
    one recent sample() call, unchanged and with all their extra model
    outputs alike; None otherwise (RLlib's connectors then build it)."""
    for replayed in reversed(_RECENT):
        mine = replayed.episodes
        if len(mine) != len(episodes) or not all(a is b for a, b in zip(mine, episodes)):
            continue
        first = episodes[0].extra_model_outputs.keys()
        if not replayed.unchanged() or any(e.extra_model_outputs.keys() != first
                                           for e in episodes):
            return None
        return replayed.columns()
    return None


def _track(structure, leaf_rows) -> Any:
    """A track's batch: leaf_rows(leaf) for each leaf, in the track's
    nesting (dicts and tuples of arrays for Dict/Tuple items)."""
    if structure is None:
        return None
    if isinstance(structure, int):
        return leaf_rows(structure)
    if isinstance(structure, dict):
        return {k: _track(v, leaf_rows) for k, v in structure.items()}
    return tuple(_track(v, leaf_rows) for v in structure)


def _leaves_of(structure) -> list:
    if structure is None:
        return []
    if isinstance(structure, int):
        return [structure]
    values = structure.values() if isinstance(structure, dict) else structure
    return [leaf for v in values for leaf in _leaves_of(v)]


# -- the multi-agent buffers ---------------------------------------------------------------


def _as_ours_multi(episode):
    """Our MultiAgentEpisode for RLlib's (same state), ours as it is."""
    from episode.multi_agent_episode import MultiAgentEpisode

    if isinstance(episode, MultiAgentEpisode):
        return episode
    if hasattr(episode, "get_state") and hasattr(episode, "agent_episodes"):
        return MultiAgentEpisode.from_state(episode.get_state())
    raise TypeError(f"a multi-agent replay buffer stores MultiAgentEpisodes, not "
                    f"{type(episode).__name__}")


def _env_steps_chunk(episode) -> SingleAgentEpisode:
    """A stand-in single-agent chunk with one (empty) row per env step of a
    multi-agent chunk: the env-step index lives in a Store as its steps."""
    n = len(episode)
    chunk = SingleAgentEpisode(
        id_=episode.id_, observations=np.zeros(n + 1, np.int8), actions=np.zeros(n, np.int8),
        rewards=np.zeros(n, np.bool_), terminated=episode.is_terminated,
        truncated=episode.is_truncated, t_started=episode.env_t_started, len_lookback_buffer=0)
    return chunk


class MultiAgentEpisodeReplayBuffer(EpisodeReplayBuffer):
    """RLlib's MultiAgentEpisodeReplayBuffer on the compiled store.

    Keeps the multi-agent episodes (ours or RLlib's; a chunk with a stored
    id is joined to it) and, per module, its agents' steps in a Store of
    their own: `sample()` draws each module's n-step transitions there
    ("independent" replay), or whole env steps ("synchronized")."""

    def __init__(self, capacity: int = 10000, *, batch_size_B: int = 16,
                 batch_length_T: int = 1, metrics_num_episodes_for_smoothing: int = 100,
                 storage=None, **kwargs):
        super().__init__(capacity=capacity, batch_size_B=batch_size_B,
                         batch_length_T=batch_length_T,
                         metrics_num_episodes_for_smoothing=metrics_num_episodes_for_smoothing,
                         storage=storage)
        self._storage = storage
        self._multi_episodes: collections.deque = collections.deque()
        self._modules: Dict[Any, Store] = {}
        self._num_agent_timesteps = 0
        self._num_module_timesteps = collections.defaultdict(int)
        self._num_agent_timesteps_added = 0
        self._num_module_timesteps_added = collections.defaultdict(int)
        self._num_module_episodes = collections.defaultdict(int)
        self._num_module_episodes_evicted = collections.defaultdict(int)
        self.sampled_timesteps_per_module = collections.defaultdict(int)

    def _new_module_store(self) -> Store:
        return Store(self.capacity, storage=self._storage)

    # -- RLlib's attributes ------------------------------------------------------------------

    @property
    def episodes(self) -> collections.deque:
        """The stored multi-agent episodes, oldest first (live: RLlib hands
        out its own stored episodes too)."""
        return self._multi_episodes

    def _ma_index(self) -> Dict[Any, int]:
        first = self._store.num_evicted
        return {e.id_: first + i for i, e in enumerate(self._multi_episodes)}

    @property
    def episode_id_to_index(self) -> Dict[Any, int]:
        return self._ma_index()

    @property
    def _indices(self) -> list:
        index = _episode_indices(self._store)
        return [(index[slot], ts) for slot, ts, _ in step_order(self._store)]

    @property
    def _module_to_indices(self) -> Dict[Any, list]:
        out = collections.defaultdict(list)
        for module_id, store in self._modules.items():
            out[module_id] = self._module_entries(module_id, store)
        return out

    def _module_entries(self, module_id, store: Store) -> list:
        index = self._ma_index()
        keys = {slot: store_key for store_key, slot in store.stored_keys().items()}
        return [(index[keys[slot][0]], keys[slot][1], ts)
                for slot, ts, _ in step_order(store)]

    # -- adding ------------------------------------------------------------------------------

    def add(self, episodes) -> None:
        """Adds multi-agent episodes as RLlib's buffer does: the oldest
        episodes are evicted first until the new env steps fit (a new chunk
        of an evicted episode is dropped with it), then each episode is
        stored (or joined to its stored part) and its agents' steps go to
        their modules. Checked first: a bad episode changes nothing."""
        episodes = [_as_ours_multi(e) for e in _force_list(episodes)]
        self._check_multi(episodes)
        self._add_multi(episodes, None)

    def _check_multi(self, episodes) -> None:
        pending: dict = {}
        per_module: Dict[Any, dict] = collections.defaultdict(dict)
        earlier = {e.id_: e for e in self._multi_episodes}
        for episode in episodes:
            self._store.check(_env_steps_chunk(episode), pending)
            before = earlier.get(episode.id_)
            if before is not None:
                # RLlib's concat_episode asserts that each agent continues its
                # own single-agent episode.
                for agent_id, agent_episode in episode.agent_episodes.items():
                    other = before.agent_episodes.get(agent_id)
                    if other is not None and other.id_ != agent_episode.id_:
                        raise AssertionError(
                            f"agent {agent_id!r}'s chunk (id {agent_episode.id_!r}) does not "
                            f"continue its stored episode (id {other.id_!r})")
            earlier[episode.id_] = episode
            for agent_id, agent_episode in episode.agent_episodes.items():
                module_id = episode.module_for(agent_id)
                store = self._modules.get(module_id)
                if store is None:
                    store = self._modules_pending(per_module, module_id)
                store.check(agent_episode, per_module[module_id], key=(episode.id_, agent_id))

    def _modules_pending(self, per_module, module_id) -> Store:
        # A module seen first in this call: checked against a scratch store.
        scratch = per_module.setdefault(("store", module_id), {})
        if "store" not in scratch:
            scratch["store"] = self._new_module_store()
        return scratch["store"]

    def _add_multi(self, episodes, weight) -> None:
        counts = _MultiCounts()
        new_ids = [e.id_ for e in episodes]
        total = sum(e.env_steps() for e in episodes)
        self._num_timesteps += total
        self._num_timesteps_added += total
        evicted_ids: list = []
        # RLlib's count of the episodes left: stored or new, not evicted.
        remaining = len(self._multi_episodes) + len(
            {i for i in new_ids if i not in self._store})
        while self._num_timesteps > self.capacity and self._multi_episodes and \
                remaining - len(evicted_ids) != 1:
            evicted = self._multi_episodes.popleft()
            evicted_ids.append(evicted.id_)
            if evicted.id_ in new_ids:
                dropped = episodes.pop(new_ids.index(evicted.id_))
                new_ids.remove(evicted.id_)
                self._num_timesteps -= dropped.env_steps()
                self._num_timesteps_added -= dropped.env_steps()
            self._num_timesteps -= evicted.env_steps()
            self._num_agent_timesteps -= evicted.agent_steps()
            counts.episodes_evicted += 1
            counts.env_steps_evicted += evicted.env_steps()
            for agent_id, agent_episode in evicted.agent_episodes.items():
                module_id = evicted._agent_to_module_mapping[agent_id]
                counts.agent_episodes_evicted[agent_id] += 1
                counts.module_episodes_evicted[module_id] += 1
                counts.agent_steps_evicted[agent_id] += agent_episode.agent_steps()
                counts.module_steps_evicted[module_id] += agent_episode.agent_steps()
                self._num_module_timesteps[module_id] -= agent_episode.env_steps()
                self._num_module_episodes[module_id] -= 1
                self._num_module_episodes_evicted[module_id] += 1
        if evicted_ids:
            self._evict_stores(evicted_ids)
        for episode in episodes:
            self._num_agent_timesteps += episode.agent_steps()
            self._num_agent_timesteps_added += episode.agent_steps()
            for agent_id in episode.agent_ids:
                steps = episode.agent_episodes[agent_id].env_steps()
                if steps > 0:
                    module_id = episode.module_for(agent_id)
                    self._num_module_timesteps[module_id] += steps
                    self._num_module_timesteps_added[module_id] += steps
        stored = {e.id_: e for e in self._multi_episodes}
        for episode in episodes:
            existing = stored.get(episode.id_)
            self._store.add(_env_steps_chunk(episode), weight)
            self._add_agents(episode, existing)
            if existing is not None:
                existing.concat_episode(copy.deepcopy(episode))
            else:
                copied = copy.deepcopy(episode)
                self._multi_episodes.append(copied)
                stored[episode.id_] = copied
                counts.episodes_added += 1
                for agent_id in episode.agent_episodes:
                    counts.agent_episodes_added[agent_id] += 1
                    counts.module_episodes_added[episode._agent_to_module_mapping[agent_id]] += 1
            counts.env_steps_added += episode.env_steps()
            for agent_id, agent_episode in episode.agent_episodes.items():
                module_id = episode._agent_to_module_mapping[agent_id]
                counts.agent_steps_added[agent_id] += agent_episode.agent_steps()
                counts.module_steps_added[module_id] += agent_episode.agent_steps()
        self._update_add_metrics(
            num_episodes_added=counts.episodes_added, num_env_steps_added=counts.env_steps_added,
            num_episodes_evicted=counts.episodes_evicted,
            num_env_steps_evicted=counts.env_steps_evicted,
            agent_to_num_episodes_added=counts.agent_episodes_added,
            agent_to_num_steps_added=counts.agent_steps_added,
            agent_to_num_episodes_evicted=counts.agent_episodes_evicted,
            agent_to_num_steps_evicted=counts.agent_steps_evicted,
            module_to_num_episodes_added=counts.module_episodes_added,
            module_to_num_steps_added=counts.module_steps_added,
            module_to_num_episodes_evicted=counts.module_episodes_evicted,
            module_to_num_steps_evicted=counts.module_steps_evicted)

    def _agent_order(self, episode):
        # The order RLlib's _add_new_module_indices takes the agents in.
        return list(episode.agent_episodes)

    def _add_agents(self, episode, existing) -> None:
        # Each agent's steps go to its module's store (RLlib's
        # _add_new_module_indices, in the same order).
        for agent_id in self._agent_order(episode):
            agent_episode = episode.agent_episodes[agent_id]
            module_id = episode.module_for(agent_id)
            store = self._modules.get(module_id)
            if store is None:
                store = self._modules[module_id] = self._new_module_store()
            if existing is None or agent_id not in existing.agent_episodes:
                self._num_module_episodes[module_id] += 1
            store.add(agent_episode, self._module_weight(module_id),
                      key=(episode.id_, agent_id))

    def _module_weight(self, module_id):
        return None

    def _evict_stores(self, evicted_ids) -> None:
        store = self._store
        stored = store.stored_keys()
        store.evict([stored[i] for i in evicted_ids if i in stored])
        gone = set(evicted_ids)
        for module_store in self._modules.values():
            slots = [slot for key, slot in module_store.stored_keys().items() if key[0] in gone]
            if slots:
                module_store.evict(slots)

    # -- sampling ------------------------------------------------------------------------

    def sample(self, num_items: Optional[int] = None, *, batch_size_B: Optional[int] = None,
               batch_length_T: Optional[int] = None, n_step: Optional[Union[int, Tuple]] = 1,
               gamma: float = 0.99, include_infos: bool = False,
               include_extra_model_outputs: bool = False, replay_mode: str = "independent",
               modules_to_sample: Optional[List[Any]] = None, **kwargs):
        """RLlib's multi-agent sample(): per module `batch_size_B` n-step
        transitions of its agents ("independent", a list of single-agent
        episodes), or env steps with every agent that has a whole transition
        there ("synchronized", a dict of batches per module)."""
        _check_gamma(gamma)
        batch_size_B = _batch_size(num_items, batch_size_B) or self.batch_size_B
        batch_length_T = batch_length_T or self.batch_length_T
        if replay_mode == "independent":
            return self._sample_independent(
                batch_size_B=batch_size_B, batch_length_T=batch_length_T, n_step=n_step,
                gamma=gamma, include_infos=include_infos,
                include_extra_model_outputs=include_extra_model_outputs,
                modules_to_sample=modules_to_sample)
        return self._sample_synchonized(
            batch_size_B=batch_size_B, batch_length_T=batch_length_T, n_step=n_step,
            gamma=gamma, include_infos=include_infos,
            include_extra_model_outputs=include_extra_model_outputs,
            modules_to_sample=modules_to_sample)

    def _draw_module(self, module_id, store, draws, batch_size_B, n_step, beta):
        return store.draw_transitions(draws, batch_size_B, n_step), None

    def _sample_independent(self, batch_size_B, batch_length_T, n_step, gamma, include_infos,
                            include_extra_model_outputs, modules_to_sample, beta=None):
        n_step = _checked_n_step(n_step or 1)
        counts = _SampleCounts()
        episodes: list = []
        draws = self._draws()
        modules = modules_to_sample or set(self._module_keys())
        if not modules:
            # RLlib's: its metrics divide by the zero steps sampled (after
            # counting the draw); ours before anything changes.
            raise ZeroDivisionError("the buffer holds no timesteps to sample")
        agent_id = None
        for module_id in modules:
            store = self._module_store(module_id)
            picks, weights = self._draw_module(module_id, store, draws, batch_size_B, n_step,
                                               beta)
            slots, ts, ns, ends = store.pick_fields(picks)
            store.locate_ends(picks)
            sampled = _transitions(store, picks, slots, ts, ns, ends, gamma,
                                   include_infos=include_infos, stored_ids=True,
                                   extras=include_extra_model_outputs,
                                   weights=weights if weights is not None
                                   else [1.0] * len(picks))
            keys = {slot: key for key, slot in store.stored_keys().items()}
            stored = {e.id_: e for e in self._multi_episodes}
            counts.resamples += picks.resamples
            counts.module_resamples[module_id] += picks.resamples
            for slot in picks.rejected:
                counts.agent_resamples[keys[slot][1]] += 1
            for episode, slot, t, n in zip(sampled, slots.tolist(), ts.tolist(), ns.tolist()):
                ma_id, agent_id = keys[slot]
                multi = stored[ma_id]
                episode.multi_agent_episode_id = ma_id
                counts.episode_idxs.add(ma_id)
                counts.agent_episode_ids[agent_id].add(episode.id_)
                counts.module_episode_ids[module_id].add(episode.id_)
                env_t = multi.env_t_to_agent_t[agent_id].data.index(t)
                counts.env_steps.add((ma_id, env_t))
                counts.agent_steps[agent_id].add((episode.id_, t))
                counts.module_steps[module_id].add((episode.id_, t))
                counts.n_steps.append(n)
                counts.agent_n_steps[agent_id].append(n)
                counts.module_n_steps[module_id].append(n)
            episodes.extend(sampled)
            B = len(picks)
            self.sampled_timesteps_per_module[module_id] += B
            counts.sampled += B
            counts.agent_sampled[agent_id] += B
            counts.module_sampled[module_id] += B
        self.sampled_timesteps += batch_size_B
        self._update_sample_metrics(
            num_env_steps_sampled=counts.sampled,
            num_episodes_per_sample=len(counts.episode_idxs),
            num_env_steps_per_sample=len(counts.env_steps),
            sampled_n_step=sum(counts.n_steps) / batch_size_B,
            num_resamples=counts.resamples,
            agent_to_num_steps_sampled=counts.agent_sampled,
            agent_to_num_episodes_per_sample={a: len(v) for a, v in
                                              counts.agent_episode_ids.items()},
            agent_to_num_steps_per_sample={a: len(v) for a, v in counts.agent_steps.items()},
            agent_to_sampled_n_step={a: sum(v) / len(v) for a, v in
                                     counts.agent_n_steps.items()},
            agent_to_num_resamples=counts.agent_resamples,
            module_to_num_steps_sampled=counts.module_sampled,
            module_to_num_episodes_per_sample={m: len(v) for m, v in
                                               counts.module_episode_ids.items()},
            module_to_num_steps_per_sample={m: len(v) for m, v in counts.module_steps.items()},
            module_to_sampled_n_step={m: sum(v) / len(v) for m, v in
                                      counts.module_n_steps.items()},
            module_to_num_resamples=counts.module_resamples)
        return episodes

    def _module_keys(self) -> list:
        return list(self._modules)

    def _module_store(self, module_id) -> Store:
        store = self._modules.get(module_id)
        if store is None:
            store = self._modules[module_id] = self._new_module_store()
        return store

    def _sample_synchonized(self, batch_size_B, batch_length_T, n_step, gamma, include_infos,
                            include_extra_model_outputs, modules_to_sample):
        random_n = isinstance(n_step, tuple)
        n = None if random_n else (n_step or 1)
        if random_n:
            n_step = _checked_n_step(n_step)
        draws = self._draws()
        stored = {e.id_: e for e in self._multi_episodes}
        columns = ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds",
                   "weights", "n_step")
        data: Dict[Any, Dict[str, list]] = {}
        wanted = modules_to_sample or self._modules.keys()
        per_module: Dict[Any, int] = collections.Counter()
        B = tries = 0
        while B < batch_size_B:
            tries += 1
            if tries > 1_000_000 + 100 * batch_size_B:
                raise ValueError(f"no item after {tries - 1} draws: no stored env step has "
                                 f"n-step transitions of its agents")
            slot, ts = self._store.uniform_step(draws)
            if random_n:
                n = draws.draw_integers(*n_step)
            if ts - n < 0:
                continue
            episode = stored[episode_fields(self._store, slot)[0]]
            observations = episode.get_observations(slice(ts - n, ts + 1), return_list=True)
            actions = episode.get_actions(ts - n)
            agents = [a for a in observations[0] if a in actions and a in observations[-1]]
            if not agents:
                continue
            rewards = episode.get_rewards(slice(ts - n, ts), return_list=True)
            done_here = ts == episode.env_t
            for agent_id in agents:
                module_id = episode._agent_to_module_mapping[agent_id]
                if module_id not in wanted:
                    continue
                rows = data.setdefault(module_id, {c: [] for c in columns})
                rows["obs"].append(observations[0][agent_id])
                rows["new_obs"].append(observations[-1][agent_id])
                rows["rewards"].append(_discounted([r[agent_id] or 0.0 for r in rewards], gamma))
                rows["actions"].append(actions[agent_id])
                agent_t = episode.env_t_to_agent_t[agent_id][ts]
                agent_episode = episode.agent_episodes[agent_id]
                terminated = (done_here and episode.is_terminated) or (
                    agent_t == agent_episode.t and agent_episode.is_terminated)
                truncated = not terminated and ((done_here and episode.is_truncated) or (
                    agent_t == agent_episode.t and agent_episode.is_truncated))
                rows["terminateds"].append(bool(terminated))
                rows["truncateds"].append(bool(truncated))
                rows["weights"].append(1.0)
                rows["n_step"].append(n)
                per_module[module_id] += 1
            B += 1
        for module_id, count in per_module.items():
            self.sampled_timesteps_per_module[module_id] += count
        self.sampled_timesteps += batch_size_B
        from episode.spaces import stack as batch_items

        return {module_id: {"obs": batch_items(rows["obs"]),
                            "actions": batch_items(rows["actions"]),
                            "rewards": np.array(rows["rewards"]),
                            "new_obs": batch_items(rows["new_obs"]),
                            "terminateds": np.array(rows["terminateds"]),
                            "truncateds": np.array(rows["truncateds"]),
                            "weights": np.array(rows["weights"]),
                            "n_step": np.array(rows["n_step"])}
                for module_id, rows in data.items()}

    # -- counters --------------------------------------------------------------------------

    def get_added_agent_timesteps(self) -> int:
        """Agent timesteps added so far."""
        return self._num_agent_timesteps_added

    def get_module_ids(self) -> list:
        """The modules whose agents' steps are stored."""
        return list(self._modules)

    def get_num_agent_timesteps(self) -> int:
        """Stored agent timesteps."""
        return self._num_agent_timesteps

    def get_num_episodes(self, module_id=None) -> int:
        return self._num_module_episodes[module_id] if module_id else self._store.num_episodes

    def get_num_episodes_evicted(self, module_id=None) -> int:
        return self._num_module_episodes_evicted[module_id] if module_id \
            else self._store.num_evicted

    def get_num_timesteps(self, module_id=None) -> int:
        return self._num_module_timesteps[module_id] if module_id else self._store.live_steps

    def get_sampled_timesteps(self, module_id=None) -> int:
        return self.sampled_timesteps_per_module[module_id] if module_id \
            else self.sampled_timesteps

    def get_added_timesteps(self, module_id=None) -> int:
        return self._num_module_timesteps_added[module_id] if module_id \
            else self._num_timesteps_added

    # -- state ------------------------------------------------------------------------------

    def get_state(self) -> Dict[str, Any]:
        return self._plain_state(self._multi_episodes) | self._multi_state()

    def set_state(self, state) -> None:
        """Restores get_state()'s checkpoint (ours or RLlib's), checked
        first: a bad one raises and leaves the buffer unchanged."""
        from episode.multi_agent_episode import MultiAgentEpisode

        episodes = [MultiAgentEpisode.from_state(s) for s in state["episodes"]]
        evicted = _int(state["_num_episodes_evicted"], "_num_episodes_evicted")
        for key in ("_num_timesteps", "_num_timesteps_added", "sampled_timesteps",
                    "_num_agent_timesteps", "_num_agent_timesteps_added"):
            _int(state[key], key)
        if [k for k, _ in state["episode_id_to_index"]] != [e.id_ for e in episodes] or \
                [v for _, v in state["episode_id_to_index"]] != \
                list(range(evicted, evicted + len(episodes))):
            raise ValueError("episode_id_to_index must list the stored episodes in order, "
                             "indexed from _num_episodes_evicted on")
        store = self._new_store(self.capacity, self._storage)
        store.restore([_env_steps_chunk(e) for e in episodes],
                      [tuple(i) for i in state["_indices"]], evicted,
                      self._global_weights(state))
        modules = {}
        for module_id, entries in dict(state["_module_to_indices"]).items():
            modules[module_id] = self._restored_module(module_id, episodes, evicted,
                                                       list(entries), state)
        counters = {key: collections.defaultdict(int, dict(state[key])) for key in (
            "_num_module_timesteps", "_num_module_timesteps_added", "_num_module_episodes",
            "_num_module_episodes_evicted", "sampled_timesteps_per_module")}
        self._restore_priorities(state, store, modules)
        self._store = store
        self._multi_episodes = collections.deque(episodes)
        self._modules = modules
        self._num_timesteps = state["_num_timesteps"]
        self._num_timesteps_added = state["_num_timesteps_added"]
        self.sampled_timesteps = state["sampled_timesteps"]
        self._num_agent_timesteps = state["_num_agent_timesteps"]
        self._num_agent_timesteps_added = state["_num_agent_timesteps_added"]
        for key, counter in counters.items():
            setattr(self, key, counter)

    def _restored_module(self, module_id, episodes, evicted, entries, state) -> Store:
        # A module's store, its agents' steps in the order of its entries.
        by_key = {(e.id_, agent_id): agent_episode for e in episodes
                  for agent_id, agent_episode in e.agent_episodes.items()
                  if e.module_for(agent_id) == module_id}
        index_of = {e.id_: evicted + i for i, e in enumerate(episodes)}
        id_of = {v: k for k, v in index_of.items()}
        order: list = []
        for entry in entries:
            if len(entry) < 3 or entry[0] not in id_of:
                raise ValueError(f"module {module_id!r}: entry {entry!r} names no stored "
                                 f"episode")
            key = (id_of[entry[0]], entry[1])
            if key not in by_key:
                raise ValueError(f"module {module_id!r}: entry {entry!r} names no agent of "
                                 f"the module")
            if key not in order:
                order.append(key)
        order += [key for key in by_key if key not in order]
        position = {key: i for i, key in enumerate(order)}
        indices = [(position[(id_of[entry[0]], entry[1])],) + tuple(entry[2:])
                   for entry in entries]
        store = self._new_module_store()
        store.restore(_alike([by_key[key] for key in order]), indices, 0,
                      self._module_weights(module_id, state), keys=order)
        return store

    def _global_weights(self, state):
        return None

    def _module_weights(self, module_id, state):
        return None

    def _restore_priorities(self, state, store: Store, modules: Dict[Any, Store]) -> None:
        """Uniform buffers keep no priorities; the prioritized one restores its trees."""

    def _multi_state(self) -> Dict[str, Any]:
        return {
            "_module_to_indices": list(self._module_to_indices.items()),
            "_num_agent_timesteps": self._num_agent_timesteps,
            "_num_agent_timesteps_added": self._num_agent_timesteps_added,
            "_num_module_timesteps": list(self._num_module_timesteps.items()),
            "_num_module_timesteps_added": list(self._num_module_timesteps_added.items()),
            "_num_module_episodes": list(self._num_module_episodes.items()),
            "_num_module_episodes_evicted": list(self._num_module_episodes_evicted.items()),
            "sampled_timesteps_per_module": list(self.sampled_timesteps_per_module.items()),
        }


def _alike(episodes: list) -> list:
    """The agents' episodes of one module with each numpy'ized track in one
    dtype: RLlib's concat_episode turns an agent's int actions into float64
    when a chunk has no step of it (so does ours, as a drop-in), and a
    module's store has one dtype per track. Such float64 tracks go back to
    the int dtype of the others where no value changes (else the store
    refuses the state)."""
    tracks = ("observations", "actions", "rewards")
    wanted = {}
    for track in tracks:
        dtypes = [getattr(e, track).data.dtype for e in episodes
                  if isinstance(getattr(e, track).data, np.ndarray) and len(getattr(e, track).data)]
        ints = [d for d in dtypes if d.kind in "iu"]
        if ints and len(set(dtypes)) > 1:
            wanted[track] = ints[0]
    out = []
    for episode in episodes:
        state = None
        for track, want in wanted.items():
            data = getattr(episode, track).data
            if isinstance(data, np.ndarray) and len(data) and data.dtype != want \
                    and np.array_equal(data.astype(want), data):
                state = state or episode.get_state()
                state[track] = dict(state[track], data=data.astype(want))
        out.append(SingleAgentEpisode.from_state(state) if state is not None else episode)
    return out


class _MultiCounts:
    def __init__(self):
        self.episodes_added = self.env_steps_added = 0
        self.episodes_evicted = self.env_steps_evicted = 0
        dd = collections.defaultdict
        self.agent_episodes_added, self.module_episodes_added = dd(int), dd(int)
        self.agent_steps_added, self.module_steps_added = dd(int), dd(int)
        self.agent_episodes_evicted, self.module_episodes_evicted = dd(int), dd(int)
        self.agent_steps_evicted, self.module_steps_evicted = dd(int), dd(int)


class _SampleCounts:
    def __init__(self):
        dd = collections.defaultdict
        self.sampled = self.resamples = 0
        self.agent_sampled, self.module_sampled = dd(int), dd(int)
        self.agent_resamples, self.module_resamples = dd(int), dd(int)
        self.episode_idxs: set = set()
        self.agent_episode_ids, self.module_episode_ids = dd(set), dd(set)
        self.env_steps: set = set()
        self.agent_steps, self.module_steps = dd(set), dd(set)
        self.n_steps: list = []
        self.agent_n_steps, self.module_n_steps = dd(list), dd(list)


def _discounted(rewards: list, gamma: float) -> float:
    # scipy.signal.lfilter([1], [1, -gamma], rewards[::-1])[-1], in the same
    # float64 operations.
    acc = 0.0 + float(rewards[-1])
    for r in reversed(rewards[:-1]):
        acc = float(r) - (-gamma) * acc
    return np.float64(acc)


class MultiAgentPrioritizedEpisodeReplayBuffer(MultiAgentEpisodeReplayBuffer,
                                               PrioritizedEpisodeReplayBuffer):
    """RLlib's MultiAgentPrioritizedEpisodeReplayBuffer on the compiled
    store: per module, RLlib's priority trees over its agents' steps (and
    its `_max_priority`); `sample()` draws each module's transitions by
    priority, `update_priorities(priorities, module_id)` sets the last
    draw's priorities of that module."""

    def __init__(self, capacity: int = 10000, *, batch_size_B: int = 16,
                 batch_length_T: int = 1, alpha: float = 1.0,
                 metrics_num_episodes_for_smoothing: int = 100, storage=None, **kwargs):
        if not alpha >= 0:
            raise AssertionError(f"alpha must be >= 0, not {alpha}")
        # (Through the prioritized buffer's __init__, which sets the rest.)
        MultiAgentEpisodeReplayBuffer.__init__(
            self, capacity=capacity, batch_size_B=batch_size_B, batch_length_T=batch_length_T,
            metrics_num_episodes_for_smoothing=metrics_num_episodes_for_smoothing,
            storage=storage)
        self._alpha = alpha
        self._module_to_max_priority = collections.defaultdict(lambda: 1.0)
        self._module_to_last_sampled_indices = collections.defaultdict(list)
        self._module_to_last_sampled_keys = collections.defaultdict(list)
        self._weight_per_module: dict = {}

    def _new_store(self, capacity, storage) -> Store:
        return PrioritizedEpisodeReplayBuffer._new_store(self, capacity, storage)

    def _new_module_store(self) -> Store:
        return Store(self.capacity, prioritized=True, tree_size=_tree_size(self.capacity),
                     storage=self._storage)

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
        picks = store.draw_prioritized(draws, batch_size_B, n_step, beta,
                                       self.get_num_timesteps(module_id))
        self._module_to_last_sampled_indices[module_id].extend(picks.leaves)
        self._module_to_last_sampled_keys[module_id].extend(
            store.priorities.keys_of(picks.leaves))
        return picks, picks.weights

    def update_priorities(self, priorities, module_id) -> None:
        """Sets the priorities of `module_id`'s timesteps drawn since the
        last update (in their order): max(p, 1e-12) ** alpha; a timestep
        evicted since it was drawn is skipped. Checked first (AssertionError
        for a wrong count, ValueError for a negative, NaN or infinite
        priority)."""
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
        self._last_sampled_indices = _sampled_leaves(state["_last_sampled_indices"],
                                                     store.priorities)
        self._module_to_max_priority = collections.defaultdict(lambda: 1.0, maxima)
        self._module_to_last_sampled_indices = collections.defaultdict(list, last)
        self._module_to_last_sampled_keys = collections.defaultdict(list, {
            m: modules[m].priorities.keys_of(leaves) for m, leaves in last.items()})


def _tree_values(tree) -> list:
    """A segment tree's node values from its state: a list, or RLlib's tree
    object (what its multi-agent buffer puts in its state) or ours."""
    if isinstance(tree, list):
        return tree
    if hasattr(tree, "get_state"):
        return tree.get_state()
    raise ValueError(f"a segment tree's state is a list of values, not {type(tree).__name__}")
