"""Hypothesis strategies for multi-agent episodes: valid env-step sequences and
every kind of call on the result.

What RLlib's `add_env_reset` / `add_env_step` accept (read from its code):

* `add_env_reset(observations=..., infos=...)` only on an empty episode; every
  agent in `observations` starts there (env step 0). Infos only for agents
  with an observation.
* Each agent is in one of these states: absent (no observation yet), ready
  (got an observation at the last env step and owes an action), hanging (sent
  an action, but the env has not answered it with an observation yet), done.
  An env runner computes actions for all ready agents, so in every step each
  ready agent sends its action (`actions`).
* An agent may get an observation in a step if it is ready and acts in that
  same step (a complete agent step: its `rewards` entry is then required,
  else MultiAgentEnvError), if it is hanging (its hanging action completes
  the step; the step's reward is added to the rewards that hung with it), or
  if it is absent (it joins late: its first observation; a reward it gets in
  that step goes to the "begin" cache and never into its data).
* A ready agent that acts without an observation becomes hanging: its action,
  its reward (if any) and its extra model outputs wait in RLlib's `_end`
  caches until its next observation; rewards it gets meanwhile are added up
  there. An observation for an agent with an episode but no hanging action
  and no action in the step trips an assert.
* Rewards for agents without an episode go to the "begin" cache (only
  `get_return(include_hanging_rewards=True)` sees them).
* An agent terminates or truncates with its last observation. A hanging (or
  just-acting) agent may terminate without an observation: RLlib repeats its
  last observation. Truncated without an observation raises
  MultiAgentEnvError. An absent agent that ends is never added.
* `__all__` (terminated or truncated) ends every agent; with a truncation
  every hanging agent needs its observation. When all agents are done the
  episode counts as terminated. After that, add_env_step raises, and a done
  agent that gets data raises MultiAgentEnvError.
* Extra model outputs travel with the action (same keys in every step of an
  agent; RLlib validates the episode after each step and refuses a step that
  loses or gains a key, after it has changed the episode).

Modes: "simultaneous" (everyone alive gets an observation every step, agents
may join late), "turn_based" (one agent gets an observation per step), "mixed"
(any subset). Now and then a step breaks one rule on purpose (`invalid`), to
compare the errors.
"""
from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
from hypothesis import strategies as st

F32 = np.float32
AGENTS = ["a0", "a1", "a2"]
EXTRA_KEYS = ("action_logp", "dist_inputs")

_floats = st.floats(-5, 5, width=32)


def _box(shape):
    return st.lists(_floats, min_size=int(np.prod(shape)), max_size=int(np.prod(shape))).map(
        lambda v: np.array(v, dtype=F32).reshape(shape))


# Per-agent space kinds: (space, value strategy).
SPACE_KINDS = {
    "box": (gym.spaces.Box(-5.0, 5.0, (3,), F32), _box((3,))),
    "discrete": (gym.spaces.Discrete(4), st.integers(0, 3)),
    "dict": (gym.spaces.Dict({"pos": gym.spaces.Box(-5.0, 5.0, (2,), F32),
                              "id": gym.spaces.Discrete(3)}),
             st.builds(lambda p, i: {"pos": p, "id": i}, _box((2,)), st.integers(0, 2))),
}
# Observations without a space that stay on the object path: strings, and
# ints mixed with strings in one agent's track (no nested lists or tuples,
# which RLlib's batching would read as structs).
OBJECT_OBS = st.one_of(st.text(alphabet="abc", max_size=3), st.integers(0, 3))
OBS_KINDS = [*sorted(SPACE_KINDS), "object"]
REWARDS = st.one_of(st.integers(-3, 3).map(float), st.floats(-5, 5))
INFOS = st.one_of(st.just({}), st.builds(lambda v: {"v": v}, st.integers(-5, 5)))


