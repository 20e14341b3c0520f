"""The Arrow IPC reader in C (episode._arrowipc) and from_minari's use of it.

* `read_file` gives what pyarrow reads from the same bytes (values, dtypes,
  shapes, schema and field metadata) for every column kind it takes, and
  None (pyarrow then reads the file) for every other layout.
* from_minari over Minari's and our own Arrow datasets gives the same
  episodes, and the same errors word for word, as with the reader switched
  off (every file through pyarrow).
* Garbage: every truncation of a small file, bit flips in its footer,
  schema, batch metadata and body, lying lengths and offsets: `read_file`
  gives None or exactly pyarrow's data, from_minari pyarrow's outcome, and
  nothing crashes (child processes).
* `read_episode_file`: a folder's one data file, or None.
"""
from __future__ import annotations

import json
import mmap
import os
import pathlib
import shutil
import types

import gymnasium as gym
import numpy as np
import pytest

from minari_tools import CASES as MINARI_CASES, done_flags as _flags, episode_buffers
from minari_tools import quiet_create as _quiet_create, run_child

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyarrow.ipc")
try:        # the reader's own tests need pyarrow only (the sanitizer run has no minari)
    import minari
    from minari.data_collector import EpisodeBuffer
except ImportError:
    minari = None
needs_minari = pytest.mark.skipif(minari is None, reason="needs minari (and pillow)")

from episode import SingleAgentEpisode, _arrowipc  # noqa: E402
from episode.offline import minari as minari_module  # noqa: E402
from episode.offline.minari import from_minari, to_minari  # noqa: E402

F32 = np.float32


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    return tmp_path


# -- pyarrow's reading, in read_file's terms ------------------------------------------

def _as_ours(array):
    """A pyarrow array as read_file gives it: numbers 1-D, fixed-size lists
    of numbers 2-D, structs dicts."""
    t = array.type
    if pa.types.is_struct(t):
        return {t.field(k).name: _as_ours(array.field(k)) for k in range(t.num_fields)}
    if pa.types.is_fixed_size_list(t):
        size = t.list_size
        values = array.values[array.offset * size:(array.offset + len(array)) * size]
        return values.to_numpy(zero_copy_only=False).reshape(len(array), size)
    return array.to_numpy(zero_copy_only=False)


def _field_metadata(fields, path=()):
    out = {}
    for field in fields:
        sub = path + (field.name,)
        if field.metadata:
            out[sub] = dict(field.metadata)
        t = field.type
        if pa.types.is_struct(t):
            out.update(_field_metadata([t.field(k) for k in range(t.num_fields)], sub))
        elif pa.types.is_fixed_size_list(t):
            out.update(_field_metadata([t.value_field], sub))
    return out


def pyarrow_reading(data):
    """(rows, columns, metadata, field metadata) as pyarrow reads `data`
    (one batch, fully validated); raises what pyarrow raises."""
    reader = pa.ipc.open_file(pa.py_buffer(data))
    if reader.num_record_batches != 1:
        raise ValueError(f"{reader.num_record_batches} batches")
    batch = reader.get_batch(0)
    batch.validate(full=True)
    schema = reader.schema
    columns = {name: _as_ours(batch.column(k)) for k, name in enumerate(schema.names)}
    return batch.num_rows, columns, schema.metadata, _field_metadata(list(schema))


def same_reading(a, b, where="columns"):
    """A difference between two readings (None: the same)."""
    if type(a) is dict or type(b) is dict:
        if type(a) is not dict or type(b) is not dict:
            return f"{where}: {type(a).__name__} vs {type(b).__name__}"
        if list(a) != list(b):
            return f"{where}: keys {list(a)} vs {list(b)}"
        for key in a:
            diff = same_reading(a[key], b[key], f"{where}[{key!r}]")
            if diff:
                return diff
        return None
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
            return f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape} or other values"
        return None
    return None if a == b else f"{where}: {a!r:.80} vs {b!r:.80}"


def compare(data):
    """"fast" (read_file took `data` and gave pyarrow's reading of it),
    "fallback" (read_file gave None) or "MISMATCH ..."."""
    ours = _arrowipc.read_file(data)
    if ours is None:
        return "fallback"
    try:
        theirs = pyarrow_reading(data)
    except Exception as exc:       # pyarrow refuses what read_file took
        return f"MISMATCH pyarrow raised {type(exc).__name__}: {exc}"[:300]
    rows, columns, metadata, field_meta = ours
    # (An empty custom_metadata is None here, {} in pyarrow: the same to its readers.)
    for what, x, y in (("rows", rows, theirs[0]), ("metadata", metadata or None, theirs[2] or None),
                       ("field metadata", field_meta, theirs[3])):
        if x != y:
            return f"MISMATCH {what}: {x!r:.100} vs {y!r:.100}"
    diff = same_reading(columns, theirs[1])
    return f"MISMATCH {diff}" if diff else "fast"


def _ipc_bytes(table_or_batch, metadata=None, **options):
    schema = table_or_batch.schema
    if metadata is not None:
        schema = schema.with_metadata(metadata)
    sink = pa.BufferOutputStream()
    opts = pa.ipc.IpcWriteOptions(**options) if options else None
    with pa.ipc.new_file(sink, schema, options=opts) as writer:
        if isinstance(table_or_batch, pa.Table):
            writer.write_table(table_or_batch)
        else:
            writer.write_batch(table_or_batch.replace_schema_metadata(schema.metadata))
    return sink.getvalue().to_pybytes()


