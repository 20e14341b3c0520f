"""episode.offline under faults: a writer killed mid-write, damaged files.

A writer killed at a random moment leaves every part it finished whole and
readable, and nothing half-written where a reader looks; one killed in the
middle of a long recording keeps what it flushed (by rows or by time). A
dataset whose files have flipped or cut bytes either reads its very values
(the damage hit bytes no value is read from) or raises DatasetError naming
the file: never wrong values, never a crash. With ``verify=False`` the
damage is not looked for: the reader may raise or crash no more than without
it. The damaged reads run in child processes, so that a crash fails a test
instead of ending pytest.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("msgpack")

from episode.offline import read_episodes  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from episode import SingleAgentEpisode
    from episode.offline import EpisodeWriter

    path, fmt = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(0)
    with EpisodeWriter(path, format=fmt, rows_per_file=2000) as writer:
        for i in range(10 ** 9):
            e = SingleAgentEpisode()
            e.add_env_reset(rng.normal(size=(16, 16)).astype(np.float32))
            for t in range(50):
                e.add_env_step(rng.normal(size=(16, 16)).astype(np.float32), t % 3, 1.0,
                               {"t": t} if t % 7 == 0 else None)
            writer.write(e)
            if i == 5:
                print("writing", flush=True)
""")


@pytest.mark.parametrize("format", ["parquet", "arrow"])
def test_a_writer_killed_mid_write_leaves_whole_parts(tmp_path, format):
    for kill_after in (0.4, 1.3):
        path = tmp_path / f"{format}-{kill_after}"
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(path), format],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=HERE)
        assert child.stdout.readline().strip() == b"writing"
        time.sleep(kill_after)
        child.send_signal(signal.SIGKILL)
        child.wait()
        names = os.listdir(path)
        tables = [n for n in names if ".episodes." in n and not n.startswith(".")]
        if not tables:
            continue          # killed before its first part
        ds = read_episodes(path)
        # Whole episodes of 50 steps, as many as the finished parts hold.
        assert len(ds) >= 1 and ds.num_steps == 50 * len(ds)
        for episode in ds:
            assert len(episode) == 50 and episode.get_observations(-1).shape == (16, 16)
        # A temporary file of the part being written, if any, is hidden.
        assert all(n.startswith(".") or n.endswith(f".{format}") for n in names)


LONG_RECORDING = textwrap.dedent("""
    import sys
    import numpy as np
    from episode import SingleAgentEpisode
    from episode.offline import EpisodeWriter

    path, fmt = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(0)
    # rows_per_file as by default: far more rows than are written before the kill.
    writer = EpisodeWriter(path, format=fmt, seconds_per_file=0.3)
    for i in range(10 ** 9):
        e = SingleAgentEpisode()
        e.add_env_reset(rng.normal(size=8).astype(np.float32))
        for t in range(50):
            e.add_env_step(rng.normal(size=8).astype(np.float32), t % 3, 1.0)
        writer.write(e)
        if i == 5:
            print("writing", flush=True)
""")


@pytest.mark.parametrize("format", ["parquet", "arrow"])
def test_a_long_recording_killed_keeps_the_parts_flushed_by_time(tmp_path, format):
    child = subprocess.Popen([sys.executable, "-c", LONG_RECORDING, str(tmp_path), format],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=HERE)
    assert child.stdout.readline().strip() == b"writing", child.stderr.read()
    time.sleep(1.5)
    child.send_signal(signal.SIGKILL)
    child.wait()
    ds = read_episodes(tmp_path)
    ds.check()
    assert len(ds) >= 1 and ds.num_steps == 50 * len(ds)
    assert all(len(e) == 50 for e in ds)


def test_a_step_file_without_its_episode_table_is_not_read(tmp_path):
    from episode.offline import write_episodes

    from test_offline_dataset import _cartpole

    files = write_episodes([_cartpole(0)], tmp_path)
    os.remove([f for f in files if ".episodes." in f][0])    # killed before its table
    kept = _cartpole(1)
    write_episodes([kept], tmp_path)
    ds = read_episodes(tmp_path)
    assert len(ds) == 1 and ds[0].id_ == kept.id_