@dataclass
class Scenario:
    """What one generated episode is made of."""
    agents: list
    mode: str
    obs_kinds: dict
    act_kinds: dict
    spaces: bool           # pass observation_space/action_space dicts
    gym_dict_spaces: bool  # ... as gym.spaces.Dict rather than a plain dict
    extras: tuple          # extra model output keys sent with each action
    extras_agents: list    # the agents that send them from the start
    late_extras: bool      # another agent may start sending them (fine in RLlib
                           # while it has no step in the chunk yet)
    invalid_rate: int      # 1 in `invalid_rate` steps breaks a rule (0: never)
    key_change_rate: int   # 1 in `key_change_rate` steps, an acting agent's extra
                           # outputs lose or gain a key (0: never)
    end_rate: int          # 1 in `end_rate` agent-steps ends that agent

    def obs_value(self, aid):
        kind = self.obs_kinds[aid]
        return OBJECT_OBS if kind == "object" else SPACE_KINDS[kind][1]

    def act_value(self, aid):
        return SPACE_KINDS[self.act_kinds[aid]][1]

    def constructor_kwargs(self, id_="ep"):
        kwargs = {"id_": id_} if id_ else {}
        if self.spaces:
            obs = {a: SPACE_KINDS[self.obs_kinds[a]][0] for a in self.agents
                   if self.obs_kinds[a] != "object"}
            act = {a: SPACE_KINDS[self.act_kinds[a]][0] for a in self.agents}
            if self.gym_dict_spaces:
                obs, act = gym.spaces.Dict(obs), gym.spaces.Dict(act)
            kwargs.update(observation_space=obs, action_space=act)
        return kwargs


@st.composite
def scenarios(draw, modes=("simultaneous", "turn_based", "mixed"), invalid=True):
    n = draw(st.integers(1, len(AGENTS)), label="agents")
    agents = AGENTS[:n]
    kinds = st.sampled_from(sorted(SPACE_KINDS))
    obs_kinds = st.sampled_from(OBS_KINDS)
    extras = draw(st.sampled_from([(), ("action_logp",), EXTRA_KEYS]), label="extras")
    extras_agents = list(agents)
    if extras and draw(st.booleans(), label="some agents without extra outputs"):
        extras_agents = draw(st.lists(st.sampled_from(agents), unique=True,
                                      max_size=n - 1), label="agents with extra outputs")
    return Scenario(
        agents=agents,
        mode=draw(st.sampled_from(modes), label="mode"),
        obs_kinds={a: draw(obs_kinds, label=f"obs kind {a}") for a in agents},
        act_kinds={a: draw(kinds, label=f"act kind {a}") for a in agents},
        spaces=draw(st.booleans(), label="spaces"),
        gym_dict_spaces=draw(st.booleans(), label="gym Dict spaces"),
        extras=extras,
        extras_agents=extras_agents,
        late_extras=bool(extras) and draw(st.booleans(), label="late extra outputs"),
        invalid_rate=draw(st.sampled_from([0, 0, 12]), label="invalid rate") if invalid else 0,
        key_change_rate=draw(st.sampled_from([0, 6]), label="key change rate") if invalid else 0,
        end_rate=draw(st.sampled_from([6, 15, 1000]), label="end rate"),
    )


# -- agent states -----------------------------------------------------------------------

ABSENT, READY, HANGING, DONE, LIMBO = "absent", "ready", "hanging", "done", "limbo"


def agent_states(ep, agents) -> dict:
    """Each agent's state (see the module doc) read from RLlib's episode `ep`.
    LIMBO: an agent with an episode, not done, no hanging action and no
    observation at the last env step (RLlib leaves an agent so that ended
    without ever acting again); it gets no more data."""
    out = {}
    for aid in agents:
        sa = ep.agent_episodes.get(aid)
        if sa is None:
            out[aid] = ABSENT
        elif sa.is_done:
            out[aid] = DONE
        elif aid in ep._hanging_actions_end:
            out[aid] = HANGING
        else:
            mapping = ep.env_t_to_agent_t.get(aid)
            data = mapping.data if mapping is not None else []
            last = data[-1] if len(data) else "S"
            out[aid] = READY if not (isinstance(last, str) and last == "S") else LIMBO
    return out


def _extras(draw, sc):
    out = {}
    for k in sc.extras:
        if k == "action_logp":
            out[k] = draw(_floats.map(F32), label="action_logp")
        else:
            out[k] = draw(_box((2,)), label="dist_inputs")
    return out


