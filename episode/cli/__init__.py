"""The `episode` command (`python -m episode`): a sampling demo, a benchmark,
and recording and inspecting datasets of episodes.

    episode demo [--env CartPole-v1] [--num-envs 1] [--agents N] [--steps 100000]
                 [--batch-mode truncate_episodes] [--rollout-fragment-length 200] ...
    episode bench [--rounds 7] [--workloads a,b] [--json PATH] [--plot PATH]
    episode record --env ID --steps N --out DIR [--policy module:function]
                   [--num-envs 1] [--format parquet|arrow] [--compression C] ...
    episode inspect DIR [--json]
    episode --version

`demo` runs an episode.Sampler on a gymnasium environment (or a multi-agent
one: N copies of a gymnasium env as agents, a PettingZoo ParallelEnv or an
RLlib MultiAgentEnv) with random actions; `bench` times the workloads of
episode.cli.workloads for ours and, when ray[rllib] is installed, for RLlib's
SingleAgentEpisode in the same process; `record` samples an env as `demo`
takes them (random actions, or a policy function) into a dataset with
episode.offline's EpisodeWriter; `inspect` describes a dataset read_episodes
opens (files, schema, counts, episode-length and return statistics).
Without a command, `demo` runs.

User errors (bad paths, foreign or damaged datasets among them) print one
line, ``episode: error: ...``, and exit with status 2; Ctrl-C prints what was
measured (or recorded: `record` writes what it sampled) so far and exits with
status 130.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import pickle
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, TextIO

from episode import __version__
from episode._extras import RLLIB_EXTRA
from episode.spaces import batch_size

__all__ = ["main"]

# The parser's description: a constant, since `python -OO` strips __doc__.
DESCRIPTION = ("The `episode` command (`python -m episode`): a sampling demo, a benchmark, "
               "and recording and inspecting datasets of episodes.")

RLLIB_HINT = f"RLlib comparison off: {RLLIB_EXTRA}"


class UsageError(Exception):
    """A mistake in the command line: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        # One line instead of argparse's usage block.
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, not {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


# -- progress -----------------------------------------------------------------

class Progress:
    """A one-line progress bar on stderr, redrawn at most ten times a second.

    Off by default when the stream is not a terminal (a log file would fill
    with carriage returns); `enabled` forces it on or off.
    """

    WIDTH = 30

    def __init__(self, total: int, unit: str, enabled: bool | None = None,
                 stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total = total
        self.unit = unit
        self.start = time.perf_counter()
        self._drawn = 0.0
        self._line_len = 0
        self._done = 0
        self._note = ""

    def update(self, done: int, note: str = "") -> None:
        if not self.enabled:
            return
        self._done, self._note = done, note
        now = time.perf_counter()
        if now - self._drawn >= 0.1:
            self._drawn = now
            self._draw(now)

    def close(self) -> None:
        """Draws the last state and ends the line."""
        if self.enabled:
            self._draw(time.perf_counter())
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, now: float) -> None:
        frac = min(self._done / self.total, 1.0) if self.total else 1.0
        filled = int(frac * self.WIDTH)
        elapsed = now - self.start
        rate = self._done / elapsed if elapsed > 0 else 0.0
        line = (f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {frac:4.0%} "
                f"{self._done:,}/{self.total:,} {self.unit} {elapsed:5.1f}s "
                f"{rate:,.0f} {self.unit}/s {self._note}").rstrip()
        # Pad over the rest of a longer previous line.
        self.stream.write("\r" + line.ljust(self._line_len))
        self.stream.flush()
        self._line_len = len(line)


# -- formatting ---------------------------------------------------------------

def format_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def format_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def format_table(header: list[str], rows: list[list[str]], right: Collection[int] = ()) -> str:
    """A plain-text table: columns padded, those in `right` right-aligned."""
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    lines = []
    for row in [header, ["-" * w for w in widths], *rows]:
        cells = [x.rjust(w) if i in right else x.ljust(w)
                 for i, (x, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


# -- demo ---------------------------------------------------------------------

@dataclass
class DemoStats:
    env_steps: int = 0          # env steps sampled
    agent_steps: int = 0        # agent steps (multi-agent envs; else the env steps)
    episodes: int = 0           # finished episodes
    returns: float = 0.0        # sum of the finished episodes' returns
    lengths: int = 0            # sum of their lengths (env steps)
    batches: int = 0            # training batches built (sample() calls)
    rows: int = 0               # their rows
    env_s: float = 0.0          # seconds in env.reset() / env.step()
    policy_s: float = 0.0       # seconds in the policy
    wall_s: float = 0.0
    # What one row of a batch holds, per module id (None: a single-agent
    # env): each column's shape after the batch axis, and its dtype.
    rows_of: dict = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)    # the same of one policy input row


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a seed >= 0, got {text!r}")
    return value


def _make_env(env_id: str, num_envs: int):
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

    def __init__(self, env, stats: DemoStats):
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


def _timed_vector_env(env, stats: DemoStats):
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


def _import_env_module(name: str, reference: str, option: str = "--env"):
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
    module = _import_env_module(module_name, reference)
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


# -- the demo --------------------------------------------------------------------

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


def _random_policy(sampler, stats: DemoStats):
    """Random actions, from a policy that is handed the inference input (so
    the views it reads are built each step) and notes its shapes. They come
    from the spaces the Sampler's own random actions come from (seeded)."""
    def policy(inputs):
        t0 = time.perf_counter()
        if sampler.multi_agent:
            # The seeded spaces of the Sampler's own random actions (the
            # demo's multi-agent env is its only sub-env).
            spaces = sampler._action_spaces[0]
            stats.inputs = _row_layout(next(iter(inputs.values()))) if inputs \
                else stats.inputs
            actions = {aid: spaces[aid].sample() for aid in inputs}
        else:
            stats.inputs = _row_layout(inputs)
            actions = sampler.env.action_space.sample()
        stats.policy_s += time.perf_counter() - t0
        return actions

    return policy


def _collect(sampler, steps: int, stats: DemoStats, progress: Progress) -> None:
    """sample() until `steps` env steps: each call's training batch counted,
    each finished episode's return and length. Each rollout is cut short to
    the steps still missing (at least one vector step)."""
    fragment = sampler.rollout_fragment_length
    try:
        while stats.env_steps < steps:
            missing = (steps - stats.env_steps) // sampler.num_envs
            sampler.rollout_fragment_length = max(1, min(fragment, missing))
            batch = sampler.sample()
            stats.batches += 1
            # Per module id for multi-agent envs.
            modules = batch.items() if sampler.multi_agent else [(None, batch)]
            for module_id, columns in modules:
                if columns:
                    # (The rows of the first column: a struct's first leaf's.)
                    stats.rows += batch_size(next(iter(columns.values())))
                    stats.rows_of[module_id] = _row_layout(columns)
            _add_metrics(sampler, stats)
            progress.update(min(stats.env_steps, steps))
    finally:
        sampler.rollout_fragment_length = fragment
        _add_metrics(sampler, stats)


def _add_metrics(sampler, stats: DemoStats) -> None:
    m = sampler.get_metrics()
    stats.env_steps += m["env_steps"]
    stats.agent_steps += m["agent_steps"]
    stats.episodes += m["episodes_done"]
    stats.returns += sum(m["episode_returns"])
    stats.lengths += sum(m["episode_lengths"])


def _held_bytes(episodes: list) -> int:
    """Bytes an unpickled copy of `episodes` allocates, traced by tracemalloc.

    Tracing the whole run would slow every allocation; a copy holds the same
    data, spaces included, without the spare capacity of growing buffers.
    """
    blob = pickle.dumps(episodes, protocol=5)
    tracemalloc.start()
    try:
        copy = pickle.loads(blob)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del copy
    return held


def _row_layout(columns: dict) -> dict:
    """What one row of each column holds: (its shape after the batch axis,
    its dtype); a dict or list of them for Dict/Tuple items. The same for
    every batch, however many rows it has."""
    def row(value):
        if isinstance(value, dict):
            return {k: row(v) for k, v in value.items()}
        if isinstance(value, tuple):
            return [row(v) for v in value]
        shape = getattr(value, "shape", None)
        return (tuple(shape[1:]) if shape else None, getattr(value, "dtype", None))

    return {k: row(v) for k, v in columns.items()}


def _format_row(row) -> str:
    """numpy's dtype name and the row shape: `float32[4, 4]`, `int64` (one
    number a row), `str` (eps_id), `object` (infos)."""
    if isinstance(row, dict):
        return "{" + ", ".join(f"{k}: {_format_row(v)}" for k, v in row.items()) + "}"
    if isinstance(row, list):
        return "(" + ", ".join(_format_row(v) for v in row) + ")"
    shape, dtype = row
    if dtype is None:
        return "?"
    name = {"U": "str", "S": "bytes", "O": "object"}.get(dtype.kind, dtype.name)
    return f"{name}[{', '.join(map(str, shape))}]" if shape else name


def _rows(layout: dict) -> str:
    return ", ".join(f"{k} {_format_row(v)}" for k, v in layout.items())


def _demo_summary(args, sampler, stats: DemoStats) -> str:
    def rate(seconds: float) -> str:
        return f"{stats.env_steps / seconds:>12,.0f} steps/s" if seconds > 0 else ""

    if sampler.multi_agent:
        agents = f"{args.agents} copies as agents" if args.agents > 1 else "multi-agent"
        head = f"{args.env}: {agents}, seed {args.seed}, count_steps_by={args.count_steps_by}"
    else:
        head = f"{args.env}: {sampler.num_envs} sync env(s), seed {args.seed}"
    head += (f", {args.batch_mode}, rollout_fragment_length={args.rollout_fragment_length}, "
             f"random actions")
    if stats.episodes:
        means = (f"mean return {stats.returns / stats.episodes:.1f}, "
                 f"mean length {stats.lengths / stats.episodes:.1f}")
    else:
        means = "none finished yet"
    sampler_s = max(stats.wall_s - stats.env_s - stats.policy_s, 0.0)
    steps_note = f"in {stats.wall_s:.2f} s wall time"
    if sampler.multi_agent:
        steps_note = f"{stats.agent_steps:,} agent steps, " + steps_note
    rows = [
        ("episodes finished", f"{stats.episodes:,}", means),
        ("env steps", f"{stats.env_steps:,}", steps_note),
        ("in the env", f"{stats.env_s:.3f} s", f"{rate(stats.env_s)}  (env.reset, env.step)"),
        ("in the sampler", f"{sampler_s:.3f} s",
         f"{rate(sampler_s)}  (episodes, views, batches; {stats.policy_s:.3f} s in the policy)"),
        ("batches built", f"{stats.batches:,}", f"{stats.rows:,} rows"),
    ]
    # One row of the batches (of each module's, multi-agent), as it is in
    # every batch: the columns' shapes after the batch axis, and dtypes.
    for i, (module_id, layout) in enumerate(stats.rows_of.items()):
        module = "" if module_id is None else f"{module_id}: "
        rows.append(("per row" if i == 0 else "", "", module + _rows(layout)))
    if stats.inputs:
        each = "agent" if sampler.multi_agent else "sub-env"
        rows.append(("policy input", "", f"a row per {each}: {_rows(stats.inputs)}"))
    live = sampler.ongoing_episodes()
    rows.append(("memory held", format_bytes(_held_bytes(live)),
                 f"by {len(live)} ongoing episode(s) (tracemalloc, on an unpickled copy)"))
    width = max(len(r[1]) for r in rows)
    return "\n".join([head] + [f"  {a:<18} {b:>{width}}  {c}" for a, b, c in rows])


def _demo_sampler(args, stats: DemoStats):
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
        env = _timed_vector_env(_make_env(args.env, args.num_envs), stats)
        views = demo_views(args.frame_stack, args.prev_actions,
                           env.single_observation_space, env.single_action_space)
    try:
        sampler = Sampler(env, view_requirements=views, batch_mode=args.batch_mode,
                          rollout_fragment_length=args.rollout_fragment_length,
                          count_steps_by=args.count_steps_by, seed=args.seed)
    except ValueError as e:
        env.close()
        raise UsageError(str(e)) from None
    if args.frame_stack > 1 or args.prev_actions:
        sampler.policy = _random_policy(sampler, stats)
    return sampler


def demo(args) -> int:
    stats = DemoStats()
    sampler = _demo_sampler(args, stats)
    progress = Progress(args.steps, "steps", args.progress)
    start = time.perf_counter()
    interrupted = False
    try:
        _collect(sampler, args.steps, stats, progress)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        stats.wall_s = time.perf_counter() - start
        progress.close()
    try:
        if interrupted:
            print("interrupted", file=sys.stderr)
        print(_demo_summary(args, sampler, stats))
    finally:
        sampler.close()
    return 130 if interrupted else 0


# -- bench --------------------------------------------------------------------

MIN_ROUND_S = 5e-3          # a timed round lasts at least this long
MIN_ROUND_S_QUICK = 1e-4


@dataclass
class BenchResult:
    workload: Any
    times: dict = field(default_factory=lambda: {"ours": [], "rllib": []})  # s per call
    mismatch: str | None = None
    missing: str | None = None     # why RLlib's side could not run, if it could not

    def median(self, impl: str) -> float | None:
        return statistics.median(self.times[impl]) if self.times[impl] else None

    def speedup(self) -> float | None:
        ours, rllib = self.median("ours"), self.median("rllib")
        return rllib / ours if ours and rllib else None


def _check_writable(path: str, option: str) -> None:
    """Raises UsageError now, rather than after the benchmark, if `path`
    cannot be written."""
    existed = os.path.exists(path)
    try:
        open(path, "a").close()
    except OSError as e:
        raise UsageError(f"cannot write {option} file {path!r}: {e.strerror}") from None
    if not existed:
        os.remove(path)


def _time_calls(rnd, number: int) -> float:
    """Seconds `number` rounds take, their setups not counted."""
    clock = time.perf_counter
    if rnd.setup is None:
        run = rnd.run
        t0 = clock()
        for _ in range(number):
            run()
        return clock() - t0
    total = 0.0
    for _ in range(number):
        args = rnd.setup()
        t0 = clock()
        rnd.run(*args)
        total += clock() - t0
    return total


def _calls_per_round(rnd, min_s: float) -> int:
    """How many calls make a timed round last min_s (as timeit's autorange)."""
    number = 1
    while _time_calls(rnd, number) < min_s:
        number *= 2
    return number


def _bench_workload(workload, classes: dict, rounds: int, min_s: float, result: BenchResult,
                    progress: Progress, done: int) -> None:
    from episode.cli.workloads import assert_same

    prepared = {}
    for impl, cls in classes.items():
        try:
            prepared[impl] = workload.prepare(cls)
        except ImportError as e:
            if impl == "ours":
                raise
            result.missing = f"RLlib's side needs {e.name or e}"
    outputs = {impl: rnd.once() for impl, rnd in prepared.items()}
    if len(outputs) == 2:
        try:
            assert_same(outputs["ours"], outputs["rllib"])
        except AssertionError as e:
            result.mismatch = str(e).splitlines()[0]
    del outputs
    number = {impl: _calls_per_round(rnd, min_s) for impl, rnd in prepared.items()}
    impls = list(prepared)
    for r in range(rounds):
        # Interleaved, in alternating order, so drift hits both sides alike.
        for impl in impls if r % 2 == 0 else impls[::-1]:
            seconds = _time_calls(prepared[impl], number[impl])
            result.times[impl].append(seconds / number[impl])
        progress.update(done + r + 1, workload.name)


def _machine() -> dict:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:   # Linux only
        cpu = next((line.split(":", 1)[1].strip() for line in f
                    if line.startswith("model name")), cpu)
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count()}


def _report(results: list[BenchResult], with_rllib: bool, interrupted: bool) -> dict:
    import numpy as np

    from episode.cli.workloads import ray_version

    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": _machine(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "ray": ray_version() if with_rllib else None,
        "interrupted": interrupted,
        "results": [{
            "workload": r.workload.name,
            "description": r.workload.description,
            "items": r.workload.items,
            "ours_s": r.median("ours"),
            "rllib_s": r.median("rllib"),
            "speedup": r.speedup(),
            "rounds": len(r.times["ours"]),
        } for r in results if r.times["ours"]],
    }


