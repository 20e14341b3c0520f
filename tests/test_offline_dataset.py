"""episode.offline's native format: episodes written and read back exactly.

Random episodes of every item kind (numbers of each type, arrays, images,
strings, Dict/Tuple items with and without spaces, objects), list-mode and
numpy'd, with lookbacks, extra model outputs, infos, custom data and done
flags go through EpisodeWriter and read_episodes in both file formats and
come back observably the same (difftools.compare_episodes: every getter,
every buffer state, item types included), ids, spaces and times too. Chunks
of one episode written apart read back as one.
"""
from __future__ import annotations

import copy
import os

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyarrow")
pytest.importorskip("msgpack")

from difftools import compare, compare_episodes  # noqa: E402
from strategies import ITEMS, LEAVES, SPACE_LEAVES, item_of, space_of, structures  # noqa: E402

from episode import SingleAgentEpisode  # noqa: E402
from episode.offline import (DatasetError, EpisodeDataset, EpisodeWriter,  # noqa: E402
                             read_episodes, write_episodes)

FORMATS = ("parquet", "arrow", "arrow_uncompressed")


def writer_options(format: str) -> dict:
    """The writer's keywords for a FORMATS entry (Arrow: lz4, the default;
    uncompressed: memory-mapped when read)."""
    if format == "arrow_uncompressed":
        return {"format": "arrow", "compression": None}
    return {"format": format}
SETTINGS = settings(max_examples=int(os.environ.get("PROPS_MAX_EXAMPLES", 40)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])

# Item kinds with their space (None: no space).
KINDS = {
    "box4": (gym.spaces.Box(-10, 10, (4,), np.float32), ITEMS["box4"]),
    "box23": (None, ITEMS["box23"]),
    "discrete_int": (gym.spaces.Discrete(5), ITEMS["discrete_int"]),
    "discrete_np": (None, ITEMS["discrete_np"]),
    "multidiscrete": (gym.spaces.MultiDiscrete([2, 3, 4]), ITEMS["multidiscrete"]),
    "dict": (gym.spaces.Dict({"a": gym.spaces.Box(-10, 10, (2,), np.float32),
                              "b": gym.spaces.Discrete(3)}), ITEMS["dict"]),
    "nested": (None, ITEMS["nested"]),
    "string": (None, st.text(alphabet="abc", min_size=1, max_size=3)),
    "image_u8": (None, ITEMS["image_u8"]),
    "mixed_scalar": (None, ITEMS["mixed_scalar"]),
    "ragged": (None, st.integers(0, 3).map(lambda n: np.arange(n, dtype=np.float64))),
    "int_nospace": (None, ITEMS["int_nospace"]),
}
REWARDS = st.one_of(st.floats(-10, 10), st.integers(-3, 3).map(float),
                    st.floats(allow_nan=True, allow_infinity=True))
INFOS = st.one_of(st.none(), st.just({}), st.builds(lambda v: {"v": v, "t": (v, "x")},
                                                     st.integers(-5, 5)))


@st.composite
def kinds(draw, label):
    name = draw(st.sampled_from(sorted(KINDS) + ["struct"]), label=label)
    if name != "struct":
        return KINDS[name]
    structure = draw(structures(list(LEAVES) + list(SPACE_LEAVES)), label=f"{label} struct")
    with_space = draw(st.booleans()) and all(leaf in SPACE_LEAVES for leaf in _leaves(structure))
    return (space_of(structure) if with_space else None), item_of(structure)


def _leaves(structure):
    if isinstance(structure, dict):
        return [x for v in structure.values() for x in _leaves(v)]
    if isinstance(structure, tuple):
        return [x for v in structure for x in _leaves(v)]
    return [structure]


@st.composite
def episodes(draw):
    """A SingleAgentEpisode built by add_env_reset/add_env_step, then maybe
    numpy'd and cut to a chunk with lookback."""
    obs_space, obs = draw(kinds("obs"))
    act_space, act = draw(kinds("actions"))
    steps = draw(st.integers(0, 6), label="steps")
    extras = draw(st.sampled_from([(), ("action_logp",), ("action_logp", "state_out")]))
    episode = SingleAgentEpisode(observation_space=obs_space, action_space=act_space)
    if draw(st.booleans(), label="reset") or steps:
        episode.add_env_reset(draw(obs), draw(INFOS))
        for t in range(steps):
            done = t == steps - 1 and draw(st.sampled_from(["", "", "terminated", "truncated"]))
            outputs = {"action_logp": np.float32(-t), "state_out": np.full(2, t, np.float32)}
            episode.add_env_step(draw(obs), draw(act), draw(REWARDS), draw(INFOS),
                                 terminated=done == "terminated", truncated=done == "truncated",
                                 extra_model_outputs={k: outputs[k] for k in extras} or None)
    if draw(st.booleans(), label="custom data"):
        episode.custom_data["note"] = draw(st.integers(0, 9))
    if draw(st.booleans(), label="to_numpy"):
        try:
            episode.to_numpy()
        except ValueError:
            pass          # items that do not stack (ragged under a struct): list mode then
    if len(episode) > 1 and draw(st.booleans(), label="cut"):
        at = draw(st.integers(1, len(episode) - 1))
        lookback = draw(st.integers(0, at))
        episode = episode.slice(slice(at, None), len_lookback_buffer=lookback)
    return episode


def assert_same(read, written):
    compare_episodes(read, written)
    assert read.id_ == written.id_
    assert read.t_started == written.t_started and read.t == written.t
    assert read._start_time == written._start_time
    assert read._last_step_time == written._last_step_time
    for name in ("observation_space", "action_space"):
        assert getattr(read, name) == getattr(written, name)
    compare(read.get_state(), written.get_state(), "get_state()")


@pytest.mark.parametrize("format", FORMATS)
@SETTINGS
@given(batch=st.lists(episodes(), min_size=1, max_size=4))
def test_episodes_round_trip_exactly(tmp_path_factory, format, batch):
    path = tmp_path_factory.mktemp("ds")
    write_episodes(batch, path, **writer_options(format))
    ds = read_episodes(path)
    assert isinstance(ds, EpisodeDataset)
    assert len(ds) == len(batch)
    assert ds.num_steps == sum(len(e) for e in batch)
    for i, (read, written) in enumerate(zip(ds, batch)):
        assert_same(read, written)
        assert_same(ds[i], written)      # iteration and indexing build alike


@pytest.mark.parametrize("format", FORMATS)
@SETTINGS
@given(episode=episodes(), cuts=st.lists(st.integers(1, 3), min_size=1, max_size=3),
       lookback=st.integers(0, 2))
def test_chunks_written_apart_read_back_as_one_episode(tmp_path_factory, format, episode, cuts,
                                                       lookback):
    if episode.is_numpy or len(episode) == 0 or episode.t_started:
        return
    chunks = [episode]
    for n in cuts:
        if len(chunks[-1]) <= n:
            break
        whole = chunks.pop()
        chunks.append(whole.slice(slice(0, n)))
        chunks.append(whole.slice(slice(n, None), len_lookback_buffer=min(lookback, n)))
    if len(chunks) < 2:
        return
    expected = chunks[0].slice(slice(0, None), len_lookback_buffer=chunks[0].observations.lookback)
    for chunk in chunks[1:]:
        expected.concat_episode(chunk)
    path = tmp_path_factory.mktemp("ds")
    for chunk in reversed(chunks):         # written in any order, each its own part
        write_episodes([chunk], path, **writer_options(format))
    ds = read_episodes(path)
    assert len(ds) == 1
    compare_episodes(ds[0], expected)


@pytest.mark.parametrize("format", FORMATS)
def test_list_mode_and_numpyd_chunks_join_in_the_first_chunks_mode(tmp_path, format):
    """A CartPole episode cut every 5 steps, its chunks alternately left in
    list mode (the first) and numpy'd: read back, it is the episode stepped
    whole in list mode (Python floats and ints, as its numpy'd chunks held
    before to_numpy()), and a replay buffer takes it (sample_batch raised
    TypeError: its rewards were a mix of floats and numpy floats, objects)."""
    env = gym.make("CartPole-v1")
    whole = SingleAgentEpisode(observation_space=env.observation_space,
                               action_space=env.action_space)
    whole.add_env_reset(*env.reset(seed=3))
    chunks, episode = [], copy.deepcopy(whole)
    for t in range(23):
        obs, reward, terminated, truncated, info = env.step(t % 2)
        for e in (whole, episode):
            e.add_env_step(obs, t % 2, reward, info, terminated=terminated,
                           truncated=truncated, extra_model_outputs={"logp": -0.5 * t})
        if terminated or truncated:
            break
        if len(episode) == 5:
            chunks.append(episode)
            episode = episode.cut()
    chunks.append(episode)
    assert len(chunks) >= 3
    for i, chunk in enumerate(chunks):
        if i % 2:
            chunk.to_numpy()
    write_episodes(chunks, tmp_path, **writer_options(format))
    ds = read_episodes(tmp_path)
    assert len(ds) == 1
    compare_episodes(ds[0], whole)
    assert {type(r) for r in ds[0].get_rewards()} == {float}
    batch = ds.sample_batch(4, n_step=1)
    assert batch["rewards"].dtype == np.float64 and batch["rewards"].shape == (4,)


