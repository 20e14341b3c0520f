"""An episode as Minari stores it, checked against the dataset's spaces:
one array of rows per leaf, the rewards and per-step flags, the infos as
one array per leaf, the extra model outputs."""
from __future__ import annotations

from typing import Any, Dict

import gymnasium as gym
import numpy as np

from episode._column import Column
from episode._episode import EpisodeCore
from episode.offline.minari.layout import _EXTRAS
from episode.offline.minari.spaces import _kinds, _Leaf
from episode.single_agent_episode import SingleAgentEpisode


# Rewards are checked as a leaf of this space is.
_SCALAR_REWARD = _Leaf((), gym.spaces.Box(-np.inf, np.inf, (), np.float64))


def _as_ours(episode: Any, k: int) -> EpisodeCore:
    if isinstance(episode, EpisodeCore):
        return episode
    if hasattr(episode, "agent_episodes"):
        raise ValueError(f"episode {k} is a multi-agent episode: Minari's datasets are "
                         f"single-agent")
    if hasattr(episode, "get_state") and hasattr(episode, "extra_model_outputs"):
        return SingleAgentEpisode.from_state(episode.get_state())
    raise TypeError(f"episode {k} is a {type(episode).__name__}, not a SingleAgentEpisode")


def _track_rows(storage: Any, space: gym.Space, leaves: Dict[tuple, _Leaf], rows: int,
                what: str) -> dict:
    """{leaf path: its rows} of one track: its storage (a tree of Columns
    shaped like the space, or a Column of whole items) checked against the
    space, leaf by leaf (an array of the leaf's rows, or strings)."""
    out: dict = {}

    def label(path: tuple) -> str:
        return what + "".join(f"[{p!r}]" for p in path)

    def keys_of(space: gym.Space) -> list:
        return (list(space.spaces) if isinstance(space, gym.spaces.Dict)
                else list(range(len(space.spaces))))

    def fits(node: Any, space: gym.Space) -> bool:
        if isinstance(space, gym.spaces.Dict):
            return isinstance(node, dict) and set(node) == set(space.spaces)
        return isinstance(node, tuple) and len(node) == len(space.spaces)

    def walk(node: Any, space: gym.Space, path: tuple) -> None:
        if not isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
            if not isinstance(node, Column):
                raise ValueError(f"{label(path)} holds a Dict/Tuple; its space is {space}")
            out[path] = _column_rows(node, leaves[path], rows, label(path))
        elif isinstance(node, Column):
            walk_items(node.to_list(), space, path)
        elif fits(node, space):
            for key in keys_of(space):
                walk(node[key], space[key], path + (key,))
        else:
            raise ValueError(f"{label(path)} does not have the structure of its space {space}")

    def walk_items(items: list, space: gym.Space, path: tuple) -> None:
        # Whole items per step (an object-path Column): split them leaf by leaf.
        if not isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
            out[path] = _stacked(items, leaves[path], rows, label(path))
            return
        for item in items:
            if not fits(item, space):
                raise ValueError(f"{label(path)} holds an item without the structure of its "
                                 f"space {space}: {item!r:.100}")
        for key in keys_of(space):
            walk_items([item[key] for item in items], space[key], path + (key,))

    walk(storage, space, ())
    return out


def _column_rows(col: Column, leaf: _Leaf, rows: int, what: str) -> Any:
    if len(col) != rows:
        raise ValueError(f"{what} holds {len(col)} rows, not {rows}")
    if leaf.kind != "text" and col.is_typed:
        arr = col.view()
        if arr is not None:
            return _checked_rows(arr, leaf, rows, what)
    return _stacked(col.to_list(), leaf, rows, what)


def _stacked(values: list, leaf: _Leaf, rows: int, what: str) -> Any:
    """Per-step values of a leaf as its rows (strings for a Text space)."""
    if len(values) != rows:
        raise ValueError(f"{what} holds {len(values)} rows, not {rows}")
    if leaf.kind == "text":
        if not all(isinstance(v, str) for v in values):
            raise ValueError(f"{what} holds other values than strings (its space is "
                             f"{leaf.space})")
        return list(values)
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError, OverflowError):
        arr = None
    if arr is None or arr.dtype.kind == "O":
        raise ValueError(f"{what} holds values that are not rows of shape {leaf.shape}")
    return _checked_rows(arr, leaf, rows, what)


def _checked_rows(arr: np.ndarray, leaf: _Leaf, rows: int, what: str) -> np.ndarray:
    if arr.shape != (rows,) + leaf.shape:
        raise ValueError(f"{what} has rows of shape {arr.shape[1:]}, but its space "
                         f"{leaf.space} has {leaf.shape}")
    if arr.dtype.kind not in leaf.dtype_kinds or arr.dtype.fields:
        raise ValueError(f"{what} holds {arr.dtype} values; its space {leaf.space} holds "
                         f"{_kinds(leaf.dtype_kinds)} values")
    return np.ascontiguousarray(arr)


def _extra_rows(buf: Any, n: int, what: str) -> np.ndarray:
    """An extra model output's rows: numbers, any row shape."""
    tree = buf._tree
    if not isinstance(tree, Column):
        raise ValueError(f"{what} is a Dict/Tuple: Minari's layout keeps arrays of numbers")
    arr = tree.view() if tree.is_typed else None
    if arr is None:
        try:
            arr = np.asarray(tree.to_list())
        except (ValueError, TypeError, OverflowError):
            arr = None
    if arr is None or arr.dtype.kind not in "biuf" or len(arr) != n:
        raise ValueError(f"{what} is not {n} rows of numbers")
    return np.ascontiguousarray(arr)


