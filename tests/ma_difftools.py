"""Helpers for comparing `episode.MultiAgentEpisode` with RLlib 2.60's class.

`MATwin` drives one multi-agent episode of each implementation through the
same calls and checks, after every call, that return values (difftools.compare;
an episode by its state), raised exception classes and the two episodes'
observable states agree.

Until our class exists, `ours_ma_class()` skips the calling test, unless
EPISODE_MA_SELFTEST=1 is set: then "ours" is RLlib's class as well, so the
harness and the generators can be run (RLlib against itself) today.

Ids: both sides make their own uuids for the agents' SingleAgentEpisodes (and
for the episode when no `id_` is given). A twin keeps a map from RLlib's ids to
ours (shared with the twins of episodes returned by cut/slice/from_state), and
an id must keep mapping to the same id on the other side.

State normalization (where RLlib's containers show read history, not data):
RLlib's `agent_t_started` and hanging-reward caches are defaultdicts that gain
entries when read; entries holding 0 and not backed by a hanging action are
dropped, and the per-agent dicts are compared in sorted key order. The
agent-to-module function is compared by what it returns for the episode's
agents, the timers by their types (None or float).

Known RLlib crashes: a call can pass `known(exc)`; where RLlib raises an
exception that `known` accepts, the results are not compared and RLlib's
episode is restored. If our episode changed in that call (it did the job RLlib
could not), the twin is marked `diverged`: the caller stops driving it. Every
RLlib exception seen is recorded in `CATALOG` (and appended as a JSON line to
the file named by EPISODE_MA_CATALOG, if set).
"""
from __future__ import annotations

import copy
import io
import math
import json
import os
import pickle
import traceback
from contextlib import redirect_stdout
from typing import Any, Callable, Optional

import gymnasium as gym
import numpy as np
import pytest

from difftools import Mismatch, Other, _buffers_as_states, _describe, _short, compare
from difftools import compare_episode_states

SELFTEST_VAR = "EPISODE_MA_SELFTEST"


def rllib_ma_class():
    """RLlib's MultiAgentEpisode class, or skip the calling test."""
    module = pytest.importorskip("ray.rllib.env.multi_agent_episode")
    return module.MultiAgentEpisode


def ours_ma_class():
    """Our MultiAgentEpisode; RLlib's under EPISODE_MA_SELFTEST=1 while ours is
    missing; otherwise the calling test is skipped."""
    try:
        from episode import MultiAgentEpisode
    except ImportError:
        if os.environ.get(SELFTEST_VAR) == "1":
            return rllib_ma_class()
        pytest.skip("episode.MultiAgentEpisode not built yet")
    return MultiAgentEpisode


def selftest() -> bool:
    """Whether "ours" is RLlib's class (the harness run against itself)."""
    return ours_ma_class() is rllib_ma_class()


# -- the catalog of RLlib exceptions ---------------------------------------------------

CATALOG: list[dict] = []


def _frames(exc: BaseException) -> list:
    return traceback.extract_tb(exc.__traceback__)


def rllib_site(exc: BaseException) -> str:
    """Where in RLlib an exception came from: the innermost frame in
    multi_agent_episode.py and the innermost frame overall."""
    frames = _frames(exc)
    ma = [f for f in frames if f.filename.endswith("multi_agent_episode.py")]
    parts = []
    if ma:
        parts.append(f"{ma[-1].name}:{ma[-1].lineno}")
    if frames and (not ma or frames[-1] is not ma[-1]):
        f = frames[-1]
        parts.append(f"{os.path.basename(f.filename)}:{f.name}:{f.lineno}")
    return " -> ".join(parts)


def record(label: str, exc: BaseException, context: str = "", kind: str = "raised") -> None:
    log({"kind": kind, "call": label, "exc": type(exc).__name__,
         "msg": str(exc)[:300], "site": rllib_site(exc), "context": context[:4000],
         "tail": "".join(traceback.format_list(_frames(exc)[-3:]))[-1500:]})


def log(entry: dict) -> None:
    CATALOG.append(entry)
    path = os.environ.get("EPISODE_MA_CATALOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")


# -- deliberate checks vs. internal crashes ---------------------------------------------


def deliberate(exc: BaseException) -> bool:
    """Whether RLlib raised `exc` on purpose (a check on the caller's input):
    MultiAgentEnvError, NotImplementedError, the ValueErrors of slice()/_get(),
    set_*()'s errors (an unknown agent, the single-agent episode's checks), RuntimeError of cut() on a done
    episode, the `assert`s at the top of add_env_reset/concat_episode/cut,
    the asserts of add_env_step on a broken step and the validation that ends
    it, and the buffers' IndexError for an index out of range (as in the
    single-agent episode)."""
    name = type(exc).__name__
    if name in ("MultiAgentEnvError", "NotImplementedError"):
        return True
    site = rllib_site(exc)
    first = site.split(" -> ")[0]
    if isinstance(exc, ValueError) and (first.startswith("slice:")
                                        or first.startswith("_get:")):
        return True
    if first.startswith("set_"):
        return True  # set_*() hands each agent's data to its episode: its checks
    if isinstance(exc, RuntimeError) and "already done" in str(exc):
        return True
    if isinstance(exc, AssertionError) and " -> " not in site and first.split(":")[0] in (
            "add_env_reset", "add_env_step", "concat_episode", "cut"):
        return True
    if isinstance(exc, AssertionError) and first.startswith("validate:") and any(
            f.name == "add_env_step" for f in _frames(exc)):
        return True  # the validation that ends add_env_step (a step losing an extra output)
    if isinstance(exc, ValueError) and "gym.Space was NOT provided" in str(exc):
        return True  # one_hot_discrete without a space, as in the single-agent episode
    if isinstance(exc, KeyError) and exc.args and exc.args[0] in _asked_keys(exc):
        return True  # an extra-model-output key the agent does not have
    if isinstance(exc, IndexError) and "infinite_lookback_buffer.py:_get_int_index:" in site \
            and not _own_indices(exc):
        return True  # the buffer's own range check on the caller's index
    return False


# RLlib's methods that take no index from the caller (or make their own).
_NO_CALLER_INDEX = ("cut", "slice", "__getitem__", "get_agents_to_act",
                    "get_agents_that_stepped", "concat_episode")