def test_a_numpyd_episode_from_arrow_files_is_read_in_place(tmp_path):
    env = gym.make("CartPole-v1")
    episode = SingleAgentEpisode(observation_space=env.observation_space,
                                 action_space=env.action_space)
    episode.add_env_reset(*env.reset(seed=1))
    for _ in range(5):
        obs, reward, terminated, truncated, info = env.step(0)
        episode.add_env_step(obs, 0, reward, info, terminated=terminated, truncated=truncated)
    episode.to_numpy()
    write_episodes([episode], tmp_path, format="arrow")
    read = read_episodes(tmp_path)[0]
    obs = read.get_observations()
    assert not obs.flags.writeable and not obs.flags.owndata   # a view of the mapped file
    # The first write copies it out; the file stays as it was.
    read.set_observations(new_data=np.zeros(4, np.float32), at_indices=0)
    assert read.get_observations(0).tolist() == [0.0] * 4
    assert read_episodes(tmp_path)[0].get_observations(0).tolist() == \
        episode.get_observations(0).tolist()
    # A list-mode read gets storage of its own and grows in place.
    episode2 = read_episodes(tmp_path)[0]
    episode2.add_env_step(np.zeros(4, np.float32), 1, 1.0) if not episode2.is_done else None


def test_reading_a_dataset_imports_neither_pandas_nor_pyarrow_compute(tmp_path):
    """pyarrow's to_numpy() and flatten() import pandas and pyarrow.compute
    (0.2 s on a process's first read); the reader takes the buffers."""
    pytest.importorskip("pandas")
    import subprocess
    import sys

    write_episodes(_cartpole(0), tmp_path / "lz4")
    write_episodes(_cartpole(1), tmp_path / "parquet", format="parquet")
    code = (
        "import sys\n"
        "from episode.offline import read_episodes\n"
        "for name in ('lz4', 'parquet'):\n"
        "    ds = read_episodes(sys.argv[1] + '/' + name)\n"
        "    [e.get_observations() for e in ds]\n"
        "    ds.sample_batch(4, n_step=1)\n"
        "print(sorted(m for m in ('pandas', 'pyarrow.compute') if m in sys.modules))\n")
    # (Run outside the checkout: from its root, `python -c` would find the
    # source folder before the installed package.)
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


@pytest.mark.parametrize("dtype", [np.bool_, np.int64, np.float32])
def test_arrow_numbers_are_read_from_their_buffers_at_their_offset(dtype):
    import pyarrow as pa

    from episode.offline import format as fmt

    values = (np.arange(21) % 3).astype(dtype)
    array = pa.array(values).slice(5, 11)
    got = fmt.array_numbers(array, np.dtype(dtype), "here")
    assert got.dtype == dtype and got.tolist() == values[5:16].tolist()
    assert not got.flags.writeable

    class Short:            # a column whose data buffer is shorter than its length
        type, offset = array.type, 0

        def __len__(self):
            return 40

        def buffers(self):
            return array.buffers()

    with pytest.raises(DatasetError, match="here: a column of 40"):
        fmt.array_numbers(Short(), np.dtype(dtype), "here")


@pytest.mark.parametrize("format", FORMATS)
def test_image_rows_are_stored_as_one_binary_value_each(tmp_path, format):
    """Rows of 256 bytes or more (images) are a fixed-size binary column:
    Parquet stores a tensor column's every number as a nested value, tens
    of times slower for an 84x84 frame; small rows stay tensor columns.
    Both read back exactly, an Arrow file's in place."""
    import pyarrow as pa

    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (7, 84, 84), np.uint8)
    episode = SingleAgentEpisode(observations=[frames[0]])
    for t in range(6):
        episode.add_env_step(frames[t + 1], t % 6, 1.0,
                             extra_model_outputs={"h": np.full(3, t, np.float32)})
    episode.to_numpy()
    write_episodes([episode], tmp_path, **writer_options(format))
    step_file = next(p for p in tmp_path.iterdir() if ".steps-" in p.name)
    schema = dataset_schema(step_file, format)
    assert schema.field("obs").type == pa.binary(84 * 84)
    assert str(schema.field("h").type).startswith("extension<arrow.fixed_shape_tensor")
    read = read_episodes(tmp_path)[0]
    assert np.array_equal(read.get_observations(), frames)
    assert read.get_observations().dtype == np.uint8
    assert np.array_equal(read.get_extra_model_outputs("h"), episode.get_extra_model_outputs("h"))
    if format == "arrow_uncompressed":
        assert not read.get_observations().flags.owndata     # (a view of the mapped file)


def dataset_schema(path, format):
    import pyarrow as pa
    import pyarrow.parquet as pq

    if format == "parquet":
        return pq.read_schema(path)
    return pa.ipc.open_file(pa.memory_map(str(path))).schema


def test_writer_parts_and_files(tmp_path):
    batch = [_cartpole(seed) for seed in range(6)]
    with EpisodeWriter(tmp_path, rows_per_file=40) as writer:
        writer.write(batch[:3])
        writer.write(batch[3])
        writer.write(batch[4:])
    names = sorted(os.listdir(tmp_path))
    tables = [n for n in names if n.endswith(".episodes.arrow")]
    assert len(tables) >= 2 and not [n for n in names if n.startswith(".")]
    ds = read_episodes(tmp_path)
    assert [e.id_ for e in ds] == [e.id_ for e in batch]
    with pytest.raises(ValueError):
        writer.write(batch)        # closed


def test_writer_parts_by_bytes(tmp_path):
    # Image rows fill a part by bytes long before rows_per_file rows: the
    # part a reader decodes stays bounded.
    frames = np.arange(30 * 7056, dtype=np.int64).astype(np.uint8).reshape(30, 84, 84)
    episodes = []
    for k in range(3):
        episode = SingleAgentEpisode(observations=[frames[0]])
        for t in range(1, 10):
            episode.add_env_step(frames[t + k], 1, 1.0, terminated=t == 9)
        episodes.append(episode.to_numpy())
    with EpisodeWriter(tmp_path, bytes_per_file=10 * 7056, seconds_per_file=None) as writer:
        writer.write(episodes)
        # Each episode is 10 rows of a frame: bytes_per_file, so a part each.
        assert len([f for f in writer.files if ".episodes." in f]) == 3
    ds = read_episodes(tmp_path)
    for read, episode in zip(ds, episodes):
        np.testing.assert_array_equal(read.get_observations(), episode.get_observations())
    with EpisodeWriter(tmp_path / "big", seconds_per_file=None) as writer:
        writer.write(episodes)
        assert writer.files == []                      # 1 MB waits (256 MiB by default)
    for bad in (0, -5, 1.5, True, "1"):
        with pytest.raises(ValueError, match="bytes_per_file"):
            EpisodeWriter(tmp_path / "bad", bytes_per_file=bad)


def test_parts_by_bytes_fill_one_block_made_once(tmp_path, monkeypatch):
    """The episode that takes a part past bytes_per_file fits in the room
    made for the part, and a later part reuses that room: every part's
    frames are copied into one block (a block grown part-way through a part
    would be copied whole, into memory the kernel has to zero). Parts are
    written in the background while the next fills, so two sets of blocks
    take turns: the third part's is the first's."""
    from episode.offline import writer as writer_module

    frames = np.arange(40 * 7056, dtype=np.int64).astype(np.uint8).reshape(40, 84, 84)
    episodes = []
    # Rows of 7,072 bytes (a frame, an action, a reward), 30 to a part. Each
    # part starts with a short episode (the room first made: the part's 30
    # rows and its 3), a longer one takes it past 30 rows, and the second
    # starts with a longer one than the first did.
    for length in (2, 3, 12, 12, 5, 12, 12, 3, 12):
        episode = SingleAgentEpisode(observations=[frames[0]])
        for t in range(1, length + 1):
            episode.add_env_step(frames[t], 1, 1.0, terminated=t == length)
        episodes.append(episode.to_numpy())
    blocks = []
    step_table = writer_module._step_table

    def recorded(group):
        blocks.append(group.leaves[0].array().__array_interface__["data"][0])
        return step_table(group)

    monkeypatch.setattr(writer_module, "_step_table", recorded)
    write_episodes(episodes, tmp_path, bytes_per_file=30 * 7072, seconds_per_file=None)
    assert len(blocks) == 3 and blocks[2] == blocks[0] != blocks[1]
    for read, episode in zip(read_episodes(tmp_path), episodes, strict=True):
        compare_episodes(read, episode)