def _bench_table(report: dict, with_rllib: bool) -> str:
    header = ["workload", "rounds", "items", "ours", "ours/item"]
    if with_rllib:
        header += ["RLlib", "RLlib/item", "speed-up"]
    rows = []
    for r in report["results"]:
        n = r["items"]
        row = [r["workload"], str(r["rounds"]), f"{n:,}", format_time(r["ours_s"]),
               format_time(r["ours_s"] / n) if n > 1 else ""]
        if with_rllib:
            row += [format_time(r["rllib_s"]),
                    format_time(r["rllib_s"] / n) if n > 1 and r["rllib_s"] else "",
                    f"{r['speedup']:.1f}x" if r["speedup"] else "-"]
        rows.append(row)
    return format_table(header, rows, right=set(range(1, len(header))))


def _plot(report: dict, path: str) -> None:
    """A horizontal bar per workload: RLlib's time / ours, from the 1x line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    rows = [r for r in report["results"] if r["speedup"]][::-1]   # first on top
    names = [r["workload"] for r in rows]
    values = [r["speedup"] for r in rows]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.42 * len(rows)))
    colors = ["tab:green" if v >= 1 else "tab:red" for v in values]
    bars = ax.barh(names, [v - 1 for v in values], left=1, color=colors, height=0.6)
    ax.bar_label(bars, labels=[f"{v:.1f}x" for v in values], padding=4, fontsize=9)
    ax.axvline(1, color="black", linewidth=1)
    lo, hi = min(values + [1.0]), max(values + [1.0])
    if hi / lo > 20:
        ax.set_xscale("log")
        ax.set_xlim(lo / 1.5, hi * 1.8)
    else:
        ax.set_xlim(0, hi * 1.2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
    scale = ", log scale" if ax.get_xscale() == "log" else ""
    ax.set_xlabel(f"speed-up: RLlib {report['ray']} time / episode time{scale}")
    machine = report["machine"]
    ax.set_title(f"episode vs RLlib SingleAgentEpisode, {report['date'][:10]}\n"
                 f"{machine['cpu']}, {machine['cores']} cores, Python {report['python']}",
                 fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bench(args) -> int:
    from episode.cli.workloads import WORKLOADS

    if args.workloads is not None:
        names = [n.strip() for n in args.workloads.split(",") if n.strip()]
        unknown = [n for n in names if n not in WORKLOADS]
        if unknown or not names:
            raise UsageError(f"unknown workload(s) {', '.join(unknown) or repr(args.workloads)}; "
                             f"known: {', '.join(WORKLOADS)}")
    else:
        names = list(WORKLOADS)
    if args.json:
        _check_writable(args.json, "--json")
    if args.plot:
        _check_writable(args.plot, "--plot")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError('--plot needs matplotlib: pip install "episode[plot]"') from None

    from episode import SingleAgentEpisode
    from episode.cli.workloads import rllib_class

    classes: dict[str, type] = {"ours": SingleAgentEpisode}
    rllib = rllib_class()
    if rllib is not None:
        classes["rllib"] = rllib
    elif args.plot:
        raise UsageError(f"--plot charts the speed-ups over RLlib, which is not installed: "
                         f"{RLLIB_EXTRA}")
    rounds = args.rounds or (3 if args.quick else 7)
    min_s = MIN_ROUND_S_QUICK if args.quick else MIN_ROUND_S

    results = []
    progress = Progress(len(names) * rounds, "rounds", args.progress)
    interrupted = False
    try:
        for k, name in enumerate(names):
            results.append(BenchResult(WORKLOADS[name]))
            _bench_workload(WORKLOADS[name], classes, rounds, min_s, results[-1], progress,
                            k * rounds)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        progress.close()

    if interrupted:
        print("interrupted", file=sys.stderr)
    for r in results:
        if r.missing:
            print(f"episode: note: {r.workload.name}: {r.missing}; timed ours only",
                  file=sys.stderr)
        if r.mismatch:
            print(f"episode: warning: {r.workload.name}: ours and RLlib's results differ: "
                  f"{r.mismatch}", file=sys.stderr)
    report = _report(results, "rllib" in classes, interrupted)
    print("median time per call over interleaved rounds (items: the steps, or episodes, "
          "one call handles)")
    print(_bench_table(report, "rllib" in classes))
    if "rllib" not in classes:
        print(RLLIB_HINT)
    if args.json and report["results"]:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    if args.plot and any(r["speedup"] for r in report["results"]):
        _plot(report, args.plot)
    return 130 if interrupted else 0


# -- record -------------------------------------------------------------------

class _PolicyError(Exception):
    """The --policy function raised: reported in one line (what was sampled
    before is written)."""


def _load_policy(reference: str):
    """The function `module:function` names, wrapped so that what it raises
    is told apart from the sampler's own errors (KeyboardInterrupt passes)."""
    module_name, sep, attr = reference.partition(":")
    if not sep or not module_name or not all(p.isidentifier() for p in attr.split(".")):
        raise UsageError(f"--policy {reference!r}: expected module:function")
    target = _import_env_module(module_name, reference, "--policy")
    for part in attr.split("."):
        target = getattr(target, part, None)
    if not callable(target):
        raise UsageError(f"--policy {reference!r}: module {module_name!r} has no function "
                         f"{attr!r}")

    def policy(inputs):
        try:
            return target(inputs)
        except Exception as e:  # noqa: BLE001 -- a user's function: report, do not trace back
            raise _PolicyError(f"--policy {reference!r} raised {type(e).__name__}: {e}") from e

    return policy