def _episode_tracks(ep: EpisodeCore, k: int, obs_space: gym.Space, action_space: gym.Space,
                    obs_leaves: Dict[tuple, _Leaf], action_leaves: Dict[tuple, _Leaf]) -> dict:
    """An episode's data as Minari stores it, checked against the spaces:
    leaf arrays, rewards and per-step flags, the infos as one array per
    leaf, the extras."""
    where = f"episode {k}"
    if ep.t_started != 0:
        raise ValueError(f"{where} starts at t={ep.t_started}: Minari keeps whole episodes "
                         f"from their reset (t_started == 0)")
    bufs = [ep.observations, ep.infos, ep.actions, ep.rewards,
            *ep.extra_model_outputs.values()]
    if any(b.lookback for b in bufs):
        raise ValueError(f"{where} has lookback rows: Minari has no place for them (give "
                         f"the episode from its reset, without lookback)")
    n = len(ep)
    if len(ep.observations) != n + 1:
        raise ValueError(f"{where} has no reset observation: Minari keeps episodes from "
                         f"their reset")
    if n == 0:
        raise ValueError(f"{where} has no steps: Minari's readers need one step or more per "
                         f"episode")
    obs = _track_rows(ep.observations._tree, obs_space, obs_leaves, n + 1,
                      f"{where}: observations")
    actions = _track_rows(ep.actions._tree, action_space, action_leaves, n,
                          f"{where}: actions")
    if isinstance(ep.rewards._tree, Column):
        rewards = _column_rows(ep.rewards._tree, _SCALAR_REWARD, n, f"{where}: rewards")
    else:
        raise ValueError(f"{where}: rewards are numbers, one per step")
    terminations, truncations = np.zeros(n, np.bool_), np.zeros(n, np.bool_)
    if n:
        terminations[-1], truncations[-1] = bool(ep.is_terminated), bool(ep.is_truncated)
    extras = {}
    for key, buf in ep.extra_model_outputs.items():
        what = f"{where}: {_EXTRAS}[{key!r}]"
        if not isinstance(key, str) or key in ("", ".") or "/" in key:
            raise ValueError(f"{what}: Minari's layout names them by strings without '/' "
                             f"(HDF5 names)")
        extras[key] = _extra_rows(buf, n, what)
    return {"obs": obs, "actions": actions, "rewards": rewards, "terminations": terminations,
            "truncations": truncations, "infos": _infos_tree(ep.get_infos(), f"{where}: infos"),
            "extras": extras, "n": n, "id_": ep.id_}


def _infos_tree(infos: list, what: str) -> dict:
    """The per-step info dicts as one array per leaf (Minari's form). Every
    step's info has one structure, as Minari keeps it."""
    first = infos[0]
    if not isinstance(first, dict):
        raise ValueError(f"{what}: an info is a dict, not {type(first).__name__}")
    return _info_leaves(infos, what)


def _info_leaves(values: list, what: str) -> dict:
    keys = list(values[0])
    out = {}
    for step, info in enumerate(values):
        if not isinstance(info, dict) or list(info) != keys:
            raise ValueError(f"{what}: step {step}'s info has keys "
                             f"{list(info) if isinstance(info, dict) else type(info).__name__}"
                             f", the reset's {keys}: Minari keeps one structure per episode")
    for key in keys:
        sub = f"{what}[{key!r}]"
        if not isinstance(key, str) or key in ("", ".") or "/" in key:
            raise ValueError(f"{sub}: Minari's layout names info keys by strings without '/' "
                             f"(HDF5 names)")
        column = [info[key] for info in values]
        head = column[0]
        if isinstance(head, dict):
            out[key] = _info_leaves(column, sub)
            continue
        kind = type(head)
        if any(type(v) is not kind for v in column):
            raise ValueError(f"{sub} changes type between steps: Minari stores one array "
                             f"per info key")
        if kind is str:
            out[key] = column
            continue
        if not (kind in (bool, int, float) or isinstance(head, (np.generic, np.ndarray))):
            raise ValueError(f"{sub} is a {kind.__name__}: Minari stores numbers, numpy "
                             f"arrays, strings and dicts of them")
        try:
            arr = np.asarray(column)
        except (ValueError, OverflowError):
            arr = None
        if arr is None or arr.dtype.kind not in "biuf" or arr.ndim < 1 or (
                isinstance(head, np.ndarray) and any(
                    v.dtype != head.dtype or v.shape != head.shape for v in column)) or (
                isinstance(head, np.generic) and any(v.dtype != head.dtype for v in column)):
            raise ValueError(f"{sub} does not stack into one array of numbers (a dtype or "
                             f"shape that changes between steps?)")
        out[key] = arr
    return out


def _same_dtypes(tracks: list, obs_leaves: list, action_leaves: list) -> None:
    """Every episode stores a leaf in one dtype: a dataset has one schema."""
    for key, leaves in (("obs", obs_leaves), ("actions", action_leaves)):
        for leaf in leaves:
            if leaf.kind == "text":
                continue
            dtypes = {t[key][leaf.path].dtype for t in tracks}
            if len(dtypes) > 1:
                raise ValueError(f"{leaf.describe(key)} is stored as "
                                 f"{sorted(map(str, dtypes))} in different episodes: a "
                                 f"dataset has one dtype per leaf")