def _own_indices(exc: BaseException) -> bool:
    """Whether an exception came from indices RLlib made itself: raised inside
    cut()/slice()/concat_episode() or the agents-to-act sets (at any depth),
    or in a getter called without indices."""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_filename.endswith("multi_agent_episode.py"):
            if frame.f_code.co_name in _NO_CALLER_INDEX:
                return True
            if frame.f_code.co_name == "_get" and frame.f_locals.get("indices") is None:
                return True
        tb = tb.tb_next
    return False


def _asked_keys(exc: BaseException) -> set:
    """The `key` arguments of the frames an exception passed through."""
    keys = set()
    tb = exc.__traceback__
    while tb is not None:
        loc = tb.tb_frame.f_locals
        for name in ("key", "extra_model_outputs_key"):
            if isinstance(loc.get(name), str):
                keys.add(loc[name])
        tb = tb.tb_next
    return keys


def known_rllib_crash(exc: BaseException) -> bool:
    """Every RLlib exception that is not a deliberate check: an internal crash."""
    return not deliberate(exc)


# -- an episode concatenated from its chunks ---------------------------------------------


def compare_joined_with_whole(joined: Any, whole: Any, path: str = "joined") -> None:
    """The chunks of an episode concatenated (`joined`) against the episode
    stepped whole: equal states and returns, where these are the same data
    told apart only by
    * the timers (an agent without a step in a chunk has none) and the order
      of the agents (a concatenation adds new agents in RLlib's set order);
    * a hanging action's extra outputs given as none: None where the step
      made it, {} where a chunk was made from lists (both RLlib's);
    * RLlib's add_env_step() gives an agent that ends without an
      observation a skip and its step at that env step (one entry too many;
      ours the same): where the whole has such an entry, the agents' steps
      in the mappings are compared, not the skips.
    Every agent's mapping has as many entries after its lookback as the
    whole's (the skips included). Raises Mismatch."""
    joined, whole = copy.deepcopy(joined), copy.deepcopy(whole)
    lengths = [{a: len(m.data) - m.lookback for a, m in ep.env_t_to_agent_t.items()}
               for ep in (joined, whole)]
    if lengths[0] != lengths[1]:
        raise Mismatch(f"{path}: env_t_to_agent_t lengths {lengths[0]} (joined) != "
                       f"{lengths[1]} (whole)")
    # One entry per env step (and the observation it starts from), one more
    # for an agent terminated without an observation (see above).
    for agent_id, n in lengths[0].items():
        episode = joined.agent_episodes.get(agent_id)
        allowed = {joined.env_t - joined.env_t_started + 1}
        if episode is not None and episode.is_terminated:
            allowed.add(joined.env_t - joined.env_t_started + 2)
        if n not in allowed:
            raise Mismatch(f"{path}: env_t_to_agent_t[{agent_id!r}] has {n} entries, not "
                           f"{sorted(allowed)}")
    expected = whole.env_t - whole.env_t_started + 1
    doubled = any(len(m.data) - m.lookback != expected for m in whole.env_t_to_agent_t.values())
    for ep in (joined, whole):
        ep._start_time = ep._last_step_time = None
        for agent_episode in ep.agent_episodes.values():
            agent_episode._start_time = agent_episode._last_step_time = None
        ep.agent_episodes = dict(sorted(ep.agent_episodes.items(), key=lambda kv: str(kv[0])))
        outputs = ep._hanging_extra_model_outputs_end
        for agent_id in list(outputs):
            if outputs[agent_id] == {}:
                outputs[agent_id] = None
        mapping = ep.env_t_to_agent_t
        for agent_id in sorted(mapping, key=str):
            steps = mapping.pop(agent_id)
            if doubled:
                steps = type(steps)(data=[t for t in steps.data if t != ep.SKIP_ENV_TS_TAG])
            mapping[agent_id] = steps
    compare_states(joined, whole, IdMap(), path)
    for hanging in (False, True):
        # (The type too: 0 and 0.0.)
        compare(joined.get_return(include_hanging_rewards=hanging),
                whole.get_return(include_hanging_rewards=hanging),
                f"{path}.get_return(include_hanging_rewards={hanging})")


# -- states ----------------------------------------------------------------------------


class IdMap:
    """RLlib id -> our id, for episodes and agent episodes (see module doc)."""

    def __init__(self):
        self.map: dict = {}

    def check(self, theirs_id: Any, ours_id: Any, path: str) -> None:
        if theirs_id in self.map:
            if self.map[theirs_id] != ours_id:
                raise Mismatch(f"{path}: RLlib id {theirs_id!r} maps to {self.map[theirs_id]!r} "
                               f"on our side before, now {ours_id!r}")
            return
        if ours_id in self.map.values() and theirs_id != ours_id:
            raise Mismatch(f"{path}: our id {ours_id!r} already stands for another RLlib id")
        self.map[theirs_id] = ours_id


def _plain(d: Any) -> dict:
    return dict(d) if d is not None else None


def _sorted(d: dict) -> list:
    return sorted(d.items(), key=lambda kv: str(kv[0]))


def _mapping_fn_results(fn: Any, ep: Any, agents: list) -> Any:
    if fn is None:
        return None
    out = []
    for aid in agents:
        try:
            out.append((aid, fn(aid, ep)))
        except Exception as e:  # noqa: BLE001
            out.append((aid, ("<raised>", type(e).__name__)))
    return out


def normalized_state(ep: Any, state: dict, theirs_side: bool) -> dict:
    """get_state() of `ep` with the normalization of the module doc (the ids
    are left in; compare_states maps them)."""
    state = dict(state)
    out = {}
    for key in ("_start_time", "_last_step_time"):
        v = state.pop(key, None)
        out[key] = None if v is None else type(v).__name__
    hanging = set(state.get("_hanging_actions_end") or {})
    agents = sorted({*ep.agent_episodes, *hanging}, key=str)
    out["agent_to_module_mapping_fn"] = _mapping_fn_results(
        state.pop("agent_to_module_mapping_fn", None), ep, agents)
    out["agent_t_started"] = _sorted({k: v for k, v in (state.pop("agent_t_started") or
                                                        {}).items() if v != 0})
    for key in ("_hanging_rewards_end", "_hanging_rewards_begin"):
        d = state.pop(key) or {}
        out[key] = _sorted({k: v for k, v in d.items()
                            if v != 0 or (key.endswith("end") and k in hanging)})
    out["_hanging_actions_end"] = _sorted(state.pop("_hanging_actions_end") or {})
    emo = state.pop("_hanging_extra_model_outputs_end") or {}
    out["_hanging_extra_model_outputs_end"] = _sorted(
        {k: v for k, v in emo.items() if k in hanging or v})
    out["_agent_to_module_mapping"] = _sorted(state.pop("_agent_to_module_mapping") or {})
    mapping = state.pop("env_t_to_agent_t") or {}
    out["env_t_to_agent_t"] = [(aid, _buffers_as_states(buf)) for aid, buf in mapping.items()]
    for key in ("observation_space", "action_space"):
        space = state.pop(key)
        out[key] = None if not space else [(k, repr(v)) for k, v in _sorted(dict(space))]
    out["agent_episodes"] = state.pop("agent_episodes")
    out.update(state)
    return out


