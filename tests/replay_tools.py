"""Episode streams for the replay-buffer tests: the chunks an env runner
hands a buffer (several envs, episodes cut into chunks with a one-step
lookback, some done), built as our episodes and as RLlib's from the same
data, and views of what the buffers return."""
from __future__ import annotations

from typing import Any, Callable, List

import numpy as np

from episode import MultiAgentEpisode, SingleAgentEpisode


def _plain_obs(rng, state: dict, first: bool) -> np.ndarray:
    return rng.normal(size=3).astype(np.float32)


def single_agent_stream(seed: int, *, n_envs: int = 3, calls: int = 12, fragment=(1, 6),
                        max_len: int = 15, observe: Callable = _plain_obs,
                        prefix: str = "e") -> List[List[dict]]:
    """Per add() call, the chunks of `n_envs` envs as plain data.
    `observe(rng, state, first)` makes each observation (`state`: a dict of
    the env's own, `first`: the episode's first one)."""
    rng = np.random.default_rng(seed)
    envs: List[Any] = [None] * n_envs
    made = 0
    out = []
    for _ in range(calls):
        call = []
        for env in range(n_envs):
            if envs[env] is None:
                made += 1
                left = int(rng.integers(1, max_len))
                state: dict = {}
                envs[env] = dict(id=f"{prefix}{seed}_{made}", t=0, left=left,
                                 obs=observe(rng, state, True), prev=None, state=state)
            s = envs[env]
            k = int(min(rng.integers(*fragment), s["left"]))
            obs = [s["obs"]] + [observe(rng, s["state"], False) for _ in range(k)]
            acts = [int(rng.integers(3)) for _ in range(k)]
            rews = [float(np.round(rng.normal(), 3)) for _ in range(k)]
            logp = [float(rng.normal()) for _ in range(k)]
            infos = [{"i": int(rng.integers(9))} if rng.random() < 0.3 else {}
                     for _ in range(k + 1)]
            ends = s["left"] == k
            term = ends and bool(rng.random() < 0.7)
            call.append(dict(id=s["id"], t0=s["t"], obs=obs, acts=acts, rews=rews, logp=logp,
                             infos=infos, term=term, trunc=ends and not term, prev=s["prev"]))
            if k:
                s["prev"] = (obs[-2], acts[-1], rews[-1], logp[-1], infos[-2])
            s["t"] += k
            s["left"] -= k
            s["obs"] = obs[-1]
            if ends:
                envs[env] = None
        out.append(call)
    return out


def chunk_episode(cls: Callable, chunk: dict, *, numpy: bool, extras: bool, lookback: bool,
                  infos: bool = True):
    """The chunk as an episode of `cls` (a continuation gets the step before
    it as lookback, as `cut(len_lookback_buffer=1)` gives)."""
    lb = 1 if lookback and chunk["t0"] > 0 and chunk["prev"] is not None else 0
    obs, acts, rews = list(chunk["obs"]), list(chunk["acts"]), list(chunk["rews"])
    logp, inf = list(chunk["logp"]), [dict(i) for i in chunk["infos"]]
    if lb:
        p = chunk["prev"]
        obs, acts, rews, logp, inf = ([p[0]] + obs, [p[1]] + acts, [p[2]] + rews,
                                      [p[3]] + logp, [dict(p[4])] + inf)
    kwargs = {"extra_model_outputs": {"logp": logp}} if extras else {}
    episode = cls(id_=chunk["id"], observations=obs, actions=acts, rewards=rews,
                  infos=inf if infos else None, terminated=chunk["term"],
                  truncated=chunk["trunc"], t_started=chunk["t0"], len_lookback_buffer=lb,
                  **kwargs)
    return episode.to_numpy() if numpy else episode


def episode_view(episode, *, with_id: bool = True, extras: bool = True) -> dict:
    """What a sampled episode holds, for compare()."""
    view = dict(obs=episode.get_observations(), actions=episode.get_actions(),
                rewards=episode.get_rewards(), infos=episode.get_infos(),
                terminated=episode.is_terminated, truncated=episode.is_truncated,
                t_started=episode.t_started, len=len(episode),
                lookback=episode.observations.lookback, agent_id=episode.agent_id,
                module_id=episode.module_id)
    if extras:
        view["extras"] = {k: episode.get_extra_model_outputs(k)
                          for k in episode.extra_model_outputs}
        # With their lookback rows: the buffers as they are.
        view["extra_buffers"] = {k: (v.lookback, v.finalized, v.data)
                                 for k, v in episode.extra_model_outputs.items()}
    if with_id:
        view["id"] = episode.id_
    return view


def metrics_view(metrics) -> Any:
    """Reduced metrics as plain values (RLlib's Stats objects peeked)."""
    if hasattr(metrics, "items"):
        return {k: metrics_view(v) for k, v in metrics.items()}
    if hasattr(metrics, "peek"):
        return metrics.peek()
    return metrics


def state_view(state: dict) -> dict:
    """A buffer state without the episodes' infos states (the infos' form
    differs, their content is compared through the samples)."""
    state = dict(state)
    state["episodes"] = [dict(e, infos=None) for e in state["episodes"]]
    return state