def test_reader_holds_files_within_its_budget(tmp_path, monkeypatch):
    # A pass over a dataset of large step files keeps one decoded file at a
    # time (before the next opens, those open hold at most OPEN_BYTES / 2).
    from episode.offline import dataset as dataset_module

    frames = np.arange(20 * 7056, dtype=np.int64).astype(np.uint8).reshape(20, 84, 84)
    episodes = []
    for k in range(6):
        episode = SingleAgentEpisode(observations=[frames[k]])
        for t in range(1, 10):
            episode.add_env_step(frames[t + k], 1, 1.0, terminated=t == 9)
        episodes.append(episode.to_numpy())
    write_episodes(episodes, tmp_path, bytes_per_file=10 * 7056, seconds_per_file=None)
    monkeypatch.setattr(dataset_module, "OPEN_BYTES", 2 * 10 * 7056)
    ds = read_episodes(tmp_path)
    held = []
    for read, episode in zip(ds, episodes):
        held.append(len(ds._files))
        np.testing.assert_array_equal(read.get_observations(), episode.get_observations())
    assert held == [1] * 6
    monkeypatch.setattr(dataset_module, "OPEN_BYTES", 1 << 40)
    ds = read_episodes(tmp_path)
    assert [len(ds._files) for _ in ds] == [1, 2, 3, 4, 4, 4]      # OPEN_FILES


@pytest.mark.parametrize("format", ["arrow", "parquet"])
def test_a_pass_hands_back_freed_blocks_of_parquet_files_only(tmp_path, monkeypatch, format):
    """Closing step files to make room hands Arrow's freed blocks back to
    the system after Parquet files (blocks of their pages' sizes, which
    would add to the peak), not after Arrow files (blocks the next file
    inflates into, reused)."""
    from episode.offline import dataset as dataset_module

    pa = dataset_module._pyarrow()
    released = []

    class Pool:
        def release_unused(self):
            released.append(True)

    class Recorded:
        def __getattr__(self, name):
            return getattr(pa, name)

        def default_memory_pool(self):
            return Pool()

    episodes = _frame_parts(tmp_path, format=format)
    monkeypatch.setattr(dataset_module, "OPEN_BYTES", 2 * 20 * 7056)
    monkeypatch.setattr(dataset_module, "_pyarrow", Recorded)
    ds = read_episodes(tmp_path)
    for read, episode in zip(ds, episodes, strict=True):
        compare_episodes(read, episode)
    assert len(ds._files) == 1
    assert len(released) == (3 if format == "parquet" else 0)


def _frame_episodes(n, length=9):
    # n episodes of `length` steps of 84x84 frames (frame k + t at step t).
    frames = np.arange((n + length) * 7056, dtype=np.int64).astype(np.uint8)
    frames = frames.reshape(-1, 84, 84)
    episodes = []
    for k in range(n):
        episode = SingleAgentEpisode(observations=[frames[k]])
        for t in range(1, length + 1):
            episode.add_env_step(frames[t + k], t % 3, 1.0, terminated=t == length)
        episodes.append(episode.to_numpy())
    return episodes


def _frame_parts(tmp_path, parts=4, format="arrow"):
    # `parts` parts of two 10-step episodes of 84x84 frames each.
    episodes = _frame_episodes(2 * parts)
    write_episodes(episodes, tmp_path, bytes_per_file=20 * 7056, seconds_per_file=None,
                   format=format)
    return episodes


@pytest.mark.parametrize("verify", [True, False])
def test_a_pass_opens_the_next_step_file_ahead(tmp_path, monkeypatch, verify):
    """A pass over the episodes opens the step file it goes on to next on a
    thread of its own (inflated on another core while the file before it
    is read) and takes it from there: the same episodes, in order, within
    the files' budget."""
    import threading

    from episode.offline import dataset as dataset_module

    episodes = _frame_parts(tmp_path)
    monkeypatch.setattr(dataset_module, "AHEAD_BYTES", 0)      # (small files here)
    opened = []
    open_step_file = dataset_module._open_step_file

    def recorded(path, *args, **kwargs):
        opened.append((os.path.basename(path).split(".")[1][-1],
                       threading.current_thread() is threading.main_thread()))
        return open_step_file(path, *args, **kwargs)

    monkeypatch.setattr(dataset_module, "_open_step_file", recorded)
    ds = read_episodes(tmp_path, verify=verify)
    held = []
    for read, episode in zip(ds, episodes, strict=True):
        compare_episodes(read, episode)
        held.append(len(ds._files))
    # The first file in this thread, the others ahead, each once.
    assert sorted(opened) == [("0", True), ("1", False), ("2", False), ("3", False)]
    assert max(held) <= dataset_module.OPEN_FILES and not ds._ahead


def test_a_damaged_file_opened_ahead_raises_where_the_pass_reaches_it(tmp_path, monkeypatch):
    """The error met by a step file opened ahead (damage) is raised when the
    pass reaches that file, as without opening ahead: the episodes before
    it come first, and the error names the file."""
    from episode.offline import dataset as dataset_module

    episodes = _frame_parts(tmp_path)
    monkeypatch.setattr(dataset_module, "AHEAD_BYTES", 0)
    damaged = sorted(p for p in tmp_path.iterdir() if ".steps-" in p.name)[2]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    read = []
    with pytest.raises(DatasetError, match=f"{damaged.name}: damaged"):
        for episode in read_episodes(tmp_path):
            read.append(episode)
    assert [e.id_ for e in read] == [e.id_ for e in episodes[:4]]


def test_episode_table_columns(tmp_path):
    import pyarrow.parquet as pq

    batch = [_cartpole(seed) for seed in range(3)]
    files = write_episodes(batch, tmp_path, format="parquet")
    table = pq.read_table([f for f in files if f.endswith(".episodes.parquet")][0])
    assert table.column("length").to_pylist() == [len(e) for e in batch]
    assert table.column("return").to_pylist() == [e.get_return() for e in batch]
    steps = pq.read_table([f for f in files if ".steps-" in f][0])
    assert steps.num_rows == sum(len(e) + 1 for e in batch)
    assert steps.column("terminateds").to_pylist().count(True) == sum(
        e.is_terminated for e in batch)
    assert steps.column("obs").type.extension_name == "arrow.fixed_shape_tensor"


def _cartpole(seed, steps=None):
    env = gym.make("CartPole-v1")
    episode = SingleAgentEpisode(observation_space=env.observation_space,
                                 action_space=env.action_space)
    episode.add_env_reset(*env.reset(seed=seed))
    rng = np.random.default_rng(seed)
    while not episode.is_done and (steps is None or len(episode) < steps):
        action = int(rng.integers(2))
        obs, reward, terminated, truncated, info = env.step(action)
        episode.add_env_step(obs, action, reward, info, terminated=terminated,
                             truncated=truncated)
    return episode


# -- bad input -------------------------------------------------------------------------


def test_bad_paths_and_foreign_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pytest.raises(FileNotFoundError):
        read_episodes(tmp_path / "missing")
    with pytest.raises(DatasetError, match="no dataset files"):
        read_episodes(tmp_path)
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "other.parquet")
    with pytest.raises(DatasetError, match="other.parquet"):
        read_episodes(tmp_path)


def test_a_newer_format_version_is_refused(tmp_path):
    import json

    import pyarrow.parquet as pq

    files = write_episodes([_cartpole(0)], tmp_path, format="parquet")
    table_file = [f for f in files if f.endswith(".episodes.parquet")][0]
    table = pq.read_table(table_file)
    meta = json.loads(table.schema.metadata[b"episode.format"])
    meta["version"] = 99
    pq.write_table(table.replace_schema_metadata({b"episode.format": json.dumps(meta)}),
                   table_file)
    with pytest.raises(DatasetError, match="version 99"):
        read_episodes(tmp_path)


def test_a_missing_step_file_or_column_is_named(tmp_path):
    import pyarrow.parquet as pq

    files = write_episodes([_cartpole(0)], tmp_path, format="parquet")
    steps = [f for f in files if ".steps-" in f][0]
    table = pq.read_table(steps)
    pq.write_table(table.drop_columns(["actions"]), steps)
    # A rewritten step file is not the one its episode table recorded ...
    with pytest.raises(DatasetError, match="steps-0.parquet: damaged"):
        read_episodes(tmp_path)[0]
    # ... and unchecked, its missing column is named.
    ds = read_episodes(tmp_path, verify=False)
    with pytest.raises(DatasetError, match="'actions'"):
        ds[0]
    os.remove(steps)
    with pytest.raises(DatasetError, match="missing"):
        read_episodes(tmp_path)


def _pendulum(seed, steps=20):
    env = gym.make("Pendulum-v1")
    episode = SingleAgentEpisode(observation_space=env.observation_space,
                                 action_space=env.action_space)
    episode.add_env_reset(*env.reset(seed=seed))
    for _ in range(steps):
        action = env.action_space.sample()
        obs, reward, terminated, truncated, info = env.step(action)
        episode.add_env_step(obs, action, reward, info)
    return episode


