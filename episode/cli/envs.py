"""The envs `demo` and `record` sample and the Sampler they sample them with:
a gymnasium id (a sync vector env), N copies of one as the agents of a
multi-agent env, or a multi-agent env factory named module:name."""
from __future__ import annotations

import os
import sys
import time

from episode.cli.common import UsageError


def make_env(env_id: str, num_envs: int):
    """A sync vector env of `num_envs` copies of `env_id` (UsageError if unknown)."""
    import gymnasium as gym

    try:
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")
    except gym.error.UnregisteredEnv as e:
        raise UsageError(f"unknown environment id {env_id!r}: {e}") from None
    except (gym.error.Error, ImportError) as e:
        raise UsageError(f"cannot make environment {env_id!r}: {e}") from None


class _Timed:
    """An env whose reset() and step() add their seconds to stats.env_s;
    everything else is the env's own."""

    def __init__(self, env, stats):
        self.env, self.stats = env, stats

    def __getattr__(self, name):
        return getattr(self.env, name)

    def reset(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.env.reset(*args, **kwargs)
        finally:
            self.stats.env_s += time.perf_counter() - t0

    def step(self, actions):
        t0 = time.perf_counter()
        try:
            return self.env.step(actions)
        finally:
            self.stats.env_s += time.perf_counter() - t0


def _timed_vector_env(env, stats):
    import gymnasium as gym

    class TimedVectorEnv(gym.vector.VectorWrapper):
        reset = _Timed.reset
        step = _Timed.step

    timed = TimedVectorEnv(env)
    timed.stats = stats
    return timed


# -- multi-agent envs ------------------------------------------------------------

class Copies:
    """`n` copies of a gymnasium env as the agents ``agent_0``... of one
    multi-agent env (RLlib's dict API): they step together, each ends on its
    own, and ``"__all__"`` ends the episode once all have."""

    def __init__(self, env_id: str, n: int):
        import gymnasium as gym

        try:
            self.envs = {f"agent_{i}": gym.make(env_id) for i in range(n)}
        except gym.error.UnregisteredEnv as e:
            raise UsageError(f"unknown environment id {env_id!r}: {e}") from None
        except (gym.error.Error, ImportError) as e:
            raise UsageError(f"cannot make environment {env_id!r}: {e}") from None
        self.possible_agents = list(self.envs)
        self.done: set = set()

    def observation_space(self, agent_id):
        return self.envs[agent_id].observation_space

    def action_space(self, agent_id):
        return self.envs[agent_id].action_space

    def reset(self, seed: int | None = None):
        self.done = set()
        obs, infos = {}, {}
        for i, (aid, env) in enumerate(self.envs.items()):
            obs[aid], infos[aid] = env.reset(seed=None if seed is None else seed + i)
            if seed is not None:
                # (Reseeded only when asked: a later reset keeps the actions
                # reproducible.)
                env.action_space.seed(seed + i)
        return obs, infos

    def step(self, actions: dict):
        obs, rewards, terminateds, truncateds, infos = {}, {}, {}, {}, {}
        for aid, action in actions.items():
            o, r, term, trunc, info = self.envs[aid].step(action)
            obs[aid], rewards[aid], infos[aid] = o, float(r), info
            terminateds[aid], truncateds[aid] = bool(term), bool(trunc)
            if term or trunc:
                self.done.add(aid)
        all_done = len(self.done) == len(self.envs)
        terminateds["__all__"] = all_done and any(terminateds.values())
        truncateds["__all__"] = all_done and not terminateds["__all__"]
        return obs, rewards, terminateds, truncateds, infos

    def close(self) -> None:
        for env in self.envs.values():
            env.close()


def import_env_module(name: str, reference: str, option: str = "--env"):
    """The module `name` of the `option` reference `module:...` (--env,
    --policy). As `python -m` does, a module in the current directory is
    found too (the `episode` script's sys.path starts with its own folder
    instead): the directory is added to sys.path, and stays there if the
    module is found in it (the module may import its neighbours later)."""
    import importlib

    def missing(e: ImportError) -> bool:
        return isinstance(e, ModuleNotFoundError) and e.name is not None \
            and (name == e.name or name.startswith(e.name + "."))

    def error(e: ImportError) -> UsageError:
        if missing(e):
            return UsageError(f"{option} {reference!r}: no module named {name!r}, neither in "
                              f"the current directory nor on sys.path")
        return UsageError(f"{option} {reference!r}: cannot import module {name!r}: {e}")

    cwd = os.getcwd()
    try:
        return importlib.import_module(name)
    except ImportError as e:
        if not missing(e) or cwd in sys.path or "" in sys.path:
            raise error(e) from None
    sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except ImportError as e:
        sys.path.remove(cwd)
        raise error(e) from None


def _multi_agent_factory(reference: str):
    """The class or function `module:attr` names (for a PettingZoo
    ParallelEnv or an RLlib MultiAgentEnv), or None for a gymnasium id. A
    `module:EnvId-v0` id's module is imported here, so that gymnasium finds
    it registered; UsageError if the module cannot be imported, or has no
    such attribute and no such environment is registered."""
    import gymnasium as gym

    module_name, sep, attr = reference.partition(":")
    if not sep:
        return None
    if not module_name or not attr:
        raise UsageError(f"--env {reference!r}: expected a gymnasium id or module:name")
    module = import_env_module(module_name, reference)
    if attr.isidentifier() and not hasattr(module, attr) and attr not in gym.registry \
            and reference not in gym.registry:
        raise UsageError(f"--env {reference!r}: module {module_name!r} has no attribute "
                         f"{attr!r} (and no environment {attr!r} is registered)")
    factory = getattr(module, attr, None) if attr.isidentifier() else None
    return factory if callable(factory) else None


def _multi_agent_env(reference: str, factory):
    """The multi-agent env `factory` (called without arguments) makes."""
    try:
        env = factory()
    except Exception as e:  # noqa: BLE001 -- a user's env: report, do not trace back
        raise UsageError(f"cannot make environment {reference!r}: {e}") from None
    if hasattr(env, "possible_agents") or hasattr(env, "get_agent_ids") \
            or callable(getattr(env, "get_action_space", None)):
        return env
    raise UsageError(f"{reference!r} made a {type(env).__name__}, which is neither a "
                     f"PettingZoo ParallelEnv nor an RLlib MultiAgentEnv")


# -- the sampler ---------------------------------------------------------------

def demo_views(frame_stack: int, prev_actions: bool, observation_space=None,
               action_space=None) -> dict:
    """RLlib's default views, plus a stack of the last `frame_stack`
    observations ("obs_frames") and prev_actions / prev_rewards if asked."""
    from episode.sampling import default_view_requirements
    from episode.views import ViewRequirement

    views = default_view_requirements(observation_space, action_space)
    space = {} if observation_space is None else {"space": observation_space}
    if frame_stack > 1:
        views["obs_frames"] = ViewRequirement("obs", shift=f"{1 - frame_stack}:0", **space)
    if prev_actions:
        views["prev_actions"] = ViewRequirement("actions", shift=-1, **(
            {} if action_space is None else {"space": action_space}))
        views["prev_rewards"] = ViewRequirement("rewards", shift=-1)
    return views


def make_sampler(args, stats):
    """The Sampler of `demo` and `record` on the env `args` names (--env,
    --agents, --num-envs), its env steps timed into `stats.env_s`."""
    from episode.sampling import Sampler

    if args.num_envs > args.steps:
        # Each step of the vector env is one env step of every sub-env.
        raise UsageError(f"--num-envs {args.num_envs:,} takes {args.num_envs:,} env steps at "
                         f"each step of the vector env, more than --steps {args.steps:,}")
    factory = _multi_agent_factory(args.env)
    if factory is not None or args.agents > 1:
        if args.num_envs != 1:
            raise UsageError("--num-envs needs a gymnasium env id: a multi-agent env "
                             "(--agents, or --env module:factory) is one env")
        if factory is not None and args.agents > 1:
            raise UsageError(f"--agents makes copies of a gymnasium env; {args.env!r} names "
                             f"a multi-agent env factory")
        made = Copies(args.env, args.agents) if factory is None \
            else _multi_agent_env(args.env, factory)
        env = _Timed(made, stats)
        views = demo_views(args.frame_stack, args.prev_actions)
    else:
        env = _timed_vector_env(make_env(args.env, args.num_envs), stats)
        views = demo_views(args.frame_stack, args.prev_actions,
                           env.single_observation_space, env.single_action_space)
    try:
        sampler = Sampler(env, view_requirements=views, batch_mode=args.batch_mode,
                          rollout_fragment_length=args.rollout_fragment_length,
                          count_steps_by=args.count_steps_by, seed=args.seed)
    except ValueError as e:
        env.close()
        raise UsageError(str(e)) from None
    return sampler
