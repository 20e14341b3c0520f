"""Episodes into and out of a Store: RLlib's episodes taken as ours, and
a stored episode (or a slice of it) made again as a SingleAgentEpisode of
its own data."""
from __future__ import annotations

import collections
import copy
from typing import Dict, Optional

import numpy as np

from episode._column import KINDS
from episode._episode import EpisodeCore
from episode._replay import Store, episode_fields, live_slots, rows_of
from episode.lookback_buffer import InfiniteLookbackBuffer
from episode.single_agent_episode import SingleAgentEpisode



DEFAULT_AGENT_ID = "default_agent"
DEFAULT_MODULE_ID = "default_policy"


def _as_ours(episode) -> SingleAgentEpisode:
    """Our episode for RLlib's (same state), ours as it is."""
    if isinstance(episode, EpisodeCore):
        return episode
    if hasattr(episode, "get_state") and hasattr(episode, "extra_model_outputs"):
        return SingleAgentEpisode.from_state(episode.get_state())
    raise TypeError(f"a replay buffer stores SingleAgentEpisodes, not {type(episode).__name__}")


_NUMBERS = (bool, int, float, np.bool_, np.integer, np.floating)
_PYTHON_DTYPES = (np.dtype(np.float64), np.dtype(np.int64), np.dtype(np.bool_))


def _numbers_as_numbers(episode: SingleAgentEpisode) -> SingleAgentEpisode:
    """`episode` with each list-mode track that holds Python and numpy
    numbers mixed (a list-mode chunk concatenated with a numpy'ized one, or
    an env that gives both) held as numbers of the dtype np.array() gives
    them, as RLlib's buffer batches them: a store keeps numbers, not
    objects. They come back as Python numbers where that dtype is Python's
    (float64, int64, bool), as list-mode steps do; RLlib's buffer keeps each
    step's own type. Else the episode as it is."""
    if episode.is_numpy:            # (every track numpy'd: no list-mode items)
        return episode
    tracks = [("observations", episode.observations), ("actions", episode.actions),
              ("rewards", episode.rewards),
              *((("extra_model_outputs", key), buf)
                for key, buf in episode.extra_model_outputs.items())]
    state = None
    for name, buf in tracks:
        column = getattr(buf, "_col", None)
        if buf.finalized or column is None or column.kind != KINDS["object"]:
            continue
        items = buf.data
        if not items or not all(isinstance(x, _NUMBERS) for x in items):
            continue
        numbers = np.array(items)
        numbers = numbers.tolist() if numbers.dtype in _PYTHON_DTYPES else list(numbers)
        state = state or episode.get_state()
        if isinstance(name, tuple):
            extras = state[name[0]] = dict(state[name[0]])
            extras[name[1]] = dict(extras[name[1]], data=numbers)
        else:
            state[name] = dict(state[name], data=numbers)
    return SingleAgentEpisode.from_state(state) if state is not None else episode


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