def test_what_is_not_a_dataset_is_named_with_what_to_pass(tmp_path):
    files = write_episodes([_cartpole(0)], tmp_path / "data")
    (steps,) = [f for f in files if ".steps-" in f]
    (table,) = [f for f in files if ".episodes." in f]
    with pytest.raises(DatasetError, match=f"^{steps}: a step file of an episode dataset.*"
                                           f"pass the dataset's folder"):
        read_episodes(steps)
    assert len(read_episodes(table)) == 1           # its episode table is fine
    os.remove(table)
    with pytest.raises(DatasetError, match="step files without their episode tables.*"
                                           "interrupted write"):
        read_episodes(tmp_path / "data")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DatasetError, match="notes.txt: not a dataset file"):
        read_episodes(tmp_path / "notes.txt")


@pytest.mark.parametrize("given", [5, "episodes", {"a": 1}, [_cartpole(0), 5], None])
def test_write_episodes_says_what_it_takes(tmp_path, given):
    with pytest.raises(TypeError, match=r"^write_episodes\(\) takes episodes \(.*\), not "):
        write_episodes(given, tmp_path / "data")
    assert not (tmp_path / "data").exists()
    with EpisodeWriter(tmp_path / "other") as writer:
        with pytest.raises(TypeError, match=r"^EpisodeWriter.write\(\) takes episodes"):
            writer.write(given)


@pytest.mark.parametrize("format", FORMATS)
def test_no_episodes_make_an_empty_dataset(tmp_path, format):
    files = write_episodes([], tmp_path, **writer_options(format))
    assert len(files) == 1 and files[0].endswith(f".episodes.{writer_options(format)['format']}")
    ds = read_episodes(tmp_path)
    assert (len(ds), ds.num_steps, list(ds), ds.num_chunks) == (0, 0, [], 0)
    assert ds.episode_table()["length"].tolist() == []
    ds.check()
    with pytest.raises(ValueError, match="no steps"):
        ds.sample_batch(4)
    # Added to later: only the episodes count.
    write_episodes([_cartpole(0)], tmp_path, **writer_options(format))
    assert len(read_episodes(tmp_path)) == 1


def test_columns_the_dataset_does_not_have_are_named(tmp_path):
    e = _cartpole(0)
    e.to_numpy()
    episode = SingleAgentEpisode(observations=e.get_observations(), actions=e.get_actions(),
                                 rewards=e.get_rewards(), len_lookback_buffer=0,
                                 extra_model_outputs={"action_logp": np.zeros(len(e))})
    write_episodes([episode], tmp_path)
    with pytest.raises(ValueError, match=r"columns \['nosuch'\]: not in the dataset, which "
                                         r"has \['action_logp', 'infos'\]"):
        read_episodes(tmp_path, columns=["nosuch", "action_logp"])
    ds = read_episodes(tmp_path, columns=["action_logp", "obs"])
    assert list(ds[0].extra_model_outputs) == ["action_logp"]


def test_a_writer_refuses_episodes_of_other_spaces_unless_asked(tmp_path):
    write_episodes([_cartpole(0)], tmp_path)
    with pytest.raises(ValueError, match="holds episodes with observations Box.*these have "
                                         "observations Box.*mixed_spaces=True"):
        write_episodes([_pendulum(0)], tmp_path)
    with EpisodeWriter(tmp_path) as writer:
        writer.check_spaces(gym.make("CartPole-v1").observation_space,
                            gym.make("CartPole-v1").action_space)
        with pytest.raises(ValueError, match="another environment"):
            writer.check_spaces(gym.make("Pendulum-v1").observation_space,
                                gym.make("Pendulum-v1").action_space)
        writer.write(_cartpole(1))                  # the same env's: fine
        no_spaces = SingleAgentEpisode()
        no_spaces.add_env_reset(np.zeros(3, np.float32))
        writer.write(no_spaces)                     # no space: matches any
    assert len(read_episodes(tmp_path)) == 3        # (the refused one left nothing)
    write_episodes([_pendulum(0)], tmp_path, mixed_spaces=True)
    ds = read_episodes(tmp_path)
    assert len(ds) == 4 and len(ds.spaces()["observation_space"]) == 3
    # A dataset of both takes either.
    write_episodes([_cartpole(2), _pendulum(1)], tmp_path)


def test_a_writer_flushes_a_part_by_time(tmp_path):
    import time

    with EpisodeWriter(tmp_path, seconds_per_file=0.05) as writer:
        writer.write(_cartpole(0))
        assert writer.files == []                   # rows_per_file is far
        time.sleep(0.1)
        writer.write(_cartpole(1))                  # the first has waited long enough
        assert len(writer.files) == 2 and len(read_episodes(tmp_path)) == 2
        writer.write(_cartpole(2))
        assert len(writer.files) == 2
    assert len(writer.files) == 4 and len(read_episodes(tmp_path)) == 3
    with pytest.raises(ValueError, match="seconds_per_file"):
        EpisodeWriter(tmp_path, seconds_per_file=0)
    with EpisodeWriter(tmp_path / "rows", seconds_per_file=None, rows_per_file=10 ** 6) as w:
        w.write(_cartpole(0))
        time.sleep(0.01)
        w.write(_cartpole(1))
        assert w.files == []


def test_bad_episodes_are_refused_before_anything_is_kept(tmp_path):
    good = _cartpole(0)
    bad = _cartpole(1)
    bad.infos.data.append({"x": object()})    # an info no file can hold (and one too many)
    with EpisodeWriter(tmp_path) as writer:
        writer.write(good)
        with pytest.raises((TypeError, AssertionError)):
            writer.write(bad)
    ds = read_episodes(tmp_path)
    assert len(ds) == 1
    compare_episodes(ds[0], good)


def test_a_bad_episode_in_a_run_keeps_those_before_it_and_nothing_of_it(tmp_path):
    """write() adds runs of our single-agent episodes in one compiled loop:
    a bad one there raises, and the writer keeps the episodes before it, in
    order, and nothing of it, as one by one; multi-agent episodes between
    runs keep their place."""
    bad = _cartpole(3)
    bad.infos.data.append({"x": object()})    # one info too many
    batch = [_cartpole(0), _two_agents(1), _cartpole(1), _cartpole(2), bad, _cartpole(4)]
    last = _cartpole(5)
    with EpisodeWriter(tmp_path, rows_per_file=60) as writer:
        with pytest.raises((TypeError, AssertionError)):
            writer.write(batch)
        writer.write(last)
    kept = batch[:4] + [last]
    assert [e.id_ for e in read_episodes(tmp_path)] == [e.id_ for e in kept]
    for read, written in zip(read_episodes(tmp_path), kept):
        if isinstance(written, SingleAgentEpisode):
            compare_episodes(read, written)


@pytest.mark.parametrize("where", ["custom data", "infos"])
def test_a_bad_episode_of_a_new_layout_leaves_no_step_file_behind(tmp_path, where):
    """An episode refused after its rows' group was made for it (its layout
    is new: float64 observations) or while its rows are copied (an info
    that cannot be encoded) leaves no group and no rows: the part has the
    step file of the good episodes only, and they read back exactly."""
    good = [_cartpole(0), _cartpole(1)]
    infos = [{}, {}, {}] if where == "custom data" else [{}, {}, {"x": object()}]
    bad = SingleAgentEpisode(observations=[np.zeros(4), np.ones(4), np.ones(4)], infos=infos,
                             actions=[0, 1], rewards=[1.0, 1.0], len_lookback_buffer=0)
    if where == "custom data":
        bad.custom_data["x"] = object()
    after = _cartpole(3)
    with EpisodeWriter(tmp_path) as writer:
        with pytest.raises(TypeError):
            writer.write(good + [bad, after])
        writer.write(after)
    steps = sorted(p.name for p in tmp_path.iterdir() if ".steps-" in p.name)
    assert [name.rpartition(".steps-")[2] for name in steps] == ["0.arrow"]
    read = read_episodes(tmp_path)
    assert [e.id_ for e in read] == [e.id_ for e in good + [after]]
    for a, b in zip(read, good + [after]):
        compare_episodes(a, b)


def test_parts_reuse_the_last_parts_rows_and_keep_nothing_of_them(tmp_path):
    """A part's groups (their blocks) are reused by the next part for the
    same layouts, renumbered in the new part's order: each part holds its
    own episodes only, in step files numbered from 0."""
    import pyarrow as pa

    def floats(seed, n):
        rng = np.random.default_rng(seed)
        return SingleAgentEpisode(observations=list(rng.normal(size=(n + 1, 3))),
                                  infos=[{"k": seed}] * (n + 1), actions=list(range(n)),
                                  rewards=list(rng.random(n)), len_lookback_buffer=0)

    parts = [[_cartpole(0), floats(1, 7).to_numpy()],
             [floats(2, 30).to_numpy(), _cartpole(3, steps=4)],
             [_cartpole(4, steps=2)], [_cartpole(5, steps=9)], [floats(6, 3).to_numpy()]]
    with EpisodeWriter(tmp_path) as writer:
        for part in parts:
            writer.write(part)
            writer.flush()
    names = sorted(p.name for p in tmp_path.iterdir() if ".steps-" in p.name)
    assert [n.rpartition(".steps-")[2] for n in names] == \
        ["0.arrow", "1.arrow", "0.arrow", "1.arrow", "0.arrow", "0.arrow", "0.arrow"]
    written = [e for part in parts for e in part]
    rows = [0] * len(parts)      # each part's step files hold its own rows only
    for name in names:
        part = int(name.rpartition(".steps-")[0].rpartition("-")[2])
        rows[part] += pa.ipc.open_file(str(tmp_path / name)).read_all().num_rows
    assert rows == [sum(len(e) + 1 for e in part) for part in parts]     # (no lookbacks)
    read = list(read_episodes(tmp_path))
    assert [e.id_ for e in read] == [e.id_ for e in written]
    for a, b in zip(read, written):
        compare_episodes(a, b)


