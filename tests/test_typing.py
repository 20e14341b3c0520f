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
            "episode._multi", "episode._vector", "episode._priority", "episode._replay",
            "episode._dataset", "episode._frames", "episode._keep", "episode._collect",
            "episode._pages", "episode._keys", "episode._draws", "episode._runs",
            "episode._blocks", "episode._gather", "episode._picks"]

# Expressions appended to tests/typing_sample.py in assert_type() calls, with
# the type mypy must infer for each (as the sample's own names spell it).
EXPECTED = {
    "episode.cut()": "SingleAgentEpisode",
    "episode.slice(slice(0, 1))": "SingleAgentEpisode",
    "episode[1:3]": "SingleAgentEpisode",
    "SingleAgentEpisode.from_state(episode_state)": "SingleAgentEpisode",
    "len(episode)": "int",
    "episode.get_return()": "float",
    "episode.is_done": "bool",
    "episode.t": "int",
    "episode.rewards": "InfiniteLookbackBuffer",
    "SingleAgentEpisode().observation_space": "gym.Space[Any] | None",
    "InfiniteLookbackBuffer.from_state(state)": "InfiniteLookbackBuffer",
    "buf + [1.0]": "InfiniteLookbackBuffer",
    "buf.sub_buffer(slice(0, 1), False, 0, None)": "InfiniteLookbackBuffer",
    "buf.len_incl_lookback()": "int",
    "buf.finalized": "bool",
    # The getters: an int index gives an item, the other indices a batch.
    "buf.get(-1)": "Item",
    "buf.get(np.int64(0))": "Item",
    "buf.get([0, 1])": "Batch",
    "buf.get(slice(None))": "Batch",
    "buf.get()": "Batch",
    "buf[0]": "Item",
    "buf[0:1]": "Batch",
    "episode.get_observations(-1)": "Item",
    "episode.get_actions(slice(-2, None), fill=0)": "Batch",
    "episode.get_extra_model_outputs('logp', 0)": "Item",
    "episode.get_extra_model_outputs('logp')": "Batch",
    "ma.get_rewards(-1)": "dict[AgentID, Item]",
    "ma.get_rewards(slice(-2, None), env_steps=False)": "dict[AgentID, Batch]",
    "ma.get_rewards(-1, return_list=True)": "list[dict[AgentID, Item]]",
    "ma.get_extra_model_outputs('logp', -1)": "dict[AgentID, Item]",
    "ma.get_extra_model_outputs(indices=-1)": "dict[AgentID, Item]",
    "ma.get_extra_model_outputs()": "dict[AgentID, Batch]",
    "ma.agent_episodes": "dict[AgentID, SingleAgentEpisode]",
    # Samplers and batches.
    "sampler.sample()": "TrainingBatch",
    "sampler.sample_episodes()": "list[SingleAgentEpisode | MultiAgentEpisode]",
    "sampler.batch_mode": "Literal['truncate_episodes', 'complete_episodes']",
    "sampler.count_steps_by": "Literal['env_steps', 'agent_steps']",
    "collector.build_for_training(views)": "TrainingBatch",
    "build_training_batch([clone], views)": "TrainingBatch",
    "vec.cut()": "list[SingleAgentEpisode]",
    "vec.take_ended()": "tuple[list[SingleAgentEpisode], list[int]]",
}

# The public classes: each public name of theirs appears in the sample.
PUBLIC = {
    "episode": ["InfiniteLookbackBuffer", "SingleAgentEpisode", "MultiAgentEpisode",
                "VectorEpisodes", "Sampler", "ViewRequirement", "AgentCollector"],
    "episode.distributed": ["DistributedSampler"],
    "episode.offline": ["EpisodeWriter", "EpisodeDataset"],
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


def _revealing_calls(source: str) -> str:
    """The sample with every call whose value is used wrapped in
    reveal_type(), except calls of modules' functions (pickle.loads gives
    Any by design) and of builtins."""
    import ast
    import builtins

    tree = ast.parse(source)
    modules = {alias.asname or alias.name.split(".")[0]
               for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names}
    statements = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}

    def root(node):
        while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
            node = node.func if isinstance(node, ast.Call) else node.value
        return node.id if isinstance(node, ast.Name) else None

    class Reveal(ast.NodeTransformer):
        def visit_Call(self, node):
            self.generic_visit(node)
            name = root(node.func)
            if id(node) in statements or name in modules or (
                    isinstance(node.func, ast.Name) and hasattr(builtins, node.func.id)):
                return node
            wrapped = ast.Call(ast.Name("reveal_type", ast.Load()), [node], [])
            return ast.copy_location(wrapped, node)

    return ast.unparse(ast.fix_missing_locations(Reveal().visit(tree)))


def _mypy(tmp_path, text: str) -> tuple:
    """mypy --strict on `text` (as sample.py): its output, and the revealed
    types by line."""
    script = tmp_path / "sample.py"
    script.write_text(text)
    result = run(["mypy", "--python-executable", sys.executable, "--strict",
                  "--follow-imports=silent", "--cache-dir", str(tmp_path / "cache"),
                  "--show-error-codes", "--no-error-summary", script.name], tmp_path)
    out = result.stdout + result.stderr
    revealed = {}
    for m in re.finditer(r"sample\.py:(\d+): note: Revealed type is \"(.*)\"", out):
        revealed.setdefault(int(m.group(1)), []).append(m.group(2).replace("builtins.", ""))
    return result, out, revealed


def test_mypy_strict_types_every_public_call(tmp_path):
    """The sample passes mypy --strict; each expression of EXPECTED has the
    type given there; and no call whose value the sample uses gives Any (its
    type is revealed)."""
    lines = _revealing_calls((HERE / "typing_sample.py").read_text()).splitlines()
    lines.append("from typing import Literal")
    lines.append("from typing_extensions import assert_type")
    lines += [f"assert_type({expr}, {expected})" for expr, expected in EXPECTED.items()]
    result, out, revealed = _mypy(tmp_path, "\n".join(lines) + "\n")
    assert " error: " not in out, out
    assert result.returncode == 0, out
    leaks = [f"line {n}: {lines[n - 1].strip()} -> {t}" for n, types in revealed.items()
             for t in types if t == "Any" or re.search(r"(^|\| )Any( \||$)", t)]
    assert sum(map(len, revealed.values())) > 80 and not leaks, "\n".join(leaks)


def test_the_sample_uses_every_public_name():
    import ast
    import importlib

    used = {node.attr for node in ast.walk(ast.parse((HERE / "typing_sample.py").read_text()))
            if isinstance(node, ast.Attribute)}
    missing = {}
    for module, classes in PUBLIC.items():
        try:
            imported = importlib.import_module(module)
        except ImportError:
            continue       # (episode.distributed without ray)
        for name in classes:
            public = {n for n in dir(getattr(imported, name)) if not n.startswith("_")}
            if public - used:
                missing[name] = sorted(public - used)
    assert not missing


def test_stubs_match_the_compiled_modules(tmp_path):
    """Every public name of the compiled modules is in its stub, with the
    runtime's signature (Cython's own additions are listed in the allowlist)."""
    result = run(["mypy.stubtest", "--allowlist", str(HERE / "stubtest-allowlist.txt"),
                  *COMPILED], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