# -- damaged files ----------------------------------------------------------------------

READER = textwrap.dedent("""
    import hashlib
    import pickle
    import sys
    from episode.offline import DatasetError, read_episodes
    verify = sys.argv[1] == "verify"
    for k, path in enumerate(sys.argv[2:]):
        # (Named before it reads: a crash is then this case's.)
        print("case", k, end=" ", flush=True)
        try:
            ds = read_episodes(path, verify=verify)
            digest = hashlib.sha256()
            for episode in ds:
                digest.update(pickle.dumps((
                    episode.get_observations(), episode.get_actions(), episode.get_rewards(),
                    episode.get_infos(), episode.get_extra_model_outputs("logp"))))
            print("read", digest.hexdigest(), flush=True)
        except (DatasetError, ValueError, TypeError, KeyError, OSError, AssertionError,
                IndexError, UnicodeDecodeError, OverflowError, MemoryError) as error:
            print("refused", type(error).__name__, flush=True)
""")


def _dataset(path, format, kind="steps"):
    import gymnasium as gym

    from episode import SingleAgentEpisode
    from episode.offline import write_episodes

    if kind == "images":
        # Image rows written from where they are: a step file of a record
        # batch per image episode, a small one between them.
        from test_offline_dataset import _screens

        write_episodes([_screens(0, 150, lookback=1), _screens(1, 5), _screens(2, 160)], path,
                       format=format)
        return sorted(os.path.join(path, n) for n in os.listdir(path))
    episodes = []
    rng = np.random.default_rng(1)
    space = gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (3,), np.float32),
                             "n": gym.spaces.Discrete(4)})
    for i in range(4):
        e = SingleAgentEpisode(observation_space=space)
        e.add_env_reset({"x": rng.uniform(-1, 1, 3).astype(np.float32), "n": 1}, {"i": i})
        for t in range(6):
            e.add_env_step({"x": rng.uniform(-1, 1, 3).astype(np.float32), "n": t % 4},
                           "s" * t, float(t), {"t": [t, "x"]} if t % 2 else None,
                           extra_model_outputs={"logp": np.float32(-t)})
        if i % 2:
            e.to_numpy()
        episodes.append(e)
    write_episodes(episodes, path, format=format)
    return sorted(os.path.join(path, n) for n in os.listdir(path))


def _damaged_reads(tmp_path, format, cases, verify="verify", kind="steps"):
    """Runs the reader on each damaged copy, one after the other in one
    child process (a crash of a case fails the test, naming the case)."""
    paths = []
    for k, damage in enumerate(cases):
        path = tmp_path / f"case{k}"
        damage(_dataset(path, format, kind))
        paths.append(str(path))
    proc = subprocess.run([sys.executable, "-c", READER, verify, *paths],
                          capture_output=True, timeout=600,
                          env=dict(os.environ, PYTHONFAULTHANDLER="1"), cwd=HERE)
    lines = proc.stdout.decode().splitlines()
    assert proc.returncode == 0, (f"the reader crashed ({proc.returncode}) in "
                                  f"{lines[-1] if lines else 'its start'}\n"
                                  + proc.stderr.decode()[-3000:])
    results = [line.split()[2:] for line in lines]
    assert len(results) == len(cases), proc.stdout + proc.stderr
    assert all(out and out[0] in ("read", "refused") for out in results), proc.stdout
    return results


def _flip(seed, count):
    def damage(files):
        rng = np.random.default_rng(seed)
        path = files[rng.integers(len(files))]
        data = bytearray(open(path, "rb").read())
        for _ in range(count):
            i = int(rng.integers(len(data)))
            data[i] ^= 1 << int(rng.integers(8))
        open(path, "wb").write(bytes(data))
    return damage


def _cut(seed):
    def damage(files):
        rng = np.random.default_rng(seed)
        path = files[rng.integers(len(files))]
        data = open(path, "rb").read()
        open(path, "wb").write(data[:int(rng.integers(len(data)))])
    return damage


