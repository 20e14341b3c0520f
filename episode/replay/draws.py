"""What the buffers' draws share: the checks of their arguments (batch
size, n-step, gamma, capacity), the n-step transitions built as one-step
episodes over one batch array per leaf, and the columns a learner reads
back from those arrays (`replayed_columns`)."""
from __future__ import annotations

import collections
import difflib
import inspect
import warnings
from typing import Any, Dict, List, Optional

import numpy as np

from episode import _gather
from episode._gather import make_transitions
from episode._replay import Store, shares_batch
from episode.single_agent_episode import SingleAgentEpisode


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


def _warn_misspelt(buffer, init, kwargs: Dict[str, Any]) -> None:
    """The keyword arguments a buffer's constructor takes and ignores (as
    RLlib's do, for the other keys of a replay_buffer_config): a warning
    for each that is a close match of one of its own, likely misspelt
    (`alhpa=0.6`, `capcity=10`), which would otherwise pass unnoticed."""
    if not kwargs:
        return
    own = [name for name, p in inspect.signature(init).parameters.items()
           if p.kind is not p.VAR_KEYWORD]
    for key in kwargs:
        close = difflib.get_close_matches(str(key), own, n=1, cutoff=0.8)
        if close:
            warnings.warn(f"{type(buffer).__name__}() ignores the unknown keyword argument "
                          f"{key!r}; did you mean {close[0]!r}?", UserWarning, stacklevel=3)


def _check_not_empty(store: Store, error=ValueError) -> None:
    """A draw from a buffer with no timesteps: `error` (the class RLlib's
    buffer raises there) saying so, before anything is drawn."""
    if store.live_steps <= 0:
        raise error("sample(): the buffer holds no timesteps yet; add() episodes before "
                    "sampling")


class _NativeArgs(collections.namedtuple(
        "_NativeArgs", "batch_size n_step gamma beta T lookback min_T extras")):
    """sample_batch()'s arguments, checked once (before any draw)."""


def _native_args(prioritized: bool, batch_size, n_step, gamma, beta, batch_length_T, lookback,
                 min_batch_length_T, extras) -> _NativeArgs:
    """sample_batch()'s arguments checked and normalized; ValueError or
    TypeError for one it cannot use."""
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
    return _NativeArgs(batch_size, _checked_n_step(n_step), float(gamma), float(beta), T,
                       lookback, min_T, bool(extras))


def _check_capacity(capacity, prioritized: bool = False) -> None:
    if isinstance(capacity, (bool, np.bool_)) or not isinstance(capacity, (int, np.integer)):
        raise TypeError(f"capacity must be an int, not {type(capacity).__name__}")
    if capacity == 0 and prioritized:
        # (RLlib's prioritized buffer asserts on its trees' size.)
        raise AssertionError("capacity must be a positive number of timesteps, not 0")
    if capacity <= 0:
        raise ValueError(f"capacity must be a positive number of timesteps, not {capacity}")


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
    obs_pairs = {leaf: _gather.gather_pairs(store, picks, leaf) for leaf in _leaves_of(layout["obs"])}
    actions = {leaf: _gather.gather(store, picks, leaf) for leaf in _leaves_of(layout["actions"])}
    extra_arrays = {}
    if extras:
        for key, structure in layout["extras"].items():
            extra_arrays[key] = {leaf: _gather.gather(store, picks, leaf) for leaf in _leaves_of(structure)}
    infos = None
    if include_infos:
        first, last = _gather.gather_infos(store, picks), _gather.gather_infos(store, picks, True)
        infos = [x for pair in zip(first, last) for x in pair]
    returns = _gather.returns(store, picks, float(gamma))
    # The oldest recent draw hands over the episodes no one holds any more.
    spent = _RECENT.popleft().episodes if len(_RECENT) == _RECENT.maxlen else None
    episodes = make_transitions(SingleAgentEpisode, store, picks, obs_pairs, actions, returns,
                                extra_arrays, infos, weights, stored_ids, exact_end,
                                outputs_lookback, spent)
    _RECENT.append(_Replayed(episodes, layout, obs_pairs, actions, returns, extra_arrays))
    return episodes


class _Replayed:
    """A drawn batch of transitions and the episodes made of it (their data
    read in place from these arrays): what the learner's fast path builds a
    train batch from, as long as the episodes are unchanged."""

    def __init__(self, episodes, layout, obs_pairs, actions, returns, extras):
        # A list of its own: an episode only it holds is no one else's (see
        # make_transitions), whoever keeps the list sample() returned.
        self.episodes = list(episodes)
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


def _discounted(rewards: list, gamma: float) -> float:
    # scipy.signal.lfilter([1], [1, -gamma], rewards[::-1])[-1], in the same
    # float64 operations.
    acc = 0.0 + float(rewards[-1])
    for r in reversed(rewards[:-1]):
        acc = float(r) - (-gamma) * acc
    return np.float64(acc)
