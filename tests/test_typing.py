"""Type information ships with the package: py.typed, and a stub beside each
compiled module. mypy checks a user's script against the installed package,
and stubtest checks the stubs against the compiled modules themselves."""
import os
import pathlib
import re
import subprocess
import sys
import sysconfig

import pytest

pytest.importorskip("mypy")

import episode  # noqa: E402

HERE = pathlib.Path(__file__).parent
PACKAGE_DIR = pathlib.Path(episode.__file__).parent
COMPILED = ["episode._buffer", "episode._column", "episode._episode", "episode._index", "episode._views", "episode._checks",
            "episode._multi", "episode._vector", "episode._priority", "episode._replay"]

# Expressions appended to tests/typing_sample.py, with the type mypy must infer.
REVEALS = {
    "episode.cut()": "episode.single_agent_episode.SingleAgentEpisode",
    "episode.slice(slice(0, 1))": "episode.single_agent_episode.SingleAgentEpisode",
    "episode[1:3]": "episode.single_agent_episode.SingleAgentEpisode",
    "SingleAgentEpisode.from_state(episode_state)":
        "episode.single_agent_episode.SingleAgentEpisode",
    "len(episode)": "int",
    "episode.get_return()": "float",
    "episode.is_done": "bool",
    "episode.t": "int",
    "episode.rewards": "episode.lookback_buffer.InfiniteLookbackBuffer",
    "SingleAgentEpisode().observation_space": "gymnasium.spaces.space.Space[Any] | None",
    "InfiniteLookbackBuffer.from_state(state)": "episode.lookback_buffer.InfiniteLookbackBuffer",
    "buf + [1.0]": "episode.lookback_buffer.InfiniteLookbackBuffer",
    "buf.sub_buffer(slice(0, 1), False, 0, None)":
        "episode.lookback_buffer.InfiniteLookbackBuffer",
    "buf.len_incl_lookback()": "int",
    "buf.finalized": "bool",
}


def mypy_env() -> dict:
    """The environment for a mypy run that must see the episode package the
    tests import. A regular install is found through site-packages (that is
    what py.typed is for). An editable install redirects imports at run time,
    which mypy cannot follow, so it is pointed at the source tree instead."""
    env = dict(os.environ)
    installed = {pathlib.Path(sysconfig.get_path(k)).resolve() for k in ("purelib", "platlib")}
    if PACKAGE_DIR.parent.resolve() not in installed:
        env["MYPYPATH"] = str(PACKAGE_DIR.parent)
    return env


def run(args: list, cwd) -> subprocess.CompletedProcess:
    # An empty working directory: a checkout's episode/ must not shadow the
    # installed package.
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=mypy_env(),
                          capture_output=True, text=True, timeout=600, check=False)


def test_py_typed_is_installed():
    assert (PACKAGE_DIR / "py.typed").is_file()


def test_sample_script_runs(tmp_path):
    result = subprocess.run([sys.executable, str(HERE / "typing_sample.py")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr


def test_mypy_types_every_public_call(tmp_path):
    sample = (HERE / "typing_sample.py").read_text()
    lines = sample.splitlines()
    first = len(lines) + 1
    lines += [f"reveal_type({expr})" for expr in REVEALS]
    script = tmp_path / "sample.py"
    script.write_text("\n".join(lines) + "\n")
    result = run(["mypy", "--python-executable", sys.executable, "--follow-imports=silent",
                  "--cache-dir", str(tmp_path / "cache"), "--show-error-codes",
                  "--no-error-summary", script.name], tmp_path)
    out = result.stdout + result.stderr
    assert " error: " not in out, out
    assert result.returncode == 0, out
    revealed = {int(m.group(1)): m.group(2).replace("builtins.", "")
                for m in re.finditer(r"sample\.py:(\d+): note: Revealed type is \"(.*)\"", out)}
    assert revealed == {first + i: expected for i, expected in enumerate(REVEALS.values())}, out


def test_stubs_match_the_compiled_modules(tmp_path):
    """Every public name of the compiled modules is in its stub, with the
    runtime's signature (Cython's own additions are listed in the allowlist)."""
    result = run(["mypy.stubtest", "--allowlist", str(HERE / "stubtest-allowlist.txt"),
                  *COMPILED], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
