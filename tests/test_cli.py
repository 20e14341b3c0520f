"""The `episode` command line: bad input, a short demo, a quick bench, Ctrl-C."""
from __future__ import annotations

import dataclasses
import importlib.metadata
import io
import json
import re
import pathlib
import subprocess
import sys
import sysconfig
import tempfile
import time

import gymnasium as gym
import pytest

import episode
from episode import cli
from episode.cli import bench, common, demo, envs
from episode.cli.workloads import WORKLOADS, Round, rllib_class


def run_module(*args: str) -> subprocess.CompletedProcess:
    """`python -m episode ARGS` in a child process: the real exit path. It runs
    in an empty directory: `-m` puts the working directory first on sys.path,
    and from a checkout that would import the uncompiled source tree instead
    of the installed package."""
    with tempfile.TemporaryDirectory() as cwd:
        return subprocess.run([sys.executable, "-m", "episode", *args], cwd=cwd,
                              check=False, capture_output=True, text=True, timeout=120)


def assert_one_line_error(stderr: str, *fragments: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "error:" in lines[0] and "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in lines[0]


def summary_value(out: str, label: str) -> str:
    """The value column of a demo summary row (`  label   value  ...`)."""
    match = re.search(rf"^  {label}\s+(\S+)", out, re.MULTILINE)
    assert match, out
    return match.group(1)


# -- bad input ------------------------------------------------------------------

@pytest.mark.parametrize("args, fragments", [
    (["demo", "--env", "Nope-v0"], ["unknown environment id 'Nope-v0'"]),
    (["demo", "--steps", "0"], ["--steps", "'0'"]),
    (["bench", "--json", "/nonexistent/dir/x.json"], ["--json", "/nonexistent/dir/x.json"]),
])
def test_bad_input_exits_2_with_one_line(args, fragments):
    result = run_module(*args)
    assert result.returncode == 2
    assert_one_line_error(result.stderr, *fragments)
    assert result.stdout == ""


@pytest.mark.parametrize("args, fragments", [
    (["demo", "--steps", "-5"], ["--steps", "'-5'"]),
    (["demo", "--steps", "ten"], ["--steps"]),
    (["demo", "--num-envs", "0"], ["--num-envs"]),
    (["demo", "--rollout", "0"], ["--rollout"]),
    (["demo", "--rollout-fragment-length", "0"], ["--rollout-fragment-length"]),
    (["demo", "--batch-mode", "whole"], ["--batch-mode"]),
    (["demo", "--count-steps-by", "steps"], ["--count-steps-by"]),
    (["demo", "--frame-stack", "0"], ["--frame-stack"]),
    (["demo", "--env", "CartPole-v9"], ["unknown environment id 'CartPole-v9'"]),
    (["demo", "--env", "nomodule:Env-v0"], ["'nomodule:Env-v0'"]),
    (["demo", "--env", "os:getcwd"], ["'os:getcwd'", "neither a PettingZoo"]),
    (["demo", "--agents", "2", "--num-envs", "2"], ["--agents", "--num-envs"]),
    (["demo", "--agents", "2", "--env", "Nope-v0"], ["unknown environment id 'Nope-v0'"]),
    (["demo", "--agents", "0"], ["--agents"]),
    (["bench", "--rounds", "0"], ["--rounds"]),
    (["bench", "--workloads", "nope,slice_64"], ["unknown workload", "nope"]),
    (["bench", "--plot", "/nonexistent/dir/x.png"], ["--plot", "/nonexistent/dir/x.png"]),
    (["frob"], ["frob"]),
])
def test_bad_input_in_process(capsys, args, fragments):
    assert cli.main(args) == 2
    captured = capsys.readouterr()
    assert_one_line_error(captured.err, *fragments)
    assert captured.out == ""


def test_json_path_that_is_a_directory(capsys, tmp_path):
    assert cli.main(["bench", "--json", str(tmp_path)]) == 2
    assert_one_line_error(capsys.readouterr().err, "--json")


def test_plot_without_matplotlib(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import fails
    path = tmp_path / "chart.png"
    assert cli.main(["bench", "--plot", str(path)]) == 2
    assert_one_line_error(capsys.readouterr().err, 'pip install "episode[plot]"')
    assert not path.exists()    # the writability check leaves nothing behind


def test_help_exits_0(capsys):
    assert cli.main(["bench", "--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # Every workload is listed, on one line with its description.
    for w in WORKLOADS.values():
        assert any(line.split() == [w.name, *w.description.split()] for line in lines), w.name


# -- version --------------------------------------------------------------------

def test_version_is_the_installed_distributions():
    assert episode.__version__ == importlib.metadata.version("episode")
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", episode.__version__)


def test_version_module():
    result = run_module("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"episode {episode.__version__}\n"
    assert result.stderr == ""


def test_version_console_script():
    script = pathlib.Path(sysconfig.get_path("scripts")) / "episode"
    with tempfile.TemporaryDirectory() as cwd:
        result = subprocess.run([str(script), "--version"], cwd=cwd, check=False,
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"episode {episode.__version__}\n"


# -- demo -----------------------------------------------------------------------

def _steps(out):
    return int(summary_value(out, "env steps").replace(",", ""))


def test_demo_short_run():
    result = run_module("demo", "--steps", "500", "--num-envs", "2",
                        "--rollout-fragment-length", "20")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    out = result.stdout
    assert out.startswith("CartPole-v1: 2 sync env(s)")
    # Rollouts of 20 steps per sub-env run whole: at least 500 env steps.
    assert 500 <= _steps(out) < 500 + 2 * 20 + 2
    episodes = int(summary_value(out, "episodes finished"))
    assert episodes > 0
    # CartPole pays 1.0 per step: the mean return is the mean length.
    means = re.search(r"mean return ([\d.]+), mean length ([\d.]+)", out)
    assert means and means.group(1) == means.group(2)
    assert "steps/s" in out and "memory held" in out and "in the sampler" in out
    # Every env step is a row of a training batch.
    rows = re.search(r"batches built +[\d,]+ +([\d,]+) rows", out)
    assert rows and int(rows.group(1).replace(",", "")) == _steps(out)


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
@pytest.mark.parametrize("batch_mode", ["truncate_episodes", "complete_episodes"])
def test_demo_records_every_step_once(mode, batch_mode):
    """The finished episodes' lengths plus the ongoing episodes' steps add up
    to the env steps sampled, whichever autoreset mode the vector env uses
    (complete mode: the steps in the batches are those of finished episodes)."""
    from episode import Sampler

    env = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode(mode)})
    stats = demo.DemoStats()
    sampler = Sampler(env, batch_mode=batch_mode, rollout_fragment_length=7, seed=0)
    demo._collect(sampler, 700, stats, common.Progress(700, "steps", enabled=False))
    live = sampler.ongoing_episodes()
    assert stats.env_steps >= 700 and stats.episodes > 0
    assert stats.returns == stats.lengths      # reward 1.0 per step
    assert stats.lengths + sum(e.t for e in live) == stats.env_steps
    rows = stats.lengths if batch_mode == "complete_episodes" else stats.env_steps
    assert stats.rows == rows
    assert all(not e.is_done and not e.is_numpy for e in live)
    sampler.close()


def test_demo_multi_agent_records_every_env_step_once():
    """N copies of CartPole as agents: every env step lands in one chunk, and
    each agent step's reward (1.0) in its agent's episode."""
    from episode import Sampler

    sampler = Sampler(envs.Copies("CartPole-v1", 3), rollout_fragment_length=7, seed=0)
    stats = demo.DemoStats()
    demo._collect(sampler, 700, stats, common.Progress(700, "steps", enabled=False))
    # One episode goes on (none if the last step ended one: the env's reset
    # comes with the next step).
    live = sampler.ongoing_episodes()
    assert len(live) <= 1
    assert stats.env_steps == 700 and stats.episodes > 0
    assert stats.lengths + sum(e.env_t for e in live) == 700
    assert stats.rows == stats.agent_steps
    for e in live:
        assert not e.is_done and not e.is_numpy
        assert e.get_return() == sum(len(ep) for ep in e.agent_episodes.values())
    sampler.close()


def test_demo_multi_agent_short_run():
    result = run_module("demo", "--agents", "2", "--steps", "300", "--rollout", "20",
                        "--count-steps-by", "agent_steps")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("CartPole-v1: 2 copies as agents")
    assert "count_steps_by=agent_steps" in out
    assert _steps(out) >= 300
    assert int(summary_value(out, "episodes finished")) > 0


def test_demo_views_reach_the_policy_and_the_batches():
    result = run_module("demo", "--steps", "400", "--num-envs", "3", "--frame-stack", "4",
                        "--prev-actions", "--batch-mode", "complete_episodes")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "complete_episodes" in out
    # One row of each: a sub-env's input, a batch's row (whatever the count).
    inputs = re.search(r"policy input +(.*)", out).group(1)
    assert inputs.startswith("a row per sub-env: obs float32[4], ")
    assert "obs_frames float32[4, 4]" in inputs and "prev_actions int64" in inputs
    columns = re.search(r"per row +(.*)", out).group(1)
    assert "obs_frames float32[4, 4]" in columns and "prev_rewards float32" in columns


@pytest.mark.rllib
@pytest.mark.parametrize("reference", [
    "ray.rllib.examples.envs.classes.multi_agent:MultiAgentCartPole",
    "ray.rllib.examples.envs.classes.multi_agent.tic_tac_toe:TicTacToe",
])
def test_demo_rllib_multi_agent_env(capsys, reference):
    pytest.importorskip("ray.rllib")
    assert cli.main(["demo", "--env", reference, "--steps", "400", "--rollout", "30"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{reference}: multi-agent")
    assert 400 <= _steps(out) < 430


def test_demo_progress_bar(capsys):
    assert cli.main(["demo", "--steps", "300", "--progress"]) == 0
    err = capsys.readouterr().err
    assert "\r" in err and "100% 300/300 steps" in err


# Every combination of the demo's options runs, or is refused in one line.
MATRIX_OPTIONS = {
    "agents": ["1", "2"],
    "num-envs": ["1", "2"],
    "batch-mode": ["truncate_episodes", "complete_episodes"],
    "count-steps-by": ["env_steps", "agent_steps"],
    "frame-stack": ["1", "3"],
    "prev-actions": [False, True],
}

MA_MODULE = """
from episode.cli.envs import Copies

def make():
    return Copies("CartPole-v1", 2)
"""


def _matrix(monkeypatch, capsys, env: str) -> dict:
    """Runs `episode demo --env ENV` with every combination of MATRIX_OPTIONS;
    returns {combination: error line} of the refused ones."""
    import itertools

    refused = {}
    names = list(MATRIX_OPTIONS)
    for values in itertools.product(*MATRIX_OPTIONS.values()):
        combo = dict(zip(names, values))
        argv = ["demo", "--env", env, "--steps", "12", "--rollout", "4", "--seed", "1"]
        for name, value in combo.items():
            if value is True:
                argv.append(f"--{name}")
            elif value is not False:
                argv += [f"--{name}", value]
        status = cli.main(argv)
        captured = capsys.readouterr()
        key = tuple(sorted(combo.items()))
        if status == 2:
            assert_one_line_error(captured.err)
            refused[key] = captured.err
        else:
            assert status == 0, (argv, captured.err)
            # --steps bounds a truncate_episodes run to one vector step more;
            # complete_episodes rollouts end with whole episodes.
            steps = _steps(captured.out)
            assert steps >= 12, (argv, captured.out)
            if combo["batch-mode"] == "truncate_episodes":
                assert steps < 12 + int(combo["num-envs"]), (argv, captured.out)
    return refused


@pytest.mark.parametrize("env", ["CartPole-v1", "Blackjack-v1", "Pendulum-v1", "ma_factory:make"])
def test_demo_option_matrix(monkeypatch, capsys, tmp_path, env):
    """Only the combinations the help rules out are refused: --agents or a
    multi-agent env with --num-envs, and --agents with a multi-agent env."""
    (tmp_path / "ma_factory.py").write_text(MA_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    refused = _matrix(monkeypatch, capsys, env)
    factory = env == "ma_factory:make"
    for key, line in refused.items():
        combo = dict(key)
        multi = factory or combo["agents"] != "1"
        assert (multi and combo["num-envs"] != "1") or (factory and combo["agents"] != "1"), \
            (combo, line)
    # (Of the 64 combinations, 16 have --agents 2 and --num-envs 2; a factory
    # also refuses the other 32 with either.)
    assert len(refused) == (48 if factory else 16), refused


@pytest.mark.rllib
def test_demo_option_matrix_rllib_env(monkeypatch, capsys):
    pytest.importorskip("ray.rllib")
    refused = _matrix(monkeypatch, capsys,
                      "ray.rllib.examples.envs.classes.multi_agent:MultiAgentCartPole")
    assert {dict(k)["num-envs"] != "1" or dict(k)["agents"] != "1" for k in refused} == {True}
    assert len(refused) == 48


@pytest.mark.parametrize("args", [["demo", "--help"], ["--help"],
                                  ["demo", "--steps", "50", "--agents", "2"]])
def test_runs_under_python_OO(args):
    """-OO strips docstrings; the command line does not need them."""
    with tempfile.TemporaryDirectory() as cwd:
        result = subprocess.run([sys.executable, "-OO", "-m", "episode", *args], cwd=cwd,
                                check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def _console_script(*args: str, cwd) -> subprocess.CompletedProcess:
    script = pathlib.Path(sysconfig.get_path("scripts")) / "episode"
    return subprocess.run([str(script), *args], cwd=cwd, check=False, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("how", ["script", "module"])
def test_env_module_in_the_current_directory(tmp_path, how):
    """`episode demo --env mod:factory` finds mod.py in the working
    directory, as `python -m episode` does."""
    (tmp_path / "ma_here.py").write_text(MA_MODULE)
    args = ["demo", "--env", "ma_here:make", "--steps", "30"]
    result = _console_script(*args, cwd=tmp_path) if how == "script" else subprocess.run(
        [sys.executable, "-m", "episode", *args], cwd=tmp_path, check=False,
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ma_here:make: multi-agent")


@pytest.mark.parametrize("env", ["no_such_module:make", "no_such_module:Env-v0"])
def test_env_module_not_found(tmp_path, env):
    result = _console_script("demo", "--env", env, cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result.stderr, "no module named 'no_such_module'")
    assert "regist" not in result.stderr


def test_env_module_that_fails_to_import(tmp_path):
    (tmp_path / "broken_env.py").write_text("import no_such_dependency\n")
    result = _console_script("demo", "--env", "broken_env:make", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result.stderr, "cannot import module 'broken_env'",
                          "no_such_dependency")


def test_demo_summary_of_tuple_observations(capsys):
    """Blackjack's observations are a Tuple: the rows are counted per batch
    and a row shows each leaf."""
    assert cli.main(["demo", "--env", "Blackjack-v1", "--steps", "300", "--rollout", "50"]) == 0
    out = capsys.readouterr().out
    rows = re.search(r"batches built +([\d,]+) +([\d,]+) rows$", out, re.MULTILINE)
    assert int(rows.group(2).replace(",", "")) == _steps(out) == 300
    row = re.search(r"per row +(.*)", out).group(1)
    assert row.startswith("obs (int64, int64, int64), new_obs (int64, int64, int64), "
                          "actions int64, rewards float32, terminateds bool, ")
    assert "infos object, eps_id str, unroll_id int64" in row


def test_demo_summary_shows_a_row_not_the_last_batch(capsys):
    """The last rollout is cut short to the missing steps (30 of 100): the
    summary shows what a row holds, the same in every batch, not the last
    batch's (30, 4) observations."""
    assert cli.main(["demo", "--steps", "230", "--rollout", "100"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  batches built +3  230 rows$", out, re.MULTILINE), out
    row = re.search(r"^  per row +(.*)$", out, re.MULTILINE).group(1)
    assert row == ("obs float32[4], new_obs float32[4], actions int64, rewards float32, "
                   "terminateds bool, truncateds bool, infos object, eps_id str, "
                   "unroll_id int64, agent_index int64, t int64")
    assert "30" not in row and "policy input" not in out


def test_demo_summary_rows_of_each_module():
    """A multi-agent run's row is shown per module id, and the policy input
    (called per agent) as one agent's row."""
    result = run_module("demo", "--agents", "2", "--steps", "200", "--rollout", "20",
                        "--frame-stack", "3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    per_row = next(i for i, line in enumerate(lines) if line.startswith("  per row "))
    assert lines[per_row].split(None, 2)[2].startswith(
        "default_policy: obs float32[4], new_obs float32[4], actions int64, ")
    assert lines[per_row].endswith("obs_frames float32[3, 4]")
    assert lines[per_row + 1].split(None, 2)[:2] == ["policy", "input"]
    assert lines[per_row + 1].endswith("a row per agent: obs float32[4], obs_frames float32[3, 4]")


def test_row_layout_of_dict_items_and_other_dtypes():
    import numpy as np

    columns = {"obs": {"pos": np.zeros((5, 2, 3), np.float32), "id": np.zeros(5, np.int8)},
               "eps_id": np.array(["a"] * 5), "raw": np.zeros((5, 2), "S4"),
               "infos": np.array([{}] * 5, dtype=object)}
    assert demo._rows(demo._row_layout(columns)) == (
        "obs {pos: float32[2, 3], id: int8}, eps_id str, raw bytes[2], infos object")


def test_demo_num_envs_beyond_steps_is_refused_at_once():
    start = time.perf_counter()
    result = run_module("demo", "--num-envs", "100000", "--steps", "10")
    assert time.perf_counter() - start < 60
    assert result.returncode == 2
    assert_one_line_error(result.stderr, "--num-envs 100,000", "--steps 10")


def test_demo_steps_bound_the_run(capsys):
    """The default fragment (200 steps per sub-env) is cut down to --steps."""
    assert cli.main(["demo", "--num-envs", "10", "--steps", "25"]) == 0
    out = capsys.readouterr().out
    assert 25 <= _steps(out) < 35
    assert "rollout_fragment_length=200" in out


class InterruptAfter(gym.vector.VectorWrapper):
    """Raises KeyboardInterrupt (as Ctrl-C would) at the n-th step() call."""

    def __init__(self, env, n: int):
        super().__init__(env)
        self.calls, self.n = 0, n

    def step(self, actions):
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt
        return self.env.step(actions)


def test_demo_ctrl_c_prints_partial_summary(capsys, monkeypatch):
    make_env = envs.make_env
    monkeypatch.setattr(envs, "make_env", lambda env_id, n: InterruptAfter(make_env(env_id, n), 51))
    assert cli.main(["demo", "--steps", "100000", "--num-envs", "2"]) == 130
    captured = capsys.readouterr()
    assert "interrupted" in captured.err and "Traceback" not in captured.err
    # 50 vector steps of 2 sub-envs; the steps that only reset a sub-env add none.
    assert 80 < _steps(captured.out) <= 100


# -- bench ----------------------------------------------------------------------

REPORT_KEYS = {"date", "machine", "python", "numpy", "ray", "interrupted", "results"}
RESULT_KEYS = {"workload", "description", "items", "ours_s", "rllib_s", "speedup", "rounds"}


def check_report(path, names, with_rllib: bool) -> dict:
    report = json.loads(path.read_text())
    assert set(report) == REPORT_KEYS
    assert set(report["machine"]) == {"platform", "cpu", "cores"}
    assert [r["workload"] for r in report["results"]] == names
    for r in report["results"]:
        assert set(r) == RESULT_KEYS
        assert r["ours_s"] > 0 and r["rounds"] >= 1
        if with_rllib:
            assert r["rllib_s"] > 0 and r["speedup"] == pytest.approx(r["rllib_s"] / r["ours_s"])
        else:
            assert r["rllib_s"] is None and r["speedup"] is None
    assert (report["ray"] is not None) == with_rllib
    return report


def test_bench_quick_writes_json(capsys, tmp_path):
    path = tmp_path / "bench.json"
    # A workload of each layer (what each does, and RLlib's agreement, are
    # tests/test_workloads.py's, once per workload).
    names = ["get_observations_last", "slice_64", "ma_add_env_step_2", "vector_append_64",
             "collector_build_for_training", "replay_sample_prioritized"]
    assert cli.main(["bench", "--quick", "--rounds", "1", "--workloads", ",".join(names),
                     "--json", str(path)]) == 0
    with_rllib = rllib_class() is not None
    report = check_report(path, names, with_rllib)
    assert not report["interrupted"]
    out = capsys.readouterr().out
    assert all(name in out for name in names)
    assert ("speed-up" in out) == with_rllib
    assert (bench.RLLIB_HINT in out) != with_rllib


def test_bench_without_ray(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("episode.cli.workloads.rllib_class", lambda: None)
    path = tmp_path / "bench.json"
    assert cli.main(["bench", "--quick", "--workloads", "slice_64", "--json", str(path)]) == 0
    check_report(path, ["slice_64"], with_rllib=False)
    out = capsys.readouterr().out
    assert bench.RLLIB_HINT in out and "RLlib/item" not in out


def test_bench_plot(tmp_path):
    pytest.importorskip("matplotlib")
    if rllib_class() is None:
        pytest.skip("the chart shows speed-ups over RLlib")
    path = tmp_path / "chart.png"
    assert cli.main(["bench", "--quick", "--workloads", "slice_64,cut_lookback_1",
                     "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_ctrl_c_prints_what_was_measured(capsys, monkeypatch, tmp_path):
    def interrupt(cls):
        raise KeyboardInterrupt

    monkeypatch.setitem(WORKLOADS, "slice_64",
                        dataclasses.replace(WORKLOADS["slice_64"], prepare=interrupt))
    path = tmp_path / "bench.json"
    assert cli.main(["bench", "--quick", "--workloads", "get_observations_last,slice_64",
                     "--json", str(path)]) == 130
    captured = capsys.readouterr()
    assert "interrupted" in captured.err and "Traceback" not in captured.err
    assert "get_observations_last" in captured.out and "slice_64" not in captured.out
    report = check_report(path, ["get_observations_last"], rllib_class() is not None)
    assert report["interrupted"]


def test_bench_warns_when_results_differ(capsys, monkeypatch):
    if rllib_class() is None:
        pytest.skip("needs RLlib to compare with")
    # A workload whose result is the class's module: never the same on both sides.
    monkeypatch.setitem(WORKLOADS, "slice_64", dataclasses.replace(
        WORKLOADS["slice_64"], prepare=lambda cls: Round(lambda: cls.__module__)))
    assert cli.main(["bench", "--quick", "--workloads", "slice_64"]) == 0
    err = capsys.readouterr().err
    assert "episode: warning: slice_64: ours and RLlib's results differ" in err


def test_progress_bar_draws_and_ends_the_line():
    stream = io.StringIO()
    progress = common.Progress(10, "rounds", enabled=True, stream=stream)
    progress.update(3, "slice_64")
    progress.update(10, "slice_64")   # within 0.1 s: not drawn until close()
    progress.close()
    text = stream.getvalue()
    first, last = text.split("\r")[1:]
    assert first.startswith("[#########.") and "30% 3/10 rounds" in first
    assert last.startswith("[" + "#" * 30 + "]") and "100% 10/10 rounds" in last
    assert last.endswith("\n") and last.rstrip().endswith("slice_64")


def test_progress_bar_off_when_not_a_terminal():
    stream = io.StringIO()
    progress = common.Progress(10, "rounds", stream=stream)
    progress.update(10)
    progress.close()
    assert stream.getvalue() == ""


@pytest.mark.parametrize("argv, message", [
    (["demo", "--env", ":"], "expected a gymnasium id or module:name"),
    (["demo", "--env", "os:"], "expected a gymnasium id or module:name"),
    (["demo", "--env", "os:missing_env_factory"], "has no attribute 'missing_env_factory'"),
    (["demo", "--seed", "-1"], "expected a seed >= 0"),
    (["record", "--env", "CartPole-v1", "--steps", "10", "--out", "x", "--seed", "-3"],
     "expected a seed >= 0"),
    (["bench", "--workloads", ""], "unknown workload(s) ''"),
])
def test_more_command_line_mistakes_are_one_line(argv, message, capsys, tmp_path, monkeypatch):
    from episode.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        code = main(argv)
        raise SystemExit(code)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
