"""add_transition(): transitions of one env or of a vector env's envs
(SB3's and cpprb's way of adding) into the single-agent buffers' episodes.

Each env has an open episode; a step joins it as add() of the one-step
chunk [obs, next_obs] (numpy'ized) would, and a done step closes it. The
next observation of a step is the next step's observation, stored once:
a step of an open episode must start from its last next_obs. Once the
store has its layout, the steps go into it in one compiled call
(Store.add_steps), else as chunks through add(); both store the same."""
from __future__ import annotations

import uuid
from typing import Any, Dict, List, Optional

import numpy as np

from episode._column import Column
from episode._episode import make_episode
from episode.single_agent_episode import SingleAgentEpisode
from episode.replay.metrics import _AddCounts


def _new_id() -> str:
    """A new episode's id (SingleAgentEpisode's kind: a uuid4's hex)."""
    return uuid.uuid4().hex


class _OpenEpisodes:
    """The episode each env's next step joins."""

    def __init__(self, n: int):
        self.n = n
        self.ids: List[Optional[str]] = [None] * n     # None: its next step starts one
        self.going = np.zeros(n, np.bool_)             # ids[i] is not None
        self.t = np.zeros(n, np.int64)                 # its steps so far (0 where none)
        self.last_obs: Optional[list] = None           # per obs leaf: the envs' next_obs (bytes, dtype, shape)
        self.last_infos: list = [{}] * n

    def kept(self) -> Dict[str, Any]:
        """The open episodes as data (a kept buffer's metadata)."""
        return {"n": self.n, "ids": list(self.ids), "going": self.going, "t": self.t,
                "last_obs": None if self.last_obs is None else
                [[data, dtype, list(shape)] for data, dtype, shape in self.last_obs],
                "last_infos": list(self.last_infos)}

    @classmethod
    def restored(cls, state: Any) -> "_OpenEpisodes":
        """kept()'s open episodes back (ValueError for anything else)."""
        bad = ValueError("the saved open episodes of add_transition() are not ones")
        if type(state) is not dict or set(state) != {"n", "ids", "going", "t", "last_obs",
                                                     "last_infos"}:
            raise bad
        n = state["n"]
        if type(n) is not int or n < 1:
            raise bad
        ids, going, t, infos = state["ids"], state["going"], state["t"], state["last_infos"]
        if type(ids) is not list or len(ids) != n or \
                not all(i is None or type(i) is str for i in ids) or \
                type(infos) is not list or len(infos) != n or \
                not all(type(i) is dict for i in infos):
            raise bad
        for array, dtype in ((going, np.bool_), (t, np.int64)):
            if type(array) is not np.ndarray or array.dtype != dtype or array.shape != (n,):
                raise bad
        last_obs = state["last_obs"]
        if last_obs is not None:
            if type(last_obs) is not list:
                raise bad
            for leaf in last_obs:
                if type(leaf) is not list or len(leaf) != 3 or type(leaf[0]) is not bytes or \
                        not isinstance(leaf[1], np.dtype) or type(leaf[2]) is not list or \
                        not leaf[2] or leaf[2][0] != n or \
                        not all(type(d) is int and 0 <= d < 1 << 40 for d in leaf[2]) or \
                        len(leaf[0]) != leaf[1].itemsize * int(np.prod(leaf[2])):
                    raise bad
            last_obs = [(data, dtype, tuple(shape)) for data, dtype, shape in last_obs]
        out = cls(n)
        out.ids, out.going, out.t = ids, np.array(going), np.array(t)
        out.last_obs, out.last_infos = last_obs, infos
        return out


def _structure_of(value) -> Any:
    # A track's nesting as the store's layout spells it (leaf numbers aside).
    if isinstance(value, dict):
        return {k: _structure_of(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_structure_of(v) for v in value)
    return 0


def _flat(value, structure, what: str) -> list:
    """The leaves of `value` in `structure`'s order (a dict's keys, a
    tuple's items); ValueError where its nesting differs."""
    if isinstance(structure, dict):
        if not isinstance(value, dict) or list(value) != list(structure):
            raise ValueError(f"{what} must be a dict with the keys {list(structure)}, "
                             f"as the stored ones, not {_describe(value)}")
        return [leaf for k, s in structure.items() for leaf in _flat(value[k], s, f"{what}[{k!r}]")]
    if isinstance(structure, tuple):
        if not isinstance(value, tuple) or len(value) != len(structure):
            raise ValueError(f"{what} must be a tuple of {len(structure)} items, as the stored "
                             f"ones, not {_describe(value)}")
        return [leaf for i, (v, s) in enumerate(zip(value, structure))
                for leaf in _flat(v, s, f"{what}[{i}]")]
    if isinstance(value, (dict, tuple)):
        raise ValueError(f"{what} must be an array, as the stored ones, not {_describe(value)}")
    return [value]


def _describe(value) -> str:
    if isinstance(value, dict):
        return f"a dict with the keys {list(value)}"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} items"
    return type(value).__name__