def _dataset_file(name: str) -> str | None:
    """'episodes' or 'steps' for a file name an EpisodeWriter writes, else None."""
    from episode.offline.format import EXTENSIONS

    stem, _, ext = name.rpartition(".")
    if name.startswith(".") or ext not in EXTENSIONS:
        return None
    if stem.endswith(".episodes"):
        return "episodes"
    return "steps" if ".steps-" in stem else None


def _existing_dataset(path: str, verify: bool = True) -> tuple | None:
    """(episodes, steps) of the dataset of ours at --out `path` to append
    to; None for a new or empty folder. UsageError for a file, a folder with
    other files in it (hidden ones aside: a writer's temporary files) and a
    dataset that does not read (every file read and checked, as `inspect`
    does)."""
    if not os.path.exists(path):
        return None
    if not os.path.isdir(path):
        raise UsageError(f"--out {path!r} is a file, not a folder")
    tables = False
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(n for n in names if not n.startswith(".")):
            kind = _dataset_file(name)
            if kind is None:
                raise UsageError(f"--out {path!r} holds files that are not an episode dataset "
                                 f"({os.path.join(root, name)}): record into a new or empty "
                                 f"folder, or into one of episode's datasets to add to it")
            tables = tables or kind == "episodes"
    if not tables:
        return None          # (step files alone: parts a killed writer never finished)
    ds = _open_dataset(path, "--out ", verify)
    _check_dataset(ds, "--out ")
    return len(ds), ds.num_steps


