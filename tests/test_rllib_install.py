"""episode.rllib: RLlib 2.60 on our episode classes.

Each run is a fresh Python process (one process cannot mix RLlib's episodes
with ours), with a fixed hash seed so that RLlib's own runs repeat exactly.
"""
from __future__ import annotations

import atexit
import fcntl
import functools
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.rllib
pytest.importorskip("ray.rllib")
pytest.importorskip("torch")

HERE = Path(__file__).parent


def _python(code: str, timeout: int = 600) -> str:
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    # From tests/: the source tree's episode/ (not built) must not shadow the
    # installed package.
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=HERE)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-1]


# The runs each training test compares, started side by side (each is a
# process of its own; two cores take two at once): the training tests need
# all of one algorithm's runs. Remote runs each start a Ray cluster: one at
# a time.
SIDE_BY_SIDE = {"ppo": ("rllib", "ours", "runner"), "dqn": ("rllib", "ours", "runner"),
                "ppo_multi_agent": ("rllib", "ours", "runner")}
_runs: dict = {}


def _start(algo: str, classes: str, iterations: int) -> subprocess.Popen:
    key = (algo, classes, iterations)
    if key not in _runs:
        env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
        _runs[key] = subprocess.Popen(
            [sys.executable, str(HERE / "rllib_runs.py"), algo, classes, str(iterations)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=HERE)
    return _runs[key]


@atexit.register
def _stop_runs() -> None:
    # Runs a test selection started but did not wait for.
    for proc in _runs.values():
        if proc.poll() is None:
            proc.kill()


@functools.lru_cache(maxsize=None)
def _run(algo: str, classes: str, iterations: int) -> dict:
    """rllib_runs.py's result (each run once per test session: the tests of
    episode.rllib.runners compare with the same RLlib runs). Under
    pytest-xdist the workers share the results through files, one lock per
    algorithm: this module and test_rllib_runners.py may run in two."""
    shared = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not shared or algo not in SIDE_BY_SIDE:
        return _run_here(algo, classes, iterations)
    folder = Path(tempfile.gettempdir()) / f"episode-rllib-runs-{shared}"
    folder.mkdir(exist_ok=True)
    result = folder / f"{algo}-{classes}-{iterations}.json"
    with open(folder / f"{algo}-{iterations}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            # The side-by-side runs all end here, their results kept for the
            # tests that ask next (in this worker or the other).
            for other in SIDE_BY_SIDE[algo]:
                done = _run_here(algo, other, iterations)
                part = folder / f"{algo}-{other}-{iterations}.json.part"
                part.write_text(json.dumps(done))
                part.replace(folder / f"{algo}-{other}-{iterations}.json")
        return json.loads(result.read_text())


def _run_here(algo: str, classes: str, iterations: int) -> dict:
    for other in SIDE_BY_SIDE.get(algo, ()):
        _start(algo, other, iterations)
    proc = _start(algo, classes, iterations)
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("algo, episodes", [
    ("ppo", {"episode.single_agent_episode.SingleAgentEpisode"}),
    ("dqn", {"episode.single_agent_episode.SingleAgentEpisode"}),
    ("ppo_multi_agent", {"episode.multi_agent_episode.MultiAgentEpisode",
                         "episode.single_agent_episode.SingleAgentEpisode"}),
])
def test_training_on_our_classes_repeats_rllib_exactly(algo, episodes):
    """PPO (CartPole, 8 envs, GAE), DQN (prioritized episode replay, 3-step)
    and multi-agent PPO (RLlib's MultiAgentCartPole, two policies): the same
    returns and losses, iteration by iteration, as on RLlib's own classes,
    and every episode the learners get is ours."""
    theirs, ours = _run(algo, "rllib", 3), _run(algo, "ours", 3)
    assert ours["curve"] == theirs["curve"]
    assert set(ours["learner_episodes"]) == episodes
    assert not any(name.startswith("episode.") for name in theirs["learner_episodes"])


@pytest.mark.parametrize("classes, vectorized", [("ours", None), ("runner", True)])
def test_episodes_from_a_remote_env_runner_are_ours(classes, vectorized):
    """Sampling in a Ray actor (started after install(): its worker setup hook
    installs there too), with RLlib's runner or ours; the episodes cross the
    object store."""
    ours = _run("ppo_remote", classes, 1)
    assert ours["learner_episodes"] == ["episode.single_agent_episode.SingleAgentEpisode"]
    assert ours["curve"][0][0] is not None
    assert ours["vectorized"] is vectorized


def test_install_swaps_every_loaded_module_and_uninstall_puts_them_back():
    out = _python("""
        import sys
        import episode.rllib as er
        assert "ray" not in sys.modules            # importing episode.rllib imports no ray
        import ray.rllib.env.single_agent_episode as sae
        import ray.rllib.env.multi_agent_episode as mae
        import ray.rllib.env.utils.infinite_lookback_buffer as ilb
        import ray.rllib.env.single_agent_env_runner as runner
        theirs = (sae.SingleAgentEpisode, mae.MultiAgentEpisode, ilb.InfiniteLookbackBuffer)
        import episode
        with er.installed():
            er.install()                           # idempotent
            assert er.is_installed()
            assert sae.SingleAgentEpisode is episode.SingleAgentEpisode
            assert runner.SingleAgentEpisode is episode.SingleAgentEpisode
            assert mae.MultiAgentEpisode is episode.MultiAgentEpisode
            assert ilb.InfiniteLookbackBuffer is episode.InfiniteLookbackBuffer
            from ray.rllib.utils.replay_buffers import episode_replay_buffer as erb
            assert erb.InfiniteLookbackBuffer is episode.InfiniteLookbackBuffer
            assert erb.SingleAgentEpisode is episode.SingleAgentEpisode
            # A module first imported now gets ours, and uninstall() puts
            # RLlib's back there too.
            late = "ray.rllib.connectors.env_to_module.observation_preprocessor"
            assert late not in sys.modules
            import ray.rllib.connectors.env_to_module.observation_preprocessor as pre
            assert pre.SingleAgentEpisode is episode.SingleAgentEpisode
        assert not er.is_installed()
        assert (sae.SingleAgentEpisode, mae.MultiAgentEpisode,
                ilb.InfiniteLookbackBuffer) == theirs
        assert runner.SingleAgentEpisode is theirs[0] and erb.SingleAgentEpisode is theirs[0]
        assert pre.SingleAgentEpisode is theirs[0]
        print("ok")
    """)
    assert out == "ok"


def test_install_refuses_while_an_rllib_episode_is_alive():
    out = _python("""
        import episode.rllib as er
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode
        kept = SingleAgentEpisode()
        try:
            er.install()
        except RuntimeError as error:
            assert "5 object(s)" in str(error), error   # the episode and its 4 buffers
        else:
            raise SystemExit("install() did not refuse")
        import ray.rllib.env.single_agent_episode as sae
        assert sae.SingleAgentEpisode is SingleAgentEpisode and not er.is_installed()
        del kept
        er.install()
        assert sae.SingleAgentEpisode.__module__ == "episode.single_agent_episode"
        print("ok")
    """)
    assert out == "ok"
