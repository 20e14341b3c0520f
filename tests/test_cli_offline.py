"""`episode record` and `episode inspect`: a recording read back, its summary
and the inspection checked against read_episodes, policies, Ctrl-C (nothing
sampled is lost), and bad paths, foreign files and damaged datasets (one
line, exit status 2)."""
from __future__ import annotations

import json
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("msgpack")

from episode import SingleAgentEpisode, cli  # noqa: E402
from episode.cli import common, inspect as cli_inspect  # noqa: E402
from episode.offline import read_episodes, write_episodes  # noqa: E402

FORMATS = ("parquet", "arrow")


def assert_one_line_error(stderr: str, *fragments: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("episode") and "error:" in lines[0]
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def value(out: str, label: str) -> str:
    """The value column of a summary row (`  label   value  note`)."""
    match = re.search(rf"^  {label}\s+(\S+(?: [KMG]?B)?)", out, re.MULTILINE)
    assert match, out
    return match.group(1)


def count(out: str, label: str) -> int:
    return int(value(out, label).replace(",", ""))


def note(out: str, label: str) -> str:
    match = re.search(rf"^  {label}\s+\S+(?: [KMG]?B)?  (.*)$", out, re.MULTILINE)
    assert match, out
    return match.group(1)


def rest(out: str, label: str) -> str:
    """What follows the label on its line."""
    match = re.search(rf"^  {label}\s+(.*)$", out, re.MULTILINE)
    assert match, out
    return match.group(1)


def env_steps(out: str) -> int:
    return int(re.search(r"of ([\d,]+) env steps sampled", out).group(1).replace(",", ""))


def record(capsys, *args: str) -> tuple:
    """`episode record ARGS` in this process: (status, stdout, stderr)."""
    status = cli.main(["record", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def dataset_files(path) -> list:
    return sorted(p for p in pathlib.Path(path).rglob("*") if p.is_file())


def same_steps(a, b) -> None:
    """Episodes `a` and `b` hold the same steps (ids aside)."""
    assert len(a) == len(b)
    assert (a.is_terminated, a.is_truncated) == (b.is_terminated, b.is_truncated)
    np.testing.assert_array_equal(a.get_observations(), b.get_observations())
    np.testing.assert_array_equal(a.get_actions(), b.get_actions())
    np.testing.assert_array_equal(a.get_rewards(), b.get_rewards())


def first_obs(episode) -> bytes:
    """A sort key: the episode's first observation."""
    return episode.get_observations(0).tobytes()


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """The working directory a --policy module is found in; its modules are
    forgotten afterwards (each test imports its own)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if hasattr(sys.modules[name], "__file__") and str(tmp_path) in str(
                getattr(sys.modules[name], "__file__", "") or ""):
            del sys.modules[name]


# -- record, then inspect ------------------------------------------------------------


@pytest.mark.parametrize("format", FORMATS)
def test_record_then_inspect(capsys, tmp_path, format):
    out = tmp_path / "data"
    status, stdout, stderr = record(capsys, "--env", "CartPole-v1", "--steps", "3000",
                                    "--num-envs", "3", "--rollout", "50", "--format", format,
                                    "--out", str(out))
    assert status == 0, stderr
    assert stderr == ""
    assert stdout.startswith(f"CartPole-v1 -> {out}: 3 sync env(s), seed 0, truncate_episodes, "
                             f"rollout_fragment_length=50, random actions; {format}")
    ds = read_episodes(out)
    episodes = list(ds)
    # The summary's numbers are the dataset's.
    assert count(stdout, "episodes") == len(ds)
    assert count(stdout, "steps") == ds.num_steps == env_steps(stdout)
    assert 3000 <= ds.num_steps < 3003
    files = dataset_files(out)
    assert count(stdout, "files") == len(files) == 2
    assert value(stdout, "on disk") == common.format_bytes(sum(f.stat().st_size for f in files))
    done = [e for e in episodes if e.is_done]
    running = len(episodes) - len(done)
    assert note(stdout, "episodes").startswith(
        f"{len(done):,} done ({sum(e.is_terminated for e in episodes):,} terminated, "
        f"{sum(e.is_truncated for e in episodes):,} truncated), {running:,} running at the end")
    # Each sub-env's last episode goes on when the recording stops.
    assert running == 3 and all(e.observation_space is not None for e in episodes)
    assert all(e.t_started == 0 for e in episodes)

    assert cli.main(["inspect", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    lengths = np.array([len(e) for e in episodes])
    returns = np.array([e.get_return() for e in episodes])
    assert report["format"] == "episode" and report["versions"] == [1]
    assert report["files"] == {"count": 2, "bytes": sum(f.stat().st_size for f in files),
                               "episode_tables": 1, "step_files": 1, "types": [format]}
    assert (report["episodes"], report["steps"]) == (len(ds), ds.num_steps)
    assert report["stored_chunks"] > len(ds)       # chunks cut at each rollout's end
    assert (report["done"], report["terminated"], report["truncated"]) == (
        len(done), sum(e.is_terminated for e in episodes), sum(e.is_truncated for e in episodes))
    for name, values in (("length", lengths), ("return", returns)):
        stats = report[name]
        assert stats["min"] == values.min() and stats["max"] == values.max()
        assert stats["median"] == np.median(values)
        assert stats["mean"] == pytest.approx(values.mean())
    space = gym.make("CartPole-v1").observation_space
    assert report["observation_space"] == [
        {"space": " ".join(str(space).split()), "description": report[
            "observation_space"][0]["description"]}]
    assert report["observation_space"][0]["description"]["space"] == "box"
    assert report["action_space"] == [{"space": "Discrete(2)", "description": {
        "space": "discrete", "n": 2, "start": 0}}]
    assert report["extra_model_outputs"] == []
    # CartPole's infos are empty: none is stored.
    assert report["infos"] == {"rows_with_info": 0, "rows": step_rows(out)}
    columns = report["schemas"][0]["columns"]
    assert report["schemas"][0]["step_files"] == 1
    assert [(c["column"], c["dtype"], c["shape"], c["stored_as"]) for c in columns] == [
        ("obs", "float32", [4], "numbers"), ("actions", "int64", [], "numbers"),
        ("rewards", "float64", [], "numbers"), ("infos", None, None, "msgpack values"),
        ("terminateds", None, None, "flags"), ("truncateds", None, None, "flags")]
    assert columns[0]["arrow_type"] == "fixed_shape_tensor[float, [4]]"
    # (An infos column of no info is null-typed: it stores nothing.)
    assert [c["arrow_type"] for c in columns[1:]] == ["int64", "double", "null", "bool", "bool"]

    # The text says the same.
    assert cli.main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{out}: episode dataset, format version 1\n")
    assert count(text, "episodes") == len(ds) and count(text, "steps") == ds.num_steps
    assert count(text, "files") == 2
    assert rest(text, "length") == (f"min {lengths.min()}, mean {lengths.mean():.1f}, "
                                    f"median {cli_inspect._number(np.median(lengths)):,}, "
                                    f"max {lengths.max()}")
    assert re.search(r"^  actions\s+Discrete\(2\)$", text, re.MULTILINE)
    assert re.search(r"^  infos\s+none$", text, re.MULTILINE)
    assert re.search(r"^  obs\s+fixed_shape_tensor\[float, \[4\]\]\s+float32\s+\(4,\)\s+numbers",
                     text, re.MULTILINE)


def step_rows(path) -> int:
    """The rows of a dataset's step files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 0
    for f in dataset_files(path):
        if ".steps-" in f.name:
            rows += pq.ParquetFile(f).metadata.num_rows if f.suffix == ".parquet" else \
                pa.ipc.open_file(pa.memory_map(str(f))).read_all().num_rows
    return rows


def test_record_complete_episodes_writes_whole_episodes_only(capsys, tmp_path):
    out = tmp_path / "data"
    status, stdout, stderr = record(capsys, "--env", "CartPole-v1", "--steps", "500",
                                    "--num-envs", "2", "--rollout", "10",
                                    "--batch-mode", "complete_episodes", "--out", str(out))
    assert status == 0, stderr
    ds = read_episodes(out)
    episodes = list(ds)
    assert all(e.is_done and e.t_started == 0 for e in episodes)
    # Whole episodes of at least --steps steps; chunks joined before writing.
    assert ds.num_steps == count(stdout, "steps") >= 500
    assert count(stdout, "episodes") == len(ds)
    assert cli.main(["inspect", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stored_chunks"] == len(ds)   # joined
    left = count(stdout, "left out")
    assert 0 <= left <= 2
    left_steps = int(re.search(r"of ([\d,]+) steps", note(stdout, "left out")).group(1))
    assert env_steps(stdout) == ds.num_steps + left_steps
    # The same episodes as a truncate_episodes recording of the same seed.
    status, _, _ = record(capsys, "--env", "CartPole-v1", "--steps", str(env_steps(stdout)),
                          "--num-envs", "2", "--rollout", "10", "--out", str(tmp_path / "all"))
    assert status == 0
    whole = [e for e in read_episodes(tmp_path / "all") if e.is_done]
    assert len(whole) == len(episodes)
    for a, b in zip(sorted(episodes, key=first_obs), sorted(whole, key=first_obs)):
        same_steps(a, b)


def test_record_appends_to_a_dataset_of_ours(capsys, tmp_path):
    out = tmp_path / "data"
    status, first, _ = record(capsys, "--env", "CartPole-v1", "--steps", "300", "--out", str(out))
    assert status == 0 and "dataset" not in first
    before = read_episodes(out)
    status, second, _ = record(capsys, "--env", "CartPole-v1", "--steps", "200", "--seed", "1",
                               "--format", "arrow", "--out", str(out))
    assert status == 0
    after = read_episodes(out)
    assert count(second, "dataset") == len(after) == len(before) + count(second, "episodes")
    assert note(second, "dataset") == (f"episodes, {after.num_steps:,} steps in all: appended "
                                       f"to the dataset of {len(before):,} episodes that was "
                                       f"there")
    assert after.num_steps == 500
    assert len(dataset_files(out)) == 4


def test_record_progress_bar(capsys, tmp_path):
    status, _, stderr = record(capsys, "--env", "CartPole-v1", "--steps", "400", "--progress",
                               "--out", str(tmp_path / "data"))
    assert status == 0
    assert "\r" in stderr and "100% 400/400 steps" in stderr


def test_record_options_reach_the_writer(capsys, tmp_path):
    out = tmp_path / "data"
    status, stdout, _ = record(capsys, "--env", "CartPole-v1", "--steps", "600", "--rollout",
                               "20", "--rows-per-file", "100", "--compression", "none",
                               "--format", "parquet", "--out", str(out))
    assert status == 0
    assert "parquet, uncompressed" in stdout.splitlines()[0]
    tables = [f for f in dataset_files(out) if f.name.endswith(".episodes.parquet")]
    assert len(tables) >= 5                       # a part per 100 rows or so
    assert count(stdout, "files") == len(dataset_files(out))
    assert read_episodes(out).num_steps == 600
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(tables[0]).metadata
    assert meta.row_group(0).column(0).compression == "UNCOMPRESSED"


# -- policies ---------------------------------------------------------------------------

POLICY = """
import numpy as np

def lean(inputs):
    # Push the cart toward where the pole leans; the logp of a sure choice.
    obs = inputs["obs"]
    actions = (obs[:, 2] > 0).astype(np.int64)
    return actions, {"action_logp": np.zeros(len(obs), np.float32)}
"""


def test_record_with_a_policy(capsys, workdir):
    (workdir / "cart_policy.py").write_text(POLICY)
    status, stdout, stderr = record(capsys, "--env", "CartPole-v1", "--steps", "800",
                                    "--num-envs", "2", "--policy", "cart_policy:lean",
                                    "--out", "data")
    assert status == 0, stderr
    assert "policy cart_policy:lean" in stdout.splitlines()[0]
    ds = read_episodes(workdir / "data")
    assert ds.num_steps == count(stdout, "steps") >= 800
    for e in ds:
        obs = e.get_observations()[:-1]
        np.testing.assert_array_equal(e.get_actions(), (obs[:, 2] > 0).astype(np.int64))
        assert list(e.extra_model_outputs) == ["action_logp"]
        assert e.get_extra_model_outputs("action_logp").tolist() == [0.0] * len(e)
    assert cli.main(["inspect", "data"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^  extra outputs\s+action_logp$", text, re.MULTILINE)
    assert re.search(r"^  action_logp\s+float\s+float32\s+\(\)\s+numbers", text, re.MULTILINE)


INTERRUPTING = """
import numpy as np

calls = 0

def policy(inputs):
    global calls
    calls += 1
    if calls == {at}:
        raise {error}
    return (inputs["obs"][:, 2] > 0).astype(np.int64)
"""


@pytest.mark.parametrize("batch_mode", ["truncate_episodes", "complete_episodes"])
def test_ctrl_c_writes_what_was_sampled(capsys, workdir, batch_mode):
    """A policy raising KeyboardInterrupt (as Ctrl-C) at its 157th call, in
    the middle of a rollout: every step sampled before is in the dataset
    (complete_episodes: every finished episode), exit status 130."""
    (workdir / "stop_157.py").write_text(INTERRUPTING.format(at=157, error="KeyboardInterrupt"))
    status, stdout, stderr = record(capsys, "--env", "CartPole-v1", "--steps", "100000",
                                    "--num-envs", "2", "--rollout", "40", "--policy",
                                    "stop_157:policy", "--batch-mode", batch_mode,
                                    "--out", "data")
    assert status == 130
    assert stderr == "interrupted\n"
    ds = read_episodes(workdir / "data")
    assert count(stdout, "steps") == ds.num_steps and count(stdout, "episodes") == len(ds)
    sampled = env_steps(stdout)
    # 156 steps of 2 sub-envs, but for the steps that reset a sub-env.
    assert 2 * 156 - 40 < sampled <= 2 * 156
    # The same steps as a recording of as many steps that was not
    # interrupted (complete_episodes: its finished episodes).
    (workdir / "lean_only.py").write_text(INTERRUPTING.format(at=-1, error="None"))
    status, _, _ = record(capsys, "--env", "CartPole-v1", "--steps", str(sampled), "--num-envs",
                          "2", "--rollout", "40", "--policy", "lean_only:policy",
                          "--out", "whole")
    assert status == 0
    whole = [e for e in read_episodes(workdir / "whole")
             if e.is_done or batch_mode == "truncate_episodes"]
    assert len(whole) == len(ds)
    for a, b in zip(sorted(ds, key=first_obs), sorted(whole, key=first_obs)):
        same_steps(a, b)
    if batch_mode == "truncate_episodes":
        assert ds.num_steps == sampled
    else:
        assert all(e.is_done for e in ds)
        left_steps = int(re.search(r"of ([\d,]+) steps", note(stdout, "left out")).group(1))
        assert ds.num_steps + left_steps == sampled


def _interrupted(out, *args) -> tuple:
    """`python -m episode record ... --out out` sent SIGINT once its first
    part is written: (the process, its stdout, its stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "episode", "record", *args, "--steps",
                             "100000000", "--out", str(out)], cwd=out.parent.parent,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any(".episodes." in p.name and not p.name.startswith(".")
                      for p in out.glob("*")):
            if proc.poll() is not None:
                raise AssertionError(proc.communicate())
            assert time.monotonic() < deadline, "no part written in 120 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc, stdout, stderr


def test_a_real_ctrl_c(capsys, tmp_path):
    """SIGINT to `python -m episode record`: it stops at the next env step,
    writes what it sampled, prints the summary and exits with 130."""
    out = tmp_path / "data"
    proc, stdout, stderr = _interrupted(out, "--env", "CartPole-v1", "--rollout", "100",
                                        "--rows-per-file", "2000")
    assert proc.returncode == 130, stderr
    assert stderr == "interrupted\n"
    ds = read_episodes(out)
    # (The first part was written after 2,000 rows: the steps and a row per
    # episode for its last observation.)
    assert count(stdout, "steps") == ds.num_steps == env_steps(stdout) > 1000
    assert count(stdout, "episodes") == len(ds)
    # (At least the first part's two files; a last part too when steps were
    # sampled after it: a slow machine, e.g. the sanitizer build, may
    # deliver the signal before the next step.)
    assert count(stdout, "files") == len(dataset_files(out)) >= 2
    # The same episodes as a recording of as many steps (the random actions
    # are seeded).
    status, _, _ = record(capsys, "--env", "CartPole-v1", "--steps", str(ds.num_steps),
                          "--rollout", "100", "--out", str(tmp_path / "whole"))
    assert status == 0
    whole = read_episodes(tmp_path / "whole")
    assert len(whole) == len(ds)
    for a, b in zip(ds, whole):
        same_steps(a, b)


def test_a_policy_that_raises_stops_with_one_line(capsys, workdir):
    """What the policy raises: one line, exit status 2, and what was sampled
    before is written."""
    (workdir / "broken.py").write_text(INTERRUPTING.format(at=90, error="ZeroDivisionError('no')"))
    status, stdout, stderr = record(capsys, "--env", "CartPole-v1", "--steps", "1000",
                                    "--rollout", "30", "--policy", "broken:policy",
                                    "--out", "data")
    assert status == 2
    assert_one_line_error(stderr, "--policy 'broken:policy' raised ZeroDivisionError: no",
                          "what was sampled before it is written")
    ds = read_episodes(workdir / "data")
    assert count(stdout, "steps") == ds.num_steps == env_steps(stdout) > 80


def test_an_action_outside_the_space_stops_with_one_line(capsys, workdir):
    (workdir / "wild.py").write_text("def policy(inputs):\n    return [7] * len(inputs['obs'])\n")
    status, stdout, stderr = record(capsys, "--env", "CartPole-v1", "--steps", "1000",
                                    "--policy", "wild:policy", "--out", "data")
    assert status == 2
    assert_one_line_error(stderr, "the policy returned sub-env 0 the action", "7",
                          "outside its action space Discrete(2)")
    assert count(stdout, "steps") == 0 and dataset_files(workdir / "data") == []


# -- multi-agent envs -------------------------------------------------------------------

MA_MODULE = """
from episode.cli.envs import Copies

def make():
    return Copies("CartPole-v1", 3)
"""

MA_POLICY = """
def lean(inputs):
    # {agent_id: input of one row} for the agents to act: an action each.
    return {aid: int(row["obs"][0, 2] > 0) for aid, row in inputs.items()}
"""


def same_multi_agent_steps(a, b) -> None:
    assert (len(a), a.is_done, sorted(a.agent_episodes)) == (len(b), b.is_done,
                                                              sorted(b.agent_episodes))
    for agent_id in a.agent_episodes:
        same_steps(a.agent_episodes[agent_id], b.agent_episodes[agent_id])


def test_record_copies_as_agents_then_inspect(capsys, tmp_path):
    from episode import MultiAgentEpisode

    out = tmp_path / "data"
    status, stdout, stderr = record(capsys, "--env", "CartPole-v1", "--agents", "2", "--steps",
                                    "600", "--rollout", "40", "--out", str(out))
    assert status == 0, stderr
    assert stdout.startswith(f"CartPole-v1 -> {out}: 2 copies as agents, seed 0")
    ds = read_episodes(out)
    episodes = list(ds)
    assert all(isinstance(e, MultiAgentEpisode) for e in episodes)
    assert count(stdout, "steps") == ds.num_steps == env_steps(stdout) == 600
    agent_steps = sum(e.agent_steps() for e in episodes)
    assert f"({agent_steps:,} agent steps)" in note(stdout, "steps")
    assert count(stdout, "episodes") == len(ds)
    running = sum(not e.is_done for e in episodes)
    assert running <= 1
    assert cli.main(["inspect", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["multi_agent"] == {"episodes": len(ds), "agents": ["agent_0", "agent_1"],
                                     "agent_steps": agent_steps}
    assert (report["episodes"], report["steps"], report["done"]) == (
        len(ds), 600, len(ds) - running)
    lengths = np.array([len(e) for e in episodes])
    returns = np.array([e.get_return() for e in episodes])
    for name, values in (("length", lengths), ("return", returns)):
        assert report[name] == {"min": values.min(), "mean": pytest.approx(values.mean()),
                                "median": np.median(values), "max": values.max()}
    assert [s["space"] for s in report["action_space"]] == ["Discrete(2)"]
    assert cli.main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert rest(text, "multi-agent") == f"{len(ds)}  episodes, agents agent_0, agent_1"
    assert rest(text, "steps") == f"600  env steps; {agent_steps:,} agent steps"


def test_record_a_multi_agent_env_with_a_policy(capsys, workdir):
    (workdir / "ma_env.py").write_text(MA_MODULE)
    (workdir / "ma_policy.py").write_text(MA_POLICY)
    status, stdout, stderr = record(capsys, "--env", "ma_env:make", "--steps", "500",
                                    "--policy", "ma_policy:lean", "--batch-mode",
                                    "complete_episodes", "--out", "data")
    assert status == 0, stderr
    assert "ma_env:make -> data: multi-agent" in stdout
    ds = read_episodes(workdir / "data")
    assert ds.num_steps == count(stdout, "steps") >= 500
    for e in ds:
        assert e.is_done and sorted(e.agent_episodes) == ["agent_0", "agent_1", "agent_2"]
        for agent in e.agent_episodes.values():
            obs = agent.get_observations()[:-1]
            np.testing.assert_array_equal(agent.get_actions(), (obs[:, 2] > 0).astype(int))


def test_a_multi_agent_policy_raising_keyboard_interrupt(capsys, workdir):
    """Ctrl-C inside a multi-agent rollout: the running episode is written,
    the dataset reads back and holds what the summary says."""
    (workdir / "ma_env.py").write_text(MA_MODULE)
    (workdir / "ma_stop.py").write_text(
        "calls = 0\n\ndef policy(inputs):\n    global calls\n    calls += 1\n"
        "    if calls == 75:\n        raise KeyboardInterrupt\n"
        "    return {aid: 0 for aid in inputs}\n")
    status, stdout, stderr = record(capsys, "--env", "ma_env:make", "--steps", "10000",
                                    "--rollout", "30", "--policy", "ma_stop:policy",
                                    "--out", "data")
    assert status == 130 and stderr == "interrupted\n"
    ds = read_episodes(workdir / "data")
    assert count(stdout, "steps") == ds.num_steps <= env_steps(stdout) == 74
    assert [e for e in ds if not e.is_done]


def test_a_real_ctrl_c_multi_agent(capsys, tmp_path):
    """SIGINT while recording a multi-agent env: it stops at the end of the
    rollout, and every step sampled is written."""
    out = tmp_path / "data"
    args = ["--env", "CartPole-v1", "--agents", "2", "--rollout", "100"]
    proc, stdout, stderr = _interrupted(out, *args, "--rows-per-file", "1000")
    assert proc.returncode == 130, stderr
    assert stderr == "interrupted\n"
    ds = read_episodes(out)
    assert count(stdout, "steps") == ds.num_steps == env_steps(stdout)
    assert ds.num_steps % 100 == 0         # whole rollouts
    status, _, _ = record(capsys, *args, "--steps", str(ds.num_steps), "--out",
                          str(tmp_path / "whole"))
    assert status == 0
    whole = read_episodes(tmp_path / "whole")
    assert len(whole) == len(ds)
    for a, b in zip(ds, whole):
        same_multi_agent_steps(a, b)


# -- bad input ------------------------------------------------------------------------------


def _parquet(path, **columns) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)


def _truncate(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def _ours(tmp_path) -> pathlib.Path:
    """A CartPole dataset of 30 episodes, about 300 rows."""
    out = tmp_path / "ours"
    env = gym.make("CartPole-v1")
    episodes = []
    for seed in range(30):
        episode = SingleAgentEpisode(observation_space=env.observation_space,
                                     action_space=env.action_space)
        episode.add_env_reset(*env.reset(seed=seed))
        while not episode.is_done:
            obs, reward, terminated, truncated, info = env.step(0)
            episode.add_env_step(obs, 0, reward, info, terminated=terminated,
                                 truncated=truncated)
        episodes.append(episode)
    write_episodes(episodes, out, format="parquet")      # (the damage below is Parquet's)
    return out


def _rewrite(path, change) -> None:
    """The step file `path` rewritten as `change` makes its table (its
    metadata kept), as a user's script might."""
    import pyarrow.parquet as pq

    pq.write_table(change(pq.read_table(path)), path)


def _flip_middle(path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
    path.write_bytes(bytes(data))


def _bad_path(tmp_path, case: str) -> str:
    """A path of each kind that `record --out` or `inspect` refuses."""
    if case == "missing":
        return str(tmp_path / "nowhere")
    if case == "empty":
        (tmp_path / "empty").mkdir()
        return str(tmp_path / "empty")
    if case == "a text file":
        (tmp_path / "notes.txt").write_text("hello")
        return str(tmp_path / "notes.txt")
    if case == "foreign files":
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "notes.txt").write_text("hello")
        return str(tmp_path / "other")
    if case == "a foreign parquet file":
        (tmp_path / "other").mkdir()
        _parquet(tmp_path / "other" / "table.parquet", x=[1, 2, 3])
        return str(tmp_path / "other")
    out = _ours(tmp_path)
    files = dataset_files(out)
    table = next(f for f in files if f.name.endswith(".episodes.parquet"))
    steps = next(f for f in files if ".steps-" in f.name)
    if case == "a truncated episode table":
        _truncate(table)
    elif case == "a truncated step file":
        _truncate(steps)
    elif case == "a missing step file":
        steps.unlink()
    elif case == "a newer version":
        import pyarrow.parquet as pq

        t = pq.read_table(table)
        meta = json.loads(t.schema.metadata[b"episode.format"])
        meta["version"] = 99
        pq.write_table(t.replace_schema_metadata({b"episode.format": json.dumps(meta)}), table)
    elif case == "a step file of another tool":
        _parquet(steps, x=[1, 2, 3])
    elif case == "flipped bytes in a step file":
        _flip_middle(steps)
    elif case == "actions cast to float64":
        import pyarrow as pa

        _rewrite(steps, lambda t: t.set_column(t.schema.get_field_index("actions"), "actions",
                                               t.column("actions").cast(pa.float64())))
    elif case == "a step file 100 rows short":
        _rewrite(steps, lambda t: t.slice(0, t.num_rows - 100))
    else:
        raise AssertionError(case)
    return str(out)


INSPECT_CASES = [
    ("missing", ["no dataset at", "nowhere"]),
    ("empty", ["empty", "no dataset files"]),
    ("a text file", ["notes.txt", "not a dataset file"]),
    ("foreign files", ["other", "no dataset files"]),
    ("a foreign parquet file", ["table.parquet"]),
    ("a truncated episode table", [".episodes.parquet", "not a readable parquet file"]),
    ("a truncated step file", [".steps-0.parquet", "damaged", "cut short"]),
    ("a missing step file", [".steps-0.parquet", "missing"]),
    ("a newer version", [".episodes.parquet", "version 99"]),
    ("a step file of another tool", [".steps-0.parquet", "damaged"]),
    ("flipped bytes in a step file", [".steps-0.parquet", "damaged", "CRC-32"]),
    ("actions cast to float64", [".steps-0.parquet", "damaged"]),
    ("a step file 100 rows short", [".steps-0.parquet", "damaged"]),
]

# Unchecked (--no-verify), what does not read is still refused.
UNCHECKED_CASES = [
    ("a truncated step file", [".steps-0.parquet", "not a readable parquet file"]),
    ("a step file of another tool", [".steps-0.parquet", "not a file of an episode dataset"]),
    ("actions cast to float64", [".steps-0.parquet", "'actions'", "expected int64, got double"]),
    ("a step file 100 rows short", [".steps-0.parquet", "rows, where its episode table",
                                    "places episodes up to row"]),
]


@pytest.mark.parametrize("case, fragments", INSPECT_CASES)
def test_inspect_refuses_in_one_line(capsys, tmp_path, case, fragments):
    path = _bad_path(tmp_path, case)
    assert cli.main(["inspect", path]) == 2
    captured = capsys.readouterr()
    assert_one_line_error(captured.err, *fragments)
    assert captured.out == ""


@pytest.mark.parametrize("case, fragments", UNCHECKED_CASES)
def test_inspect_reads_what_it_reports_on_also_unchecked(capsys, tmp_path, case, fragments):
    path = _bad_path(tmp_path, case)
    assert cli.main(["inspect", "--no-verify", path]) == 2
    captured = capsys.readouterr()
    assert_one_line_error(captured.err, *fragments)
    assert captured.out == ""


def test_inspect_of_a_trusted_dataset_skips_the_checksums(capsys, tmp_path):
    out = _ours(tmp_path)
    write_episodes(list(read_episodes(out)), tmp_path / "arrow", format="arrow")
    _flip_middle(next(f for f in dataset_files(tmp_path / "arrow") if ".steps-" in f.name))
    # (the flipped bytes hit values, which read as something nobody wrote)
    assert cli.main(["inspect", "--no-verify", str(tmp_path / "arrow")]) == 0
    assert cli.main(["inspect", str(tmp_path / "arrow")]) == 2
    assert_one_line_error(capsys.readouterr().err, ".steps-0.arrow: damaged")


def test_inspect_into_a_closed_pipe_ends_quietly(tmp_path):
    """`episode inspect DIR | head`: the reader leaves; no traceback."""
    out = _ours(tmp_path)
    # (Run from tmp_path: from the checkout's root the source folder would
    # shadow the installed package.)
    child = subprocess.Popen([sys.executable, "-m", "episode", "inspect", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    child.stdout.close()                     # before it writes a line
    stderr = child.stderr.read().decode()
    assert child.wait(timeout=120) == 141, stderr
    assert stderr == ""


RECORD_CASES = [
    ("a text file", ["--out", "notes.txt", "is a file, not a folder"]),
    ("foreign files", ["--out", "holds files that are not an episode dataset", "notes.txt"]),
    ("a foreign parquet file", ["--out", "holds files that are not an episode dataset",
                                "table.parquet"]),
    ("a truncated episode table", ["--out", ".episodes.parquet", "not a readable parquet"]),
    ("a missing step file", ["--out", ".steps-0.parquet", "missing"]),
    ("a newer version", ["--out", "version 99"]),
    ("a truncated step file", ["--out", ".steps-0.parquet", "damaged"]),
    ("flipped bytes in a step file", ["--out", ".steps-0.parquet", "damaged", "CRC-32"]),
    ("a step file 100 rows short", ["--out", ".steps-0.parquet", "damaged"]),
]


@pytest.mark.parametrize("case, fragments", RECORD_CASES)
def test_record_refuses_an_out_folder_in_one_line(capsys, tmp_path, case, fragments):
    path = _bad_path(tmp_path, case)
    before = {f: f.read_bytes() for f in dataset_files(tmp_path)}
    status, stdout, stderr = record(capsys, "--env", "CartPole-v1", "--steps", "50", "--out",
                                    path)
    assert status == 2
    assert_one_line_error(stderr, *fragments)
    assert stdout == ""
    # Nothing was added or changed.
    assert {f: f.read_bytes() for f in dataset_files(tmp_path)} == before


def test_record_into_an_empty_folder_or_beside_unfinished_parts(capsys, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert record(capsys, "--env", "CartPole-v1", "--steps", "30", "--out", str(empty))[0] == 0
    # A killed writer's step file without its episode table, and a temporary file.
    out = _ours(tmp_path)
    next(f for f in dataset_files(out) if f.name.endswith(".episodes.parquet")).unlink()
    (out / ".part.tmp").write_bytes(b"partial")
    status, stdout, _ = record(capsys, "--env", "CartPole-v1", "--steps", "30", "--out", str(out))
    assert status == 0 and "dataset" not in stdout
    assert read_episodes(out).num_steps == 30


@pytest.mark.parametrize("args, fragments", [
    (["--agents", "2", "--num-envs", "2"], ["--num-envs", "multi-agent env"]),
    (["--policy", "no_such_policy_module:f"], ["--policy 'no_such_policy_module:f'",
                                               "no module named 'no_such_policy_module'"]),
    (["--policy", "os:no_such_function"], ["--policy 'os:no_such_function'",
                                           "has no function 'no_such_function'"]),
    (["--policy", "os"], ["--policy 'os'", "module:function"]),
    (["--policy", "os:"], ["--policy 'os:'", "module:function"]),
    (["--format", "arrow", "--compression", "snappy"], ["snappy", "arrow"]),
    (["--format", "csv"], ["--format"]),
    (["--compression", "rar"], ["--compression"]),
    (["--rows-per-file", "0"], ["--rows-per-file"]),
    (["--steps", "0"], ["--steps"]),
    (["--num-envs", "60"], ["--num-envs 60", "--steps 50"]),
    (["--env", "Nope-v0"], ["unknown environment id 'Nope-v0'"]),
])
def test_record_bad_options_in_one_line(capsys, tmp_path, args, fragments):
    argv = ["--env", "CartPole-v1", "--steps", "50", "--out", str(tmp_path / "data"), *args]
    status, stdout, stderr = record(capsys, *argv)
    assert status == 2
    assert_one_line_error(stderr, *fragments)
    assert stdout == ""
    assert not (tmp_path / "data").exists()


def test_record_refuses_agents_of_a_multi_agent_env(capsys, workdir):
    (workdir / "ma_env.py").write_text(MA_MODULE)
    status, _, stderr = record(capsys, "--env", "ma_env:make", "--agents", "2", "--steps", "50",
                               "--out", "data")
    assert status == 2
    assert_one_line_error(stderr, "--agents", "'ma_env:make'")
    assert not (workdir / "data").exists()


@pytest.mark.parametrize("missing", ["--env", "--steps", "--out"])
def test_record_needs_env_steps_and_out(capsys, tmp_path, missing):
    argv = {"--env": "CartPole-v1", "--steps": "50", "--out": str(tmp_path / "data")}
    del argv[missing]
    assert cli.main(["record", *[x for kv in argv.items() for x in kv]]) == 2
    assert_one_line_error(capsys.readouterr().err, missing)


def test_unstorable_infos_stop_with_one_line(capsys, workdir):
    """An env whose infos a dataset cannot hold: one line, what was written
    stays readable."""
    (workdir / "odd_env.py").write_text("""
import gymnasium as gym

class OddInfos(gym.Wrapper):
    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {"thing": object()}

gym.register("OddInfos-v0", entry_point=lambda: OddInfos(gym.make("CartPole-v1")))
""")
    status, stdout, stderr = record(capsys, "--env", "odd_env:OddInfos-v0", "--steps", "50",
                                    "--out", "new/data")
    assert status == 2
    assert_one_line_error(stderr, "cannot record the episodes", "object")
    assert stdout == ""
    assert not (workdir / "new").exists()           # nothing recorded, nothing left


def test_record_refuses_a_dataset_of_another_env_unless_asked(capsys, tmp_path):
    out = str(tmp_path / "data")
    assert record(capsys, "--env", "CartPole-v1", "--steps", "50", "--out", out)[0] == 0
    before = {f: f.read_bytes() for f in dataset_files(out)}
    status, stdout, stderr = record(capsys, "--env", "Pendulum-v1", "--steps", "50",
                                    "--out", out)
    assert status == 2 and stdout == ""
    assert_one_line_error(stderr, "--out", "(3,), float32), actions Box(-2.0, 2.0, (1,)",
                          "another environment", "--mixed-spaces")
    assert {f: f.read_bytes() for f in dataset_files(out)} == before
    status, _, stderr = record(capsys, "--env", "Pendulum-v1", "--steps", "50", "--out", out,
                               "--mixed-spaces")
    assert status == 0, stderr
    assert len(read_episodes(out).spaces()["observation_space"]) == 2


def test_a_recording_killed_keeps_what_it_flushed(tmp_path):
    """kill -9 in the middle of a long recording: the parts written every
    --seconds-per-file read."""
    out = tmp_path / "data"
    child = subprocess.Popen([sys.executable, "-m", "episode", "record", "--env",
                              "CartPole-v1", "--steps", "50000000", "--num-envs", "4",
                              "--seconds-per-file", "0.3", "--out", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
            ".episodes." in f.name for f in out.glob("*") if out.exists()):
        time.sleep(0.1)
    time.sleep(0.5)
    child.send_signal(signal.SIGKILL)
    child.wait()
    ds = read_episodes(out)
    ds.check()
    assert ds.num_steps > 0 and ds.num_steps == sum(len(e) for e in ds)


# -- inspect: Dict/Tuple items, extra outputs, infos ----------------------------------------


def test_inspect_nested_spaces_extra_outputs_and_infos(capsys, tmp_path):
    obs_space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,), np.float32),
                                 "mode": gym.spaces.Discrete(3)})
    act_space = gym.spaces.Tuple((gym.spaces.Discrete(2),
                                  gym.spaces.Box(0, 1, (3,), np.float64)))
    episodes = []
    for n, end in ((3, "terminated"), (5, "truncated"), (2, "")):
        e = SingleAgentEpisode(observation_space=obs_space, action_space=act_space)
        e.add_env_reset({"pos": np.zeros(2, np.float32), "mode": 0}, {"start": True})
        for t in range(n):
            e.add_env_step({"pos": np.full(2, t / 10, np.float32), "mode": t % 3},
                           (t % 2, np.full(3, 0.5)), float(t), {} if t else {"t": t},
                           terminated=end == "terminated" and t == n - 1,
                           truncated=end == "truncated" and t == n - 1,
                           extra_model_outputs={"action_logp": np.float32(-t),
                                                "state_out": np.zeros(4, np.float32)})
        e.to_numpy()
        episodes.append(e)
    write_episodes(episodes, tmp_path / "data")
    assert cli.main(["inspect", str(tmp_path / "data"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["episodes"], report["steps"], report["done"], report["terminated"],
            report["truncated"]) == (3, 10, 2, 1, 1)
    assert report["length"] == {"min": 2, "mean": pytest.approx(10 / 3), "median": 3, "max": 5}
    assert report["return"] == {"min": 1, "mean": pytest.approx(14 / 3), "median": 3, "max": 10}
    assert report["extra_model_outputs"] == ["action_logp", "state_out"]
    # An info on each reset and first step; 10 steps + 3 last observations.
    assert report["infos"] == {"rows_with_info": 6, "rows": 13}
    assert [s["space"] for s in report["observation_space"]] == [
        "Dict('mode': Discrete(3), 'pos': Box(-1.0, 1.0, (2,), float32))"]
    assert [s["space"] for s in report["action_space"]] == [
        "Tuple(Discrete(2), Box(0.0, 1.0, (3,), float64))"]
    rows = [(c["column"], c["arrow_type"], c["dtype"], c["shape"], c["items"], c["mode"])
            for c in report["schemas"][0]["columns"]]
    assert rows == [
        ("obs.pos", "fixed_shape_tensor[float, [2]]", "float32", [2], "array", "numpy"),
        ("obs.mode", "int64", "int64", [], "int", "numpy"),
        ("actions.0", "int64", "int64", [], "int", "numpy"),
        ("actions.1", "fixed_shape_tensor[double, [3]]", "float64", [3], "array", "numpy"),
        ("rewards", "double", "float64", [], "float", "numpy"),
        ("action_logp", "float", "float32", [], "scalar", "numpy"),
        ("state_out", "fixed_shape_tensor[float, [4]]", "float32", [4], "array", "numpy"),
        ("infos", "binary", None, None, None, None),
        ("terminateds", "bool", None, None, None, None),
        ("truncateds", "bool", None, None, None, None),
    ]
    assert cli.main(["inspect", str(tmp_path / "data")]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^  infos\s+on 6 of 13 rows$", text, re.MULTILINE)
    assert re.search(r"^  obs\.pos\s+fixed_shape_tensor\[float, \[2\]\]\s+float32\s+\(2,\)",
                     text, re.MULTILINE)
    assert re.search(r"^  extra outputs\s+action_logp, state_out$", text, re.MULTILINE)


def test_inspect_list_mode_and_object_items(capsys, tmp_path):
    """Episodes never numpy'd, strings as observations: list-mode leaves and
    msgpack'd values; an empty dataset folder's statistics are none."""
    e = SingleAgentEpisode()
    e.add_env_reset("start")
    for t in range(4):
        e.add_env_step(f"s{t}", t, 1.0)
    write_episodes([e], tmp_path / "data")
    assert cli.main(["inspect", str(tmp_path / "data"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    columns = {c["column"]: c for c in report["schemas"][0]["columns"]}
    assert (columns["obs"]["stored_as"], columns["obs"]["items"], columns["obs"]["mode"]) == (
        "msgpack values", "object", "list")
    assert (columns["actions"]["dtype"], columns["actions"]["items"],
            columns["actions"]["mode"]) == ("int64", "int", "list")
    assert report["observation_space"] == [{"space": None, "description": None}]
    assert report["return"] == {"min": 4, "mean": 4.0, "median": 4, "max": 4}


def test_inspect_a_dataset_without_episodes(capsys, tmp_path):
    (tmp_path / "folder").mkdir()
    assert cli.main(["inspect", str(tmp_path / "folder")]) == 2
    assert_one_line_error(capsys.readouterr().err, "no dataset files")
    write_episodes([], tmp_path / "data")           # a dataset of no episodes
    assert cli.main(["inspect", str(tmp_path / "data"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["episodes"], report["steps"], report["length"]) == (0, 0, None)
    # An episode without steps: counted, its statistics are its own.
    e = SingleAgentEpisode()
    e.add_env_reset(np.zeros(2, np.float32))
    write_episodes([e], tmp_path / "one")
    assert cli.main(["inspect", str(tmp_path / "one"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["episodes"], report["steps"], report["done"]) == (1, 0, 0)
    assert report["length"] == {"min": 0, "mean": 0.0, "median": 0, "max": 0}


@pytest.mark.rllib
def test_inspect_an_rllib_recording(capsys, tmp_path):
    """RLlib's episode format (msgpack'd get_state() in an `item` column)."""
    msgpack = pytest.importorskip("msgpack")
    mnp = pytest.importorskip("msgpack_numpy")
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode

    env = gym.make("CartPole-v1")
    items, lengths = [], []
    for seed in range(3):
        e = RLlibEpisode(observation_space=env.observation_space, action_space=env.action_space)
        e.add_env_reset(*env.reset(seed=seed))
        while not e.is_done:
            obs, reward, terminated, truncated, info = env.step(len(e) % 2)
            e.add_env_step(obs, len(e) % 2, reward, info, terminated=terminated,
                           truncated=truncated)
        e.to_numpy()
        lengths.append(len(e))
        items.append(msgpack.packb(e.get_state(), default=mnp.encode))
    (tmp_path / "rec").mkdir()
    _parquet(tmp_path / "rec" / "part.parquet", item=items)
    assert cli.main(["inspect", str(tmp_path / "rec"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["episodes"], report["steps"], report["done"]) == (3, sum(lengths), 3)
    assert report["length"]["max"] == max(lengths)
    assert report["files"]["count"] == 1
    assert [c["column"] for c in report["schemas"][0]["columns"]] == ["item"]


# -- the command line as a whole -----------------------------------------------------------


def test_help_and_docstring_list_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "{demo,bench,record,inspect}" in out
    for command in ("demo", "bench", "record", "inspect"):
        assert f"episode {command}" in cli.__doc__
    assert cli.main(["record", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--policy MODULE:FUNCTION" in out and "one row per sub-env" in out
    assert "--agents" in out and "{agent_id: action}" in out
    assert cli.main(["inspect", "--help"]) == 0
    assert "--json" in capsys.readouterr().out


def test_record_and_inspect_under_python_OO():
    """-OO strips docstrings; recording and inspecting do not need them."""
    with tempfile.TemporaryDirectory() as cwd:
        for args in (["record", "--help"], ["inspect", "--help"],
                     ["record", "--env", "CartPole-v1", "--steps", "300", "--num-envs", "2",
                      "--out", "data"],
                     ["inspect", "data"], ["inspect", "data", "--json"]):
            result = subprocess.run([sys.executable, "-OO", "-m", "episode", *args], cwd=cwd,
                                    check=False, capture_output=True, text=True, timeout=120)
            assert result.returncode == 0, result.stderr
            assert result.stderr == ""
        assert json.loads(result.stdout)["steps"] in (300, 301)
        result = subprocess.run([sys.executable, "-OO", "-m", "episode", "inspect", "nowhere"],
                                cwd=cwd, check=False, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 2
        assert_one_line_error(result.stderr, "no dataset at 'nowhere'")


def test_inspect_is_light_on_big_datasets(capsys, tmp_path, monkeypatch):
    """inspect reads episode tables and file footers: it builds no episode."""
    status, stdout, _ = record(capsys, "--env", "CartPole-v1", "--steps", "2000", "--num-envs",
                               "4", "--out", str(tmp_path / "data"))
    assert status == 0
    from episode.offline.dataset import EpisodeDataset

    def refuse(self, k):
        raise AssertionError("inspect built an episode")

    monkeypatch.setattr(EpisodeDataset, "_chunk", refuse)
    assert cli.main(["inspect", str(tmp_path / "data")]) == 0
    assert count(capsys.readouterr().out, "steps") == count(stdout, "steps") >= 2000