class _CtrlC:
    """Ctrl-C while recording. The first one asks the sampler of a vector
    env to stop at its next env step (see `_stoppable`), where every step so
    far is in its episodes, and the loop to stop after handing on a
    rollout; a second one stops at once, except inside a `critical()` block
    (a writer taking episodes or writing a part), where it waits for the
    block's end."""

    def __init__(self):
        self.requested = False
        self._critical = 0

    def __call__(self, signum, frame) -> None:
        if self.requested and not self._critical:
            raise KeyboardInterrupt
        self.requested = True

    @contextlib.contextmanager
    def installed(self):
        import signal

        try:
            previous = signal.signal(signal.SIGINT, self)
        except ValueError:      # not the main thread: Ctrl-C goes elsewhere
            yield
            return
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    @contextlib.contextmanager
    def critical(self):
        self._critical += 1
        try:
            yield
        finally:
            self._critical -= 1


def _stoppable(env, ctrl_c: _CtrlC):
    """`env` (a vector env) raising KeyboardInterrupt at a step once Ctrl-C
    was pressed: the sampler then hands on what it has, as for any step
    that raises."""
    import gymnasium as gym

    class StoppableVectorEnv(gym.vector.VectorWrapper):
        def step(self, actions):
            if ctrl_c.requested:
                raise KeyboardInterrupt
            return self.env.step(actions)

    return StoppableVectorEnv(env)


class _Recorder:
    """Hands a sampler's episodes to an EpisodeWriter and counts what it
    wrote. `complete`: only whole episodes are written; the chunks of a
    running episode wait here and are written joined once it ends."""

    def __init__(self, writer, complete: bool, ctrl_c: _CtrlC):
        self.writer, self.complete, self.ctrl_c = writer, complete, ctrl_c
        self.waiting: dict = {}    # complete: episode id -> its chunks so far
        self.ids: set = set()      # the episodes written (a chunk's id is its episode's)
        self.running: set = set()  # those whose last chunk written is not done
        self.steps = self.agent_steps = self.terminated = self.truncated = 0
        self.write_s = 0.0

    def hand_on(self, episodes: list) -> None:
        ready = []
        for e in episodes:
            if self.complete:
                if not e.is_done:
                    self.waiting.setdefault(e.id_, []).append(e)
                    continue
                chunks = self.waiting.pop(e.id_, [])
                if chunks:
                    for chunk in chunks[1:] + [e]:
                        chunks[0].concat_episode(chunk)
                    e = chunks[0]
            ready.append(e)
        t0 = time.perf_counter()
        try:
            with self.ctrl_c.critical():
                self.writer.write(ready)
        except (TypeError, ValueError) as e:
            raise UsageError(f"cannot record the episodes: {_one_line(e)}") from None
        except OSError as e:
            raise UsageError(f"cannot write into {self.writer.path!r}: {e.strerror or e}") \
                from None
        finally:
            self.write_s += time.perf_counter() - t0
        for e in ready:
            self.ids.add(e.id_)
            self.steps += len(e)
            self.agent_steps += e.agent_steps() if hasattr(e, "agent_steps") else len(e)
            if e.is_done:
                self.running.discard(e.id_)
                self.terminated += bool(e.is_terminated)
                self.truncated += bool(e.is_truncated)
            else:
                self.running.add(e.id_)

    def hand_on_leftovers(self, sampler) -> None:
        """After a rollout that raised: the episodes that ended in it and
        the chunks of the running ones."""
        self.hand_on(sampler.take_pending())

    def close(self) -> None:
        t0 = time.perf_counter()
        try:
            with self.ctrl_c.critical():
                self.writer.close()
        finally:
            self.write_s += time.perf_counter() - t0

    def left_out(self) -> tuple:
        """(episodes, steps) waiting unfinished (complete mode)."""
        return len(self.waiting), sum(len(c) for chunks in self.waiting.values() for c in chunks)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


@dataclass
class RecordStats:
    env_steps: int = 0          # env steps sampled
    wall_s: float = 0.0


def _record_loop(sampler, recorder: _Recorder, steps: int, stats: RecordStats,
                 progress: Progress) -> None:
    """Rollouts until `steps` env steps (complete mode: steps of whole
    episodes written), each handed to the recorder. Each rollout is cut
    short to the steps still missing (at least one vector step). A rollout
    that raises hands on what it sampled, then the error is raised on;
    Ctrl-C raises KeyboardInterrupt once what was sampled is handed on."""
    fragment = sampler.rollout_fragment_length

    def done() -> int:
        return recorder.steps if recorder.complete else stats.env_steps

    try:
        while done() < steps:
            missing = (steps - done()) // sampler.num_envs
            sampler.rollout_fragment_length = max(1, min(fragment, missing))
            try:
                episodes = sampler.sample_episodes()
            except BaseException:
                stats.env_steps += sampler.get_metrics()["env_steps"]
                recorder.hand_on_leftovers(sampler)
                raise
            stats.env_steps += sampler.get_metrics()["env_steps"]
            recorder.hand_on(episodes)
            progress.update(min(done(), steps))
            if recorder.ctrl_c.requested:
                raise KeyboardInterrupt
    finally:
        sampler.rollout_fragment_length = fragment


def _record_writer(args):
    from episode.offline import DatasetError, EpisodeWriter

    options = {"format": args.format, "mixed_spaces": args.mixed_spaces,
               "seconds_per_file": args.seconds_per_file or None}
    if args.compression is not None:
        options["compression"] = args.compression
    if args.rows_per_file is not None:
        options["rows_per_file"] = args.rows_per_file
    if args.mb_per_file is not None:
        options["bytes_per_file"] = args.mb_per_file << 20
    try:
        return EpisodeWriter(args.out, **options)
    except DatasetError as e:
        raise UsageError(f"--out {_one_line(e)}") from None
    except ValueError as e:
        raise UsageError(f"--compression {args.compression}: {e}") from None
    except OSError as e:
        raise UsageError(f"cannot write --out {args.out!r}: {e.strerror or e}") from None
    except ModuleNotFoundError as e:
        raise UsageError(str(e)) from None


