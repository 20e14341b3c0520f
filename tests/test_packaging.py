"""The packages: the conda recipe agrees with pyproject.toml, and the wheel
configuration covers the targets.

(The sdist and the wheel themselves are built and installed by .ci/run.)"""
from __future__ import annotations

import pathlib
import re
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
if sys.version_info >= (3, 11):
    import tomllib
else:
    tomllib = pytest.importorskip("tomli")

import episode  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "conda" / "recipe.yaml"

if not RECIPE.exists():
    pytest.skip("no conda recipe beside these tests (an installed copy of the tests)",
                allow_module_level=True)


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _recipe() -> dict:
    return yaml.safe_load(RECIPE.read_text())


def _requirement(text: str) -> tuple:
    # "numpy>=2.0" and conda's "numpy >=2.0" as (name, specifier).
    match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*(.*?)\s*", text)
    assert match, text
    name = match.group(1).lower().replace("_", "-")
    # (conda-forge's name of PyPI's msgpack)
    return _CONDA_NAMES.get(name, name), match.group(2).replace(" ", "")


_CONDA_NAMES = {"msgpack-python": "msgpack"}


def test_the_recipe_parses_and_builds_with_pip_and_cmake():
    recipe = _recipe()
    assert recipe["package"]["name"] == "${{ name }}" and recipe["context"]["name"] == "episode"
    assert recipe["context"]["version"] == episode.__version__
    script = recipe["build"]["script"]
    assert "-m pip install . --no-deps --no-build-isolation" in script
    assert "${{ compiler('c') }}" in recipe["requirements"]["build"]
    assert any(r.startswith("cmake") for r in recipe["requirements"]["build"])


def test_the_recipe_requirements_are_pyproject_s():
    project, recipe = _pyproject(), _recipe()
    run = {_requirement(r) for r in recipe["requirements"]["run"]}
    python = ("python", project["project"]["requires-python"])
    assert run == {_requirement(r) for r in project["project"]["dependencies"]} | {python}
    host = {_requirement(r) for r in recipe["requirements"]["host"]}
    assert {_requirement(r) for r in project["build-system"]["requires"]} <= host
    assert python in host


def test_the_recipe_tests_import_and_run_the_suite():
    tests = _recipe()["tests"]
    imports = [t["python"]["imports"] for t in tests if "python" in t]
    assert imports and "episode" in imports[0]
    scripts = [line for t in tests for line in t.get("script", [])]
    assert any(line.startswith("pytest") and "not rllib" in line for line in scripts)
    entry = _recipe()["build"]["python"]["entry_points"]
    assert entry == [f"episode = {_pyproject()['project']['scripts']['episode']}"]


def test_wheels_are_configured_for_manylinux_and_macos_with_a_test_command():
    config = _pyproject()["tool"]["cibuildwheel"]
    assert set(config["linux"]["archs"]) == {"x86_64", "aarch64"}
    assert config["macos"]["archs"]
    assert "musllinux" in config["skip"]
    assert "pytest" in config["test-command"] and "{project}/tests" in config["test-command"]
    assert all(f"cp3{minor}-*" in config["build"].split() for minor in (10, 11, 12))


def test_the_sdist_leaves_out_what_the_build_does_not_need():
    exclude = set(_pyproject()["tool"]["scikit-build"]["sdist"]["exclude"])
    assert {"tests", "benchmarks", ".ci", "conda", "docs"} <= exclude
    assert not exclude & {"pyx", "episode", "CMakeLists.txt", "README.md", "pyproject.toml"}


def test_importing_an_uncompiled_source_folder_says_what_to_do(tmp_path):
    """A checkout's episode/ found before the installed package (python run
    from the checkout) has no compiled core: the import says so and what to
    do, not `No module named 'episode._column'`."""
    import shutil
    import subprocess

    source = ROOT / "episode"
    if pathlib.Path(episode.__file__).resolve().parent == source.resolve():
        pytest.skip("an editable install: the checkout is the installed package")
    shutil.copytree(source, tmp_path / "episode",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    done = subprocess.run([sys.executable, "-c", "import episode"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode != 0
    assert "compiled core is not in" in done.stderr and "pip install -e ." in done.stderr
    assert "No module named 'episode._column'" not in done.stderr.splitlines()[-1]