def _rows(leaves: list, n: int, single: bool, what: str) -> list:
    """Each leaf as an array with the env axis first (added for a single
    transition); ValueError where a leaf has no n rows."""
    out = []
    for leaf in leaves:
        try:
            array = np.asarray(leaf)
        except Exception as error:      # noqa: BLE001 - what numpy cannot take
            raise TypeError(f"{what}: {type(leaf).__name__} is no array") from error
        if array.dtype.kind not in "biuf":
            raise TypeError(f"{what} must be numbers or arrays of numbers, not {array.dtype} "
                            f"(add() episodes for other data)")
        if single:
            array = array[None]
        elif array.ndim == 0 or array.shape[0] != n:
            raise ValueError(f"{what} must have the {n} envs' rows first, not shape "
                             f"{array.shape}")
        out.append(np.ascontiguousarray(array))
    return out


def _flags(value, shape, what: str) -> np.ndarray:
    array = np.asarray(value)
    if array.shape != shape:
        raise ValueError(f"{what} must be of shape {shape}, as the rewards, not {array.shape}")
    if array.dtype.kind in "iu" and array.size and not np.isin(array, (0, 1)).all():
        raise ValueError(f"{what} must be bools (or 0/1), not {array.ravel()[:4]}...")
    if array.dtype.kind not in "biu" and array.size:
        raise TypeError(f"{what} must be bools, not {array.dtype}")
    return np.ascontiguousarray(array.reshape(-1), np.bool_)


def add_transitions(buffer, obs, next_obs, action, reward, terminated, truncated,
                    infos) -> None:
    """EpisodeReplayBuffer.add_transition() (see there): checked first, then
    stored; a refused call changes nothing."""
    reward = np.asarray(reward)
    if reward.dtype.kind not in "biuf":
        raise TypeError(f"reward must be real numbers, not {reward.dtype}")
    if reward.ndim > 1:
        raise ValueError(f"reward must be one number, or one per env, not of shape "
                         f"{reward.shape}")
    single = reward.ndim == 0
    n = 1 if single else reward.shape[0]
    if n == 0:
        raise ValueError("add_transition() of no envs' steps")
    open_ = buffer.__dict__.get("_open_episodes")
    if open_ is not None and open_.n != n:
        raise ValueError(f"the buffer's transitions come from {open_.n} envs; this call has "
                         f"{n}")
    terminated = _flags(terminated, reward.shape, "terminated")
    truncated = _flags(truncated, reward.shape, "truncated")
    rewards = [np.ascontiguousarray(reward.reshape(n))]
    layout = buffer._store.layout
    obs_structure = layout["obs"] if layout["obs"] is not None else _structure_of(obs)
    act_structure = layout["actions"] if layout["actions"] is not None else \
        _structure_of(action)
    obs_rows = _rows(_flat(obs, obs_structure, "obs"), n, single, "obs")
    next_rows = _rows(_flat(next_obs, obs_structure, "next_obs"), n, single, "next_obs")
    act_rows = _rows(_flat(action, act_structure, "action"), n, single, "action")
    for a, b in zip(obs_rows, next_rows):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(f"next_obs must be alike obs: {b.dtype} {b.shape} against "
                             f"{a.dtype} {a.shape}")
    if infos is not None:
        infos = [infos] if single else list(infos)
        if len(infos) != n or not all(isinstance(i, dict) for i in infos):
            raise TypeError(f"infos must be None or {'a dict' if single else f'{n} dicts'}")
    if open_ is None:
        open_ = _OpenEpisodes(n)
    going = open_.going
    if open_.last_obs is not None:
        for a, (data, dtype, shape) in zip(obs_rows, open_.last_obs):
            if a.dtype == dtype and a.tobytes() == data:    # (the common case)
                continue
            last = np.frombuffer(data, dtype).reshape(shape)
            same = (a == last).reshape(n, -1).all(axis=1) | ~going
            if not same.all():
                env = int(np.argmin(same))
                raise ValueError(f"env {env}: obs is not the next_obs of its previous "
                                 f"transition; a step of an ongoing episode starts where the "
                                 f"last one ended (a new episode starts after a terminated "
                                 f"or truncated step)")
    ids = open_.ids if None not in open_.ids else \
        [i if i is not None else _new_id() for i in open_.ids]
    t = open_.t
    counts = _AddCounts()
    # (The compiled path writes whole observation rows: a frame-stacked
    # store takes its frames through add().)
    if layout["obs"] is not None and layout["actions"] is not None and \
            layout["rewards"] is not None and buffer._stacked() is None and \
            buffer._add_steps(ids, t, _numbered(obs_rows, layout["obs"]),
                              _numbered(next_rows, layout["obs"]),
                              _numbered(act_rows, layout["actions"]), rewards, terminated,
                              truncated, infos, _first_infos(open_), counts):
        buffer._log_add(counts)
    else:
        # (Nothing stored yet, or arrays unlike the stored ones: add() of
        # the chunks lays the tracks out, or says what does not match.)
        buffer.add([_chunk(i, ids[i], int(t[i]), obs_structure, act_structure, obs_rows,
                           next_rows, act_rows, rewards[0], terminated[i], truncated[i],
                           open_.last_infos[i] if going[i] else {},
                           infos[i] if infos is not None else {})
                    for i in range(n)])
    # Stored: the envs' episodes move on.
    # (np.count_nonzero and bytes: a few hundred ns where .any(), .all(),
    # np.where and array copies cost microseconds on a vector env's rows.)
    done = terminated | truncated
    open_.t = t + 1
    if np.count_nonzero(done):
        open_.ids = [None if d else i for i, d in zip(ids, done.tolist())]
        open_.t[done] = 0
    else:
        open_.ids = ids
    open_.going = ~done
    open_.last_obs = [(rows.tobytes(), rows.dtype, rows.shape) for rows in next_rows]
    open_.last_infos = infos if infos is not None else [{}] * n
    buffer.__dict__["_open_episodes"] = open_