def multi_agent_stream(seed: int, classes, *, calls: int = 10, n_envs: int = 2,
                       turn_based: bool = False, numpy: bool = True):
    """Per add() call, per env, the same multi-agent chunk as an episode of
    each class in `classes` (agents a0, a1 on module m0, a2 on m1; with
    `turn_based` one agent observes per step, so agents skip steps)."""
    rng = np.random.default_rng(seed)
    envs: List[Any] = [None] * n_envs
    out = []
    agents = ("a0", "a1", "a2")
    made = 0
    for _ in range(calls):
        call = []
        for i in range(n_envs):
            if envs[i] is None:
                made += 1
                # One id on both sides: a state can go from one class to the other.
                episodes = [cls(id_=f"m{seed}_{made}", agent_to_module_mapping_fn=module_of)
                            for cls in classes]
                obs = {a: rng.normal(size=2).astype(np.float32) for a in agents}
                for e in episodes:
                    e.add_env_reset(observations=obs)
                    for a, agent_episode in e.agent_episodes.items():
                        agent_episode.id_ = f"m{seed}_{made}_{a}"
                envs[i] = dict(episodes=episodes, left=int(rng.integers(2, 12)),
                               acting=set(obs))
            s = envs[i]
            for _ in range(int(min(rng.integers(1, 5), s["left"]))):
                s["left"] -= 1
                acting = sorted(s["acting"])
                nxt = {agents[int(rng.integers(3))]} if turn_based else set(agents)
                obs = {a: rng.normal(size=2).astype(np.float32) for a in nxt}
                acts = {a: int(rng.integers(3)) for a in acting}
                rews = {a: float(np.round(rng.normal(), 2)) for a in acting}
                for e in s["episodes"]:
                    e.add_env_step(observations=obs, actions=acts, rewards=rews,
                                   terminateds={"__all__": s["left"] == 0})
                s["acting"] = set(obs)
            if numpy:
                for e in s["episodes"]:
                    e.to_numpy()
            call.append(tuple(s["episodes"]))
            if s["left"] == 0:
                envs[i] = None
            else:
                chunks = [e.cut(len_lookback_buffer=1) for e in s["episodes"]]
                # RLlib's successor (built from lists) forgets each agent's last
                # observation, so an agent that ends without a new one loses its
                # last step there; ours keeps it (docs/differences.md): RLlib's
                # chunk is given the same before the two are compared.
                for e, chunk in zip(s["episodes"], chunks):
                    for agent_id, agent_episode in chunk.agent_episodes.items():
                        mine = e.agent_episodes[agent_id]
                        agent_episode._last_added_observation = mine._last_added_observation
                        agent_episode._last_added_infos = mine._last_added_infos
                s["episodes"] = chunks
        out.append(call)
    return out


def chunked_stream(calls: int, n_envs: int, start: Callable, advance: Callable) -> List[list]:
    """Per add() call, the chunk of each of `n_envs` envs: `start(made)`
    begins an env's `made`-th episode (a dict with the "episode" and the
    steps "left" in it), `advance(env)` adds the chunk's steps to it (counting
    "left" down). Each chunk is handed over as numpy and continued by its
    `cut(len_lookback_buffer=1)`; an env whose episode is done begins
    another."""
    envs: List[Any] = [None] * n_envs
    made = 0
    out = []
    for _ in range(calls):
        call = []
        for i in range(n_envs):
            if envs[i] is None:
                made += 1
                envs[i] = start(made)
            s = envs[i]
            advance(s)
            s["episode"].to_numpy()
            call.append(s["episode"])
            if s["left"] == 0:
                envs[i] = None
            else:
                s["episode"] = s["episode"].cut(len_lookback_buffer=1)
        out.append(call)
    return out


def numbered_episode(num: int, length: int, *, cls: Callable = SingleAgentEpisode, t0: int = 0,
                     extras: bool = False, **kwargs):
    """Episode f"ep{num}" of `cls` with steps t0 .. t0 + length - 1 whose
    observation t is [num, t] (float32, so each names its step), action
    100 * num + t, reward num + t, infos {"t": t} (and extra model output
    "logp" = -t with `extras`)."""
    ts = range(t0, t0 + length + 1)
    if extras:
        kwargs["extra_model_outputs"] = {"logp": [-float(t) for t in ts[:-1]]}
    return cls(id_=f"ep{num}", observations=[np.array([num, t], np.float32) for t in ts],
               actions=[100 * num + t for t in ts[:-1]], rewards=[float(num + t) for t in ts[:-1]],
               infos=[{"t": t} for t in ts], t_started=t0, len_lookback_buffer=0, **kwargs)


def plain_state(state: Any) -> Any:
    """A buffer checkpoint with the objects in it (the multi-agent buffers'
    segment trees) replaced by their get_state(), for compare()."""
    if isinstance(state, dict):
        return {k: plain_state(v) for k, v in state.items()}
    if type(state) in (list, tuple):
        if set(map(type, state)) <= PLAIN_NUMBERS:
            return state          # (a tree's nodes: millions of them in a 1M buffer)
        return type(state)(plain_state(v) for v in state)
    return plain_state(state.get_state()) if hasattr(state, "get_state") else state


# The item types of a list that plain_state() passes on whole.
PLAIN_NUMBERS = {int, float, bool, type(None)}


def unmapped(state: Any) -> Any:
    """A (plain) buffer state without its episodes' mapping functions: a
    buffer opened from a folder has the default one in its episodes (a
    function is code, which a saved buffer does not keep); their resolved
    mappings (`_agent_to_module_mapping`) stay to be compared, and they are
    what the buffer maps the agents by."""
    if isinstance(state, dict):
        return {k: unmapped(v) for k, v in state.items() if k != "agent_to_module_mapping_fn"}
    if type(state) in (list, tuple):
        return type(state)(unmapped(v) for v in state)
    return state


def module_of(agent_id, episode) -> str:
    return "m1" if agent_id == "a2" else "m0"


__all__ = ["SingleAgentEpisode", "MultiAgentEpisode", "chunk_episode", "chunked_stream",
           "episode_view",
           "metrics_view", "module_of", "multi_agent_stream", "numbered_episode",
           "plain_state", "unmapped", "single_agent_stream", "state_view"]