def _fsl(values, size):
    return pa.FixedSizeListArray.from_arrays(pa.array(values), size)


# -- read_file against pyarrow: the column kinds it takes -----------------------------

NUMBER_TYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64", "bool"]


@pytest.mark.parametrize("rows", [0, 1, 7, 8, 9, 64, 133])
@pytest.mark.parametrize("dtype", NUMBER_TYPES)
def test_numbers_and_their_fixed_size_lists_read_as_pyarrow_does(dtype, rows):
    r = np.random.default_rng(rows)
    values = (r.integers(0, 2, rows * 3).astype(bool) if dtype == "bool"
              else (r.standard_normal(rows * 3) * 50).astype(dtype))
    batch = pa.record_batch({
        "flat": pa.array(values[:rows]),
        "list3": _fsl(values, 3),
        "list1": _fsl(values[:rows], 1),
    })
    data = _ipc_bytes(batch)
    assert compare(data) == "fast"
    got_rows, columns, _, _ = _arrowipc.read_file(data)
    assert got_rows == rows
    assert columns["flat"].dtype == np.dtype(dtype) and columns["flat"].shape == (rows,)
    assert columns["list3"].shape == (rows, 3)
    assert np.array_equal(columns["list3"].ravel(), values, equal_nan=dtype != "bool")


def test_structs_nest_in_schema_order_with_their_metadata():
    rows = 5
    r = np.random.default_rng(1)
    inner = pa.StructArray.from_arrays(
        [pa.array(r.integers(0, 9, rows)), _fsl(r.standard_normal(rows * 2).astype(F32), 2)],
        fields=[pa.field("z", pa.int64()),
                pa.field("a", pa.list_(pa.float32(), 2), metadata={"shape": "2"})])
    outer = pa.StructArray.from_arrays(
        [inner, pa.array(r.integers(0, 2, rows).astype(bool)), pa.StructArray.from_arrays(
            [pa.array(np.arange(rows, dtype=np.int8))], names=["only"])],
        fields=[pa.field("b", inner.type), pa.field("0", pa.bool_(), metadata={"k": "v"}),
                pa.field("empty_ok", pa.struct([pa.field("only", pa.int8())]))])
    batch = pa.record_batch({"observations": outer, "rewards": pa.array(np.ones(rows))})
    data = _ipc_bytes(batch, metadata={"id_": "ep-7", "other": "x"})
    assert compare(data) == "fast"
    _, columns, metadata, field_meta = _arrowipc.read_file(data)
    assert list(columns["observations"]) == ["b", "0", "empty_ok"]
    assert list(columns["observations"]["b"]) == ["z", "a"]
    assert metadata == {b"id_": b"ep-7", b"other": b"x"}
    assert field_meta == {("observations", "b", "a"): {b"shape": b"2"},
                          ("observations", "0"): {b"k": b"v"}}


def test_the_arrays_view_the_files_bytes_read_only():
    rows = 6
    batch = pa.record_batch({"x": pa.array(np.arange(rows, dtype=np.float64)),
                             "l": _fsl(np.arange(rows * 2, dtype=np.int32), 2),
                             "b": pa.array(np.arange(rows) % 2 == 0)})
    data = _ipc_bytes(batch)
    _, columns, _, _ = _arrowipc.read_file(data)
    buffer = np.frombuffer(data, np.uint8)
    for name in ("x", "l"):
        assert np.shares_memory(columns[name], buffer)
        assert not columns[name].flags.writeable
        with pytest.raises(ValueError):
            columns[name][0] = 1
    # Booleans are bits in the file: unpacked into a new (writable) array, as
    # pyarrow's to_numpy gives them.
    assert not np.shares_memory(columns["b"], buffer) and columns["b"].flags.writeable
    del data, buffer
    assert columns["x"].tolist() == list(range(rows))      # kept alive by the arrays


def test_an_mmap_is_read_in_place_and_kept_open(tmp_path):
    batch = pa.record_batch({"x": pa.array(np.arange(10, dtype=np.int64))})
    file = tmp_path / "f.arrow"
    file.write_bytes(_ipc_bytes(batch))
    with open(file, "rb") as fh:
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    _, columns, _, _ = _arrowipc.read_file(mapped)
    assert columns["x"].tolist() == list(range(10))
    with pytest.raises(BufferError):          # the arrays still look at it
        mapped.close()
    del columns
    mapped.close()
    assert _arrowipc.read_file(bytearray(file.read_bytes()))[1]["x"].tolist() == list(range(10))
    assert _arrowipc.read_file(memoryview(file.read_bytes())[::2]) is None   # not contiguous
    with pytest.raises(TypeError):
        _arrowipc.read_file(12)


# -- read_file: everything else is left to pyarrow ------------------------------------