def test_a_recording_refuses_marks_and_row_counts_it_did_not_make(tmp_path):
    """Recording.rollback() and GroupRows.truncate() set the sizes that the
    compiled copies trust: a mark of another recording, a negative count or
    one past the rows is ValueError, and the rows kept are untouched."""
    episode = _cartpole(0)
    with EpisodeWriter(tmp_path) as writer:
        writer.write(episode)
        recording = writer._recording
        n, nrows = recording.mark()
        group = next(iter(recording.groups.values()))
        for bad in [(-1, nrows), (n + 1, nrows), (0, [nrows[0] + 1]), (0, [-1]),
                    (0, nrows + [0]), (-(1 << 62), [])]:
            with pytest.raises(ValueError):
                recording.rollback(bad)
        with pytest.raises(ValueError):
            group.truncate(-1)
        assert recording.mark() == (n, nrows)
    compare_episodes(read_episodes(tmp_path)[0], episode)


# -- multi-agent episodes ------------------------------------------------------------


@pytest.mark.parametrize("format", FORMATS)
def test_multi_agent_episodes_round_trip_exactly(tmp_path, format):
    from test_multi_agent_pickling import EPISODES, same_episode

    from episode import MultiAgentEpisode

    written = [make() for make in EPISODES.values()]
    single = _cartpole(3)
    write_episodes(written[:4] + [single] + written[4:], tmp_path, **writer_options(format))
    ds = read_episodes(tmp_path)
    assert len(ds) == len(written) + 1
    read = list(ds)
    assert read[4].id_ == single.id_ and isinstance(read[4], SingleAgentEpisode)
    del read[4]
    for name, a, b in zip(EPISODES, written, read):
        assert isinstance(b, MultiAgentEpisode), name
        # The mapping function is code: the read episode has the default one
        # and the agent-to-module mapping the written one had resolved.
        assert b._agent_to_module_mapping == a._agent_to_module_mapping, name
        b.agent_to_module_mapping_fn = a.agent_to_module_mapping_fn
        try:
            same_episode(a, b)
        except AssertionError as error:
            raise AssertionError(f"{name}: {error}") from None
        assert b.id_ == a.id_ and ds.num_steps >= len(a)


def test_iteration_builds_what_indexing_builds(tmp_path):
    """Iteration builds runs of plain single-agent episodes in one compiled
    loop per step file, and everything else (joined chunks, multi-agent
    episodes, episodes with details) as indexing does, in stored order,
    part after part."""
    whole = _cartpole(20)
    first, rest = whole.slice(slice(0, 5)), whole.slice(slice(5, None), len_lookback_buffer=2)
    flagged = _cartpole(21, steps=6)
    flagged.is_terminated = np.True_          # numpy flags: kept in its details
    numpyd = [_cartpole(s).to_numpy() for s in range(3)]
    write_episodes([_cartpole(s) for s in range(3)] + [first, flagged] + numpyd, tmp_path)
    write_episodes([_two_agents(1), rest, _cartpole(30), _cartpole(31).to_numpy()], tmp_path)
    by_index = read_episodes(tmp_path)
    expected = [by_index[i] for i in range(len(by_index))]
    read = list(read_episodes(tmp_path))
    assert len(read) == len(expected) == 11
    for a, b in zip(read, expected):
        assert type(a) is type(b)
        compare(a.get_state(), b.get_state(), "get_state()")
    assert any(len(e) == len(whole) and e.id_ == whole.id_ for e in read)
    assert any(e.is_terminated is np.True_ for e in read)


def test_episodes_of_another_layout_go_to_a_step_file_of_their_own(tmp_path):
    """The writer tells an episode of its last group's layout without making
    its signature; any difference (dtype, row shape, mode, kind, extra
    outputs' keys or their order, a defaultdict) still starts another group."""
    def made(obs, extras=None, numpy=True, rewards=(1.0, 2.0)):
        episode = SingleAgentEpisode()
        episode.add_env_reset(obs)
        for reward in rewards:
            episode.add_env_step(obs, 1, reward, extra_model_outputs=extras)
        return episode.to_numpy() if numpy else episode

    f4 = np.zeros(4, np.float32)
    batch = [made(f4), made(f4.astype(np.float64)), made(np.zeros(3, np.float32)),
             made(f4, numpy=False), made(f4, rewards=(1, 2)),
             made(f4, {"a": np.float32(0), "b": np.float32(1)}),
             made(f4, {"b": np.float32(1), "a": np.float32(0)}),
             SingleAgentEpisode.from_state(made(f4).get_state()), made(f4)]
    files = write_episodes(batch, tmp_path)
    assert sum(".steps-" in os.path.basename(f) for f in files) == 8
    for read, written in zip(read_episodes(tmp_path), batch):
        assert_same(read, written)


