"""The replay buffers' metrics: RLlib's names and reductions, logged in
bulk (a few calls per key and read, instead of RLlib's ~26 log_value()
calls per add()), through RLlib's MetricsLogger where RLlib is loaded and
a small logger of ours where it is not."""
from __future__ import annotations

import collections
import sys
from typing import Any, Dict, Optional

import numpy as np


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
        # key -> (reduce, window, values), keys in the order first logged;
        # an _AddTally under its own class where add() counts were tallied.
        self.entries: Dict[Any, Any] = {}

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

    def tally_add(self, counts: "_AddCounts", episodes_stored: int, steps_stored: int,
                  window: Optional[int]) -> None:
        """A single-agent add()'s counts, as its ~26 log() calls under
        RLlib's keys (see _AddTally) would fold them."""
        tally = self.entries.get(_AddTally)
        if tally is None:
            tally = self.entries[_AddTally] = _AddTally(window)
        tally.adds += 1
        tally.episodes_added += counts.episodes_added
        tally.episodes_evicted += counts.episodes_evicted
        tally.env_steps_added += counts.env_steps_added
        tally.env_steps_evicted += counts.env_steps_evicted
        tally.agent_steps_added += counts.agent_steps_added
        tally.agent_steps_evicted += counts.agent_steps_evicted
        tally.episodes_stored.append(episodes_stored)
        tally.steps_stored.append(steps_stored)

    def flush(self, logger) -> None:
        entries, self.entries = self.entries, {}
        for key, entry in entries.items():
            if key is _AddTally:
                entry.flush(logger)
                continue
            reduce, window, values = entry
            for value in values:
                logger.log_value(key, value, reduce=reduce, window=window)


class _AddTally:
    """Single-agent add() counts since the metrics were last read: sums,
    and the windowed stored sizes. Handed to the logger as _Unlogged.log()
    of each add()'s values would hand them (RLlib's keys, in the order its
    add() logs them, DEFAULT_AGENT_ID's and DEFAULT_MODULE_ID's own), for a
    few additions per add() instead of ~26 calls."""

    __slots__ = ("adds", "episodes_added", "episodes_evicted", "env_steps_added",
                 "env_steps_evicted", "agent_steps_added", "agent_steps_evicted", "window",
                 "episodes_stored", "steps_stored")

    def __init__(self, window: Optional[int]):
        self.adds = self.episodes_added = self.episodes_evicted = 0
        self.env_steps_added = self.env_steps_evicted = 0
        self.agent_steps_added = self.agent_steps_evicted = 0
        self.window = window
        self.episodes_stored: collections.deque = collections.deque(maxlen=window)
        self.steps_stored: collections.deque = collections.deque(maxlen=window)

    def flush(self, logger) -> None:
        from episode.replay.stored import DEFAULT_AGENT_ID, DEFAULT_MODULE_ID

        # (One push stays a Python int; RLlib's "sum" of several is numpy's.)
        many = self.adds > 1
        window = self.window

        def pair(name, total, key=None):
            logger.log_value(name if key is None else (name, key),
                             np.int64(total) if many else total, reduce="sum", window=None)
            logger.log_value(f"{name}_lifetime" if key is None else (f"{name}_lifetime", key),
                             total, reduce="lifetime_sum", window=None)

        for value in self.episodes_stored:
            logger.log_value("num_episodes_stored", value, reduce="mean", window=window)
        pair("num_episodes_added", self.episodes_added)
        pair("num_episodes_evicted", self.episodes_evicted)
        for value in self.steps_stored:
            logger.log_value("num_env_steps_stored", value, reduce="mean", window=window)
        pair("num_env_steps_added", self.env_steps_added)
        pair("num_env_steps_evicted", self.env_steps_evicted)
        for kind, key in (("agent", DEFAULT_AGENT_ID), ("module", DEFAULT_MODULE_ID)):
            pair(f"num_{kind}_episodes_added", self.episodes_added, key)
            pair(f"num_{kind}_steps_added", self.agent_steps_added, key)
            pair(f"num_{kind}_episodes_evicted", self.episodes_evicted, key)
            pair(f"num_{kind}_steps_evicted", self.agent_steps_evicted, key)


def _metrics_logger():
    # RLlib's own logger where RLlib is loaded (its algorithms aggregate the
    # buffer's metrics); importing ray only for it would cost seconds.
    module = sys.modules.get("ray.rllib.utils.metrics.metrics_logger")
    if module is None and "ray.rllib" in sys.modules:
        import importlib

        module = importlib.import_module("ray.rllib.utils.metrics.metrics_logger")
    return module.MetricsLogger(root=False) if module is not None else _Logger()