def _fallback_files():
    rows = 4
    ints = pa.array(np.arange(rows, dtype=np.int64))
    yield "strings", pa.record_batch({"s": pa.array(["a", "bb", "", "c"])})
    yield "binary", pa.record_batch({"b": pa.array([b"x"] * rows)})
    yield "list", pa.record_batch({"l": pa.array([[1, 2]] * rows, pa.list_(pa.int64()))})
    yield "large_list", pa.record_batch({"l": pa.array([[1]] * rows, pa.large_list(pa.int64()))})
    yield "nulls", pa.record_batch({"x": pa.array([1, None, 3, 4])})
    yield "nulls_in_a_list", pa.record_batch({"l": _fsl(pa.array([1, None, 3, 4]), 2)})
    yield "null_lists", pa.record_batch({"l": pa.array([[1], None, [2], [3]],
                                                       pa.list_(pa.int64(), 1))})
    yield "null_struct_rows", pa.record_batch({"s": pa.array(
        [{"a": 1}, None, {"a": 2}, {"a": 3}], pa.struct([("a", pa.int64())]))})
    yield "dictionary", pa.record_batch({"d": pa.array(["a", "b", "a", "a"]).dictionary_encode()})
    yield "timestamp", pa.record_batch({"t": pa.array(np.arange(rows), pa.timestamp("s"))})
    yield "date", pa.record_batch({"d": pa.array(np.arange(rows, dtype=np.int32), pa.date32())})
    yield "decimal", pa.record_batch({"d": pa.array([1, 2, 3, 4], pa.decimal128(5, 0))})
    yield "null_type", pa.record_batch({"n": pa.nulls(rows)})
    yield "list_of_lists", pa.record_batch({"l": pa.FixedSizeListArray.from_arrays(
        _fsl(np.arange(rows * 4), 2), 2)})
    yield "list_of_structs", pa.record_batch({"l": pa.FixedSizeListArray.from_arrays(
        pa.StructArray.from_arrays([pa.array(np.arange(rows * 2))], names=["a"]), 2)})
    yield "empty_lists", pa.record_batch({"l": pa.array([[]] * rows, pa.list_(pa.int64(), 0))})
    yield "repeated_names", pa.RecordBatch.from_arrays([ints, ints], names=["x", "x"])
    yield "repeated_struct_names", pa.record_batch({"s": pa.StructArray.from_arrays(
        [ints, ints], names=["a", "a"])})
    yield "a_map", pa.record_batch({"m": pa.array([[("k", 1)]] * rows,
                                                  pa.map_(pa.string(), pa.int64()))})


@pytest.mark.parametrize("name, batch", list(_fallback_files()), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_other_layouts_are_left_to_pyarrow(name, batch):
    data = _ipc_bytes(batch)
    pyarrow_reading(data)                     # a good file, which pyarrow reads
    assert _arrowipc.read_file(data) is None


def test_compressed_files_and_many_batches_are_left_to_pyarrow():
    batch = pa.record_batch({"x": pa.array(np.arange(100, dtype=np.int64))})
    for codec in ("lz4", "zstd"):
        data = _ipc_bytes(batch, compression=codec)
        pyarrow_reading(data)
        assert _arrowipc.read_file(data) is None
    table = pa.Table.from_batches([batch, batch])
    assert _arrowipc.read_file(_ipc_bytes(table)) is None
    assert _arrowipc.read_file(_ipc_bytes(table.slice(0, 0))) is None     # no batch
    # The stream format, Parquet and foreign bytes are not IPC files.
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    import pyarrow.parquet as pq
    parquet = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_batches([batch]), parquet)
    for data in (sink.getvalue().to_pybytes(), parquet.getvalue().to_pybytes(), b"",
                 b"ARROW1", b"ARROW1\x00\x00" + b"\x00" * 10 + b"ARROW1", b"x" * 100):
        assert _arrowipc.read_file(data) is None


def test_a_file_of_metadata_version_4_is_read():
    batch = pa.record_batch({"x": pa.array(np.arange(3, dtype=np.int64))})
    v4 = _ipc_bytes(batch, metadata_version=pa.ipc.MetadataVersion.V4)
    assert compare(v4) == "fast"


# -- from_minari: the same episodes and errors with and without read_file -------------

def _without_reader(monkeypatch):
    """from_minari with _arrowipc switched off: every file through pyarrow."""
    stub = types.SimpleNamespace(read_file=lambda data: None,
                                 read_episode_file=lambda fd, i: None)
    monkeypatch.setattr(minari_module, "_arrowipc", stub)


def _outcome(read):
    try:
        episodes = read()
    except ValueError as exc:
        return "error", str(exc)
    return "ok", episodes


def _state_of(ep):
    obs, acts = ep.get_observations(), ep.get_actions()

    def leaves(x):
        if isinstance(x, dict):
            return {k: leaves(v) for k, v in x.items()}
        if isinstance(x, tuple):
            return tuple(leaves(v) for v in x)
        x = np.asarray(x)
        return (x.dtype.str, x.shape, x.tobytes())
    infos = ep.get_infos()
    return (type(ep), ep.id_, len(ep), ep.is_terminated, ep.is_truncated, ep.t_started,
            ep.observation_space, ep.action_space, leaves(obs), leaves(acts),
            leaves(ep.get_rewards()), repr(infos), [[type(v) for v in i.values()] for i in infos],
            {k: leaves(ep.get_extra_model_outputs(k)) for k in ep.extra_model_outputs})


def assert_same_outcome(fast, slow):
    assert fast[0] == slow[0], (fast, slow)
    if fast[0] == "error":
        assert fast[1] == slow[1]
        return
    assert [_state_of(e) for e in fast[1]] == [_state_of(e) for e in slow[1]]