def _extras_as_states(state: dict) -> dict:
    """A single-agent state whose length-0 extra-output buffers (RLlib keeps the
    buffer object there) are given as their states, as compare_episode_states
    does for RLlib's side; needed where "ours" is RLlib's class too."""
    extras = state.get("extra_model_outputs")
    if extras:
        state["extra_model_outputs"] = {
            k: v.get_state() if hasattr(v, "len_incl_lookback") else v
            for k, v in extras.items()}
    return state


def compare_states(ours_ep: Any, theirs_ep: Any, ids: IdMap, path: str,
                   ours_state: Optional[dict] = None, theirs_state: Optional[dict] = None) -> None:
    """get_state() of both episodes (or the states given), normalized, ids mapped."""
    ours = normalized_state(ours_ep, copy.deepcopy(
        ours_ep.get_state() if ours_state is None else ours_state), False)
    theirs = normalized_state(theirs_ep, copy.deepcopy(
        theirs_ep.get_state() if theirs_state is None else theirs_state), True)
    ids.check(theirs.pop("id_"), ours.pop("id_"), f"{path}.id_")
    o_agents, t_agents = ours.pop("agent_episodes"), theirs.pop("agent_episodes")
    compare([a for a, _ in o_agents], [a for a, _ in t_agents], f"{path}: agent_episodes keys")
    for (aid, o), (_, t) in zip(o_agents, t_agents):
        o, t = dict(o), dict(t)
        ids.check(t.pop("id_"), o.pop("id_"), f"{path}.agent_episodes[{aid!r}].id_")
        ids.check(t.pop("multi_agent_episode_id"), o.pop("multi_agent_episode_id"),
                  f"{path}.agent_episodes[{aid!r}].multi_agent_episode_id")
        compare_episode_states(_extras_as_states(o), t, f"{path}.agent_episodes[{aid!r}]")
    compare(ours, theirs, path)


def _safe(fn: Callable[[], Any]) -> Any:
    try:
        return ("ok", copy.deepcopy(fn()))
    except Exception as e:  # noqa: BLE001
        return ("raised", e)


# Read-only views compared after every call, beside get_state(): (method, args,
# kwargs); a name that is not callable is read as an attribute. RLlib's internal
# crashes there are not compared, nor the views known_wrong() names.
VIEWS = [
    ("__len__", (), {}), ("env_t", (), {}), ("env_t_started", (), {}), ("is_reset", (), {}),
    ("is_numpy", (), {}), ("is_done", (), {}), ("is_terminated", (), {}),
    ("is_truncated", (), {}), ("agent_ids", (), {}), ("env_steps", (), {}),
    ("agent_steps", (), {}), ("get_return", (), {}),
    ("get_return", (), {"include_hanging_rewards": True}),
    ("get_agents_to_act", (), {}), ("get_agents_that_stepped", (), {}),
    ("get_terminateds", (), {}), ("get_truncateds", (), {}),
    ("get_observations", (), {}), ("get_infos", (), {}), ("get_actions", (), {}),
    ("get_rewards", (), {}), ("get_observations", (-1,), {}),
    ("get_actions", (), {"env_steps": False}), ("get_rewards", (), {"return_list": True}),
    # (Hanging rewards show here, for agents without a step too.)
    ("get_rewards", (-1,), {"env_steps": False}),
]


# -- calls whose RLlib result is known to be wrong -----------------------------------


def _requested_agents(ep: Any, kwargs: dict) -> list:
    asked = kwargs.get("agent_ids")
    if asked is None or asked == []:
        return list(ep.agent_episodes)
    asked = [asked] if isinstance(asked, str) else list(asked)
    return [a for a in ep.agent_episodes if a in asked]


def _non_scalar(x: Any) -> bool:
    return isinstance(x, (dict, tuple, list)) or (isinstance(x, np.ndarray) and x.ndim > 0)


