"""Without ray[rllib] or torch, what needs them raises an ImportError that
names the extra installing them. Each case runs in a child process in which
the missing package cannot be imported."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

EXTRA = 'pip install "episode[rllib]"'

CASES = {
    "distributed": "import episode.distributed",
    "rllib_install": "import episode.rllib\nepisode.rllib.install()",
    "rllib_runners": "import episode.rllib.runners",
    "single_agent_sample_batch": """
        from episode import SingleAgentEpisode
        episode = SingleAgentEpisode(observations=[0, 1], actions=[0], rewards=[1.0])
        episode.get_sample_batch()
    """,
    "multi_agent_sample_batch": """
        from episode import MultiAgentEpisode
        episode = MultiAgentEpisode()
        episode.add_env_reset(observations={"a": 0})
        episode.get_sample_batch()
    """,
    "views_sample_batch": """
        from episode import SingleAgentEpisode
        from episode.views import build_training_batch
        from episode.sampling import default_view_requirements
        episode = SingleAgentEpisode(observations=[0, 1], actions=[0], rewards=[1.0])
        build_training_batch([episode], default_view_requirements(), sample_batch=True)
    """,
}


def _run_without(package: str, code: str) -> subprocess.CompletedProcess:
    script = (f"import sys\nsys.modules[{package!r}] = None   # import {package} fails\n"
              + textwrap.dedent(code))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False, cwd="/")


@pytest.mark.parametrize("case, package", [(case, "ray") for case in sorted(CASES)]
                         + [("rllib_runners", "torch")])
def test_a_missing_package_is_reported_with_the_extra(case, package):
    result = _run_without(package, CASES[case])
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: "), result.stderr
    assert EXTRA in last and package in last, last


def test_import_episode_needs_neither():
    result = _run_without("ray", "import sys; sys.modules['torch'] = None\nimport episode")
    assert result.returncode == 0, result.stderr