def _read_both(monkeypatch, source, **kw):
    fast = _outcome(lambda: from_minari(source, **kw))
    with monkeypatch.context() as m:
        _without_reader(m)
        slow = _outcome(lambda: from_minari(source, **kw))
    assert_same_outcome(fast, slow)
    return fast


# Minari's datasets of these tests (minari_tools.CASES): of numbers, which
# _arrowipc reads, and of strings ("text_infos"), which pyarrow reads.
CASES = ["box_2d_infos", "cartpole", "dict_tuple", "small_ints", "text_infos"]


def _minari_dataset(case, lengths, dataset_id, seed=0):
    obs_space, act_space, buffers = episode_buffers(case, lengths, seed)
    ds = _quiet_create(dataset_id, buffers, observation_space=obs_space,
                       action_space=act_space, data_format="arrow", author="a")
    return pathlib.Path(ds.storage.data_path), buffers


def _counting(monkeypatch):
    """Counts read_file's answers while from_minari runs."""
    counts = {"fast": 0, "fallback": 0}
    real = _arrowipc.read_file

    def read_file(data):
        out = real(data)
        counts["fast" if out is not None else "fallback"] += 1
        return out
    monkeypatch.setattr(minari_module, "_arrowipc", types.SimpleNamespace(
        read_file=read_file, read_episode_file=_arrowipc.read_episode_file))
    return counts


@needs_minari
@pytest.mark.parametrize("case", sorted(CASES))
def test_minari_datasets_read_the_same_either_way(root, monkeypatch, case):
    data, buffers = _minari_dataset(case, [5, 1, 7, 3, 2], f"ipc/{case}-v0")
    counts = _counting(monkeypatch)
    outcome = _read_both(monkeypatch, f"ipc/{case}-v0")
    assert outcome[0] == "ok" and len(outcome[1]) == 5
    # The numeric cases go through read_file, each file once; the others
    # never reach it (their spaces hold strings or pictures).
    assert counts == ({"fast": 0, "fallback": 0} if case == "text_infos" else {"fast": 5, "fallback": 0})
    theirs = list(minari.load_dataset(f"ipc/{case}-v0").iterate_episodes())
    for ep, ed in zip(outcome[1], theirs):
        assert len(ep) == len(ed.rewards)
        assert np.array_equal(ep.get_rewards(), ed.rewards)
        assert ep.is_numpy
    _read_both(monkeypatch, f"ipc/{case}-v0", episode_indices=[4, 0, 4])


def test_our_datasets_with_ids_and_extras_read_the_same_either_way(root, monkeypatch):
    space = gym.spaces.Dict({"v": gym.spaces.Box(-1, 1, (2,), F32),
                             "k": gym.spaces.Discrete(5)})
    r = np.random.default_rng(2)
    episodes = []
    for n in (3, 1, 4):
        ep = SingleAgentEpisode(id_=f"ep{n}", observation_space=space,
                                action_space=gym.spaces.Box(-1, 1, (2,), F32))
        ep.add_env_reset({"v": np.zeros(2, F32), "k": 1}, {"a": 1.0})
        for t in range(n):
            ep.add_env_step({"v": r.uniform(-1, 1, 2).astype(F32), "k": t % 5},
                            r.uniform(-1, 1, 2).astype(F32), float(t), {"a": 2.0 + t},
                            truncated=t == n - 1,
                            extra_model_outputs={"logp": F32(-t), "vf": np.full(3, t, F32)})
        episodes.append(ep)
    path = to_minari(episodes, "ours/extras-v0", data_format="arrow")
    counts = _counting(monkeypatch)
    outcome = _read_both(monkeypatch, path)
    assert counts["fast"] == 3
    assert [e.id_ for e in outcome[1]] == ["ep3", "ep1", "ep4"]
    assert outcome[1][2].get_extra_model_outputs("vf").shape == (4, 3)


def _rewrite(file, change):
    table = pa.ipc.open_file(file.read_bytes()).read_all()
    table = change(table)
    with pa.ipc.new_file(file, table.schema) as writer:
        writer.write_table(table)


def _set(table, name, array):
    return table.set_column(table.schema.get_field_index(name), name, array)