def _record_summary(args, sampler, recorder: _Recorder, stats: RecordStats, env_s: float,
                    before: tuple | None) -> str:
    writer = recorder.writer
    policy = f"policy {args.policy}" if args.policy else "random actions"
    compression = writer.compression or "uncompressed"
    if sampler.multi_agent:
        envs = f"{args.agents} copies as agents" if args.agents > 1 else "multi-agent"
    else:
        envs = f"{sampler.num_envs} sync env(s)"
    head = (f"{args.env} -> {args.out}: {envs}, seed {args.seed}, {args.batch_mode}, "
            f"rollout_fragment_length={args.rollout_fragment_length}, {policy}; "
            f"{writer.format}, {compression}")
    episodes = len(recorder.ids)
    done = recorder.terminated + recorder.truncated
    note = f"{done:,} done ({recorder.terminated:,} terminated, {recorder.truncated:,} truncated)"
    if recorder.running:
        note += f", {len(recorder.running):,} running at the end (written as they were)"
    rate = f", {stats.env_steps / stats.wall_s:,.0f} steps/s" if stats.wall_s > 0 else ""
    sizes = [os.path.getsize(f) for f in writer.files if os.path.exists(f)]
    on_disk = sum(sizes)
    per_step = f"{on_disk / recorder.steps:.1f} B per step" if recorder.steps else ""
    agents = f" ({recorder.agent_steps:,} agent steps)" if sampler.multi_agent else ""
    rows = [
        ("episodes", f"{episodes:,}", note),
        ("steps", f"{recorder.steps:,}",
         (f"of {stats.env_steps:,} env steps sampled{agents} in {stats.wall_s:.2f} s{rate} "
          f"({env_s:.2f} s in the env, {recorder.write_s:.2f} s writing)")),
        ("files", f"{len(writer.files):,}", f"written into {args.out}"),
        ("on disk", format_bytes(on_disk), per_step),
    ]
    if recorder.complete:
        left, left_steps = recorder.left_out()
        rows.append(("left out", f"{left:,}", (f"running episode(s) of {left_steps:,} steps "
                                                f"(complete_episodes writes whole episodes)")))
    if before is not None:
        rows.append(("dataset", f"{before[0] + episodes:,}",
                     (f"episodes, {before[1] + recorder.steps:,} steps in all: appended to "
                      f"the dataset of {before[0]:,} episodes that was there")))
    width = max(len(r[1]) for r in rows)
    return "\n".join([head] + [f"  {a:<10} {b:>{width}}  {c}".rstrip() for a, b, c in rows])


def _check_spaces(writer, sampler) -> None:
    """UsageError, before anything is sampled, when the env's spaces are not
    those of the dataset at --out (a multi-agent env's agents are checked
    as their episodes are written)."""
    if sampler.multi_agent:
        return
    try:
        writer.check_spaces(sampler.env.single_observation_space,
                            sampler.env.single_action_space)
    except ValueError as e:
        message = _one_line(e).replace("EpisodeWriter(..., mixed_spaces=True)", "--mixed-spaces")
        raise UsageError(f"--out {message}") from None


def _made_folders(path: str) -> list:
    """The folders that making `path` would make, deepest first."""
    made = []
    path = os.path.abspath(path)
    while not os.path.exists(path):
        made.append(path)
        path = os.path.dirname(path)
    return made


def _remove_recording(writer, made: list) -> None:
    """Takes back what a recording that wrote no episode left: the writer's
    (empty) files and the folders it made."""
    for f in writer.files:
        with contextlib.suppress(OSError):
            os.remove(f)
    for folder in made:
        with contextlib.suppress(OSError):
            os.rmdir(folder)         # (only if empty)


def record(args) -> int:
    policy = _load_policy(args.policy) if args.policy else None
    before = _existing_dataset(args.out, args.verify)
    made = _made_folders(args.out)
    demo_stats = DemoStats()
    # Rollouts cut the running episodes and hand the chunks on (complete
    # mode joins them here), so no sampled step stays in the sampler.
    sampler = _demo_sampler(argparse.Namespace(**{
        **vars(args), "batch_mode": "truncate_episodes", "count_steps_by": "env_steps",
        "frame_stack": 1, "prev_actions": False}), demo_stats)
    ctrl_c = _CtrlC()
    if not sampler.multi_agent:
        # (A multi-agent rollout that raises loses the episodes that ended
        # in it: there Ctrl-C stops at the rollout's end.)
        sampler.env = _stoppable(sampler.env, ctrl_c)
    if policy is not None:
        sampler.policy = policy
    recorder = None
    try:
        recorder = _Recorder(_record_writer(args), args.batch_mode == "complete_episodes",
                             ctrl_c)
        _check_spaces(recorder.writer, sampler)
        stats = RecordStats()
        progress = Progress(args.steps, "steps", args.progress)
        start = time.perf_counter()
        status, error = 0, None
        with ctrl_c.installed():
            try:
                _record_loop(sampler, recorder, args.steps, stats, progress)
            except KeyboardInterrupt:
                status = 130
            except (_PolicyError, ValueError) as e:
                # The policy's error, or what the sampler refused (an action
                # outside the action space, an observation outside the
                # observation space).
                status, error = 2, _one_line(e)
            finally:
                try:
                    recorder.close()
                except OSError as e:
                    raise UsageError(f"cannot write into {args.out!r}: {e.strerror or e}") \
                        from None
                finally:
                    stats.wall_s = time.perf_counter() - start
                    progress.close()
        if status == 130:
            print("interrupted", file=sys.stderr)
        if not recorder.ids:
            _remove_recording(recorder.writer, made)
        print(_record_summary(args, sampler, recorder, stats, demo_stats.env_s, before))
        if error is not None:
            print(f"episode: error: {error} (what was sampled before it is written)",
                  file=sys.stderr)
        return status
    except BaseException:
        if recorder is not None and not recorder.ids:
            _remove_recording(recorder.writer, made)
        raise
    finally:
        sampler.close()


# -- inspect ------------------------------------------------------------------

def _open_dataset(path: str, label: str = "", verify: bool = True):
    """read_episodes(path), its errors as UsageError (one line, naming the file)."""
    try:
        from episode.offline import DatasetError, read_episodes
    except ModuleNotFoundError as e:
        raise UsageError(str(e)) from None
    try:
        return read_episodes(path, verify=verify)
    except FileNotFoundError:
        raise UsageError(f"{label}no dataset at {path!r}: no such file or folder") from None
    except DatasetError as e:
        raise UsageError(f"{label}{_one_line(e)}") from None
    except ModuleNotFoundError as e:      # pyarrow or msgpack missing
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"{label}cannot read {e.filename or path!r}: {e.strerror or e}") \
            from None


def _check_dataset(ds, label: str = "") -> None:
    """ds.check() (every file read and checked), its errors as UsageError."""
    from episode.offline import DatasetError

    try:
        ds.check()
    except DatasetError as e:
        raise UsageError(f"{label}{_one_line(e)}") from None
    except OSError as e:
        raise UsageError(f"{label}cannot read {e.filename or ds.path!r}: {e.strerror or e}") \
            from None


def _arrow_type(t) -> str:
    """An Arrow type, the fixed-shape tensors shortened."""
    import pyarrow as pa

    if isinstance(t, pa.FixedShapeTensorType):
        return f"fixed_shape_tensor[{t.value_type}, {list(t.shape)}]"
    if isinstance(t, pa.StructType):
        return "struct"
    return str(t)


_STORED_AS = {"arrow": "numbers", "bytes": "fixed-size bytes", "value": "msgpack values",
              "none": "nothing", "zero": "nothing (zero-size rows)"}


def _track_leaves(name: str, tree, arrow_type, where: str, out: list) -> None:
    """The rows describing a track's leaves (Dict/Tuple nested: name.key...),
    each checked against the step file's Arrow type."""
    import pyarrow as pa

    from episode._column import KINDS
    from episode.offline import DatasetError
    from episode.offline import format as fmt

    if isinstance(tree, dict):
        dtype = fmt.leaf_dtype(tree)
        kinds = {v: k for k, v in KINDS.items()}
        out.append({
            "column": name, "arrow_type": _arrow_type(arrow_type),
            "dtype": None if dtype is None else str(dtype),
            "shape": list(tree["shape"]) if tree["codec"] in fmt.STORED else None,
            "stored_as": _STORED_AS[tree["codec"]],
            "items": kinds.get(tree["kind"], str(tree["kind"])),
            "mode": "numpy" if tree["finalized"] else "list",
        })
        return
    kind, subs = tree
    if not subs:
        out.append({"column": name, "arrow_type": _arrow_type(arrow_type), "dtype": None,
                    "shape": None, "stored_as": "nothing", "items": f"empty {kind}",
                    "mode": None})
        return
    if not isinstance(arrow_type, pa.StructType) or arrow_type.num_fields != len(subs):
        raise DatasetError(f"{where}: column {name!r} is {arrow_type}, not a struct of "
                           f"{len(subs)} fields")
    for i, sub in enumerate(subs):
        key, sub = sub if kind == "dict" else (i, sub)
        _track_leaves(f"{name}.{key}", sub, arrow_type.field(i).type, where, out)


