"""Checks an sdist's file list: everything the build needs, nothing else.

    python .ci/check_sdist.py dist/episode-X.tar.gz

Needed: pyproject.toml, CMakeLists.txt, README.md (the package's readme),
PKG-INFO, every pyx/episode/*.pyx and *.pxd and every file of the episode/
package that git tracks. Anything else (tests, benchmarks, CI scripts,
build output) fails the check.
"""
import subprocess
import sys
import tarfile
from pathlib import Path

root = Path(__file__).resolve().parents[1]
tracked = subprocess.run(["git", "ls-files", "pyx", "episode"], cwd=root, check=True,
                         capture_output=True, text=True).stdout.split()
needed = {"pyproject.toml", "CMakeLists.txt", "README.md", "PKG-INFO", *tracked}

with tarfile.open(sys.argv[1]) as sdist:
    names = {name.split("/", 1)[1] for name in sdist.getnames()
             if "/" in name and not sdist.getmember(name).isdir()}
missing, extra = sorted(needed - names), sorted(names - needed)
print(f"sdist: {len(names)} files")
if missing or extra:
    sys.exit(f"sdist file list is off: missing {missing}, extra {extra}")