@st.composite
def reset_call(draw, sc):
    """("add_env_reset", (), kwargs) for a fresh episode: a non-empty subset of
    the agents (all of them when simultaneous)."""
    if sc.mode == "turn_based":
        first = [draw(st.sampled_from(sc.agents), label="first agent")]
    elif sc.mode == "simultaneous" and draw(st.booleans(), label="everyone at reset"):
        first = list(sc.agents)
    else:
        first = draw(st.lists(st.sampled_from(sc.agents), min_size=1, unique=True),
                     label="agents at reset")
    obs = {a: draw(sc.obs_value(a), label=f"obs {a}") for a in first}
    infos = {a: draw(INFOS, label=f"info {a}") for a in first
             if draw(st.booleans(), label="info given")}
    kwargs = {"observations": obs}
    if infos or draw(st.booleans(), label="infos=None"):
        kwargs["infos"] = infos or None
    return ("add_env_reset", (), kwargs), {a: (READY if a in first else ABSENT)
                                           for a in sc.agents}


def output_agents(ep) -> list:
    """The agents of RLlib's episode `ep` that send extra model outputs (have
    some stored or hanging)."""
    return [a for a, e in ep.agent_episodes.items()
            if e.extra_model_outputs or (ep._hanging_extra_model_outputs_end.get(a) or {})]


def stepped_agents(ep) -> list:
    """The agents of RLlib's episode `ep` with a step in the chunk."""
    return [a for a, e in ep.agent_episodes.items() if len(e)]