def _infos_rows(path: str, pa) -> tuple:
    """(rows with an info, rows) of a step file: from the Parquet footer's
    statistics where it has them, else from the (mapped) column."""
    if path.endswith(".arrow"):
        reader = pa.ipc.open_file(pa.memory_map(path))
        index = reader.schema.get_field_index("infos")
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        rows = sum(b.num_rows for b in batches)
        return rows - sum(b.column(index).null_count for b in batches), rows
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    # (Parquet's leaf columns: a struct or tensor column has several.)
    index = [meta.schema.column(i).path for i in range(meta.num_columns)].index("infos")
    nulls = 0
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(index).statistics
        if stats is None or not stats.has_null_count:
            column = pq.read_table(path, columns=["infos"]).column(0)
            return len(column) - column.null_count, meta.num_rows
        nulls += stats.null_count
    return meta.num_rows - nulls, meta.num_rows


def _step_files(paths: list) -> tuple:
    """(the schemas of the step files: each distinct one once, with its
    columns and how many files have it; the extra output keys; (rows with
    an info, rows); the format versions)."""
    import pyarrow as pa

    from episode.offline import DatasetError
    from episode.offline import format as fmt
    from episode.offline.dataset import read_schema

    schemas: dict = {}
    extras: list = []
    infos = [0, 0]
    versions = set()
    for path in paths:
        schema = read_schema(path)
        meta = fmt.read_metadata(schema, path, "steps")
        versions.add(meta["version"])
        key = (str(schema.remove_metadata()), json.dumps(meta, sort_keys=True))
        if key in schemas:
            schemas[key]["step_files"] += 1
        else:
            tracks, extra_specs = meta.get("tracks"), meta.get("extras")
            if not (isinstance(tracks, list) and isinstance(extra_specs, list)):
                raise DatasetError(f"{path}: malformed track metadata")
            columns: list = []
            for i, spec in enumerate(tracks + extra_specs):
                if not (isinstance(spec, dict) and isinstance(spec.get("column"), str)):
                    raise DatasetError(f"{path}: malformed track metadata")
                name = spec["column"]
                if name not in schema.names:
                    raise DatasetError(f"{path}: no column {name!r}")
                tree = fmt.tree_from_json(spec.get("tree"), f"{path}: column {name!r}")
                _track_leaves(name, tree, schema.field(name).type, path, columns)
                if i >= len(tracks):
                    extra = fmt.key_from_json(spec.get("key"), path)
                    if extra not in extras:
                        extras.append(extra)
            for name in (fmt.INFOS, fmt.TERMINATEDS, fmt.TRUNCATEDS):
                if name not in schema.names:
                    raise DatasetError(f"{path}: no column {name!r}")
                columns.append({"column": name, "arrow_type": _arrow_type(schema.field(name).type),
                                "dtype": None, "shape": None,
                                "stored_as": "msgpack values" if name == fmt.INFOS else "flags",
                                "items": None, "mode": None})
            schemas[key] = {"step_files": 1, "columns": columns}
        try:
            with_info, rows = _infos_rows(path, pa)
        except (OSError, pa.ArrowException) as e:
            raise DatasetError(f"{path}: not a readable file ({e})") from None
        infos[0] += with_info
        infos[1] += rows
    return list(schemas.values()), extras, tuple(infos), versions


def _statistics(values) -> dict | None:
    """min, mean, median, max (None: no values, or some not numbers)."""
    import numpy as np

    values = np.asarray(values, np.float64)
    if not len(values) or not np.isfinite(values).all():
        return None
    return {"min": _number(values.min()), "mean": float(values.mean()),
            "median": _number(np.median(values)), "max": _number(values.max())}


def _number(x) -> int | float:
    x = float(x)
    return int(x) if x.is_integer() else x


def _spaces(texts: list) -> list:
    """Spaces (as the JSON text of RLlib's dict, or None) as text and dict."""
    from episode.offline import format as fmt

    return [{"space": None, "description": None} if t is None else
            {"space": " ".join(str(fmt.space_of(t, "space")).split()),
             "description": json.loads(t)}
            for t in texts]


def _describe(ds) -> dict:
    """What `episode inspect` reports on an open dataset (see its help)."""
    from episode.offline import format as fmt
    from episode.offline.dataset import read_schema

    if ds.format != fmt.FORMAT:
        return _describe_foreign(ds)

    files = ds.files
    tables = [f for f in files if ".episodes." in os.path.basename(f)]
    step_paths = [f for f in files if f not in tables]
    versions = {fmt.read_metadata(read_schema(path), path, "episodes")["version"]
                for path in tables}
    schemas, extras, infos, step_versions = _step_files(step_paths)
    episodes = ds.episode_table()
    multi = None
    if episodes["multi_agent"].any():
        multi = {"episodes": int(episodes["multi_agent"].sum()), "agents": [
            a if isinstance(a, (str, int)) else repr(a) for a in ds.agent_ids()],
            "agent_steps": int(episodes["agent_steps"].sum())}
    return _report_of(
        ds, fmt.FORMAT, sorted(versions | step_versions), files,
        {"episode_tables": len(tables), "step_files": len(step_paths)}, episodes,
        {name: _spaces(texts) for name, texts in ds.spaces().items()},
        extras, {"rows_with_info": infos[0], "rows": infos[1]}, schemas,
        stored_chunks=ds.num_chunks, multi_agent=multi)


def _describe_foreign(ds) -> dict:
    """The report for RLlib's recordings (read whole by read_episodes: the
    statistics come from its episodes)."""
    from episode.offline import rllib_format
    from episode.offline.dataset import read_schema

    files = ds.files
    episodes = list(ds)
    kinds, schemas = [], {}
    for path in files:
        schema = read_schema(path)
        kind = rllib_format.detect_format(schema)
        if kind not in kinds:
            kinds.append(kind)
        key = str(schema.remove_metadata())
        if key in schemas:
            schemas[key]["files"] += 1
        else:
            schemas[key] = {"files": 1, "columns": [
                {"column": f.name, "arrow_type": _arrow_type(f.type), "dtype": None,
                 "shape": None, "stored_as": kind, "items": None, "mode": None}
                for f in schema]}
    extras = list(dict.fromkeys(k for e in episodes for k in e.extra_model_outputs))
    with_info = sum(1 for e in episodes for info in e.get_infos() if info)
    rows = sum(len(e.get_infos()) for e in episodes)
    return _report_of(ds, " / ".join(map(str, kinds)), [], files, {"data_files": len(files)},
                      ds.episode_table(),
                      {name: _spaces(texts) for name, texts in ds.spaces().items()},
                      extras, {"rows_with_info": with_info, "rows": rows},
                      list(schemas.values()), stored_chunks=ds.num_chunks)