DAMAGES = {
    # name: a change of one episode's table; each is read through pyarrow in
    # the end, and the error (or the episodes) must be the same either way.
    "rewards_as_strings": lambda t: _set(t, "rewards", t["rewards"].cast(pa.string())),
    "rewards_as_float32": lambda t: _set(t, "rewards", t["rewards"].cast(pa.float32())),
    "rewards_as_lists": lambda t: _set(t, "rewards", pa.FixedSizeListArray.from_arrays(
        t["rewards"].combine_chunks(), 1)),
    "rewards_as_lists_of_2": lambda t: _set(t, "rewards", pa.FixedSizeListArray.from_arrays(
        pa.array(np.repeat(t["rewards"].to_numpy(), 2)), 2)),
    "no_rewards": lambda t: t.drop_columns(["rewards"]),
    "no_actions": lambda t: t.drop_columns(["actions"]),
    "terminations_as_ints": lambda t: _set(t, "terminations", t["terminations"].cast(pa.int8())),
    "terminations_of_2": lambda t: _set(t, "terminations", pa.array(
        np.full(len(t), 2, np.int8))),
    "early_end": lambda t: _set(t, "terminations", pa.array(np.arange(len(t)) == 0)),
    "terminations_as_floats": lambda t: _set(t, "terminations",
                                             t["terminations"].cast(pa.float64())),
    "observations_of_5": lambda t: _set(t, "observations", pa.FixedSizeListArray.from_arrays(
        pa.array(np.zeros(len(t) * 5, F32)), 5)),
    "observations_as_float64": lambda t: _set(t, "observations", t["observations"].cast(
        pa.list_(pa.float64(), 4))),
    "observations_flat": lambda t: _set(t, "observations", pa.array(np.zeros(len(t), F32))),
    "observations_as_struct": lambda t: _set(t, "observations", pa.StructArray.from_arrays(
        [pa.array(np.zeros(len(t), F32))], names=["a"])),
    "actions_as_floats": lambda t: _set(t, "actions", t["actions"].cast(pa.float64())),
    "actions_as_bools": lambda t: _set(t, "actions", t["actions"].cast(pa.bool_())),
    "no_rows": lambda t: t.slice(0, 0),
    "infos_not_a_struct": lambda t: t.append_column("infos", pa.array(np.zeros(len(t)))),
    "infos_with_a_bad_shape": lambda t: t.append_column("infos", pa.StructArray.from_arrays(
        [pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(len(t) * 4)), 4)],
        fields=[pa.field("a", pa.list_(pa.float64(), 4), metadata={"shape": "3"})])),
    "infos_with_a_scalar_shape": lambda t: t.append_column("infos", pa.StructArray.from_arrays(
        [pa.FixedSizeListArray.from_arrays(pa.array(np.arange(len(t), dtype=np.float64)), 1)],
        fields=[pa.field("a", pa.list_(pa.float64(), 1), metadata={"shape": ""})])),
    "infos_with_strings": lambda t: t.append_column("infos", pa.StructArray.from_arrays(
        [pa.array(["s"] * len(t))], names=["s"])),
    "extras_of_structs": lambda t: t.append_column(
        "extra_model_outputs", pa.StructArray.from_arrays(
            [pa.StructArray.from_arrays([pa.array(np.zeros(len(t)))], names=["x"])], names=["d"])),
    "extras_of_bools": lambda t: t.append_column(
        "extra_model_outputs", pa.StructArray.from_arrays(
            [pa.array(np.zeros(len(t), bool))], names=["b"])),
    "id_not_utf8": lambda t: t.replace_schema_metadata({b"id_": b"\xff\xfe"}),
    "an_id": lambda t: t.replace_schema_metadata({b"id_": "épisode".encode()}),
}


@needs_minari
@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_odd_files_give_the_same_episodes_or_error_either_way(root, monkeypatch, damage):
    data, _ = _minari_dataset("cartpole", [4, 5, 3], f"odd/{damage}-v0", seed=3)
    _rewrite(data / "1" / "part-0.arrow", DAMAGES[damage])
    _read_both(monkeypatch, f"odd/{damage}-v0", episode_indices=[0, 1, 2])
    _read_both(monkeypatch, f"odd/{damage}-v0", episode_indices=[1])
    outcome = _read_both(monkeypatch, f"odd/{damage}-v0")
    if damage in READ_ALIKE:
        assert outcome[0] == "ok"
    else:
        assert outcome[0] == "error" and "1/part-0.arrow: episode 1: " in outcome[1].replace(
            os.sep, "/")


# The changes that still make an episode (as its spaces allow them).
READ_ALIKE = {"an_id", "extras_of_bools", "infos_with_a_scalar_shape", "infos_with_strings",
              "observations_as_float64", "rewards_as_float32", "rewards_as_lists",
              "terminations_as_ints"}
@needs_minari
def test_folders_that_are_not_one_file_read_the_same_either_way(root, monkeypatch):
    data, _ = _minari_dataset("cartpole", [4, 5, 3, 2, 6], "folders/x-v0", seed=4)
    # Two files of one episode (read and joined by pyarrow), hidden files,
    # a folder in place of the file, an empty folder, a missing one.
    (data / "1" / "part-1.arrow").write_bytes((data / "1" / "part-0.arrow").read_bytes())
    _rewrite(data / "1" / "part-0.arrow", lambda t: _set(_set(
        t, "terminations", pa.array(np.zeros(len(t), bool))), "truncations",
        pa.array(np.zeros(len(t), bool))))
    (data / "2" / "_hidden").write_bytes(b"x")
    (data / "2" / ".dot").write_bytes(b"x")
    (data / "2" / "metadata.json.bak").write_bytes(b"x")
    outcome = _read_both(monkeypatch, "folders/x-v0", episode_indices=[0, 1, 2])
    assert [len(e) for e in outcome[1]] == [4, 11, 3]
    (data / "3" / "part-0.arrow").unlink()
    (data / "3" / "part-0.arrow").mkdir()
    for k, want in (([3], "a folder inside its folder"), ([0, 3], "a folder inside")):
        outcome = _read_both(monkeypatch, "folders/x-v0", episode_indices=k)
        assert outcome[0] == "error" and want in outcome[1]
    (data / "3" / "part-0.arrow").rmdir()
    assert "holds no data file" in _read_both(monkeypatch, "folders/x-v0",
                                              episode_indices=[3])[1]
    shutil.rmtree(data / "3")
    assert "the episode is missing" in _read_both(monkeypatch, "folders/x-v0",
                                                  episode_indices=[2, 3, 4])[1]