def _reduced(logger) -> Dict[str, Any]:
    """logger.reduce(). RLlib's MetricsLogger walks its nested dict of Stats
    with dm-tree, which costs as much as reducing them (DQN reads the
    metrics after every draw); the same walk in plain recursion reduces each
    Stats the same way (reduce(compile=False)) into dicts of the same
    order. Any other logger reduces itself."""
    stats = getattr(logger, "stats", None)
    lock = getattr(logger, "_threading_lock", None)
    if type(logger).__name__ != "MetricsLogger" or type(stats) is not dict or lock is None:
        return logger.reduce()
    with lock:
        return _reduced_tree(stats, ())


def _reduced_tree(stats: dict, path: tuple) -> Dict[str, Any]:
    out = {}
    for key, value in stats.items():
        if type(value) is dict:
            out[key] = _reduced_tree(value, path + (key,))
            continue
        try:
            out[key] = value.reduce(compile=False)
        except Exception as error:
            # (RLlib's message: the stats and where they are.)
            raise ValueError(f"Error reducing stats {value} with compile=False at path "
                             f"{path + (key,)}.") from error
    return out


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


# -- kept in a folder (replay/kept.py): the logger as data -------------------------------

_RLLIB_LOGGER = "ray.rllib.utils.metrics.metrics_logger"


def kept_metrics(metrics) -> Dict[str, Any]:
    """A buffer's metrics as data: _kept_state()'s ("stats", module, RLlib's
    Stats by nested key) as each Stats' own get_state() (msgpack-ready by
    RLlib's design) by key path, in the logger's order (RLlib's
    MetricsLogger.get_state() sorts the keys, and the order is the order
    of the reduced metrics); or ("logger", None, our _Logger) as its stats."""
    kind, module, logger = metrics
    if kind == "stats":
        entries: list = []

        def walk(node: dict, path: list) -> None:
            for key, value in node.items():
                if type(value) is dict:
                    walk(value, path + [key])
                else:
                    entries.append([path + [key], value.get_state()])
        walk(logger, [])
        return {"rllib": entries}
    if type(logger) is not _Logger:
        raise TypeError(f"the buffer's metrics logger, a {type(logger).__name__}, is not kept")
    return {"ours": [[list(key), stats.reduce,
                      stats.values.maxlen if type(stats.values) is collections.deque else None,
                      list(stats.values), stats.lifetime]
                     for key, stats in logger.stats.items()]}


def restored_metrics(state: Any):
    """kept_metrics()'s logger back (ValueError for anything else)."""
    if type(state) is not dict or len(state) != 1:
        raise ValueError("the saved metrics are not a logger's")
    if "rllib" in state:
        import importlib

        logger = importlib.import_module(_RLLIB_LOGGER).MetricsLogger(root=False)
        if type(state["rllib"]) is not list:
            raise ValueError("the saved metrics are not RLlib's logger's")
        for entry in state["rllib"]:
            if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not list or \
                    not entry[0] or type(entry[1]) is not dict:
                raise ValueError("the saved metrics are not RLlib's logger's")
            path, stats_state = entry
            cls = logger.stats_cls_lookup.get(stats_state.get("stats_cls_identifier"))
            if cls is None:
                raise ValueError(f"the saved metrics hold a Stats of kind "
                                 f"{stats_state.get('stats_cls_identifier')!r:.40}, not RLlib's")
            try:
                stats = cls.from_state(state=stats_state)
            except Exception as error:     # noqa: BLE001 - RLlib's checks are asserts and lookups
                raise ValueError(f"the saved metrics are not RLlib's logger's: {error!r:.200}") \
                    from None
            node = logger.stats
            for key in path[:-1]:
                node = node.setdefault(key, {})
                if type(node) is not dict:
                    raise ValueError("the saved metrics are not RLlib's logger's")
            node[path[-1]] = stats
        return logger
    entries = state.get("ours")
    if type(entries) is not list:
        raise ValueError("the saved metrics are not a logger's")
    logger = _Logger()
    for entry in entries:
        if type(entry) is not list or len(entry) != 5:
            raise ValueError("the saved metrics are not a logger's")
        key, reduce, window, values, lifetime = entry
        if type(key) is not list or reduce not in ("mean", "sum", "lifetime_sum") or \
                not (window is None or (type(window) is int and window > 0)) or \
                type(values) is not list or not isinstance(lifetime, (int, float, np.number)):
            raise ValueError("the saved metrics are not a logger's")
        stats = _Stats(reduce, window)
        stats.values.extend(values)
        stats.lifetime = lifetime
        logger.stats[tuple(key)] = stats
    return logger