@pytest.mark.parametrize("format", ["parquet", "arrow"])
def test_damaged_datasets_are_refused_or_read_right_never_a_crash(tmp_path, format):
    cases = [_flip(seed, count) for seed in range(12) for count in (1, 8)] + \
        [_cut(seed) for seed in range(6)]
    (intact,) = _damaged_reads(tmp_path / "intact", format, [lambda files: None])
    assert intact[0] == "read"
    results = _damaged_reads(tmp_path, format, cases)
    # What reads is what was written; cut files are always refused.
    assert all(r == intact or r == ["refused", "DatasetError"] for r in results), results
    assert all(r[0] == "refused" for r in results[-6:]), results[-6:]
    assert sum(r[0] == "refused" for r in results) >= len(results) // 2


@pytest.mark.parametrize("format", ["parquet", "arrow"])
def test_damaged_image_datasets_of_many_record_batches_never_crash(tmp_path, format):
    """Step files of a record batch per image episode: a damaged copy is
    refused (DatasetError) or reads what was written, and read unchecked
    it never crashes."""
    cases = [_flip(seed, count) for seed in range(6) for count in (1, 8)] + \
        [_cut(seed) for seed in range(3)]
    (intact,) = _damaged_reads(tmp_path / "intact", format, [lambda files: None],
                               kind="images")
    assert intact[0] == "read"
    results = _damaged_reads(tmp_path / "checked", format, cases, kind="images")
    assert all(r == intact or r == ["refused", "DatasetError"] for r in results), results
    assert all(r[0] == "refused" for r in results[-3:]), results[-3:]
    _damaged_reads(tmp_path / "trusted", format, cases[:12], verify="trust", kind="images")


@pytest.mark.parametrize("format", ["parquet", "arrow"])
def test_unchecked_damaged_datasets_never_crash(tmp_path, format):
    cases = [_flip(seed, count) for seed in range(6) for count in (1, 8)]
    _damaged_reads(tmp_path, format, cases, verify="trust")


# Each file kind a writer makes: Parquet, Arrow with lz4 (the default) and
# uncompressed Arrow (memory-mapped when read).
WRITTEN = {"parquet": {"format": "parquet"}, "arrow": {"format": "arrow"},
           "arrow_uncompressed": {"format": "arrow", "compression": None}}


@pytest.mark.parametrize("format", list(WRITTEN))
def test_flipped_bytes_in_a_step_file_are_named_unless_trusted(tmp_path, format):
    """The issue's case: 64 bytes flipped in the middle of a step file of a
    CartPole dataset read as observations far outside the space."""
    from episode.offline import DatasetError, write_episodes

    from test_offline_dataset import _cartpole

    episodes = [_cartpole(i) for i in range(20)]
    files = write_episodes(episodes, tmp_path, **WRITTEN[format])
    (steps,) = [f for f in files if ".steps-" in f]
    data = bytearray(open(steps, "rb").read())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
    open(steps, "wb").write(bytes(data))
    ds = read_episodes(tmp_path)                # (the episode table is whole)
    with pytest.raises(DatasetError, match=f"^{steps}: damaged"):
        ds[0]
    with pytest.raises(DatasetError, match=f"^{steps}: damaged"):
        ds.check()
    with pytest.raises(DatasetError, match=f"^{steps}: damaged"):
        ds.sample_batch(8)
    # Storage the user trusts: read as it is (here, values nobody wrote).
    trusted = read_episodes(tmp_path, verify=False)
    read = np.concatenate([e.get_observations() for e in trusted])
    written = np.concatenate([e.get_observations() for e in episodes])
    assert read.shape == written.shape and not np.array_equal(read, written, equal_nan=True)