@needs_minari
def test_episodes_read_by_either_path_keep_their_order_and_errors(root, monkeypatch):
    # Files the reader takes, between files it leaves to pyarrow (strings in
    # the infos) and joins: the episodes come in order, and the first
    # damaged one in order is named.
    data, _ = _minari_dataset("cartpole", [3, 4, 5, 2, 6, 3], "mixed/x-v0", seed=5)
    strings = DAMAGES["infos_with_strings"]
    for k in (1, 2, 4):
        _rewrite(data / str(k) / "part-0.arrow", strings)
    counts = _counting(monkeypatch)
    outcome = _read_both(monkeypatch, "mixed/x-v0")
    assert [len(e) for e in outcome[1]] == [3, 4, 5, 2, 6, 3]
    assert counts == {"fast": 3, "fallback": 3}     # strings: left to pyarrow
    assert outcome[1][1].get_infos(0) == {"s": "s"}
    _rewrite(data / "2" / "part-0.arrow", DAMAGES["early_end"])
    (data / "4" / "part-0.arrow").write_bytes(b"\x00" * 64)
    outcome = _read_both(monkeypatch, "mixed/x-v0")
    assert "episode 2: terminations ends the episode at step 0" in outcome[1]
    outcome = _read_both(monkeypatch, "mixed/x-v0", episode_indices=[0, 1, 3, 4, 2])
    assert "episode 4: not a readable arrow file" in outcome[1]


# -- garbage, in child processes: None or pyarrow's data, never a crash ---------------

CHILD = r"""
import faulthandler, json, sys
faulthandler.enable()
import numpy as np
import test_offline_minari_ipc as t
spec = json.loads(sys.argv[1])
base = open(spec["file"], "rb").read()
counts = {}
for name, data in t.mutations(base, spec["kind"], spec["seed"]):
    outcome = t.compare(data)
    key = outcome.split(" ")[0]
    counts[key] = counts.get(key, 0) + 1
    if key == "MISMATCH":
        print("MISMATCH", name, outcome, flush=True)
print("COUNTS", json.dumps(counts), flush=True)
print("DONE", flush=True)
"""


def _i32(v):
    return int(v).to_bytes(4, "little", signed=v < 0)


def _i64(v):
    return int(v).to_bytes(8, "little", signed=v < 0)


def _regions(data):
    """(name, start, stop) of a one-batch IPC file's parts: the schema
    message, the batch's metadata, its body, the footer."""
    footer = int.from_bytes(data[-10:-6], "little")
    schema = 8 + 8 + int.from_bytes(data[12:16], "little")
    meta = 8 + int.from_bytes(data[schema + 4:schema + 8], "little")
    return [("schema", 8, schema), ("batch_meta", schema, schema + meta),
            ("body", schema + meta, len(data) - 10 - footer),
            ("footer", len(data) - 10 - footer, len(data))]


LIES = [0, 1, -1, 7, 8, -8, 16, 255, 4096, 2 ** 31 - 1, -2 ** 31, 2 ** 32 - 1, 2 ** 62,
        2 ** 63 - 1, -2 ** 63]


def mutations(data, kind, seed):
    """(name, bytes) variants of `data`: "cuts" (every truncation), "flips"
    (one bit, or a byte, in each region, from `seed`), "lies" (each aligned
    int32 and int64 of the metadata set to a lying value)."""
    r = np.random.default_rng(seed)
    if kind == "cuts":
        for n in range(len(data)):
            yield f"cut-{n}", data[:n]
        return
    regions = _regions(data)
    if kind == "flips":
        for name, start, stop in regions:
            for k in range(200):
                pos = int(r.integers(start, stop))
                out = bytearray(data)
                if k % 4 == 3:
                    out[pos] = int(r.integers(0, 256))
                else:
                    out[pos] ^= 1 << int(r.integers(0, 8))
                yield f"{name}-{pos}-{k}", bytes(out)
        return
    if kind == "lies":
        for name, start, stop in regions:
            if name == "body":
                continue
            for pos in range(start - start % 4, stop - 4, 4):
                for value in LIES:
                    for width, pack in ((4, _i32), (8, _i64)):
                        if pos + width > len(data) or (width == 4 and abs(value) >= 2 ** 32):
                            continue
                        if width == 4 and value >= 2 ** 31:
                            value = value - 2 ** 32
                        out = bytearray(data)
                        out[pos:pos + width] = pack(value)
                        yield f"{name}-{pos}-{width}-{value}", bytes(out)
        return
    raise ValueError(kind)


def _run_child(spec, script=CHILD, timeout=600):
    """The COUNTS a child `script` (CHILD or FROM_MINARI_CHILD) prints for
    `spec`; the test fails on any MISMATCH it prints."""
    lines = run_child(script, spec, timeout).splitlines()
    mismatches = [line for line in lines if line.startswith("MISMATCH")]
    assert not mismatches, "\n".join(mismatches[:20])
    (counts,) = [json.loads(line[7:]) for line in lines if line.startswith("COUNTS ")]
    return counts


