"""Reading a dataset runs no code from it: wherever a format holds pickled
bytes (RLlib's packed cells, msgpack-numpy's object arrays) a code-running
pickle is refused with a clear error and never runs, and our own format's
values (msgpack) build data only."""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
msgpack = pytest.importorskip("msgpack")
pytest.importorskip("lz4")

from episode import SingleAgentEpisode  # noqa: E402
from episode.offline import read_episodes, write_episodes  # noqa: E402
from episode.offline import rllib_format as F  # noqa: E402


class _Planted:
    """A pickle that makes a folder when it is loaded."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _episode() -> SingleAgentEpisode:
    episode = SingleAgentEpisode(observations=[np.zeros(4, np.float32)])
    for t in range(5):
        episode.add_env_step(np.full(4, t + 1, np.float32), t % 2, 1.0)
    episode.to_numpy()
    return episode


def _read_all(folder) -> None:
    dataset = read_episodes(folder)
    for episode in dataset:
        episode.get_observations()


def test_a_planted_pickle_in_a_packed_row_cell_never_runs(tmp_path):
    marker = str(tmp_path / "ran")
    table = F.episode_rows([_episode()])
    cells = table.column("obs").to_pylist()
    cells[2] = F.pack_value(np.array([_Planted(marker)], dtype=object))
    table = table.set_column(table.schema.get_field_index("obs"), "obs", pa.array(cells))
    (tmp_path / "rows").mkdir()
    pq.write_table(table, tmp_path / "rows" / "part-0.parquet")
    with pytest.raises(ValueError, match="names posix.mkdir|only numpy"):
        _read_all(tmp_path / "rows")
    assert not os.path.exists(marker)


def _planted_episode_blob(marker: str) -> bytes:
    # A packed episode (RLlib's episode format) whose observations are a
    # msgpack-numpy object array: its data a pickle of the planted object.
    state = msgpack.unpackb(F.pack_episode(_episode()), raw=False, strict_map_key=False)

    def plant(node):
        if isinstance(node, dict):
            if node.get(b"nd") is True:
                node.update({b"type": "|O", b"kind": b"O", b"shape": [1],
                             b"data": pickle.dumps(np.array([_Planted(marker)], dtype=object))})
                return True
            return any(plant(v) for v in node.values())
        if isinstance(node, list):
            return any(plant(v) for v in node)
        return False

    assert plant(state["observations"])
    return msgpack.packb(state, use_bin_type=True)


def test_a_planted_pickle_in_a_recorded_episode_never_runs(tmp_path):
    marker = str(tmp_path / "ran")
    blob = _planted_episode_blob(marker)
    with pytest.raises(ValueError, match="posix.mkdir|only numpy"):
        F.unpack_episode(blob)
    (tmp_path / "episodes").mkdir()
    pq.write_table(pa.table({"item": pa.array([blob], pa.binary())}),
                   tmp_path / "episodes" / "part-0.parquet")
    with pytest.raises(ValueError):
        _read_all(tmp_path / "episodes")
    assert not os.path.exists(marker)


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_a_pickle_in_our_formats_infos_is_not_unpickled(tmp_path, fmt):
    marker = str(tmp_path / "ran")
    episode = _episode()
    episode.infos[1] = {"x": 1}
    write_episodes([episode], tmp_path / "d", format=fmt)
    step_file = next(p for p in (tmp_path / "d").iterdir() if ".steps-" in p.name)
    table = pq.read_table(step_file) if fmt == "parquet" else \
        pa.ipc.open_file(pa.memory_map(str(step_file))).read_all()
    infos = table.column("infos").to_pylist()
    k = next(i for i, v in enumerate(infos) if v is not None)
    infos[k] = pickle.dumps({"x": _Planted(marker)})
    table = table.set_column(table.schema.get_field_index("infos"), table.schema.field("infos"),
                             pa.array(infos, table.schema.field("infos").type))
    if fmt == "parquet":
        pq.write_table(table, step_file)
    else:
        with pa.ipc.new_file(str(step_file), table.schema) as writer:
            writer.write_table(table)
    # (The replaced file fails its checksum; unchecked, its infos are
    # decoded as data and refused.)
    with pytest.raises(ValueError, match="damaged"):
        read_episodes(tmp_path / "d").check()
    with pytest.raises(ValueError, match="not a stored value"):
        for episode in read_episodes(tmp_path / "d", verify=False):
            episode.get_infos()
    assert not os.path.exists(marker)