@st.composite
def env_step(draw, sc, states, stepped=(), started=()):
    """One ("add_env_step", args, kwargs) call valid for agents in `states`,
    and the states after it (None if the step ends the episode or breaks a
    rule on purpose). `stepped`: the agents with a step in this chunk
    already (whose extra outputs may then change keys); `started`: agents
    beside the scenario's that send extra outputs now (output_agents())."""
    ready = [a for a in sc.agents if states[a] == READY]
    hanging = [a for a in sc.agents if states[a] == HANGING]
    absent = [a for a in sc.agents if states[a] == ABSENT]
    acting = list(ready)
    waiting = acting + hanging
    # Who gets an observation.
    if sc.mode == "simultaneous":
        joining = [a for a in absent if draw(st.booleans(), label=f"{a} joins")]
        receivers = waiting + joining
    elif sc.mode == "turn_based":
        pool = [a for a in hanging + absent] or waiting
        receivers = [draw(st.sampled_from(pool), label="next")] if pool else []
    else:
        receivers = draw(st.lists(st.sampled_from(waiting + absent), unique=True)
                         if waiting + absent else st.just([]), label="receivers")
    end = st.integers(0, sc.end_rate - 1).map(lambda x: x == 0)
    terminated, truncated = {}, {}
    for a in receivers:
        if draw(end, label=f"{a} ends"):
            (terminated if draw(st.booleans(), label="term/trunc") else truncated)[a] = True
    for a in waiting:
        if a not in receivers and draw(end, label=f"{a} ends without obs"):
            terminated[a] = True
    everyone = draw(st.sampled_from([None] * 12 + ["terminated", "truncated"]),
                    label="__all__")
    if everyone == "truncated":
        receivers += [a for a in waiting if a not in receivers]
    obs = {a: draw(sc.obs_value(a), label=f"obs {a}") for a in receivers}
    actions = {a: draw(sc.act_value(a), label=f"act {a}") for a in acting}
    rewards = {}
    for a in sc.agents:
        needed = a in acting and a in obs
        if states[a] == DONE:
            continue
        if needed or draw(st.sampled_from([True, False, False]), label=f"reward {a}"):
            rewards[a] = draw(REWARDS, label=f"reward {a}")
    infos = {a: draw(INFOS, label=f"info {a}") for a in receivers
             if draw(st.booleans(), label=f"info {a} given")}
    extras = {a: _extras(draw, sc) for a in acting
              if a in sc.extras_agents or a in started} if sc.extras else {}
    # An agent that sent none so far starts to: where it has a step in the
    # chunk, both sides refuse the step (its earlier steps lack the keys), a
    # key change that only scenarios with key changes make.
    late = [a for a in acting if a not in extras and sc.late_extras
            and (sc.key_change_rate or a not in stepped)
            and draw(st.integers(0, 2), label=f"{a} starts extra outputs") == 0]
    for a in late:
        extras[a] = _extras(draw, sc)
    # Only for an agent that completes a step now, not its first in the chunk:
    # both sides refuse that step. (RLlib accepts new keys in a chunk's first
    # step, and keeps a hanging action's outputs unchecked; the agent's later
    # outputs, without those keys, then crash its reads.)
    stepping = [a for a in acting if a in obs and a in stepped]
    key_change = bool(stepping) and sc.key_change_rate and draw(
        st.integers(0, sc.key_change_rate - 1), label="key change") == 0
    if key_change:
        a = draw(st.sampled_from(stepping), label="agent whose keys change")
        if extras.get(a) and draw(st.booleans(), label="lose a key"):
            extras[a].pop(draw(st.sampled_from(sorted(extras[a]))))
        else:
            extras.setdefault(a, {})["vf_preds"] = draw(_floats.map(F32), label="vf_preds")
    if everyone:
        (terminated if everyone == "terminated" else truncated)["__all__"] = True
        for d in (terminated, truncated):
            if draw(st.booleans(), label="__all__ False given too") and "__all__" not in d:
                d["__all__"] = False
    broken = sc.invalid_rate and draw(st.integers(0, sc.invalid_rate - 1),
                                      label="invalid") == 0
    if broken:
        breakers = []
        if [a for a in acting if a in obs]:
            breakers.append("no reward")
        if [a for a in sc.agents if states[a] == DONE]:
            breakers.append("data for done agent")
        if ready:
            breakers.append("obs without action")
        if hanging:
            breakers.append("second action")
            breakers.append("truncated hanging")
        if not breakers:
            broken = False
        else:
            how = draw(st.sampled_from(breakers), label="broken rule")
            if how == "no reward":
                rewards.pop(draw(st.sampled_from([a for a in acting if a in obs])))
            elif how == "data for done agent":
                a = draw(st.sampled_from([a for a in sc.agents if states[a] == DONE]))
                obs[a] = draw(sc.obs_value(a))
            elif how == "obs without action":
                a = draw(st.sampled_from(ready))
                actions.pop(a, None)
                extras.pop(a, None)
                obs[a] = draw(sc.obs_value(a))
            elif how == "second action":
                a = draw(st.sampled_from(hanging))
                actions[a] = draw(sc.act_value(a))
                obs.pop(a, None)
            else:
                a = draw(st.sampled_from(hanging))
                obs.pop(a, None)
                truncated[a] = True
    kwargs = {}
    if terminated or draw(st.booleans(), label="terminateds={}"):
        kwargs["terminateds"] = terminated
    if truncated:
        kwargs["truncateds"] = truncated
    if extras:
        kwargs["extra_model_outputs"] = extras
    if draw(st.booleans(), label="keywords"):
        call = ("add_env_step", (), dict(observations=obs, actions=actions, rewards=rewards,
                                         infos=infos, **kwargs))
    else:
        call = ("add_env_step", (obs, actions, rewards, infos), kwargs)
    if broken or everyone or key_change or any(a in stepped for a in late):
        return call, None
    new = dict(states)
    for a in sc.agents:
        if a in obs:
            new[a] = DONE if (terminated.get(a) or truncated.get(a)) else READY
            if states[a] == ABSENT and new[a] == DONE:
                new[a] = ABSENT
        elif a in acting or a in hanging:
            new[a] = DONE if terminated.get(a) else HANGING
    existing = [a for a in sc.agents if states[a] != ABSENT]
    if existing and all(new[a] in (DONE, LIMBO) for a in existing):
        return call, None
    return call, new


@dataclass
class Episode:
    scenario: Scenario
    constructor: dict
    calls: list = field(default_factory=list)


@st.composite
def episodes(draw, modes=("simultaneous", "turn_based", "mixed"), max_steps=8, invalid=True):
    """A scenario, constructor kwargs and a call list: a reset and up to
    `max_steps` steps (stops when the episode is done or a step broke a rule)."""
    sc = draw(scenarios(modes, invalid), label="scenario")
    ep = Episode(sc, sc.constructor_kwargs(draw(st.sampled_from(["ep", None]), label="id")))
    call, states = draw(reset_call(sc))
    ep.calls.append(call)
    stepped, started = set(), set()
    for _ in range(draw(st.integers(0, max_steps), label="steps")):
        call, new = draw(env_step(sc, states, stepped, started))
        ep.calls.append(call)
        if new is None:
            break
        kwargs = call[2]
        obs = call[1][0] if call[1] else kwargs["observations"]
        started.update(kwargs.get("extra_model_outputs") or ())
        # (An agent's step completes with its observation after its action.)
        stepped.update(a for a in obs if states[a] in (READY, HANGING))
        states = new
    return ep