@pytest.mark.parametrize("format", list(WRITTEN))
def test_a_damaged_episode_table_is_named(tmp_path, format):
    from episode.offline import DatasetError, write_episodes

    from test_offline_dataset import _cartpole

    files = write_episodes([_cartpole(i) for i in range(20)], tmp_path, **WRITTEN[format])
    (table,) = [f for f in files if ".episodes." in f]
    data = bytearray(open(table, "rb").read())
    if format == "parquet":
        import pyarrow.parquet as pq

        # The last byte of column 'length': a data page's, not its header's.
        meta = pq.ParquetFile(table).metadata
        names = [meta.schema.column(i).name for i in range(meta.num_columns)]
        chunk = meta.row_group(0).column(names.index("length"))
        start = chunk.dictionary_page_offset or chunk.data_page_offset
        at = start + chunk.total_compressed_size - 1
    else:
        at = len(data) // 2        # the record batch's
    data[at] ^= 0x10
    open(table, "wb").write(bytes(data))
    with pytest.raises(DatasetError, match=f"^{table}: damaged"):
        read_episodes(tmp_path)


def test_datasets_without_checksums_are_read_unchecked_only(tmp_path):
    """A dataset written before the checksums: refused, with the way out."""
    import json

    import pyarrow.parquet as pq

    from episode.offline import DatasetError, write_episodes

    from test_offline_dataset import _cartpole

    files = write_episodes([_cartpole(0)], tmp_path, format="parquet")
    (table_file,) = [f for f in files if ".episodes." in f]
    table = pq.read_table(table_file)
    meta = json.loads(table.schema.metadata[b"episode.format"])
    del meta["step_checksums"]
    pq.write_table(table.replace_schema_metadata({b"episode.format": json.dumps(meta)}),
                   table_file)
    with pytest.raises(DatasetError, match="no checksums.*verify=False"):
        read_episodes(tmp_path)
    assert len(read_episodes(tmp_path, verify=False)[0]) == len(_cartpole(0))


# -- a dataset bigger than what it may hold -----------------------------------------------


@pytest.mark.skipif(not os.path.exists("/proc/self/status"),
                    reason="reads the resident size from /proc")
@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="AddressSanitizer's shadow memory grows with every page touched")
def test_reading_a_large_memory_mapped_dataset_keeps_the_resident_size_bounded(tmp_path):
    """630 MB of 84x84 frames in Arrow files: opening reads the episode
    tables only, and reading every frame of every episode holds no more than
    the few files open at a time (episode.offline.dataset.OPEN_FILES)."""
    import gc

    from test_replay import _rss

    from episode import SingleAgentEpisode
    from episode.offline import EpisodeWriter

    frames = np.random.default_rng(0).integers(0, 255, (1001, 84, 84), dtype=np.uint8)
    with EpisodeWriter(tmp_path, format="arrow", compression=None, rows_per_file=4000) as writer:
        for i in range(90):
            frames[:, 0, 0] = i
            writer.write(SingleAgentEpisode(observations=frames, actions=np.zeros(1000, np.int64),
                                            rewards=np.ones(1000), terminated=True,
                                            len_lookback_buffer=0))
    size = sum(os.path.getsize(tmp_path / f) for f in os.listdir(tmp_path))
    assert size > 600 << 20
    gc.collect()
    before = _rss()
    ds = read_episodes(tmp_path)
    assert _rss() - before < 20 << 20 and ds.num_steps == 90_000
    grown, seen = 0, []
    for episode in ds:
        obs = episode.get_observations()
        seen.append(int(obs[:, 0, 0].max()))
        assert int(obs.sum(dtype=np.int64)) > 0       # every page of the episode read
        del obs, episode
        grown = max(grown, _rss() - before)
    assert seen == list(range(90))
    assert grown < 250 << 20, grown