def known_wrong(ep: Any, method: str, args: tuple, kwargs: dict) -> Optional[str]:
    """Why RLlib's answer to `method(*args, **kwargs)` on its episode `ep` is
    known to be wrong (ours answers right there: the calls are not compared),
    or None. Each reason is pinned by an explicit test."""
    if method == "get_truncateds" and ep.is_terminated != ep.is_truncated:
        return "get_truncateds()['__all__'] is is_terminated"
    if method == "to_numpy" and any(len(sa) == 0 for sa in ep.agent_episodes.values()):
        return "to_numpy() skips agents without a completed step"
    if method in ("cut", "slice", "__getitem__", "to_numpy", "get_state", "set_observations",
                  "set_actions", "set_rewards", "set_extra_model_outputs") and _half_numpy(ep):
        return "half-converted episode"
    cut_rows = method == "cut" and (
        (args[0] if args else kwargs.get("len_lookback_buffer", 0)) or ep._hanging_actions_end)
    if (cut_rows or method in ("slice", "__getitem__")) and _late_extras(
            ep, list(ep.agent_episodes), None):
        return "extra outputs of a key new in the chunk read shifted by the lookback"
    if method in ("slice", "__getitem__"):
        reason = _slice_known_wrong(ep, method, args, kwargs)
        if reason:
            return reason
    if method == "add_env_step" and _ends_without_last_observation(ep, args, kwargs):
        return ("an agent of an episode built from lists or restored ends without an "
                "observation: RLlib drops its last step and its end")
    if method == "cut" and ep._hanging_actions_end and not ep.is_done:
        try:
            out = copy.deepcopy(ep).cut(**kwargs)
        except Exception:  # noqa: BLE001 - an exception is compared as one
            return None
        lost = [a for a in ep._hanging_actions_end if a not in out.agent_episodes]
        if lost:
            return f"cut() drops agents with a hanging action: {lost}"
    if method == "concat_episode" and args:
        other = _resolve(args, "theirs")[0]
        if _numpy_concat(ep, other):
            return ("concat_episode() into a numpy'ized agent episode, or of a numpy'ized "
                    "Dict/Tuple chunk (single-agent difference)")
        if any(a in other.agent_episodes and a not in other._hanging_actions_end
               for a in ep._hanging_actions_end):
            return "concat_episode() keeps a hanging action the successor took into a step"
    if method in ("set_observations", "set_actions") and _struct_space_set(ep, method, kwargs):
        return "set() on numpy'ized Dict/Tuple data checks each leaf against the whole space"
    if method in ("slice", "__getitem__", "cut") and (
            any(_non_scalar(v) for v in ep._hanging_actions_end.values())
            or any(_non_scalar(v) for outs in ep._hanging_extra_model_outputs_end.values()
                   for v in (outs or {}).values())):
        return "hanging non-scalar action/extra output np.append()ed flat into the piece"
    if method not in ("get_actions", "get_rewards", "get_extra_model_outputs",
                      "get_observations", "get_infos"):
        return None
    if _half_numpy(ep):
        return "half-converted episode: some agents' data still lists"
    agents = _requested_agents(ep, kwargs)
    env_steps = kwargs.get("env_steps", True)
    if kwargs.get("fill") is not None and _fill_without_space(ep, method, agents):
        return "fill rows without a space on numpy'ized rows (buffer difference)"
    if not env_steps and kwargs.get("neg_index_as_lookback") and _wraps_around(
            ep, method, _indices(method, args, kwargs), agents):
        return "negative index before a numpy'ized lookback wraps around (buffer difference)"
    if method == "get_extra_model_outputs" and env_steps and _late_extras(
            ep, agents, args[0] if args else kwargs.get("key")):
        return "extra outputs of a key new in the chunk read shifted by the lookback"
    if method == "get_extra_model_outputs":
        key = args[0] if args else kwargs.get("key")
        if any(k not in ep.agent_episodes[a].extra_model_outputs
               for a in agents
               for k in (ep._hanging_extra_model_outputs_end.get(a) or {})
               if key is None or k == key):
            # (Asked for, or read with all keys.)
            return "an extra-output key an agent has only as a hanging value"
    if method in ("get_observations", "get_infos"):
        return None
    if (not env_steps and kwargs.get("fill") is not None
            and isinstance(_indices(method, args, kwargs), slice)
            and any(not ep.agent_episodes[a].is_numpy and _hanging(ep, method, a) is not None
                    for a in agents)):
        return "list-mode fill added elementwise to np.append()ed rows"
    if env_steps and not kwargs.get("return_list") and any(
            ep.agent_t_started.get(a, 0) != ep.agent_episodes[a].observations.lookback
            for a in agents):
        return "env-step getters with agent_t_started != lookback"
    if method == "get_actions" and any(
            _non_scalar(ep._hanging_actions_end.get(a)) for a in agents):
        return "hanging non-scalar action np.append()ed flat"
    if method == "get_extra_model_outputs" and any(
            _non_scalar(v) for a in agents
            for v in (ep._hanging_extra_model_outputs_end.get(a) or {}).values()):
        return "hanging non-scalar extra output np.append()ed flat"
    return None


# -- where ours is right and RLlib's result is put right before comparing --------------


def _slice_bounds(ep: Any, method: str, args: tuple, kwargs: dict) -> Optional[tuple]:
    """(start, stop) of a slice()/[] call as the episode resolves them, or None."""
    sl = args[0] if args else kwargs.get("slice_", kwargs.get("item"))
    n = ep.env_t - ep.env_t_started
    if not isinstance(sl, slice) or sl.step not in (1, None) or n < 0:
        return None
    start, stop = sl.start, sl.stop
    start = 0 if start is None else max(n + start, 0) if start < 0 else min(start, n)
    stop = n if stop is None else max(n + stop, 0) if stop < 0 else min(stop, n)
    return start, stop


def _slice_known_wrong(ep: Any, method: str, args: tuple, kwargs: dict) -> Optional[str]:
    """Why RLlib's slice() of `ep` is known to be wrong, or None (each pinned
    in test_multi_agent_episode_rllib.py)."""
    bounds = _slice_bounds(ep, method, args, kwargs)
    if bounds is None:
        return None
    start, stop = bounds
    n = ep.env_t - ep.env_t_started
    tag = ep.SKIP_ENV_TS_TAG
    for agent_id, steps in ep.env_t_to_agent_t.items():
        if len(steps.data) - steps.lookback != n + 1:
            return ("slice() reads an agent's mapping from its first entry: one that "
                    "ended without an observation or joined in a chunk is read off")
    for agent_id, episode in ep.agent_episodes.items():
        steps = ep.env_t_to_agent_t[agent_id]
        if stop < len(steps) and steps[stop] != tag and episode.t == steps[stop] \
                and len(episode) != steps[stop]:
            return "slice() misses the end of an agent whose chunk starts after its first step"
        if all(steps[i] == tag for i in range(start, len(steps))) and any(
                t != tag for t in steps.data):
            return "slice() counts the steps of an agent without an observation in it from 0"
    if stop == n and ep._hanging_actions_end:
        try:
            piece = copy.deepcopy(ep).slice(slice(start, stop), **{
                k: v for k, v in kwargs.items() if k == "len_lookback_buffer"})
        except Exception:  # noqa: BLE001 - an exception is compared as one
            return None
        if any(a not in piece._hanging_actions_end for a in ep._hanging_actions_end):
            return "slice() up to the end drops hanging actions"
    return None


def _ends_without_last_observation(ep: Any, args: tuple, kwargs: dict) -> bool:
    """Whether add_env_step(*args, **kwargs) ends an agent of RLlib's `ep`
    without an observation where its episode knows no last observation
    (built from lists, restored): RLlib then drops the agent's last step."""
    names = ("observations", "actions", "rewards", "infos")
    given = dict(zip(names, args))
    given.update({k: v for k, v in kwargs.items() if k in names})
    obs, actions = given.get("observations") or {}, given.get("actions") or {}
    terminateds = kwargs.get("terminateds") or {}
    everyone = terminateds.get("__all__", False)
    for agent_id, episode in ep.agent_episodes.items():
        if episode.is_done or agent_id in obs or episode._last_added_observation is not None:
            continue
        acting = agent_id in actions or agent_id in ep._hanging_actions_end
        if acting and (terminateds.get(agent_id) or everyone):
            return True
    return False