def as_constructor_data(ep: Episode) -> dict:
    """The episode's reset and steps (without broken ones or __all__) as the
    constructor's per-env-step lists: observations[t] and infos[t] at env step
    t; actions[t], rewards[t], extra_model_outputs[t] for the agents that
    acted after their observation at t (rewards: those received in step t+1)."""
    observations, infos, actions, rewards, extras = [], [], [], [], []
    last_obs_t = {}
    for name, args, kwargs in ep.calls:
        if name == "add_env_reset":
            observations.append(dict(kwargs["observations"]))
            infos.append(dict(kwargs.get("infos") or {}))
            for a in kwargs["observations"]:
                last_obs_t[a] = 0
            continue
        obs, act, rew, inf = (args + (None,) * 4)[:4] if args else (
            kwargs["observations"], kwargs["actions"], kwargs["rewards"], kwargs["infos"])
        emo = kwargs.get("extra_model_outputs") or {}
        t = len(observations)
        actions.append({})
        extras.append({})
        rewards.append(dict(rew))
        for a, v in act.items():
            actions[last_obs_t[a]][a] = v
            if a in emo:
                extras[last_obs_t[a]][a] = emo[a]
        observations.append(dict(obs))
        infos.append(dict(inf or {}))
        for a in obs:
            last_obs_t[a] = t
    data = dict(observations=observations, infos=infos, actions=actions, rewards=rewards)
    if any(extras):
        data["extra_model_outputs"] = extras
    return copy.deepcopy(data)


# -- calls on an episode ------------------------------------------------------------------

INDEX = st.integers(-7, 7)
BOUND = st.one_of(st.none(), st.integers(-9, 9))
SLICES = st.builds(slice, BOUND, BOUND, st.sampled_from([None, None, None, 1]))
INDICES = st.one_of(st.none(), INDEX, st.lists(INDEX, max_size=3), SLICES)

GETTERS = ("get_observations", "get_infos", "get_actions", "get_rewards",
           "get_extra_model_outputs", "get_terminateds", "get_truncateds")


@st.composite
def getter_call(draw, agents=AGENTS, keys=EXTRA_KEYS, name=None):
    """(method, args, kwargs) for one of the getters with any of its options."""
    name = name or draw(st.sampled_from(GETTERS), label="getter")
    if name in ("get_terminateds", "get_truncateds"):
        return name, (), {}
    kwargs = {}
    args = ()
    if name == "get_extra_model_outputs":
        key = draw(st.sampled_from([None, *keys, "missing"]), label="key")
        if key is not None or draw(st.booleans(), label="key=None given"):
            kwargs["key"] = key
    indices = draw(INDICES, label="indices")
    if indices is not None or draw(st.booleans(), label="indices=None given"):
        kwargs["indices"] = indices
    agent_ids = draw(st.one_of(st.none(), st.sampled_from(agents + ["zz"]),
                               st.lists(st.sampled_from(agents + ["zz"]), unique=True,
                                        max_size=3)), label="agent_ids")
    if agent_ids is not None:
        kwargs["agent_ids"] = agent_ids
    for opt in ("env_steps", "neg_index_as_lookback", "return_list"):
        v = draw(st.sampled_from([None, True, False]), label=opt)
        if v is not None:
            kwargs[opt] = v
    fill_values = {"get_infos": [{"f": 1}], "get_rewards": [0.0]}.get(name, [0, 0.0])
    fill = draw(st.sampled_from([None, None, *fill_values]), label="fill")
    if fill is not None:
        kwargs["fill"] = fill
    if name in ("get_observations", "get_actions") and draw(st.booleans(), label="one_hot"):
        kwargs["one_hot_discrete"] = True
    return name, args, kwargs


SIMPLE_CALLS = ("__len__", "__repr__", "get_return", "get_agents_to_act",
                "get_agents_that_stepped", "env_steps", "agent_steps", "is_done",
                "is_terminated", "is_truncated", "is_reset", "is_numpy", "agent_ids",
                "agent_episode_ids", "env_t_to_agent_t", "env_t", "env_t_started",
                "get_state", "validate", "get_duration_s", "print")