def _small_files(tmp_path):
    """Small files of Minari's layout: written by Minari when it is
    installed, and by pyarrow (struct columns, fixed-size lists of bools,
    schema and field metadata)."""
    out = {}
    r = np.random.default_rng(9)
    if minari is not None:
        for case in ("cartpole", "dict_tuple", "box_2d_infos"):
            data, _ = _minari_dataset(case, [3], f"small/{case}-v0")
            out[case] = data / "0" / "part-0.arrow"
    batch = pa.record_batch({
        "observations": _fsl(r.standard_normal(16).astype(F32), 4),
        "actions": pa.array(np.array([0, 1, 1, 0])), "rewards": pa.array(np.ones(4)),
        "terminations": pa.array(np.arange(4) == 2), "truncations": pa.array(np.zeros(4, bool)),
        "infos": pa.StructArray.from_arrays(
            [_fsl(np.arange(16.0), 4), pa.array(np.arange(4, dtype=np.int8)),
             _fsl(np.arange(8) % 3 == 0, 2)],
            fields=[pa.field("arr", pa.list_(pa.float64(), 4), metadata={"shape": "2,2"}),
                    pa.field("i", pa.int8()), pa.field("bits", pa.list_(pa.bool_(), 2))])})
    file = tmp_path / "layout.arrow"
    file.write_bytes(_ipc_bytes(batch))
    out["layout"] = file
    batch = pa.record_batch({
        "observations": pa.StructArray.from_arrays(
            [_fsl(r.standard_normal(6).astype(F32), 2), pa.array([True, False, True])],
            fields=[pa.field("a", pa.list_(pa.float32(), 2), metadata={"shape": "2"}),
                    pa.field("b", pa.bool_())]),
        "rewards": pa.array([1.0, 2.0, 0.0])})
    file = tmp_path / "struct.arrow"
    file.write_bytes(_ipc_bytes(batch, metadata={"id_": "x"}))
    out["struct"] = file
    return out


def test_every_truncation_of_a_small_file_is_left_to_pyarrow(root, tmp_path):
    for name, file in _small_files(tmp_path).items():
        data = file.read_bytes()
        assert compare(data) == "fast"
        counts = _run_child({"file": str(file), "kind": "cuts", "seed": 0})
        assert counts == {"fallback": len(data)}, name


@pytest.mark.parametrize("seed", range(3))
def test_bit_flips_give_none_or_pyarrows_data(root, tmp_path, seed):
    total = {}
    for name, file in _small_files(tmp_path).items():
        counts = _run_child({"file": str(file), "kind": "flips", "seed": seed})
        for key, n in counts.items():
            total[key] = total.get(key, 0) + n
    # Flips in the body leave readable files (their values change); most
    # flips in the metadata do not.
    assert total.get("fast", 0) > 0 and total.get("fallback", 0) > 0, total


def test_lying_lengths_and_offsets_give_none_or_pyarrows_data(root, tmp_path):
    for name, file in _small_files(tmp_path).items():
        counts = _run_child({"file": str(file), "kind": "lies", "seed": 0})
        assert counts.get("fallback", 0) > 0, (name, counts)


FROM_MINARI_CHILD = r"""
import faulthandler, json, os, shutil, sys, types
faulthandler.enable()
import numpy as np
import test_offline_minari_ipc as t
from episode.offline import minari as module
from episode.offline.minari import from_minari
from episode import _arrowipc
spec = json.loads(sys.argv[1])
base = open(spec["file"], "rb").read()
off = types.SimpleNamespace(read_file=lambda d: None, read_episode_file=lambda fd, i: None)
counts = {}
for name, data in t.mutations(base, spec["kind"], spec["seed"]):
    with open(spec["file"], "wb") as fh:
        fh.write(data)
    fast = t._outcome(lambda: from_minari(spec["dataset"]))
    module._arrowipc = off
    try:
        slow = t._outcome(lambda: from_minari(spec["dataset"]))
    finally:
        module._arrowipc = _arrowipc
    try:
        t.assert_same_outcome(fast, slow)
    except AssertionError as exc:
        print("MISMATCH", name, str(exc)[:300].replace("\n", " "), flush=True)
    counts[fast[0]] = counts.get(fast[0], 0) + 1
with open(spec["file"], "wb") as fh:
    fh.write(base)
print("COUNTS", json.dumps(counts), flush=True)
print("DONE", flush=True)
"""


@needs_minari
@pytest.mark.parametrize("case", ["cartpole", "box_2d_infos"])
def test_damaged_files_give_from_minari_the_same_outcome_either_way(root, case):
    data, _ = _minari_dataset(case, [3, 4], f"flip/{case}-v0")
    spec = {"file": str(data / "1" / "part-0.arrow"), "kind": "flips", "seed": 5,
            "dataset": str(data)}
    counts = _run_child(spec, FROM_MINARI_CHILD, timeout=900)
    assert counts.get("ok", 0) > 0 and counts.get("error", 0) > 0, counts


# -- read_episode_file ----------------------------------------------------------------