def _slice_put_right(before: Any, args: tuple, kwargs: dict, result: Any) -> None:
    """RLlib's piece with the infos of the episode it was sliced from (RLlib
    passes none: its piece holds {} for each), each with the observation it
    came with, and that episode's mapping of agents to modules as before
    (RLlib hands its dict to the piece, which drops the agents it has no
    data of)."""
    observed = _observed_steps(before, args, kwargs)
    for agent_id, piece in result.agent_episodes.items():
        source = before.agent_episodes.get(agent_id)
        if source is None:
            continue
        at = observed.get(agent_id)
        if at is None or len(at) != len(piece.infos.data):
            first = piece.t_started - piece.infos.lookback
            at = [source.infos.lookback + t - source.t_started
                  for t in range(first, first + len(piece.infos.data))]
        else:
            at = [i + source.infos.lookback - source.observations.lookback for i in at]
        if all(0 <= i < len(source.infos.data) for i in at):
            piece.infos.data = [copy.deepcopy(source.infos.data[i]) for i in at]


def _observed_steps(before: Any, args: tuple, kwargs: dict) -> dict:
    """Per agent, the positions in RLlib's `before` of the observations its
    slice(*args, **kwargs) holds: the same slice of a copy whose observations
    are their own positions. (Where an agent has only lookback observations
    in the piece, RLlib's t_started is past them, and observations of equal
    values would not tell where they came from.)"""
    marked = copy.deepcopy(before)
    for episode in marked.agent_episodes.values():
        n = len(episode.observations.data)
        episode.observations.data = np.arange(n) if episode.observations.finalized \
            else list(range(n))
    try:
        piece = marked.slice(*args, **kwargs)
        return {agent_id: [int(i) for i in episode.observations.data]
                for agent_id, episode in piece.agent_episodes.items()}
    except Exception:  # noqa: BLE001 - then t_started says where they are
        return {}


def put_right(method: str, before: Any, args: tuple, kwargs: dict, ep: Any,
              result: Any) -> None:
    """RLlib's episode `ep` (and `result`) after `method`, with what the
    differences page lists put right, so that the rest is still compared
    (each difference is pinned in test_multi_agent_episode_rllib.py):

    * cut(): each agent of the successor goes on from its last observation
      (RLlib's has none, and drops the step of an agent that then ends
      without an observation);
    * concat_episode(): the concatenation is the uncut episode (see
      _concat_put_right)."""
    if method in ("slice", "__getitem__") and is_ma_episode(result):
        _slice_put_right(before, args, kwargs, result)
        ep._agent_to_module_mapping = dict(before._agent_to_module_mapping)
    if method == "cut" and is_ma_episode(result):
        for agent_id, agent_episode in result.agent_episodes.items():
            mine = ep.agent_episodes.get(agent_id)
            if mine is not None and mine._last_added_observation is not None:
                agent_episode._last_added_observation = mine._last_added_observation
                agent_episode._last_added_infos = mine._last_added_infos
    elif method == "concat_episode" and args and is_ma_episode(args[0]):
        _concat_put_right(before, args[0], ep)


def _concat_put_right(before: Any, other: Any, ep: Any) -> None:
    """RLlib's concat_episode() of `other` onto `before` (giving `ep`), put
    right where it differs from the uncut episode: an agent done here or
    without data in `other` gets a skip per env step of `other`; an agent
    new in `other` has its mapping laid over this chunk's env steps (it
    holds a skip per env step from 0 on); both episode and agent done flags
    come from `other`; an agent done at the end has no hanging values; an
    agent not observed here keeps the rewards it got before its first
    observation here and adds `other`'s, and loses them where it ended in
    `other`; agents `other` mapped to modules keep them."""
    steps = other.env_t - before.env_t
    observed = set(before.agent_episodes)
    tag = before.SKIP_ENV_TS_TAG
    reference = next(iter(before.env_t_to_agent_t.values()), None)
    lookback = reference.lookback if reference is not None else before._len_lookback_buffers
    first = before.env_t_started - lookback
    for agent_id, mapping in list(ep.env_t_to_agent_t.items()):
        mine = before.agent_episodes.get(agent_id)
        if agent_id not in before.env_t_to_agent_t:
            # (RLlib's is other's own object: a new one.)
            items = list(mapping.data)
            ep.env_t_to_agent_t[agent_id] = type(mapping)(
                data=[tag] * -first + items if first <= 0 else items[first:],
                lookback=lookback)
        elif agent_id not in other.agent_episodes or (mine is not None and mine.is_done):
            for _ in range(steps):
                mapping.append(tag)
    if other.is_truncated:
        ep.is_truncated = True
    for agent_id, theirs in other.agent_episodes.items():
        mine = before.agent_episodes.get(agent_id)
        if mine is not None and not mine.is_done:
            agent_episode = ep.agent_episodes[agent_id]
            agent_episode.is_terminated = theirs.is_terminated
            agent_episode.is_truncated = theirs.is_truncated
            if theirs._last_added_observation is not None:
                agent_episode._last_added_observation = theirs._last_added_observation
                agent_episode._last_added_infos = theirs._last_added_infos
    for agent_id, reward in other._hanging_rewards_begin.items():
        if agent_id not in observed:
            earlier = before._hanging_rewards_begin.get(agent_id)
            ep._hanging_rewards_begin[agent_id] = reward if earlier is None else earlier + reward
    for agent_id in before._hanging_rewards_begin:
        if (agent_id not in observed and agent_id in other._agent_to_module_mapping
                and agent_id not in other.agent_episodes
                and agent_id not in other._hanging_rewards_begin):
            ep._hanging_rewards_begin.pop(agent_id, None)
    for agent_id, agent_episode in ep.agent_episodes.items():
        if agent_episode.is_done:
            for cache in (ep._hanging_rewards_begin, ep._hanging_actions_end,
                          ep._hanging_rewards_end, ep._hanging_extra_model_outputs_end):
                cache.pop(agent_id, None)
    for agent_id, module_id in other._agent_to_module_mapping.items():
        ep._agent_to_module_mapping.setdefault(agent_id, module_id)


def leaves_buffers(ep: Any, method: str, args: tuple, kwargs: dict) -> bool:
    """A read of an extra-output key some asked-for agent lacks, on RLlib's
    episode after from_state() (its outputs are then defaultdicts): RLlib
    adds an empty buffer there, which its next step finds misaligned. Ours
    reads the same values without adding it (pinned in
    test_multi_agent_episode_rllib.py); the twin compares the results and
    drops RLlib's buffers."""
    if method != "get_extra_model_outputs":
        return False
    key = args[0] if args else kwargs.get("key")
    return key is not None and any(
        key not in ep.agent_episodes[a].extra_model_outputs
        and key not in (ep._hanging_extra_model_outputs_end.get(a) or {})
        for a in _requested_agents(ep, kwargs))


