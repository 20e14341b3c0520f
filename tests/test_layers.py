"""The package's layers import downward only.

The Python modules are checked by import-linter against the contracts in
pyproject.toml ([tool.importlinter]); the compiled core (pyx/episode/*.pyx),
which import-linter cannot read, by its import lines here: it may import its
own compiled modules and the base modules below it, nothing else of the
package (the facade registers itself into the core instead)."""
from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYX = os.path.join(ROOT, "pyx", "episode")

# Python modules below the compiled core: they import nothing of the package
# (import-linter's first contract keeps them at the bottom).
BASE = {"episode.spaces", "episode.typing", "episode.values"}

_IMPORT = re.compile(r"^\s*(?:from\s+(episode(?:\.\w+)*)\s+(c?import)\s+([\w, ()]+)"
                     r"|import\s+(episode(?:\.\w+)*))", re.M)


def core_imports(text: str) -> set:
    """The package's modules a .pyx file imports at run time (cimports,
    which are compile-time declarations of compiled modules, left out)."""
    out = set()
    for package, kind, names, plain in _IMPORT.findall(text):
        if plain:
            out.add(plain)
        elif kind == "import":
            if package == "episode":     # from episode import _frames
                out.update(f"episode.{n.strip()}" for n in names.strip("()").split(","))
            else:
                out.add(package)
    return out


def test_the_python_layers_keep_their_contracts():
    pytest.importorskip("importlinter")
    from importlinter.cli import lint_imports

    assert lint_imports(config_filename=os.path.join(ROOT, "pyproject.toml"),
                        no_cache=True, no_logo=True) == 0


def test_the_compiled_core_imports_only_itself_and_the_base():
    if not os.path.isdir(PYX):
        pytest.skip("no pyx/ sources here (the tests of an installed package)")
    compiled = {f"episode.{name[:-4]}" for name in os.listdir(PYX) if name.endswith(".pyx")}
    found = {}
    for name in sorted(os.listdir(PYX)):
        if name.endswith(".pyx"):
            with open(os.path.join(PYX, name)) as f:
                found[name] = core_imports(f.read())
    assert found["_replay.pyx"] >= {"episode._frames", "episode.spaces"}    # the reader reads
    upward = {name: sorted(mods - compiled - BASE) for name, mods in found.items()
              if mods - compiled - BASE}
    assert upward == {}


def test_the_import_reader_sees_every_form():
    text = ("from episode.spaces import a, b\nfrom episode._column cimport Column\n"
            "    from episode.lookback_buffer import X\nimport episode.rllib\n"
            "from episode import _frames, views\n")
    assert core_imports(text) == {"episode.spaces", "episode.lookback_buffer", "episode.rllib",
                                  "episode._frames", "episode.views"}


def test_the_core_takes_only_subclasses_of_its_classes_as_the_facade_s():
    from episode._episode import _register_facade_class
    from episode.lookback_buffer import InfiniteLookbackBuffer

    for bad in (int, object(), "InfiniteLookbackBuffer"):
        with pytest.raises(TypeError, match="BufferCore or EpisodeCore"):
            _register_facade_class(bad)
    # Registering the facade's class again keeps it.
    _register_facade_class(InfiniteLookbackBuffer)
    from episode import SingleAgentEpisode

    episode = SingleAgentEpisode(observations=[0, 1], actions=[0], rewards=[1.0])
    assert type(episode.observations) is InfiniteLookbackBuffer
