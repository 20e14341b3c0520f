"""`episode demo`: an episode.Sampler on an env with random actions, and a
summary of where the time went and what the batches hold."""
from __future__ import annotations

import pickle
import sys
import time
import tracemalloc
from dataclasses import dataclass, field

from episode.cli.common import Progress, format_bytes
from episode.cli.envs import make_sampler
from episode.spaces import batch_size


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
    sampler = make_sampler(args, stats)
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