def _late_extras(ep: Any, agents: list, key: Any) -> bool:
    """An extra-output buffer (of `key`, or any) of one of `agents` whose
    lookback is not its observations' (a key that first came in the chunk,
    made with no lookback): RLlib places env steps in it with the
    observations' lookback, so its rows come shifted, some not at all
    (pinned in test_multi_agent_episode_rllib.py)."""
    for agent_id in agents:
        agent_episode = ep.agent_episodes[agent_id]
        outputs = agent_episode.extra_model_outputs
        buffers = outputs.values() if key is None else (
            [outputs[key]] if key in outputs else [])
        if any(b.lookback != agent_episode.observations.lookback for b in buffers):
            return True
    return False


def _numpy_concat(ep: Any, other: Any) -> bool:
    """concat_episode() of `other` into `ep` meets a single-agent concat that
    RLlib cannot do (pinned in test_single_agent_episode_differences.py): an
    agent in both whose track in `ep` is numpy'ized, or whose numpy'ized
    track in `other` holds Dict/Tuple items."""
    for aid, sa in ep.agent_episodes.items():
        theirs = other.agent_episodes.get(aid)
        if theirs is None or sa.is_done:
            continue
        for track in ("observations", "actions"):
            mine, chunk = getattr(sa, track), getattr(theirs, track)
            if mine.finalized or (chunk.finalized and isinstance(chunk.data, (dict, tuple))):
                return True
    return False


def _indices(method: str, args: tuple, kwargs: dict) -> Any:
    position = 1 if method == "get_extra_model_outputs" else 0
    return args[position] if len(args) > position else kwargs.get("indices")


def _hanging(ep: Any, method: str, agent_id: Any) -> Any:
    if method == "get_actions":
        return ep._hanging_actions_end.get(agent_id)
    if method == "get_rewards":
        return ep._hanging_rewards_end.get(agent_id)
    return ep._hanging_extra_model_outputs_end.get(agent_id)


def _struct_space_set(ep: Any, method: str, kwargs: dict) -> bool:
    """A set_*() on an agent whose numpy'ized track has a Dict/Tuple space
    (RLlib's buffer checks each leaf against the whole space there: pinned in
    the single-agent differences)."""
    track = "observations" if method == "set_observations" else "actions"
    for agent_id in kwargs.get("new_data") or {}:
        agent_episode = ep.agent_episodes.get(agent_id)
        buffer = getattr(agent_episode, track, None)
        if buffer is not None and buffer.finalized and isinstance(
                buffer.space, (gym.spaces.Dict, gym.spaces.Tuple)):
            return True
    return False


def _fill_without_space(ep: Any, method: str, agents: list) -> bool:
    """Fill rows for a numpy'ized agent track with no space whose rows are
    not scalars: RLlib makes scalar fill rows (or fails to join them); ours
    gives rows of the row shape (pinned in the lookback buffer's differences)."""
    track = {"get_observations": "observations", "get_actions": "actions"}.get(method)
    if track is None:
        return False
    for agent_id in agents:
        buffer = getattr(ep.agent_episodes[agent_id], track)
        if buffer.finalized and buffer.space is None and len(buffer.data) and (
                isinstance(buffer.data, dict) or np.ndim(buffer.data) > 1):
            return True
    return False


def _wraps_around(ep: Any, method: str, indices: Any, agents: list) -> bool:
    """A negative index reaching before a numpy'ized agent track's lookback:
    RLlib's numpy indexing wraps around to the end there (pinned in the
    lookback buffer's differences)."""
    if isinstance(indices, int):
        indices = [indices]
    if not isinstance(indices, list):
        return False
    track = {"get_observations": "observations", "get_infos": "infos",
             "get_actions": "actions", "get_rewards": "rewards"}.get(method)
    for agent_id in agents:
        agent_episode = ep.agent_episodes[agent_id]
        buffers = [getattr(agent_episode, track)] if track else \
            list(agent_episode.extra_model_outputs.values())
        for buffer in buffers:
            if buffer.finalized and any(isinstance(i, int) and i < 0 and -i > buffer.lookback
                                        for i in indices):
                return True
    return False


def _half_numpy(ep: Any) -> bool:
    """RLlib's to_numpy() left some agent half-converted: agents differ, or
    one has numpy observations but list actions (no completed step)."""
    flags = {sa.is_numpy for sa in ep.agent_episodes.values()}
    return len(flags) > 1 or any(sa.observations.finalized and not sa.is_numpy
                                 for sa in ep.agent_episodes.values())


def _exc_match(exc_ours: Optional[BaseException], exc_theirs: BaseException) -> bool:
    """Same exception class: ours a subclass of RLlib's, or (for RLlib-only
    classes such as MultiAgentEnvError, which ours defines without ray) the
    same class name."""
    if exc_ours is None:
        return False
    return isinstance(exc_ours, type(exc_theirs)) or (
        type(exc_ours).__name__ == type(exc_theirs).__name__)


def compare_views(ours: Any, theirs: Any, path: str, known: Callable = known_rllib_crash,
                  ids: Optional[IdMap] = None) -> None:
    for method, args, kwargs in VIEWS:
        if known_wrong(theirs, method, args, kwargs):
            continue
        name = call_label(method, args, kwargs)
        o = _safe(lambda: _invoke(ours, method, args, kwargs))
        t = _safe(lambda: _invoke(theirs, method, args, kwargs))
        if t[0] == "raised":
            if known(t[1]):
                continue
            if o[0] != "raised" or not _exc_match(o[1], t[1]):
                raise Mismatch(f"{path}.{name}: RLlib raised {type(t[1]).__name__}({t[1]}); "
                               f"ours {_describe(o[1])}")
            continue
        if o[0] == "raised":
            raise Mismatch(f"{path}.{name}: RLlib gave {_describe(t[1])}; ours raised "
                           f"{type(o[1]).__name__}({o[1]})")
        if method == "get_return":
            # A sum over agents and RLlib's hanging-reward defaultdicts, whose
            # zero entries come and go with reads: int 0 and 0.0 are one value.
            # Their keys are added in RLlib's set order, which changes with the
            # hash seed, so even RLlib's own float sum varies in its last bits.
            o_ret, t_ret = float(o[1]), float(t[1])
            if not math.isclose(o_ret, t_ret, rel_tol=1e-12, abs_tol=1e-12):
                compare(o_ret, t_ret, f"{path}.{name}")
            continue
        compare(o[1], t[1], f"{path}.{name}")
    if ids is not None:
        o_ids, t_ids = ours.agent_episode_ids, theirs.agent_episode_ids
        compare(list(o_ids), list(t_ids), f"{path}.agent_episode_ids keys")
        for aid in t_ids:
            ids.check(t_ids[aid], o_ids[aid], f"{path}.agent_episode_ids[{aid!r}]")