@st.composite
def other_call(draw):
    """A call beside the getters: the simple ones, cut, slice/[], to_numpy."""
    kind = draw(st.sampled_from(["simple", "cut", "slice", "getitem", "to_numpy",
                                 "return"]), label="call kind")
    if kind == "simple":
        return draw(st.sampled_from(SIMPLE_CALLS)), (), {}
    if kind == "return":
        return "get_return", (), {"include_hanging_rewards": draw(st.booleans())}
    if kind == "cut":
        lb = draw(st.sampled_from([None, 0, 1, 2, 4]), label="cut lookback")
        return "cut", (), ({} if lb is None else {"len_lookback_buffer": lb})
    if kind == "to_numpy":
        return "to_numpy", (), {}
    sl = draw(SLICES, label="slice")
    if kind == "getitem":
        return "__getitem__", (sl,), {}
    lb = draw(st.sampled_from([None, 0, 1, 3]), label="slice lookback")
    return "slice", (sl,), ({} if lb is None else {"len_lookback_buffer": lb})


def calls(agents=AGENTS, keys=EXTRA_KEYS):
    return st.one_of(getter_call(agents, keys), other_call())


# -- an episode stepped whole and in chunks ---------------------------------------------


# How a successor chunk is made (each from the chunk it follows, at its env_t):
# cut(); an empty slice of that cut (ep[0:0], or slice() with a lookback);
# slice() of the chunk's last steps, then cut(); a pickled cut; a cut copied
# through get_state() / from_state().
SUCCESSORS = ("cut", "empty", "empty_slice", "slice_cut", "pickle", "state")


@st.composite
def cut_points(draw, ep: Episode, kinds=("cut",)) -> dict:
    """Where to cut `ep`'s calls: {call index: len_lookback_buffer} (the cut
    follows that call), or with several successor `kinds`, {call index:
    (kind, len_lookback_buffer, start)} (`start`: how many steps back a
    slice begins)."""
    last = max(len(ep.calls) - 2, 0)
    lookbacks = st.sampled_from([0, 1, 2, 3])
    if kinds == ("cut",):
        values = lookbacks
    else:
        values = st.tuples(st.sampled_from(kinds), lookbacks, st.integers(0, 3))
    return draw(st.dictionaries(st.integers(0, last), values, max_size=3), label="cuts")


def successor(chunk, how):
    """The chunk that follows `chunk`, made as `how` says (a lookback, or
    what cut_points() draws with several kinds). Where a slice is refused
    (ValueError: the agents' lookbacks differ, as after a cut that reached
    back to a hanging agent's observation; RLlib refuses it alike), the cut."""
    if not isinstance(how, tuple):
        return chunk.cut(len_lookback_buffer=how)
    kind, lookback, back = how
    if kind == "slice_cut":
        end = len(chunk)
        try:
            piece = chunk.slice(slice(max(end - back, 0), end), len_lookback_buffer=lookback)
        except ValueError:
            return chunk.cut(len_lookback_buffer=lookback)
        return piece.cut(len_lookback_buffer=back % 2)
    cut = chunk.cut(len_lookback_buffer=lookback)
    try:
        if kind == "empty":
            return cut[0:0]
        if kind == "empty_slice":
            return cut.slice(slice(0, 0), len_lookback_buffer=back)
    except ValueError:
        return cut
    if kind == "pickle":
        return pickle.loads(pickle.dumps(cut))
    if kind == "state":
        return type(cut).from_state(cut.get_state())
    return cut


def play_in_chunks(cls, ep: Episode, cuts: dict):
    """`ep`'s calls on one episode of class `cls` (the whole) and on a chain
    of chunks, a successor made (see successor()) after the calls `cuts`
    names and each chunk stepped on; then the chunks concat_episode()'d
    onto the first. Returns (whole, joined); raises what a call raises."""
    whole = cls(**ep.constructor)
    chunks = [cls(**ep.constructor)]
    for i, (name, args, kwargs) in enumerate(ep.calls):
        getattr(whole, name)(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        getattr(chunks[-1], name)(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        if i in cuts and not chunks[-1].is_done:
            chunks.append(successor(chunks[-1], cuts[i]))
    joined = chunks[0]
    for chunk in chunks[1:]:
        joined.concat_episode(chunk)
    return whole, joined