def _report_of(ds, format_name: str, versions: list, files: list, kinds: dict,
               episodes: dict, spaces: dict, extras: list, infos: dict, schemas: list,
               stored_chunks: int, multi_agent: dict | None = None) -> dict:
    terminated, truncated = episodes["terminated"], episodes["truncated"]
    sizes = [os.path.getsize(f) for f in files]
    return {
        "path": ds.path,
        "format": format_name,
        "versions": versions,
        "files": {"count": len(files), "bytes": int(sum(sizes)), **kinds,
                  "types": sorted({f.rpartition(".")[2] for f in files})},
        "episodes": len(ds),
        "stored_chunks": stored_chunks,
        "steps": int(ds.num_steps),
        "done": int((terminated | truncated).sum()),
        "terminated": int(terminated.sum()),
        "truncated": int(truncated.sum()),
        "multi_agent": multi_agent,
        "length": _statistics(episodes["length"]),
        "return": _statistics(episodes["return"]),
        **spaces,
        "extra_model_outputs": [k if isinstance(k, str) else repr(k) for k in extras],
        "infos": infos,
        "schemas": schemas,
    }


def _format_statistics(stats: dict | None, precision: str) -> str:
    if stats is None:
        return "-"
    return ", ".join(f"{k} {v:,{precision}}" if isinstance(v, float) else f"{k} {v:,}"
                     for k, v in stats.items())


def _inspect_text(report: dict) -> str:
    files = report["files"]
    versions = ", ".join(map(str, report["versions"]))
    head = f"{report['path']}: {report['format']} dataset" + (
        f", format version {versions}" if versions else "")
    if "step_files" in files:
        files_note = (f"{format_bytes(files['bytes'])} of {'/'.join(files['types'])}: "
                      f"{files['episode_tables']:,} episode table(s), "
                      f"{files['step_files']:,} step file(s)")
    else:
        files_note = f"{format_bytes(files['bytes'])} of {'/'.join(files['types'])}"
    done = report["done"]
    episodes_note = (f"{done:,} done ({report['terminated']:,} terminated, "
                     f"{report['truncated']:,} truncated), "
                     f"{report['episodes'] - done:,} not done")
    if report["stored_chunks"] != report["episodes"]:
        episodes_note += f"; stored as {report['stored_chunks']:,} chunks"
    infos = report["infos"]
    multi = report["multi_agent"]
    rows = [
        ("files", f"{files['count']:,}", files_note),
        ("episodes", f"{report['episodes']:,}", episodes_note),
        ("steps", f"{report['steps']:,}",
         f"env steps; {multi['agent_steps']:,} agent steps" if multi else ""),
    ]
    if multi:
        rows.append(("multi-agent", f"{multi['episodes']:,}",
                     f"episodes, agents {', '.join(map(str, multi['agents']))}"))
    rows += [
        ("length", "", _format_statistics(report["length"], ".1f")),
        ("return", "", _format_statistics(report["return"], ".3g")),
        ("observations", "", "; ".join(str(s["space"]) for s in report["observation_space"])
         or "-"),
        ("actions", "", "; ".join(str(s["space"]) for s in report["action_space"]) or "-"),
        ("extra outputs", "", ", ".join(report["extra_model_outputs"]) or "none"),
        ("infos", "", f"on {infos['rows_with_info']:,} of {infos['rows']:,} rows"
         if infos["rows_with_info"] else "none"),
    ]
    width = max(len(r[1]) for r in rows)
    lines = [head] + [f"  {a:<13} {b:>{width}}  {c}".rstrip() for a, b, c in rows]
    for schema in report["schemas"]:
        count = schema.get("step_files", schema.get("files"))
        lines.append(f"schema of {count:,} {'step ' if 'step_files' in schema else ''}file(s):")
        table = format_table(
            ["column", "Arrow type", "dtype", "row shape", "stored as", "items"],
            [[c["column"], c["arrow_type"], c["dtype"] or "",
              "" if c["shape"] is None else str(tuple(c["shape"])), c["stored_as"] or "",
              f"{c['items']} ({c['mode']} mode)" if c["mode"] else c["items"] or ""]
             for c in schema["columns"]])
        lines += ["  " + line for line in table.splitlines()]
    return "\n".join(lines)


def inspect(args) -> int:
    ds = _open_dataset(args.path, verify=args.verify)
    _check_dataset(ds)
    try:
        report = _describe(ds)
    except ValueError as e:        # DatasetError: a file the reader did not open yet
        raise UsageError(_one_line(e)) from None
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(_inspect_text(report))
    return 0


# -- the command line ---------------------------------------------------------