def _first_infos(open_: _OpenEpisodes) -> Optional[list]:
    """The infos of each env's obs, for a step that starts a stored
    episode: its open episode's last ones (one that was evicted while open
    goes on as a new stored episode), none where its episode starts."""
    if not any(open_.last_infos):
        return None
    return [infos if going else {} for infos, going in zip(open_.last_infos, open_.going.tolist())]


def _numbered(leaves: list, structure) -> list:
    """A track's leaves (in its nesting's order) in the order of the
    store's leaf numbers (dm-tree's: a dict's keys sorted)."""
    if isinstance(structure, int):
        return leaves
    numbers: list = []

    def collect(s):
        if isinstance(s, dict):
            for v in s.values():
                collect(v)
        elif isinstance(s, tuple):
            for v in s:
                collect(v)
        else:
            numbers.append(s)
    collect(structure)
    return [leaf for _, leaf in sorted(zip(numbers, leaves), key=lambda pair: pair[0])]


def _tree(structure, leaves: list, pick) -> Any:
    # `structure` rebuilt with pick(leaf array) in the leaves' order.
    it = iter(leaves)

    def build(s):
        if isinstance(s, dict):
            return {k: build(v) for k, v in s.items()}
        if isinstance(s, tuple):
            return tuple(build(v) for v in s)
        return pick(next(it))
    return build(structure)


def _chunk(i: int, id_: str, t: int, obs_structure, act_structure, obs_rows, next_rows,
           act_rows, rewards, terminated, truncated, first_infos, infos):
    """Env i's step as a numpy'ized one-step episode (what add() takes)."""
    obs = _tree(obs_structure, [np.stack([a[i], b[i]]) for a, b in zip(obs_rows, next_rows)],
                Column.from_array)
    actions = _tree(act_structure, [a[i:i + 1].copy() for a in act_rows], Column.from_array)
    return make_episode(SingleAgentEpisode, id_, obs, Column.from_list([first_infos, infos]),
                        actions, Column.from_array(rewards[i:i + 1].copy()), {}, (0, 0, 0, 0, 0),
                        bool(terminated), bool(truncated) and not bool(terminated), t, None,
                        None)