def compare_ma_episodes(ours: Any, theirs: Any, ids: IdMap, path: str = "episode",
                        known: Callable = known_rllib_crash) -> None:
    if _half_numpy(theirs) and not selftest():
        return  # (RLlib's to_numpy() left it half-converted: known_wrong)
    compare_states(ours, theirs, ids, path)
    compare_views(ours, theirs, path, known, ids)


def is_ma_episode(x: Any) -> bool:
    return hasattr(x, "agent_episodes") and hasattr(x, "env_t_started")


def _invoke(ep: Any, method: str, args: tuple, kwargs: dict) -> Any:
    """Calls ep.method(*args, **kwargs); a non-callable attribute (a property)
    is read; `print` returns what it printed."""
    if method == "print":
        out = io.StringIO()
        with redirect_stdout(out):
            ep.print(*args, **kwargs)
        return out.getvalue()
    attr = getattr(ep, method)
    if callable(attr):
        return attr(*args, **kwargs)
    if args or kwargs:
        raise TypeError(f"{method} is not callable")
    return attr


def _resolve(x: Any, side: str) -> Any:
    if isinstance(x, Other):
        return x.twin.ours if side == "ours" else x.twin.theirs
    if type(x) is tuple:
        return tuple(_resolve(a, side) for a in x)
    if type(x) is dict:
        return {k: _resolve(v, side) for k, v in x.items()}
    return copy.deepcopy(x)


def call_label(method: str, args: tuple, kwargs: dict) -> str:
    parts = [_short(a) for a in args] + [f"{k}={_short(v)}" for k, v in kwargs.items()]
    return f"{method}({', '.join(parts)})"