def test_several_writers_write_one_dataset(tmp_path):
    """Processes writing one folder at once (as Ray actors would) each
    under names of their own: every episode of every writer reads back."""
    script = textwrap.dedent("""
        import sys
        from episode import Sampler
        from episode.offline import EpisodeWriter
        with EpisodeWriter(sys.argv[1], format=sys.argv[3], rows_per_file=500) as writer:
            sampler = Sampler("CartPole-v1", num_envs=2, rollout_fragment_length=100,
                              seed=int(sys.argv[2]), writer=writer)
            steps = sum(len(e) for _ in range(6) for e in sampler.sample_episodes())
            steps += sum(len(e) for e in sampler.take_pending())
        print(steps)
    """)
    children = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(seed), fmt],
                                 stdout=subprocess.PIPE, cwd=HERE)
                for seed, fmt in ((0, "parquet"), (1, "arrow"), (2, "parquet"))]
    steps = [int(child.communicate()[0]) for child in children]
    assert all(child.returncode == 0 for child in children)
    ds = read_episodes(tmp_path)
    assert ds.num_steps == sum(steps) and min(steps) >= 6 * 2 * 100
    assert len({e.id_ for e in ds}) == len(ds)


def test_a_store_refuses_a_bad_block_and_changes_nothing(tmp_path):
    """Store.add_block() checks every row, lookback and leaf before it
    stores anything (its C loop then trusts them)."""
    from episode.offline import write_episodes
    from episode.replay import EpisodeReplayBuffer

    from test_offline_dataset import _cartpole

    write_episodes([_cartpole(seed) for seed in range(3)], tmp_path, format="arrow")
    (kind, block), = read_episodes(tmp_path).replay_items()
    assert kind == "block"
    buffer = EpisodeReplayBuffer(capacity=1000)
    store = buffer._store
    n = block["nrows"]
    bad = [
        {"rows": block["rows"] + n}, {"rows": -block["rows"] - 1},
        {"lengths": block["lengths"] + n}, {"lookbacks": block["lookbacks"] - 1},
        {"rows": block["rows"][:1]}, {"ids": [block["ids"][0]] * len(block["ids"])},
        {"nrows": n + 1}, {"nrows": -1}, {"metas": [None] * len(block["ids"])},
        {"tracks": {**block["tracks"], ("obs", None): [np.zeros((n, 3), np.float32)]}},
        {"tracks": {**block["tracks"], ("obs", None): [np.zeros((n - 1, 4), np.float32)]}},
        {"tracks": {**block["tracks"], ("obs", None): [np.zeros((n, 4), np.float64)]}},
        {"tracks": {("obs", None): block["tracks"][("obs", None)]}},
        {"tracks": {**block["tracks"], ("actions", None): [["x"] * n]}},
    ]
    for change in bad:
        with pytest.raises((ValueError, TypeError)):
            store.add_block(**{**block, **change})
        assert store.num_episodes == 0 and store.live_steps == 0
    store.add_block(**block)
    assert store.num_episodes == 3
    with pytest.raises(ValueError, match="stored already"):
        store.add_block(**block)
    assert store.num_episodes == 3


@pytest.mark.parametrize("column", ["id", "custom_data", "details"])
def test_a_packed_cell_that_does_not_unpack_fails_its_episode_only(tmp_path, column):
    """An episode table's cells are unpacked a column at a time; one that is
    not a stored value is named when its episode is read, and the other
    episodes still read (the check unchecked, as a user's verify=False)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from episode.offline import DatasetError

    files = _dataset(str(tmp_path / "d"), "parquet")
    table_path = next(p for p in files if p.endswith(".episodes.parquet"))
    table = pq.read_table(table_path)
    cells = table.column(column).to_pylist()
    cells[1] = b"\xc1"                     # a byte msgpack never uses
    index = table.schema.get_field_index(column)
    table = table.set_column(index, pa.field(column, pa.binary()), pa.array(cells, pa.binary()))
    pq.write_table(table, table_path)
    dataset = read_episodes(tmp_path / "d", verify=False)
    for i in (0, 2, 3):
        assert len(dataset[i]) == 6
    with pytest.raises(DatasetError, match=f"column '{column}', episode 1: "):
        dataset[1]
    read = []
    with pytest.raises(DatasetError, match=f"column '{column}', episode 1: "):
        for episode in dataset:
            read.append(episode)
    assert len(read) == 1