def test_read_episode_file_finds_a_folders_one_data_file(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (tmp_path / "0").mkdir()
        (tmp_path / "0" / "part-0.arrow").write_bytes(b"abc")
        (tmp_path / "0" / "metadata.json").write_bytes(b"{}")
        (tmp_path / "0" / "_x").write_bytes(b"")
        (tmp_path / "0" / ".y").write_bytes(b"")
        assert _arrowipc.read_episode_file(fd, 0) == ("part-0.arrow", b"abc")
        big = np.random.default_rng(0).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
        (tmp_path / "1").mkdir()
        (tmp_path / "1" / "é.arrow").write_bytes(big)          # left to the caller to read
        assert _arrowipc.read_episode_file(fd, 1) == ("é.arrow", None)
        (tmp_path / "1" / "é.arrow").write_bytes(big[:1 << 16])
        assert _arrowipc.read_episode_file(fd, 1) == ("é.arrow", None)
        (tmp_path / "1" / "é.arrow").write_bytes(big[:(1 << 16) - 1])
        assert _arrowipc.read_episode_file(fd, 1) == ("é.arrow", big[:(1 << 16) - 1])
        (tmp_path / "2").mkdir()
        (tmp_path / "2" / "empty").write_bytes(b"")
        assert _arrowipc.read_episode_file(fd, 2) == ("empty", b"")
        (tmp_path / "3").mkdir()                                   # no data file
        (tmp_path / "3" / "metadata.json").write_bytes(b"{}")
        (tmp_path / "4").mkdir()                                   # two
        (tmp_path / "4" / "a").write_bytes(b"1")
        (tmp_path / "4" / "b").write_bytes(b"2")
        (tmp_path / "5").mkdir()                                   # a folder, not a file
        (tmp_path / "5" / "sub").mkdir()
        (tmp_path / "6").write_bytes(b"a file, not a folder")
        many = tmp_path / "7"
        many.mkdir()
        for k in range(300):                                       # listed in several reads
            (many / f"_ignored-{k:040d}").write_bytes(b"")
        (many / "data").write_bytes(b"d")
        assert _arrowipc.read_episode_file(fd, 7) == ("data", b"d")
        for index in (3, 4, 5, 6, 8, -1, 2 ** 62):
            assert _arrowipc.read_episode_file(fd, index) is None, index
        assert _arrowipc.read_episode_file(-1, 0) is None         # not a descriptor
    finally:
        os.close(fd)
    with pytest.raises(OverflowError):
        _arrowipc.read_episode_file(fd, 2 ** 64)
@needs_minari
def test_the_data_folders_descriptor_is_closed(root):
    data, _ = _minari_dataset("cartpole", [2, 3], "fd/x-v0")
    fds = "/proc/self/fd"
    before = set(os.listdir(fds)) if os.path.isdir(fds) else None
    from_minari("fd/x-v0")
    (data / "1").rename(data / "1x")
    with pytest.raises(ValueError, match="the episode is missing"):
        from_minari("fd/x-v0")
    if before is not None:
        assert set(os.listdir(fds)) == before


@needs_minari
@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_an_infos_shape_is_each_files_own(root, monkeypatch, fmt):
    # Episode 1's infos name another row shape than episode 0's: read one by
    # one, as pyarrow's joined reading once read it under episode 0's.
    obs_space, act_space, make = MINARI_CASES["cartpole"]
    r = np.random.default_rng(6)
    buffers = []
    for n in (3, 4, 2):
        obs, actions, _ = make(r, n)
        buffers.append(EpisodeBuffer(observations=obs, actions=actions, rewards=list(np.ones(n)),
                                     terminations=_flags(n, True), truncations=_flags(n, False),
                                     infos={"arr": r.standard_normal((n + 1, 2, 2))}))
    ds = _quiet_create(f"shape/x-{fmt}-v0", buffers, observation_space=obs_space,
                       action_space=act_space, data_format=fmt)
    file = pathlib.Path(ds.storage.data_path) / "1" / f"part-0.{fmt}"
    if fmt == "arrow":
        table = pa.ipc.open_file(file.read_bytes()).read_all()
    else:
        import pyarrow.parquet as pq
        table = pq.read_table(file)
    infos = table["infos"].combine_chunks()
    field = infos.type.field(0).with_metadata({"shape": "4"})
    table = _set(table, "infos", pa.StructArray.from_arrays([infos.field(0)], fields=[field]))
    if fmt == "arrow":
        with pa.ipc.new_file(file, table.schema) as writer:
            writer.write_table(table)
    else:
        pq.write_table(table, file)
    outcome = _read_both(monkeypatch, f"shape/x-{fmt}-v0")
    assert [e.get_infos(1)["arr"].shape for e in outcome[1]] == [(2, 2), (4,), (2, 2)]
    with monkeypatch.context() as m:
        m.setattr(minari_module, "_JOINED_BYTES", 0)
        assert_same_outcome(outcome, _outcome(lambda: from_minari(f"shape/x-{fmt}-v0")))


def test_large_episode_files_read_the_same_either_way(root, monkeypatch):
    # Files past 64 KiB are read by Python at their size, then parsed alike.
    r = np.random.default_rng(12)
    episodes = []
    for n in (5000, 3, 2500):
        ep = SingleAgentEpisode(observation_space=gym.spaces.Box(-5, 5, (4,), F32),
                                action_space=gym.spaces.Discrete(2))
        ep.add_env_reset(np.zeros(4, F32), {})
        for t in range(n):
            ep.add_env_step(r.uniform(-5, 5, 4).astype(F32), t % 2, 1.0, {},
                            terminated=t == n - 1)
        episodes.append(ep)
    path = to_minari(episodes, "large/x-v0", data_format="arrow")
    sizes = [(pathlib.Path(path) / "data" / str(k) / "part-0.arrow").stat().st_size
             for k in range(3)]
    assert sizes[0] > 1 << 16 > sizes[1] and sizes[2] > 1 << 16
    counts = _counting(monkeypatch)
    outcome = _read_both(monkeypatch, path)
    assert counts == {"fast": 3, "fallback": 0}
    assert [len(e) for e in outcome[1]] == [5000, 3, 2500]