def test_an_episode_that_does_not_fit_its_rows_is_named_when_iterated(tmp_path):
    """An episode table row whose steps do not fit its rows (read unchecked)
    fails iteration with DatasetError naming the episode, after the
    episodes before it; a length no file can hold fails the table."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    write_episodes([_cartpole(s).to_numpy() for s in range(4)], tmp_path)
    table_path = next(str(p) for p in tmp_path.iterdir() if p.name.endswith(".episodes.arrow"))
    with pa.memory_map(table_path) as source:
        table = ipc.open_file(source).read_all()
    lengths = table.column("length").to_pylist()
    lengths[2] += 1
    index = table.schema.get_field_index("length")
    table = table.set_column(index, table.schema.field(index),
                             pa.array(lengths, table.schema.field(index).type))
    with ipc.new_file(table_path, table.schema) as sink:
        sink.write_table(table)
    ds = read_episodes(tmp_path, verify=False)
    seen = []
    with pytest.raises(DatasetError, match="episode 2 does not fit its step file"):
        for episode in ds:
            seen.append(episode)
    assert len(seen) == 2
    with pytest.raises(DatasetError, match="episode 2 does not fit its step file"):
        ds[2]
    assert len(ds[3]) == len(_cartpole(3))
    lengths[2] = 1 << 62              # sums of it would overflow int64
    table = table.set_column(index, table.schema.field(index),
                             pa.array(lengths, table.schema.field(index).type))
    with ipc.new_file(table_path, table.schema) as sink:
        sink.write_table(table)
    with pytest.raises(DatasetError, match="out of range"):
        list(read_episodes(tmp_path, verify=False))


def _two_agents(seed, steps=30):
    from episode import MultiAgentEpisode

    rng = np.random.default_rng(seed)
    episode = MultiAgentEpisode(agent_to_module_mapping_fn=lambda agent, e: f"m{agent[-1]}")
    episode.add_env_reset(observations={a: rng.normal(size=3).astype(np.float32)
                                        for a in ("a0", "a1")})
    for t in range(steps):
        episode.add_env_step({a: rng.normal(size=3).astype(np.float32) for a in ("a0", "a1")},
                             {a: int(rng.integers(2)) for a in ("a0", "a1")},
                             {"a0": 1.0, "a1": float(t)},
                             terminateds={"__all__": t == steps - 1})
    return episode


def test_sample_batch_on_multi_agent_datasets_draws_per_module(tmp_path):
    write_episodes([_two_agents(seed) for seed in range(3)], tmp_path / "multi")
    ds = read_episodes(tmp_path / "multi")
    ds.rng = np.random.default_rng(0)
    batch = ds.sample_batch(16, n_step=2, gamma=0.9)
    assert sorted(batch) == ["m0", "m1"]
    assert batch["m0"]["obs"].shape == (16, 3) and batch["m1"]["rewards"].shape == (16,)
    assert ds.replay_buffer().get_num_timesteps() == ds.num_steps == 90
    assert list(ds.sample_batch(4, modules_to_sample=["m1"])) == ["m1"]
    # Drawn the same again from the same seed.
    again = read_episodes(tmp_path / "multi")
    again.rng = np.random.default_rng(0)
    np.testing.assert_array_equal(again.sample_batch(16, n_step=2, gamma=0.9)["m0"]["obs"],
                                  batch["m0"]["obs"])
    # Single- and multi-agent episodes in one dataset: one kind is drawn from.
    write_episodes([_cartpole(0)], tmp_path / "multi")
    with pytest.raises(ValueError, match="single- and multi-agent episodes"):
        read_episodes(tmp_path / "multi").sample_batch(4)


def test_a_multi_agent_episode_cut_and_written_apart_reads_back_whole(tmp_path):
    from test_multi_agent_pickling import cut_chunks, same_episode

    ep, successor = cut_chunks()
    write_episodes([ep], tmp_path)
    write_episodes([successor], tmp_path)
    expected = copy.deepcopy(ep)
    expected.concat_episode(successor)
    ds = read_episodes(tmp_path)
    assert len(ds) == 1 and ds.num_steps == len(expected)
    same_episode(expected, ds[0])


def test_a_multi_agent_episode_failing_part_way_leaves_the_writer_as_it_was(tmp_path):
    from test_multi_agent_pickling import simultaneous

    good, bad = simultaneous(3), simultaneous(3, numpy=False)
    bad.agent_episodes["a1"].infos.data[-1] = {"x": object()}
    with EpisodeWriter(tmp_path) as writer:
        writer.write(good)
        with pytest.raises(TypeError):
            writer.write([good, bad])      # the first is kept, the second not at all
    ds = read_episodes(tmp_path)
    assert [e.id_ for e in ds] == [good.id_, good.id_]


@SETTINGS
@given(sequence=st.deferred(lambda: _ma_strategies().episodes(max_steps=8)),
       numpy=st.booleans(), cut=st.booleans(), format=st.sampled_from(FORMATS))
def test_random_multi_agent_episodes_round_trip_exactly(tmp_path_factory, sequence, numpy, cut,
                                                         format):
    from test_multi_agent_pickling import same

    from episode import MultiAgentEpisode

    episode = MultiAgentEpisode(**sequence.constructor)
    for name, args, kwargs in sequence.calls:
        try:
            getattr(episode, name)(*args, **kwargs)
        except Exception:        # a step the episode refused: the sequence ends there
            break
    if cut and episode.env_t > episode.env_t_started and not episode.is_done:
        episode = episode.cut(len_lookback_buffer=1)
    if numpy:
        try:
            episode.to_numpy()
        except ValueError:
            pass                 # items that do not stack: it stays in list mode
    path = tmp_path_factory.mktemp("ds")
    write_episodes([episode], path, **writer_options(format))
    read = read_episodes(path)[0]
    read.agent_to_module_mapping_fn = episode.agent_to_module_mapping_fn
    same(episode.get_state(), read.get_state())
    for name in ("env_t_to_agent_t", "agent_t_started", "_hanging_actions_end",
                 "_hanging_extra_model_outputs_end", "_hanging_rewards_end",
                 "_hanging_rewards_begin", "_len_lookback_buffers", "_agent_to_module_mapping"):
        same(getattr(episode, name), getattr(read, name), name)
    for getter in ("get_observations", "get_actions", "get_rewards", "get_infos"):
        for args, kwargs in (((), {}), ((-1,), {}), ((slice(-4, 2),), {"fill": 0})):
            compare(_outcome(read, getter, args, kwargs), _outcome(episode, getter, args, kwargs),
                    getter)


def _outcome(episode, name, args, kwargs):
    try:
        return getattr(episode, name)(*args, **kwargs)
    except Exception as error:     # the class is what is compared
        return type(error)


def _ma_strategies():
    import ma_strategies

    return ma_strategies


# -- drawing batches -------------------------------------------------------------------


@pytest.mark.parametrize("format", FORMATS)
def test_sample_batch_draws_as_a_replay_buffer_holding_the_dataset(tmp_path, format):
    from episode.replay import EpisodeReplayBuffer

    batch = [_cartpole(seed) for seed in range(8)]
    for e in batch[::3]:
        e.to_numpy()
    write_episodes(batch, tmp_path, **writer_options(format))
    ds = read_episodes(tmp_path)
    ds.rng = np.random.default_rng(7)
    reference = EpisodeReplayBuffer(capacity=sum(len(e) for e in batch))
    reference.add(batch)
    reference.rng = np.random.default_rng(7)
    for kwargs in ({"n_step": 3, "gamma": 0.9}, {"batch_length_T": 5, "lookback": 1},
                   {"n_step": (1, 4)}, {"n_step": 2, "include_extra_model_outputs": True}):
        ours, theirs = ds.sample_batch(32, **kwargs), reference.sample_batch(32, **kwargs)
        # (indices name steps of the buffer they were drawn from)
        assert ours.pop("indices").shape == theirs.pop("indices").shape
        compare(ours, theirs, str(kwargs))
    with pytest.raises(ValueError):
        ds.sample_batch(0)


# -- recording from a sampler ------------------------------------------------------------


def test_a_sampler_records_what_it_hands_on(tmp_path):
    from episode import Sampler

    with EpisodeWriter(tmp_path, format="arrow") as writer:
        sampler = Sampler("CartPole-v1", num_envs=4, rollout_fragment_length=30, seed=0,
                          writer=writer)
        handed = [e for _ in range(6) for e in sampler.sample_episodes()]
    ds = read_episodes(tmp_path)
    # The chunks of one episode come back as one (each with every step once).
    joined = {}
    for chunk in handed:
        if chunk.id_ in joined:
            joined[chunk.id_].concat_episode(chunk)
        else:
            joined[chunk.id_] = chunk.slice(slice(0, None),
                                            len_lookback_buffer=chunk.observations.lookback)
    assert len(ds) == len(joined) and ds.num_steps == sum(len(e) for e in joined.values())
    by_id = {e.id_: e for e in ds}
    for id_, expected in joined.items():
        read = by_id[id_]
        compare(read.get_observations(slice(0, len(expected) + 1)),
                expected.get_observations(), "observations")
        compare(read.get_actions(slice(0, len(expected))), expected.get_actions(), "actions")
        assert read.t_started == expected.t_started and read.is_numpy
    # The batch path hands on episodes too.
    with EpisodeWriter(tmp_path / "batches") as writer:
        sampler = Sampler("CartPole-v1", num_envs=2, rollout_fragment_length=20, seed=0,
                          writer=writer)
        batch = sampler.sample()
    assert read_episodes(tmp_path / "batches").num_steps == len(batch["obs"]) >= 40


def test_a_continued_chunk_is_written_without_its_lookback(tmp_path):
    import pyarrow.parquet as pq

    episode = _cartpole(0, steps=10)
    first = episode.slice(slice(0, 6))
    second = episode.slice(slice(6, None), len_lookback_buffer=4)
    with EpisodeWriter(tmp_path, format="parquet") as writer:
        writer.write(first)
        writer.write(second)             # the writer has its lookback rows already
    steps = [f for f in os.listdir(tmp_path) if ".steps-" in f]
    assert sum(pq.read_metadata(tmp_path / f).num_rows for f in steps) == \
        (len(first) + 1) + (len(second) + 1)
    read = read_episodes(tmp_path)
    assert len(read) == 1
    expected = first.slice(slice(0, None))
    expected.concat_episode(second)
    compare_episodes(read[0], expected)
    # Written alone, a chunk keeps its lookback.
    write_episodes([second], tmp_path / "alone")
    compare_episodes(read_episodes(tmp_path / "alone")[0], second)


def test_vector_episodes_record_what_they_hand_on(tmp_path):
    from episode import VectorEpisodes

    env = gym.make_vec("CartPole-v1", num_envs=3)
    handed = []
    with EpisodeWriter(tmp_path) as writer:
        vector = VectorEpisodes.for_env(env)
        vector.writer = writer
        vector.add_reset(*env.reset(seed=0))
        env.action_space.seed(0)
        for _ in range(60):
            actions = env.action_space.sample()
            obs, rewards, terminateds, truncateds, infos = env.step(actions)
            handed += vector.add_step(obs, actions, rewards, terminateds, truncateds, infos)
        handed += vector.cut()
    ds = read_episodes(tmp_path)
    assert sorted(e.id_ for e in ds) == sorted(e.id_ for e in handed)
    for read in ds:
        compare_episodes(read, next(e for e in handed if e.id_ == read.id_))


def test_what_a_dataset_holds_without_building_episodes(tmp_path, monkeypatch):
    from test_multi_agent_pickling import simultaneous

    singles = [_cartpole(seed) for seed in range(3)]
    first = singles[2].slice(slice(0, 5))
    rest = singles[2].slice(slice(5, None), len_lookback_buffer=1)
    multi = simultaneous(4)
    write_episodes(singles[:2] + [first, multi], tmp_path)
    write_episodes([rest], tmp_path, format="arrow")
    ds = read_episodes(tmp_path)
    monkeypatch.setattr(type(ds), "__getitem__", None)      # nothing is built below
    table = ds.episode_table()
    assert table["length"].tolist() == [len(e) for e in singles] + [len(multi)]
    assert table["return"].tolist() == [e.get_return() for e in singles] + [multi.get_return()]
    assert table["agent_steps"][-1] == multi.agent_steps()
    assert table["terminated"].tolist() == [e.is_terminated for e in singles] + [False]
    assert table["multi_agent"].tolist() == [False, False, False, True]
    assert ds.num_chunks == 5 and ds.format == "episode"
    assert len([f for f in ds.files if ".episodes." in f]) == 2
    assert all(os.path.exists(f) for f in ds.files)
    assert ds.spaces()["action_space"] == [
        '{"space":"discrete","n":2,"start":0}', None]     # CartPole's; the agents' have none
    assert ds.agent_ids() == ["a0", "a1"]


@pytest.mark.parametrize("format", FORMATS)
def test_a_replay_buffer_filled_from_a_dataset_is_the_one_add_makes(tmp_path, format):
    """add_dataset() (a step file's rows adopted whole) against add() of the
    same episodes in the same order: the same counts, samples and state;
    with eviction too, and with chunks joined, lookbacks and infos."""
    import pickle

    from episode import Sampler
    from episode.replay import EpisodeReplayBuffer

    episodes = [_cartpole(seed) for seed in range(5)]
    episodes[1].infos.data[3] = {"x": 3}
    episodes.append(episodes[4].slice(slice(2, None), len_lookback_buffer=2))
    episodes[4] = _cartpole(9)
    with EpisodeWriter(tmp_path, **writer_options(format)) as writer:
        writer.write(episodes)
        sampler = Sampler("CartPole-v1", num_envs=2, rollout_fragment_length=30, seed=0,
                          writer=writer)
        for _ in range(3):
            sampler.sample_episodes()
    ds = read_episodes(tmp_path)
    for capacity in (ds.num_steps, ds.num_steps // 2):
        ours, theirs = EpisodeReplayBuffer(capacity=capacity), \
            EpisodeReplayBuffer(capacity=capacity)
        ours.add_dataset(ds)
        theirs.add(list(ds))
        assert ours.get_num_episodes() == theirs.get_num_episodes()
        assert ours.get_num_timesteps() == theirs.get_num_timesteps()
        assert ours.get_num_episodes_evicted() == theirs.get_num_episodes_evicted()
        ours.rng, theirs.rng = np.random.default_rng(3), np.random.default_rng(3)
        for a, b in zip(ours.sample(20, n_step=2, sample_episodes=True),
                        theirs.sample(20, n_step=2, sample_episodes=True)):
            compare_episodes(a, b)
        for a, b in zip(ours.sample(4, batch_length_T=6, n_step=1, sample_episodes=True),
                        theirs.sample(4, batch_length_T=6, n_step=1, sample_episodes=True)):
            compare_episodes(a, b)
        back = pickle.loads(pickle.dumps(ours))
        assert back.get_num_timesteps() == ours.get_num_timesteps()


def _added_from(buffer, dataset) -> int:
    # buffer.add_dataset(dataset); the bytes Python's allocators hold after.
    import tracemalloc

    tracemalloc.start()
    try:
        buffer.add_dataset(dataset)
        return tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def test_a_buffer_filled_from_memory_mapped_files_reads_them_in_place(tmp_path):
    from episode.replay import EpisodeReplayBuffer

    frames = np.random.default_rng(0).integers(0, 255, (201, 32, 32), dtype=np.uint8)
    episodes = [SingleAgentEpisode(observations=frames, actions=np.zeros(200, np.int64),
                                   rewards=np.ones(200), terminated=True, len_lookback_buffer=0)
                for _ in range(50)]
    write_episodes(episodes, tmp_path, format="arrow")
    ds = read_episodes(tmp_path)
    buffer = EpisodeReplayBuffer(capacity=ds.num_steps)
    held = _added_from(buffer, ds)
    assert held < frames.nbytes * 50 / 20, held       # the frames stay in the files
    batch = buffer.sample_batch(64, n_step=3)
    assert batch["obs"].shape == (64, 32, 32) and buffer.get_num_timesteps() == 10_000


def test_a_packed_column_unpacks_as_each_cell_would():
    from episode.offline import format as fmt

    values = ["a" * 40, None, {"x": [1, 2.5]}, np.arange(3, dtype=np.int16), None, 7, ""]
    blobs = [None if v is None else fmt.pack_value(v) for v in values]
    got = fmt.unpack_values(blobs)
    assert len(got) == len(values)
    for g, blob in zip(got, blobs):
        compare(g, None if blob is None else fmt.unpack_value(blob))
    assert fmt.unpack_values([]) == [] and fmt.unpack_values([None]) == [None]
    # A cell holding two values, none, a broken one, or cut short: refused
    # (the reader then unpacks cell by cell to name the episode).
    one, two = fmt.pack_value(1), fmt.pack_value(2)
    for bad in ([one + two], [b"", one], [one, b""], [b"\xc1"], [fmt.pack_value("abc")[:-1]]):
        with pytest.raises(ValueError, match="not a stored value"):
            fmt.unpack_values(bad)


# -- image rows written from where they are ----------------------------------------------


def _screens(seed, steps, dict_obs=False, lookback=0, numpy=True, done=True):
    # An episode of 84x84 frames: 150 steps or more make over 1 MiB (a
    # writer refers to such rows in place instead of copying them).
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 255, (steps + 1 + lookback, 84, 84), np.uint8)
    obs = [{"img": f, "pos": np.float32([seed, t])} for t, f in enumerate(frames)] \
        if dict_obs else list(frames)
    episode = SingleAgentEpisode(observations=obs[:lookback + 1],
                                 actions=list(range(lookback)),
                                 rewards=[0.5] * lookback,
                                 extra_model_outputs={"logp": [np.float32(-1)] * lookback},
                                 len_lookback_buffer=lookback)
    for t in range(steps):
        episode.add_env_step(obs[lookback + t + 1], t % 6, float(t),
                             extra_model_outputs={"logp": np.float32(-t)},
                             terminated=done and t == steps - 1)
    return episode.to_numpy() if numpy else episode


def _step_batches(path):
    # The record batches of each Arrow step file of a dataset, in name order.
    import pyarrow as pa

    return [pa.ipc.open_file(str(p)).num_record_batches
            for p in sorted(path.iterdir()) if ".steps-" in p.name]


@pytest.mark.parametrize("format", FORMATS)
def test_image_episodes_are_written_from_where_they_are(tmp_path, format):
    """An episode's image rows of 1 MiB or more are compressed from the
    episode's own storage, as a record batch of their own, instead of being
    copied into the part first; small episodes and small leaves are copied
    as before. Every kind reads back exactly: numpy'd and list mode, a Dict
    observation, a chunk that continues one written before (kept without
    its lookback rows), across parts."""
    first = _screens(0, 160, lookback=3, done=False)
    successor = first.cut(len_lookback_buffer=2)
    for t in range(150):
        successor.add_env_step(first.get_observations(-1), 1, 0.0,
                               extra_model_outputs={"logp": np.float32(0)},
                               truncated=t == 149)
    successor.to_numpy()
    episodes = [_screens(1, 160), _screens(2, 20), _screens(3, 160, numpy=False),
                _screens(5, 160, dict_obs=True), first, successor]
    with EpisodeWriter(tmp_path, bytes_per_file=2 << 20, **writer_options(format)) as writer:
        writer.write(episodes[:3])
        writer.write(episodes[3:])
    read = list(read_episodes(tmp_path))
    assert len(read) == 5         # (the successor joined to its first chunk)
    for a, b in zip(read, episodes[:4]):
        assert_same(a, b)
    assert np.array_equal(read[4].get_observations(),
                          np.concatenate([first.get_observations(),
                                          successor.get_observations()[1:]]))
    assert read[4].get_rewards().tolist() == first.get_rewards().tolist() + [0.0] * 150
    if format != "parquet":
        # Part 0, written within the first call: an image episode from where
        # it is, then a small one copied (the list-mode one has a step file
        # of its own layout). Part 1: a step file per layout. Part 2, open
        # when the second call returned (its rows then copied: see
        # EpisodeWriter.write), written by close().
        assert _step_batches(tmp_path) == [2, 1, 1, 1, 1]


def test_rows_referred_to_are_copied_before_write_returns(tmp_path):
    """EpisodeWriter.write() hands the episodes back with their image rows
    still in an open part: those rows are copied before it returns (also
    when it raises), so what the caller changes afterwards (set_observations,
    in place) is not what the file holds."""
    mixed = [_screens(0, 160), _screens(5, 20), _screens(6, 160), _screens(7, 20)]
    kept = _screens(1, 160)
    before = kept.get_observations().copy()
    bad = _screens(2, 160)
    bad.infos.data.append({"x": object()})        # one info too many: refused
    with EpisodeWriter(tmp_path) as writer:
        writer.write(mixed)     # (copied in: the small ones' rows move up past them)
        with pytest.raises((TypeError, AssertionError)):
            writer.write([kept, bad])
        kept.set_observations(new_data=np.zeros((84, 84), np.uint8), at_indices=5)
    assert _step_batches(tmp_path) == [1]
    read = list(read_episodes(tmp_path))
    assert len(read) == 5
    for a, b in zip(read, mixed):
        assert_same(a, b)
    assert np.array_equal(read[4].get_observations(), before)
    assert not np.array_equal(kept.get_observations(), before)


def test_a_bad_image_episode_leaves_none_of_its_rows_referred_to(tmp_path):
    """An image episode refused after its rows were referred to in place
    (an info that cannot be encoded comes after them) leaves nothing: the
    episodes around it read back exactly, from batches of their own."""
    bad = _screens(2, 160)
    bad.infos.data[3] = {"x": object()}
    good = [_screens(1, 160), _screens(3, 160)]
    with EpisodeWriter(tmp_path) as writer:
        with pytest.raises(TypeError):
            writer._add([good[0], bad, good[1]])
        writer._add(good[1:])
    assert _step_batches(tmp_path) == [2]
    read = list(read_episodes(tmp_path))
    assert [e.id_ for e in read] == [e.id_ for e in good]
    for a, b in zip(read, good):
        assert_same(a, b)


@pytest.mark.parametrize("list_mode", [False, True])
def test_a_step_file_of_many_record_batches_is_read_across_them(tmp_path, list_mode):
    """A step file's record batches need not follow its episodes (a file
    rewritten by another tool): rows within one batch are read in place,
    rows across batches joined; a Dict observation's fields, a replay buffer
    made from the dataset and a list-mode pass read the same episodes."""
    import pyarrow as pa

    rng = np.random.default_rng(0)
    episodes = []
    for seed in range(4):
        episode = SingleAgentEpisode(observations=[{"a": rng.normal(size=3), "b": seed}])
        for t in range(9 + seed):
            episode.add_env_step({"a": rng.normal(size=3), "b": t}, t % 2, float(t),
                                 extra_model_outputs={"h": np.float32([t, seed])})
        episodes.append(episode if list_mode else episode.to_numpy())
    write_episodes(episodes, tmp_path)
    step_file = next(p for p in tmp_path.iterdir() if ".steps-" in p.name)
    table = pa.ipc.open_file(pa.memory_map(str(step_file))).read_all()
    with pa.OSFile(str(step_file), "wb") as sink, \
            pa.ipc.new_file(sink, table.schema) as out:
        for batch in table.to_batches(max_chunksize=7):
            out.write_batch(batch)
    assert _step_batches(tmp_path) == [-(-table.num_rows // 7)]
    read = read_episodes(tmp_path, verify=False)    # (its checksum was the old file's)
    for a, b in zip(read, episodes):
        assert_same(a, b)
    ours = read.sample_batch(16, n_step=1)
    assert ours["obs"]["a"].shape == (16, 3)


def test_a_leaf_of_no_chunks_is_refused():
    from episode._dataset import Chunks

    with pytest.raises(ValueError):
        Chunks([])


def test_parts_of_one_write_are_written_two_at_a_time(tmp_path, monkeypatch):
    """Within one write(), a part that is due is written on a thread of its
    own while the part before it may still be (two compress at once), and
    the next fills; write() returns once all are written, in order."""
    import threading
    import time

    from episode.offline import writer as writer_module

    episodes = _frame_episodes(12)
    active, most = [0], [0]
    lock = threading.Lock()
    step_table = writer_module._step_table

    def slow(group):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return step_table(group)

    monkeypatch.setattr(writer_module, "_step_table", slow)
    with EpisodeWriter(tmp_path, bytes_per_file=25 * 7062, seconds_per_file=None) as writer:
        writer.write(episodes)
        assert len(writer.files) == 8 and active[0] == 0     # (4 parts written)
    assert most[0] == 2
    assert [e.id_ for e in read_episodes(tmp_path)] == [e.id_ for e in episodes]
    for read, episode in zip(read_episodes(tmp_path), episodes):
        compare_episodes(read, episode)


def test_a_part_that_fails_in_the_background_is_written_again(tmp_path, monkeypatch):
    """A part whose write fails on its thread raises from write(), leaves no
    file of it, and is kept: the next flush (here close()) writes it again
    under its name, so the dataset holds every part in order."""
    from episode.offline import writer as writer_module

    episodes = _frame_episodes(12)
    calls = [0]
    step_table = writer_module._step_table

    def failing_once(group):
        calls[0] += 1
        if calls[0] == 2:
            raise OSError("no space left on device")
        return step_table(group)

    monkeypatch.setattr(writer_module, "_step_table", failing_once)
    with EpisodeWriter(tmp_path, bytes_per_file=25 * 7062, seconds_per_file=None) as writer:
        with pytest.raises(OSError, match="no space"):
            writer.write(episodes)
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    tables = sorted(p.name for p in tmp_path.iterdir() if ".episodes." in p.name)
    assert [n.rpartition(".episodes.")[0].rpartition("-")[2] for n in tables] == \
        ["000000", "000001", "000002"]
    kept = episodes[:9]     # (three parts: the episodes after the error were not added)
    assert [e.id_ for e in read_episodes(tmp_path)] == [e.id_ for e in kept]
    for read, episode in zip(read_episodes(tmp_path), kept):
        compare_episodes(read, episode)


def test_a_buffer_filled_from_image_episodes_adopts_each_batch(tmp_path):
    """Image episodes written from where they are make step files of a
    record batch each: add_dataset() adopts each batch's rows as a block of
    its own (read in place, not joined into a copy), and the buffer is the
    one add() of the same episodes makes."""
    from episode.replay import EpisodeReplayBuffer

    episodes = [_screens(seed, 160) for seed in range(3)] + [_screens(3, 20)] + \
        [_screens(seed, 160) for seed in range(4, 6)]
    write_episodes(episodes, tmp_path)
    assert _step_batches(tmp_path) == [6]      # (five image episodes, one small)
    ds = read_episodes(tmp_path)
    ours = EpisodeReplayBuffer(capacity=ds.num_steps)
    held = _added_from(ours, ds)
    assert held < sum(e.get_observations().nbytes for e in episodes) / 20, held
    theirs = EpisodeReplayBuffer(capacity=ds.num_steps)
    theirs.add(list(ds))
    assert ours.get_num_episodes() == theirs.get_num_episodes() == 6
    ours.rng, theirs.rng = np.random.default_rng(1), np.random.default_rng(1)
    for a, b in zip(ours.sample(8, n_step=2, sample_episodes=True),
                    theirs.sample(8, n_step=2, sample_episodes=True)):
        compare_episodes(a, b)


@settings(max_examples=int(os.environ.get("PROPS_MAX_EXAMPLES", 40)) // 4 + 1, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(shapes=st.lists(st.tuples(st.sampled_from([2, 15, 150, 170]), st.integers(0, 3),
                                 st.booleans(), st.booleans()), min_size=1, max_size=6),
       calls=st.lists(st.integers(1, 6), min_size=1, max_size=6),
       part_mib=st.sampled_from([1, 2, 4, 256]))
def test_image_episodes_round_trip_however_they_are_handed_over(tmp_path_factory, shapes,
                                                                 calls, part_mib):
    """Image episodes (rows referred to in place: 150 steps of 84x84 are
    over 1 MiB) among short ones, of any lookback, list mode or numpy'd, a
    Dict observation or not, handed to write() in calls of any size (the
    open part's rows copied in as each call returns) with parts of any
    size: each reads back exactly, in order, and a buffer made from the
    dataset holds every step."""
    from episode.replay import EpisodeReplayBuffer

    episodes = [_screens(seed, steps, dict_obs=dict_obs, lookback=lookback, numpy=numpy)
                for seed, (steps, lookback, numpy, dict_obs) in enumerate(shapes)]
    path = tmp_path_factory.mktemp("ds")
    with EpisodeWriter(path, bytes_per_file=part_mib << 20, seconds_per_file=None) as writer:
        at = 0
        for n in calls + [len(episodes)]:
            writer.write(episodes[at:at + n])
            at += n
    read = read_episodes(path)
    assert [e.id_ for e in read] == [e.id_ for e in episodes]
    for a, b in zip(read, episodes):
        assert_same(a, b)
    if all(not dict_obs for _, _, _, dict_obs in shapes):
        buffer = EpisodeReplayBuffer(capacity=read.num_steps + 1)
        buffer.add_dataset(read)
        assert buffer.get_num_timesteps() == read.num_steps


def test_a_step_files_rows_are_asked_for_within_it(tmp_path):
    """StepFile.block_tracks() and infos_by_row() take a range of rows (a
    record batch's): one outside the file is IndexError, not a read past
    its arrays."""
    write_episodes([_screens(0, 150), _screens(1, 5)], tmp_path)
    ds = read_episodes(tmp_path)
    step_file = ds._step_file(ds._parts[0], 0)
    n = step_file.nrows
    assert step_file.batches() == [0, 151, n]
    for start, stop in ((0, n + 1), (-1, 3), (5, 2), (n + 1, None)):
        with pytest.raises(IndexError):
            step_file.block_tracks(start, stop)
        with pytest.raises(IndexError):
            step_file.infos_by_row(start, stop)
    first, second = ds[0].get_observations(), ds[1].get_observations()
    assert np.array_equal(step_file.block_tracks(151, n)[("obs", None)][0], second)
    across = step_file.block_tracks(100, n)[("obs", None)][0]     # (joined: a copy)
    assert np.array_equal(across, np.concatenate([first[100:], second]))