def _workload_list() -> str:
    from episode.cli.workloads import WORKLOADS

    width = max(map(len, WORKLOADS))
    return "workloads:\n" + "\n".join(f"  {w.name:<{width}}  {w.description}"
                                      for w in WORKLOADS.values())


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="episode", description=DESCRIPTION,
                     epilog="Without a command, `demo` runs with its defaults.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="{demo,bench,record,inspect}")
    progress = _Parser(add_help=False)
    progress.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                          help="show a progress bar on stderr (default: when it is a terminal)")

    d = commands.add_parser(
        "demo", parents=[progress], help="sample an env into episodes and training batches",
        description="Runs an episode.Sampler on a gymnasium env (vectorized with --num-envs) "
                    "or a multi-agent env with random actions, the way RLlib's EnvRunners "
                    "sample: rollouts of --rollout-fragment-length steps per sub-env "
                    "(--batch-mode), each turned into a training batch of RLlib's default "
                    "views (plus --frame-stack / --prev-actions). Ends with a summary of "
                    "the time spent in the env and in the sampler.")
    d.add_argument("--env", default="CartPole-v1", help="a registered gymnasium env id, or "
                   "module:factory making a PettingZoo ParallelEnv or an RLlib "
                   "MultiAgentEnv (default: %(default)s)")
    d.add_argument("--agents", type=_positive_int, default=1,
                   help="with N > 1: N copies of the --env gymnasium env as the agents of "
                        "one multi-agent env, kept in MultiAgentEpisodes (default: 1)")
    d.add_argument("--num-envs", type=_positive_int, default=1,
                   help="sub-envs of the vector env (default: %(default)s)")
    d.add_argument("--steps", type=_positive_int, default=100_000,
                   help="env steps to collect, over all sub-envs: each rollout is cut short "
                        "to the steps still missing, so at most --num-envs - 1 more are "
                        "taken (complete_episodes: the last episodes run to their end); "
                        "at least --num-envs (default: %(default)s)")
    d.add_argument("--batch-mode", choices=["truncate_episodes", "complete_episodes"],
                   default="truncate_episodes",
                   help="truncate_episodes: rollouts of exactly the fragment length, running "
                        "episodes cut and continued; complete_episodes: whole episodes only "
                        "(default: %(default)s)")
    d.add_argument("--rollout-fragment-length", "--rollout", dest="rollout_fragment_length",
                   type=_positive_int, default=200,
                   help="steps per sub-env and rollout (default: %(default)s)")
    d.add_argument("--count-steps-by", choices=["env_steps", "agent_steps"],
                   default="env_steps",
                   help="what a multi-agent rollout's length counts (default: %(default)s)")
    d.add_argument("--frame-stack", type=_positive_int, default=1, metavar="K",
                   help="with K > 1: a view of the last K observations (obs_frames), read by "
                        "the policy and in the batches (default: 1, none)")
    d.add_argument("--prev-actions", action="store_true",
                   help="views of the previous action and reward (prev_actions, "
                        "prev_rewards), read by the policy and in the batches")
    d.add_argument("--seed", type=_seed, default=0, help="env and action seed "
                   "(default: %(default)s)")
    d.set_defaults(func=demo)

    b = commands.add_parser(
        "bench", parents=[progress], help="time ours against RLlib's SingleAgentEpisode",
        description="Times each workload for ours and, when ray[rllib] is installed, for\n"
                    "RLlib's SingleAgentEpisode, in interleaved rounds; prints the median\n"
                    "time per call and the speed-up (RLlib / ours).",
        epilog=_workload_list(), formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--rounds", type=_positive_int, default=None,
                   help="timed rounds per workload and implementation (default: 7, 3 with "
                        "--quick)")
    b.add_argument("--workloads", default=None, metavar="NAME,...",
                   help="comma-separated workloads to run (default: all, listed below)")
    b.add_argument("--json", metavar="PATH", help="write the results as JSON")
    b.add_argument("--plot", metavar="PATH",
                   help='write a PNG chart of the speed-ups (needs "episode[plot]")')
    b.add_argument("--quick", action="store_true",
                   help="fewer and shorter rounds (a smoke test, not a measurement)")
    b.set_defaults(func=bench)

    r = commands.add_parser(
        "record", parents=[progress], help="record an env's episodes into a dataset",
        description="Samples a gymnasium env (vectorized with --num-envs) or a multi-agent "
                    "env with an episode.Sampler (random actions, or --policy) and writes "
                    "every episode it hands on into the dataset folder --out with "
                    "episode.offline's EpisodeWriter. A folder holding a dataset of ours is "
                    "added to, once every file of it is read and checked; one holding other "
                    "files, a dataset that does not read or one of other spaces than the "
                    "env's is refused before anything is sampled. Ends with a summary: "
                    "episodes, steps, files, bytes on disk, steps/s. Ctrl-C stops the "
                    "sampling (at the next env step; a multi-agent env's at the end of the "
                    "rollout), writes what was sampled (no step is lost), prints the summary "
                    "and exits with status 130. Read the dataset with "
                    "episode.offline.read_episodes, or describe it with `episode inspect`.",
        epilog="--policy module:function: for a gymnasium env, the function is called "
               "before each step of the vector env with the policy input, a dict whose "
               "'obs' is a batch of the sub-envs' current observations (one row per sub-env; "
               "a Dict or Tuple observation as a dict or tuple of such batches), and returns "
               "the actions: a batch with one row per sub-env, inside the action space; or "
               "a tuple (actions, {name: batch}) whose extra model outputs (e.g. "
               "'action_logp') are recorded as columns of their own. For a multi-agent env "
               "it is called at each env step with {agent_id: policy input of one row} for "
               "the agents to act and returns {agent_id: action} for exactly those agents, "
               "or a tuple (that, {agent_id: {name: extra output}}). The module is found on "
               "sys.path or in the current directory. An action outside the action space, "
               "or an error the function raises, stops the recording with one line (exit "
               "status 2); what was sampled before is written.")
    r.add_argument("--env", required=True,
                   help="a registered gymnasium env id (module:EnvId-v0 imports the module "
                        "that registers it first), or module:factory making a PettingZoo "
                        "ParallelEnv or an RLlib MultiAgentEnv")
    r.add_argument("--steps", type=_positive_int, required=True,
                   help="env steps to record, over all sub-envs (each rollout is cut short "
                        "to the steps still missing, so at most --num-envs - 1 more); with "
                        "--batch-mode complete_episodes, steps of whole episodes")
    r.add_argument("--out", required=True, metavar="DIR",
                   help="the dataset folder: made if missing, added to if it holds a "
                        "dataset of episode's")
    r.add_argument("--policy", metavar="MODULE:FUNCTION",
                   help="the function choosing the actions (see below; default: random "
                        "actions from the seeded action space)")
    r.add_argument("--num-envs", type=_positive_int, default=1,
                   help="sub-envs of the vector env (default: %(default)s)")
    r.add_argument("--agents", type=_positive_int, default=1,
                   help="with N > 1: N copies of the --env gymnasium env as the agents of "
                        "one multi-agent env, recorded as MultiAgentEpisodes (default: 1)")
    r.add_argument("--seed", type=_seed, default=0, help="env and action seed "
                   "(default: %(default)s)")
    r.add_argument("--format", choices=["arrow", "parquet"], default="arrow",
                   help="Arrow IPC files (uncompressed ones are read memory-mapped, in "
                        "place), or Parquet files (default: %(default)s)")
    r.add_argument("--compression", choices=["zstd", "lz4", "snappy", "gzip", "brotli", "none"],
                   help="the files' compression (default: lz4 for arrow, zstd for parquet; "
                        "arrow files take zstd, lz4 or none)")
    r.add_argument("--rows-per-file", type=_positive_int, default=None, metavar="R",
                   help="rows (steps, and a row per episode for its last observation) kept "
                        "before a part of the dataset is written (default: EpisodeWriter's, "
                        "1,048,576)")
    r.add_argument("--mb-per-file", type=_positive_int, default=None, metavar="M",
                   help="a part is also written once its rows hold M MiB (images: what a "
                        "reader holds of a file it decodes) (default: EpisodeWriter's, 256)")
    r.add_argument("--seconds-per-file", type=_non_negative_float, default=5.0, metavar="S",
                   help="a part is also written once its first episode has waited S seconds, "
                        "whichever comes first: a recording killed without warning (kill -9, "
                        "a lost machine) loses at most about S seconds; smaller S means more, "
                        "smaller files, slower to open; 0: by rows only (default: %(default)s)")
    r.add_argument("--mixed-spaces", action="store_true",
                   help="add to a dataset at --out whose observation or action spaces differ "
                        "from the env's (refused otherwise: another env, most likely)")
    r.add_argument("--no-verify", dest="verify", action="store_false",
                   help="do not check the checksums of the dataset at --out before adding to "
                        "it (by default every file is read and checked first)")
    r.add_argument("--batch-mode", choices=["truncate_episodes", "complete_episodes"],
                   default="truncate_episodes",
                   help="truncate_episodes: every step is written, the episodes still "
                        "running at the end as they are (not done); complete_episodes: only "
                        "whole episodes, those running at the end left out "
                        "(default: %(default)s)")
    r.add_argument("--rollout-fragment-length", "--rollout", dest="rollout_fragment_length",
                   type=_positive_int, default=200,
                   help="steps per sub-env and rollout: each rollout's episodes (and chunks "
                        "of running ones) go to the writer (default: %(default)s)")
    r.set_defaults(func=record)

    i = commands.add_parser(
        "inspect", help="describe a dataset: files, schema, counts, statistics",
        description="Opens the dataset at DIR with episode.offline.read_episodes (ours, or "
                    "RLlib's recordings) and prints its format and version, its files "
                    "(count, bytes), the step files' schema (each track's columns, leaf by "
                    "leaf for Dict/Tuple items: Arrow type, dtype, row shape), the spaces, "
                    "the counts (episodes, steps, done, terminated, truncated), the "
                    "episode-length and return statistics (min, mean, median, max), the "
                    "extra model outputs and whether infos are stored. The statistics come "
                    "from the episode tables: no episode is built; but every file is read "
                    "and checked first (its checksums, its columns against its metadata, its "
                    "rows against its episode table), so that what is described reads. A "
                    "dataset that does not read is refused in one line (exit status 2).")
    i.add_argument("path", metavar="DIR", help="a dataset folder (or one of its files)")
    i.add_argument("--json", action="store_true", help="print the same as one JSON object")
    i.add_argument("--no-verify", dest="verify", action="store_false",
                   help="do not check the files' checksums (storage you trust); their columns "
                        "and rows are still read and checked")
    i.set_defaults(func=inspect)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the command line `argv` (default: sys.argv[1:]); returns the exit status."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:       # --help, or a bad argument (reported already)
        return e.code if isinstance(e.code, int) else 2
    if args.command is None:
        args = parser.parse_args(["demo"])
    try:
        status = args.func(args)
        sys.stdout.flush()
        return status
    except UsageError as e:
        print(f"episode: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:     # before the measuring started
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of stdout left (`episode inspect ... | head`): nothing
        # more to say, and nothing to flush at exit.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13           # (a process ended by SIGPIPE)
