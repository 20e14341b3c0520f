"""The conda recipe's build and tests, run with pip in the current venv.

    python .ci/conda_recipe.py build
    python .ci/conda_recipe.py test WORKDIR

rattler-build needs the conda-forge channel, which CI's machines cannot
reach (only PyPI and Debian). So this runs what conda/recipe.yaml says with
the same packages from PyPI, in two phases (.ci/sanitize runs the build with
the sanitizers' compiler flags and the tests under their runtime, which pip
itself need not run under):
- build: installs the recipe's build and host requirements (the compiler is
  the system's), runs its build script in the source folder, and installs
  its run requirements and those of its tests;
- test: in WORKDIR, with the files the tests list copied there, the imports,
  `pip check` and each test script.
Any failure exits non-zero.
"""
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

root = Path(__file__).resolve().parents[1]
recipe = yaml.safe_load((root / "conda" / "recipe.yaml").read_text())

# conda-forge's names of packages PyPI names otherwise.
PIP_NAMES = {"msgpack-python": "msgpack"}


def pip_specs(requirements: list) -> list:
    # conda's "name >=x" as pip's "name>=x"; python and pip are the venv's,
    # and the compiler is the system's.
    specs = []
    for req in requirements:
        name = req.split()[0]
        if name in ("python", "pip") or "compiler(" in req:
            continue
        specs.append(PIP_NAMES.get(name, name) + req[len(name):].replace(" ", ""))
    return specs


def run(command: str, cwd: Path) -> None:
    command = command.replace("${{ PYTHON }}", shlex.quote(sys.executable))
    print(f"+ {command}  (in {cwd})", flush=True)
    subprocess.run(command, shell=True, cwd=cwd, check=True)


def pip_install(specs: list) -> None:
    if specs:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *specs], check=True)


def build() -> None:
    requirements = recipe["requirements"]
    pip_install(pip_specs(requirements["build"] + requirements["host"]))
    run(recipe["build"]["script"], root)
    tests_need = [
        req for test in recipe["tests"] for req in test.get("requirements", {}).get("run", [])
    ]
    pip_install(pip_specs(requirements["run"] + tests_need))
    print("conda recipe: built", flush=True)


def test(workdir: Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    for test in recipe["tests"]:
        if "python" in test:
            for module in test["python"].get("imports", []):
                run(f"${{{{ PYTHON }}}} -c 'import {module}'", workdir)
            if test["python"].get("pip_check"):
                run("${{ PYTHON }} -m pip check", workdir)
        if "script" in test:
            for source in test.get("files", {}).get("source", []):
                target = workdir / source
                if (root / source).is_dir():
                    shutil.copytree(root / source, target, dirs_exist_ok=True)
                else:
                    shutil.copy2(root / source, target)
            for command in test["script"]:
                run(command, workdir)
    print("conda recipe: tests passed", flush=True)


if len(sys.argv) == 2 and sys.argv[1] == "build":
    build()
elif len(sys.argv) == 3 and sys.argv[1] == "test":
    test(Path(sys.argv[2]))
else:
    sys.exit(__doc__)