def _tb(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text if len(text) < 3000 else "..." + text[-3000:]


class Known:
    """Stands for RLlib's result where it crashed or is known to be wrong."""

    def __init__(self, why: Any):
        self.why = why

    def __repr__(self) -> str:
        return f"Known({self.why!r})"


class MATwin:
    """One RLlib MultiAgentEpisode and one of ours, driven through the same calls.

    After each `call`:
      * if RLlib returned, ours must return an equal result (an episode compared
        by its state and views) and both episodes must be equal;
      * if RLlib raised a deliberate error, ours must raise the same class and
        keep its state (checked against its state before the call); RLlib's
        episode is restored from a backup (RLlib may have changed it before
        raising);
      * if RLlib crashed and `known(exc)` accepts it, nothing is compared, RLlib's
        episode is restored and, if ours changed, the twin is `diverged`.
    `history` lists the calls so far (for reports).
    """

    def __init__(self, ours: Any, theirs: Any, ids: Optional[IdMap] = None,
                 history: Optional[list] = None):
        self.Rllib, self.Ours = rllib_ma_class(), ours_ma_class()
        self.ours, self.theirs = ours, theirs
        self.ids = ids or IdMap()
        self.history = list(history or [])
        self.diverged = False

    @classmethod
    def new(cls, **kwargs: Any) -> Optional["MATwin"]:
        """Both constructors with the same arguments. Raises Mismatch if they
        disagree; returns None if both raised alike."""
        Rllib, Ours = rllib_ma_class(), ours_ma_class()
        label = call_label("MultiAgentEpisode", (), kwargs)
        try:
            theirs, exc_theirs = Rllib(**copy.deepcopy(kwargs)), None
        except Exception as e:  # noqa: BLE001
            theirs, exc_theirs = None, e
        try:
            ours, exc_ours = Ours(**copy.deepcopy(kwargs)), None
        except Exception as e:  # noqa: BLE001
            ours, exc_ours = None, e
        if exc_theirs is not None:
            record(label, exc_theirs)
            if not _exc_match(exc_ours, exc_theirs):
                raise Mismatch(f"{label}: RLlib raised {type(exc_theirs).__name__}({exc_theirs})"
                               f"; ours " + (f"raised {_tb(exc_ours)}" if exc_ours
                                              else "built an episode"))
            return None
        if exc_ours is not None:
            raise Mismatch(f"{label}: RLlib built an episode; ours raised {_tb(exc_ours)}")
        twin = cls(ours, theirs, history=[label])
        twin.check_state(label)
        return twin

    def child(self, ours: Any, theirs: Any) -> "MATwin":
        """A twin of two episodes derived from this twin's (same id map)."""
        twin = type(self)(ours, theirs, self.ids, self.history)
        twin.check_half_numpy()
        return twin

    def check_half_numpy(self) -> None:
        """RLlib's to_numpy() and slice() leave agents without a completed
        step as lists (a listed difference): from such an episode on, the
        two classes store the same steps differently, so the twin stops."""
        if _half_numpy(self.theirs) and not selftest():
            self.diverged = True

    def check_state(self, label: str = "") -> None:
        compare_ma_episodes(self.ours, self.theirs, self.ids, f"state after {label}")

    def compare_results(self, r_ours: Any, r_theirs: Any, label: str,
                        method: str = "") -> None:
        if method == "get_state":
            compare_states(self.ours, self.theirs, self.ids, f"result of {label}",
                           r_ours, r_theirs)
            return
        if method == "get_duration_s":
            # (A clock reading: the same type, and 0.0 on both sides or on neither.)
            compare(type(r_ours), type(r_theirs), f"type of result of {label}")
            compare(r_ours == 0.0, r_theirs == 0.0, f"result of {label} is 0.0")
            return
        if method == "agent_episode_ids":
            compare(list(r_ours), list(r_theirs), f"result of {label}: keys")
            for aid in r_theirs:
                self.ids.check(r_theirs[aid], r_ours[aid], f"result of {label}[{aid!r}]")
            return
        if method == "__repr__" and isinstance(r_ours, str):
            self.ids.check(self.theirs.id_, self.ours.id_, f"{label}: id_")
            r_ours = r_ours.replace(str(self.ours.id_), str(self.theirs.id_))
        if r_theirs is self.theirs:
            if r_ours is not self.ours:
                raise Mismatch(f"{label}: RLlib returned the episode itself; ours "
                               f"{_describe(r_ours)}")
            return
        if is_ma_episode(r_theirs):
            if not is_ma_episode(r_ours):
                raise Mismatch(f"{label}: RLlib returned an episode, ours {_describe(r_ours)}")
            compare_ma_episodes(r_ours, r_theirs, self.ids, f"episode returned by {label}")
            return
        if isinstance(r_theirs, dict) and isinstance(r_ours, dict) and any(
                hasattr(v, "len_incl_lookback") for v in r_theirs.values()):
            r_ours, r_theirs = _buffers_as_states(dict(r_ours)), _buffers_as_states(
                dict(r_theirs))
        compare(r_ours, r_theirs, f"result of {label}")

    def context(self) -> str:
        return "\n".join(self.history[-40:])

    def call(self, method: str, *args: Any, known: Optional[Callable] = known_rllib_crash,
             compare_result: bool = True,
             result_check: Optional[Callable[[Any, Any], None]] = None,
             **kwargs: Any) -> Any:
        """Calls `method` on both episodes; returns (ours, RLlib's) results,
        (None, None) where both raised, (ours, Known) where RLlib crashed
        (`known`)."""
        label = call_label(method, args, kwargs)
        self.history.append(label)
        reason = known_wrong(self.theirs, method, args, kwargs)
        if reason:
            log({"kind": "known-wrong", "call": label, "msg": reason,
                 "context": self.context()})
            if not selftest():
                return None, Known(reason)
        backup_theirs = copy.deepcopy(self.theirs)
        backup_ours = copy.deepcopy(self.ours)
        try:
            r_theirs, exc_theirs = _invoke(self.theirs, method, _resolve(args, "theirs"),
                                           _resolve(kwargs, "theirs")), None
        except Exception as e:  # noqa: BLE001 - any RLlib error is a result
            r_theirs, exc_theirs = None, e
        try:
            r_ours, exc_ours = _invoke(self.ours, method, _resolve(args, "ours"),
                                       _resolve(kwargs, "ours")), None
        except Exception as e:  # noqa: BLE001
            r_ours, exc_ours = None, e

        if exc_theirs is not None:
            crash = not deliberate(exc_theirs)
            record(label, exc_theirs, self.context(), "crash" if crash else "check")
            self.theirs = backup_theirs
            if crash and known is not None and known(exc_theirs):
                if exc_ours is not None:
                    self._restore_ours(backup_ours, label)
                else:
                    try:
                        compare_states(self.ours, backup_ours, IdMap(), "unchanged")
                    except Mismatch:
                        self.diverged = True
                return r_ours, Known(exc_theirs)
            if not _exc_match(exc_ours, exc_theirs):
                raise Mismatch(
                    f"{label}: RLlib raised {type(exc_theirs).__name__}"
                    f"({_short(str(exc_theirs))}), ours "
                    + (f"raised {_tb(exc_ours)}" if exc_ours is not None
                       else f"returned {_describe(r_ours)}")
                    + f"\ncalls:\n{self.context()}")
            self._restore_ours(backup_ours, label)
            return None, None
        if exc_ours is not None:
            raise Mismatch(f"{label}: RLlib returned {_describe(r_theirs)}, ours raised "
                           f"{_tb(exc_ours)}\ncalls:\n{self.context()}")
        if leaves_buffers(backup_theirs, method, args, kwargs) and not selftest():
            self.theirs = backup_theirs
        if not selftest():
            put_right(method, backup_theirs, _resolve(args, "theirs"), kwargs, self.theirs,
                      r_theirs)
        try:
            if result_check is not None:
                result_check(r_ours, r_theirs)
            elif compare_result:
                self.compare_results(r_ours, r_theirs, label, method)
            self.check_state(label)
        except Mismatch as e:
            raise Mismatch(f"{e}\ncalls:\n{self.context()}") from None
        self.check_half_numpy()
        return r_ours, r_theirs

    def _restore_ours(self, backup_ours: Any, label: str) -> None:
        """After a failed call our episode must be as before it. RLlib's (in the
        self-test, "ours") may have changed before raising: that is recorded
        and the backup restored."""
        try:
            compare_states(self.ours, backup_ours, IdMap(), f"our state after failed {label}")
        except Mismatch as e:
            if not selftest():
                raise Mismatch(f"{e}\ncalls:\n{self.context()}") from None
            log({"kind": "mutated-on-failure", "call": label, "msg": str(e)[:500],
                 "context": self.context()})
        self.ours = backup_ours

    def restored_copy(self, how: str, from_ours: bool = True) -> Optional["MATwin"]:
        """A twin of both episodes rebuilt by from_state() (ours from its own
        state, or with `from_ours=False` from RLlib's, taking RLlib's ids), by
        from_state() of the state sent through pickle ("state_pickle", as a
        replay buffer's checkpoint does it) or by a pickle round trip. None
        where RLlib's from_state() crashes on its own state (recorded; ours
        must then rebuild, or fail alike in the self-test)."""
        label = f"{how} round trip"
        self.history.append(label)

        def state_of(ep: Any) -> dict:
            if how == "state_pickle":
                return pickle.loads(pickle.dumps(ep.get_state(), protocol=5))
            return copy.deepcopy(ep.get_state())

        try:
            if how == "pickle":
                theirs = pickle.loads(pickle.dumps(self.theirs, protocol=5))
            else:
                theirs = self.Rllib.from_state(state_of(self.theirs))
            exc_theirs = None
        except Exception as e:  # noqa: BLE001
            theirs, exc_theirs = None, e
        try:
            if how == "pickle":
                ours = pickle.loads(pickle.dumps(self.ours, protocol=5))
            else:
                source = self.ours if from_ours else self.theirs
                ours = self.Ours.from_state(state_of(source))
            exc_ours = None
        except Exception as e:  # noqa: BLE001
            ours, exc_ours = None, e
        if exc_theirs is not None:
            record(label, exc_theirs, self.context(), "crash")
            if selftest() and not _exc_match(exc_ours, exc_theirs):
                raise Mismatch(f"{label}: RLlib raised {exc_theirs!r}, ours {exc_ours!r}")
            if not selftest() and exc_ours is not None:
                raise Mismatch(f"{label}: RLlib crashed; ours raised {_tb(exc_ours)}")
            return None
        if exc_ours is not None:
            raise Mismatch(f"{label}: RLlib worked, ours raised {_tb(exc_ours)}")
        twin = self.child(ours, theirs)
        if how != "pickle" and not from_ours:
            twin.ids = IdMap()
        twin.check_state(label)
        return twin

    def copy(self) -> "MATwin":
        return self.child(copy.deepcopy(self.ours), copy.deepcopy(self.theirs))
