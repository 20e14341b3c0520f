"""The command line: the parser of the four commands and `main`, which runs
the one it parses and turns a UsageError into one line and exit status 2."""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

from episode import __version__
from episode.cli.bench import bench, workload_list
from episode.cli.common import UsageError
from episode.cli.demo import demo
from episode.cli.inspect import inspect
from episode.cli.record import record


# The parser's description: a constant, since `python -OO` strips __doc__.
DESCRIPTION = ("The `episode` command (`python -m episode`): a sampling demo, a benchmark, "
               "and recording and inspecting datasets of episodes.")


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


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def _seed(text: str) -> int:
    return _int_at_least(text, 0, "a seed >= 0")


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
        epilog=workload_list(), formatter_class=argparse.RawDescriptionHelpFormatter)
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
