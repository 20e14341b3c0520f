"""`episode record`: an env sampled as `demo` samples it (random actions, or
a --policy function) into a dataset written by episode.offline's
EpisodeWriter; Ctrl-C writes what was sampled."""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from dataclasses import dataclass

from episode.cli.common import (Progress, UsageError, check_dataset, format_bytes, one_line,
                                open_dataset)
from episode.cli.envs import import_env_module, make_sampler


class _PolicyError(Exception):
    """The --policy function raised: reported in one line (what was sampled
    before is written)."""


def _load_policy(reference: str):
    """The function `module:function` names, wrapped so that what it raises
    is told apart from the sampler's own errors (KeyboardInterrupt passes)."""
    module_name, sep, attr = reference.partition(":")
    if not sep or not module_name or not all(p.isidentifier() for p in attr.split(".")):
        raise UsageError(f"--policy {reference!r}: expected module:function")
    target = import_env_module(module_name, reference, "--policy")
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
    ds = open_dataset(path, "--out ", verify)
    check_dataset(ds, "--out ")
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
            raise UsageError(f"cannot record the episodes: {one_line(e)}") from None
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


@dataclass
class RecordStats:
    env_steps: int = 0          # env steps sampled
    env_s: float = 0.0          # seconds in env.reset() / env.step()
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
        raise UsageError(f"--out {one_line(e)}") from None
    except ValueError as e:
        raise UsageError(f"--compression {args.compression}: {e}") from None
    except OSError as e:
        raise UsageError(f"cannot write --out {args.out!r}: {e.strerror or e}") from None
    except ModuleNotFoundError as e:
        raise UsageError(str(e)) from None


def _record_summary(args, sampler, recorder: _Recorder, stats: RecordStats,
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
          f"({stats.env_s:.2f} s in the env, {recorder.write_s:.2f} s writing)")),
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
        message = one_line(e).replace("EpisodeWriter(..., mixed_spaces=True)", "--mixed-spaces")
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
    stats = RecordStats()
    # Rollouts cut the running episodes and hand the chunks on (complete
    # mode joins them here), so no sampled step stays in the sampler.
    sampler = make_sampler(argparse.Namespace(**{
        **vars(args), "batch_mode": "truncate_episodes", "count_steps_by": "env_steps",
        "frame_stack": 1, "prev_actions": False}), stats)
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
                status, error = 2, one_line(e)
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
        print(_record_summary(args, sampler, recorder, stats, before))
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
