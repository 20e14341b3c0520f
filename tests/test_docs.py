"""Every Python example of the README and of the documentation site (docs/)
runs as written. An example whose first line is `# needs ray[rllib]` runs in
a fresh process (RLlib and Ray are set up per process), and only where ray
is installed; one whose first line is `# needs episode[<extra>]` runs only
where that extra's modules are installed, and one whose first line is
`# needs torch` only where torch is."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
HERE = pathlib.Path(__file__).parent
NEEDS_RAY = "# needs ray[rllib]"
# The modules an extra's examples import (checked before they run).
EXTRA_MODULES = {"episode[minari]": ("h5py", "pyarrow", "PIL"),
                 "episode[pettingzoo]": ("pettingzoo",),
                 "torch": ("torch",)}
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _examples() -> list:
    found = []
    for page in PAGES:
        if not page.exists():
            continue      # (an installed copy of the tests without the checkout)
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S)):
            marks = [pytest.mark.rllib] if code.startswith(NEEDS_RAY) else []
            name = f"{page.relative_to(ROOT)}#{i}"
            found.append(pytest.param(page, code, id=name, marks=marks))
    return found


EXAMPLES = _examples()


@pytest.mark.parametrize("page, code", EXAMPLES)
def test_example_runs(page, code):
    first = code.split("\n", 1)[0]
    for module in EXTRA_MODULES.get(first.removeprefix("# needs ").strip(), ()):
        pytest.importorskip(module)
    if not code.startswith(NEEDS_RAY):
        exec(compile(code, str(page), "exec"), {"__name__": "__example__"})
        return
    pytest.importorskip("ray.rllib")
    pytest.importorskip("torch")
    # From tests/: Ray's workers put the working directory first on sys.path,
    # and the checkout's episode/ (not built) must not shadow the package.
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, env=env, cwd=HERE)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_every_page_with_code_has_examples():
    pages = {param.values[0] for param in EXAMPLES}
    if (ROOT / "docs").exists():
        for name in ("README.md", "docs/guide/episodes.md", "docs/guide/multi-agent.md",
                     "docs/guide/sampling.md", "docs/guide/replay.md", "docs/guide/rllib.md",
                     "docs/guide/ray.md", "docs/guide/datasets.md",
                     "docs/guide/multi-agent-sampling.md", "docs/guide/save-load.md",
                     "docs/guide/reproducibility.md"):
            assert ROOT / name in pages, name
