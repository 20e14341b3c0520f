"""Minari's HDF5 files read by episode._hdf5 (from_minari's parsed path).

* The parsed path reads exactly what h5py's path and Minari's own
  iterate_episodes read, on datasets Minari writes (Box, Discrete, Dict and
  Tuple spaces, infos) and on files rewritten with every storage layout the
  parser reads (compact, contiguous, chunked with edge chunks and B-trees of
  several levels, empty and one-step episodes). "parsed only" reads replace
  h5py's per-episode reader by one that fails, so they prove that the
  parsed path read every episode.
* Files to_minari writes (creation-ordered groups: version 2 headers,
  links as messages, an id_ string per episode in the global heap) and
  files with a creation-ordered root are parsed too, in h5py's order.
* What the parser does not read (filters, big-endian numbers, the newest
  file format, strings, soft links, chunks never written, an id_ that is
  not a UTF-8 string) goes to h5py, with the same result; damaged episodes
  give h5py's path's error, word for word.
* Damaged files (cut at many points, flipped metadata bytes, lying counts,
  sizes and addresses, cyclic B-trees and continuation chains, broken
  global heaps), Minari's and ours, give a ValueError naming the file, the
  data as written, or what h5py's path reads from them; never a crash or a
  hang (they run in a child process).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import struct
import warnings

import gymnasium as gym
import numpy as np
import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

minari = pytest.importorskip("minari")
h5py = pytest.importorskip("h5py")
pytest.importorskip("PIL")

from minari.data_collector import EpisodeBuffer  # noqa: E402

from episode import _hdf5  # noqa: E402
from episode.offline import minari as module  # noqa: E402
from episode.offline.minari import from_minari, to_minari  # noqa: E402
from minari_tools import case_results, episode_buffers as _minari_buffers  # noqa: E402
from test_offline_minari import assert_same, canonical_minari, canonical_ours  # noqa: E402

F32 = np.float32
H5 = "main_data.hdf5"


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    return tmp_path


def _create(dataset_id, buffers, obs_space, act_space):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = minari.create_dataset_from_buffers(dataset_id, buffers, observation_space=obs_space,
                                                action_space=act_space, data_format="hdf5",
                                                author="a")
    return pathlib.Path(ds.storage.data_path).parent


def _h5py_only(monkeypatch, source, **kw):
    """from_minari with the parser refusing every file (h5py's path)."""
    def refuse(path):
        raise _hdf5.Unreadable()
    with monkeypatch.context() as m:
        m.setattr(_hdf5, "File", refuse)
        return from_minari(source, **kw)


def _parsed_only(monkeypatch, source, **kw):
    """from_minari with h5py's per-episode reader failing: every episode
    must come from the parser."""
    def fail(self, i):
        raise AssertionError(f"episode {i} went to h5py")
    with monkeypatch.context() as m:
        m.setattr(module._HDF5Reader, "episode", fail)
        return from_minari(source, **kw)


def _assert_same_episodes(a, b, obs_space, act_space):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x.id_, len(x), x.is_terminated, x.is_truncated, x.t_started) == \
            (y.id_, len(y), y.is_terminated, y.is_truncated, y.t_started)
        assert_same(canonical_ours(x, obs_space, act_space),
                    canonical_ours(y, obs_space, act_space))
        # The same Python types and key order in the infos.
        assert [_typed(i) for i in x.get_infos()] == [_typed(i) for i in y.get_infos()]
        assert list(x.extra_model_outputs) == list(y.extra_model_outputs)
        for key in x.extra_model_outputs:
            p, q = x.get_extra_model_outputs(key), y.get_extra_model_outputs(key)
            assert p.dtype == q.dtype and np.array_equal(p, q)
        assert x.observation_space == y.observation_space
        assert x.action_space == y.action_space


def _typed(info):
    return [(k, _typed(v) if isinstance(v, dict) else
             (type(v).__name__, getattr(v, "dtype", None), np.asarray(v).tolist()))
            for k, v in info.items()]


# -- datasets Minari writes -------------------------------------------------------------

@pytest.mark.parametrize("case", ["cartpole", "box_actions_infos", "dict_tuple"])
def test_parsed_read_equals_h5py_and_minari(root, monkeypatch, case):
    obs_space, act_space, buffers = _minari_buffers(case, [5, 1, 7, 3, 40])
    path = _create(f"h5/{case}-v0", buffers, obs_space, act_space)
    parsed = _parsed_only(monkeypatch, path)
    _assert_same_episodes(parsed, _h5py_only(monkeypatch, path), obs_space, act_space)
    theirs = list(minari.load_dataset(f"h5/{case}-v0").iterate_episodes())
    assert [e.id_ for e in parsed] == [str(k) for k in range(5)]
    for ep, ed in zip(parsed, theirs):
        assert ep.is_numpy and len(ep) == len(ed.rewards)
        assert_same(canonical_ours(ep, obs_space, act_space),
                    canonical_minari(ed, obs_space, act_space))
    # A selection, in its order.
    again = _parsed_only(monkeypatch, path, episode_indices=[4, 0])
    _assert_same_episodes(again, [parsed[4], parsed[0]], obs_space, act_space)


def test_arrays_are_fresh_arrays_of_the_stored_dtypes(root, monkeypatch):
    obs_space, act_space, buffers = _minari_buffers("box_actions_infos", [4, 2])
    path = _create("h5/dtypes-v0", buffers, obs_space, act_space)
    ep = _parsed_only(monkeypatch, path)[0]
    obs = ep.get_observations()
    assert obs.dtype == np.float64 and obs.shape == (5, 3) and obs.flags.writeable
    assert ep.get_actions().dtype == F32
    assert ep.get_rewards().dtype == np.float64
    info = ep.get_infos(0)
    # float64 and bool leaves come back as Python numbers, arrays as rows
    assert type(info["x"]) is float and type(info["flag"]) is bool
    assert info["arr"].shape == (2, 2) and info["arr"].dtype == np.float64
    with h5py.File(path / "data" / H5) as f:
        assert f["episode_0/infos/flag"].dtype == np.bool_
        assert np.array_equal(f["episode_0/observations"][()], obs)


def test_chunks_in_both_dimensions(root, monkeypatch):
    # Large enough that h5py splits the observations along both axes, with
    # edge chunks that reach past the data.
    space = gym.spaces.Box(-np.inf, np.inf, (40,), np.float64)
    r = np.random.default_rng(5)
    buffers = [EpisodeBuffer(observations=r.standard_normal((n + 1, 40)),
                             actions=r.integers(0, 3, n), rewards=r.standard_normal(n),
                             terminations=np.arange(n) == n - 1, truncations=np.zeros(n, bool))
               for n in (3000, 2)]
    path = _create("h5/chunks-v0", buffers, space, gym.spaces.Discrete(3))
    with h5py.File(path / "data" / H5) as f:
        dset = f["episode_0/observations"]
        assert dset.chunks[0] < 3001 and dset.chunks[1] < 40 and 3001 % dset.chunks[0]
        assert dset.id.get_num_chunks() > 1
    _assert_same_episodes(_parsed_only(monkeypatch, path), _h5py_only(monkeypatch, path),
                          space, gym.spaces.Discrete(3))


# -- files rewritten with other layouts -------------------------------------------------

def _rewrite(path, make, root_kw=None, file_kw=None):
    """Rewrite the dataset's HDF5 file: the same groups and attributes, each
    dataset made by make(group, name, data) (None: as h5py makes it)."""
    file = path / "data" / H5
    old = file.with_suffix(".old")
    os.replace(file, old)
    with h5py.File(old, "r") as src, h5py.File(file, "w", **(file_kw or {})) as dst:
        def copy(s, d):
            d.attrs.update(dict(s.attrs))
            for name, obj in s.items():
                if isinstance(obj, h5py.Group):
                    copy(obj, d.create_group(name, **(root_kw or {})))
                elif make(d, name, obj[()]) is None:
                    d.create_dataset(name, data=obj[()])
        copy(src, dst)
    os.remove(old)


def _compact(group, name, data):
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.COMPACT)
    dsid = h5py.h5d.create(group.id, name.encode(), h5py.h5t.py_create(data.dtype),
                           h5py.h5s.create_simple(data.shape), dcpl=dcpl)
    if data.size:
        dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(data))
    return dsid


def _contiguous(group, name, data):
    return group.create_dataset(name, data=data, chunks=None)


def _small_chunks(group, name, data):
    # (3, 2, ...) chunks: edge chunks everywhere, and hundreds of chunks in
    # the long episode: a chunk B-tree of two levels.
    chunks = tuple(min(c, max(d, 1)) for c, d in zip((3, 2, 2, 2), data.shape))
    return group.create_dataset(name, data=data, chunks=chunks, maxshape=(None,) + data.shape[1:])


def _resized(group, name, data):
    # Minari's way of appending: a chunked dataset grown by resize().
    dset = group.create_dataset(name, data=data[:1], chunks=True,
                                maxshape=(None,) + data.shape[1:])
    dset.resize(data.shape)
    dset[1:] = data[1:]
    return dset


@pytest.mark.parametrize("make", [_compact, _contiguous, _small_chunks, _resized])
def test_layouts(root, monkeypatch, make):
    obs_space, act_space, buffers = _minari_buffers("dict_tuple", [5, 1, 3, 400])
    path = _create(f"h5/{make.__name__}-v0", buffers, obs_space, act_space)
    want = _h5py_only(monkeypatch, path)
    if make is _compact:      # a compact dataset holds at most 64 KiB
        path = _create("h5/compact-small-v0", buffers[:3], obs_space, act_space)
        want = _h5py_only(monkeypatch, path)
    _rewrite(path, make)
    layout = {_compact: h5py.h5d.COMPACT, _contiguous: h5py.h5d.CONTIGUOUS}.get(
        make, h5py.h5d.CHUNKED)
    with h5py.File(path / "data" / H5) as f:
        assert f["episode_0/observations/pos"].id.get_create_plist().get_layout() == layout
    if make is _small_chunks:
        with h5py.File(path / "data" / H5) as f:
            assert f["episode_3/observations/pos"].id.get_num_chunks() > 64   # > one node
    got = _parsed_only(monkeypatch, path)
    _assert_same_episodes(got, want, obs_space, act_space)
    _assert_same_episodes(_h5py_only(monkeypatch, path), want, obs_space, act_space)


def _episode_group(f, i, n, obs, actions, rewards=None, flags=None):
    g = f.create_group(f"episode_{i}")
    g.attrs["id"] = np.int64(i)
    g.attrs["total_steps"] = np.int64(n)
    g.create_dataset("observations", data=obs)
    g.create_dataset("actions", data=actions)
    g.create_dataset("rewards", data=np.arange(n, dtype=np.float64) if rewards is None
                     else rewards)
    term = np.zeros(n, bool) if flags is None else flags
    g.create_dataset("terminations", data=term)
    g.create_dataset("truncations", data=np.zeros(n, bool))
    return g


def _hand_written(tmp_path, name, episodes, obs_space=None, act_space=None, **file_kw):
    """A Minari layout written here with h5py: episodes = [(n, fill(group))]."""
    obs_space = obs_space or gym.spaces.Box(-np.inf, np.inf, (2,), F32)
    act_space = act_space or gym.spaces.Discrete(3)
    path = tmp_path / name
    (path / "data").mkdir(parents=True)
    meta = {"data_format": "hdf5", "minari_version": "0.5.3", "dataset_id": f"{name}-v0",
            "total_episodes": len(episodes), "total_steps": sum(n for n, _ in episodes),
            "observation_space": json.dumps(module._space_to_json(obs_space)),
            "action_space": json.dumps(module._space_to_json(act_space))}
    (path / "data" / "metadata.json").write_text(json.dumps(meta))
    with h5py.File(path / "data" / H5, "w", **file_kw) as f:
        for i, (n, fill) in enumerate(episodes):
            fill(_episode_group(f, i, n, np.arange((n + 1) * 2, dtype=F32).reshape(n + 1, 2),
                                np.arange(n) % 3))
    return path


def test_empty_and_one_step_episodes(tmp_path, monkeypatch):
    path = _hand_written(tmp_path, "short", [(0, lambda g: None), (1, lambda g: None),
                                             (2, lambda g: None)])
    got = _parsed_only(monkeypatch, path)
    assert [len(e) for e in got] == [0, 1, 2]
    assert np.array_equal(got[0].get_observations(), [[0, 1]])
    assert got[0].get_actions().shape == (0,)
    _assert_same_episodes(got, _h5py_only(monkeypatch, path), *_spaces())


def _spaces():
    return gym.spaces.Box(-np.inf, np.inf, (2,), F32), gym.spaces.Discrete(3)


def test_numeric_dtypes(tmp_path, monkeypatch):
    obs_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float16)
    act_space = gym.spaces.Box(-9, 9, (), np.int16)

    def fill(g):
        del g["observations"], g["actions"]
        g.create_dataset("observations", data=np.arange(8, dtype=np.float16).reshape(4, 2))
        g.create_dataset("actions", data=np.array([1, -2, 3], np.int16))
        infos = g.create_group("infos")
        for dtype in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
                      np.uint64, np.float16, np.float32, np.float64, np.bool_):
            infos.create_dataset(np.dtype(dtype).name, data=np.arange(4).astype(dtype))
    path = _hand_written(tmp_path, "dtypes", [(3, fill)], obs_space, act_space)
    got = _parsed_only(monkeypatch, path)
    _assert_same_episodes(got, _h5py_only(monkeypatch, path), obs_space, act_space)
    assert got[0].get_infos(1)["uint16"] == np.uint16(1)
    assert type(got[0].get_infos(1)["uint16"]) is np.uint16


# -- what goes to h5py ------------------------------------------------------------------

def _fallback_cases():
    def string_info(g):
        g.create_group("infos").create_dataset("s", data=np.array(["a", "bc", "d", "e"],
                                                                   dtype=object),
                                               dtype=h5py.string_dtype())

    def id_bytes(g):
        g.attrs["id_"] = np.bytes_(b"my-episode")       # (h5py's path refuses it)

    def id_array(g):
        g.attrs["id_"] = ["a", "b"]

    def gzip(g):
        del g["observations"]
        g.create_dataset("observations", data=np.arange(8, dtype=F32).reshape(4, 2),
                         compression="gzip", shuffle=True)

    def big_endian(g):
        del g["rewards"]
        g.create_dataset("rewards", data=np.arange(3, dtype=">f8"))

    def soft_link(g):
        g.create_group("_infos").create_dataset("x", data=np.arange(4))
        g["infos"] = h5py.SoftLink(g.name + "/_infos")

    def never_written_chunk(g):
        del g["observations"]
        dset = g.create_dataset("observations", shape=(4, 2), dtype=F32, chunks=(2, 2),
                                fillvalue=7)
        dset[:2] = 1

    def extra_strings(g):
        g.create_dataset("notes", data="written by hand")

    return {"string_info": string_info, "id_bytes": id_bytes, "id_array": id_array, "gzip": gzip,
            "big_endian": big_endian, "soft_link": soft_link,
            "never_written_chunk": never_written_chunk, "extra_strings": extra_strings}


@pytest.mark.parametrize("case", sorted(_fallback_cases()))
def test_what_the_parser_leaves_to_h5py(tmp_path, monkeypatch, case):
    fill = _fallback_cases()[case]
    path = _hand_written(tmp_path, case, [(3, lambda g: None), (3, fill)])
    parser = _hdf5.File(path / "data" / H5)
    try:
        assert parser.group(b"episode_0") is not None
        assert parser.group(b"episode_1") is None
    finally:
        parser.close()
    if case.startswith("id_"):
        with pytest.raises(ValueError) as ours:
            from_minari(path)
        with pytest.raises(ValueError) as theirs:
            _h5py_only(monkeypatch, path)
        assert str(ours.value) == str(theirs.value) and "id_" in str(ours.value)
        return
    got = from_minari(path)
    _assert_same_episodes(got, _h5py_only(monkeypatch, path), *_spaces())
    if case == "never_written_chunk":
        assert np.array_equal(got[1].get_observations()[2:], np.full((2, 2), 7, F32))


def test_the_newest_file_format_goes_to_h5py(tmp_path, monkeypatch):
    path = _hand_written(tmp_path, "newer", [(3, lambda g: None), (2, lambda g: None)],
                         libver="latest")
    with pytest.raises(_hdf5.Unreadable):
        _hdf5.File(path / "data" / H5)
    _assert_same_episodes(from_minari(path), _h5py_only(monkeypatch, path), *_spaces())


def test_a_creation_ordered_root_is_listed_by_h5py(tmp_path, monkeypatch):
    # h5py.File(new path, track_order=True): the root keeps its links in a
    # fractal heap (more than 8 of them); the episodes' groups are the usual.
    path = _hand_written(tmp_path, "ordered", [(k % 4, lambda g: None) for k in range(12)],
                         track_order=True)
    parser = _hdf5.File(path / "data" / H5)
    assert parser.root is None
    parser.close()
    got = _parsed_only(monkeypatch, path)
    assert [len(e) for e in got] == [k % 4 for k in range(12)]
    _assert_same_episodes(got, _h5py_only(monkeypatch, path), *_spaces())


@pytest.mark.parametrize("count", [3, 12])
def test_to_minari_files(root, monkeypatch, count):
    # Creation-ordered groups (version 2 headers, links as messages; a root
    # of more than 8 episodes keeps them in a fractal heap, which h5py
    # lists), an id_ per episode (a string in the global heap), infos keys
    # in their order, extra model outputs.
    episodes = [ep for _ in range(3) for ep in _our_episodes()][:count]
    for k, ep in enumerate(episodes):
        ep.id_ = f"ep-{k}-\u00e9"
    path = to_minari(episodes, f"h5/ours-{count}-v0")
    parser = _hdf5.File(path / "data" / H5)
    assert (parser.root is None) == (count > 8)
    parser.close()
    got = _parsed_only(monkeypatch, path)
    assert [e.id_ for e in got] == [e.id_ for e in episodes]
    assert list(got[0].get_infos(1)) == ["x", "y"]
    assert got[0].get_extra_model_outputs("logp").dtype == F32
    space = episodes[0].observation_space
    _assert_same_episodes(got, _h5py_only(monkeypatch, path), space, gym.spaces.Discrete(3))


def test_creation_ordered_groups_keep_their_order(tmp_path, monkeypatch):
    def fill(g):
        infos = g.create_group("infos", track_order=True)
        for key in ("zeta", "alpha", "mid"):
            infos.create_dataset(key, data=np.arange(4))
        plain = g.create_group("extra_model_outputs")
        for key in ("b", "a"):
            plain.create_dataset(key, data=np.arange(3.0))
    path = _hand_written(tmp_path, "ordered_infos", [(3, fill)])
    got = _parsed_only(monkeypatch, path)
    assert list(got[0].get_infos(0)) == ["zeta", "alpha", "mid"]
    assert list(got[0].extra_model_outputs) == ["a", "b"]          # by name
    _assert_same_episodes(got, _h5py_only(monkeypatch, path), *_spaces())


def _damages():
    def rewards_2d(g):
        del g["rewards"]
        g.create_dataset("rewards", data=np.zeros((3, 1)))

    def scalar_rewards(g):
        del g["rewards"]
        g.create_dataset("rewards", data=1.0)

    def obs_shape(g):
        del g["observations"]
        g.create_dataset("observations", data=np.zeros((4, 3), F32))

    def obs_dtype(g):
        del g["observations"]
        g.create_dataset("observations", data=np.zeros((4, 2), np.complex64))

    def early_end(g):
        g["terminations"][0] = True

    def flag_values(g):
        del g["truncations"]
        g.create_dataset("truncations", data=np.array([0, 2, 0], np.int8))

    def missing_actions(g):
        del g["actions"]

    def actions_group(g):
        del g["actions"]
        g.create_group("actions").create_dataset("x", data=np.zeros(3))

    def info_rows(g):
        g.create_group("infos").create_dataset("x", data=np.zeros(7))

    def extras_rows(g):
        g.create_group("extra_model_outputs").create_dataset("logp", data=np.zeros(2))

    def extras_text(g):
        g.create_group("extra_model_outputs").create_dataset("t", data=["a", "b", "c"])

    def too_many_steps(g):
        del g["rewards"], g["terminations"], g["truncations"]
        g.create_dataset("rewards", data=np.zeros(9))
        g.create_dataset("terminations", data=np.zeros(9, bool))
        g.create_dataset("truncations", data=np.zeros(9, bool))

    return {f.__name__: f for f in (rewards_2d, scalar_rewards, obs_shape, obs_dtype, early_end,
                                    flag_values, missing_actions, actions_group, info_rows,
                                    extras_rows, extras_text, too_many_steps)}


@pytest.mark.parametrize("case", sorted(_damages()))
def test_damaged_episodes_give_h5py_paths_error(tmp_path, monkeypatch, case):
    path = _hand_written(tmp_path, case, [(3, lambda g: None), (3, _damages()[case])])
    with pytest.raises(ValueError) as ours:
        from_minari(path)
    with pytest.raises(ValueError) as theirs:
        _h5py_only(monkeypatch, path)
    assert str(ours.value) == str(theirs.value)
    assert str(path / "data" / H5) in str(ours.value) and "episode 1" in str(ours.value)


def test_the_parser_on_files_it_does_not_read(tmp_path):
    for name, content in [("empty", b""), ("text", b"not an hdf5 file" * 20),
                          ("short", b"\x89HDF\r\n\x1a\n" + bytes(20))]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(_hdf5.Unreadable):
            _hdf5.File(tmp_path / name)
    with pytest.raises(FileNotFoundError):
        _hdf5.File(tmp_path / "missing")
    path = _hand_written(tmp_path, "ok", [(2, lambda g: None)])
    data = (path / "data" / H5).read_bytes()
    (tmp_path / "cut").write_bytes(data[:-1])       # shorter than its stored end
    with pytest.raises(_hdf5.Unreadable):
        _hdf5.File(tmp_path / "cut")
    parser = _hdf5.File(path / "data" / H5)
    assert list(parser.root) == [b"episode_0"]
    assert parser.group(b"episode_1") is None
    tree, id_ = parser.group(b"episode_0")
    assert sorted(tree) == ["actions", "observations", "rewards", "terminations", "truncations"]
    assert id_ is None
    parser.close()
    parser.close()
    with pytest.raises(ValueError, match="closed"):
        parser.group(b"episode_0")


# -- damaged files, in a child process --------------------------------------------------

CHILD = r"""
import hashlib, json, sys
import numpy as np
from episode import _hdf5
from episode.offline.minari import from_minari

def digest(episodes):
    h = hashlib.sha256()
    for e in episodes:
        h.update(repr((e.id_, len(e), e.is_terminated, e.is_truncated)).encode())
        for arrays in (e.get_observations(), e.get_actions()):
            for a in (arrays.values() if isinstance(arrays, dict) else
                      arrays if isinstance(arrays, tuple) else [arrays]):
                for leaf in (a.values() if isinstance(a, dict) else
                             a if isinstance(a, tuple) else [a]):
                    h.update(str(leaf.dtype).encode() + repr(leaf.shape).encode() + leaf.tobytes())
        h.update(e.get_rewards().tobytes() + repr(e.get_infos()).encode())
    return h.hexdigest()

def outcome(path):
    try:
        return "ok " + digest(from_minari(path))
    except ValueError as exc:
        return "ValueError " + str(exc).replace("\n", " ")
    except Exception as exc:
        return "other " + type(exc).__name__ + " " + str(exc).replace("\n", " ")

real = _hdf5.File
def refuse(path):
    raise _hdf5.Unreadable()
for name, path in json.loads(sys.argv[1]):
    print("CASE " + name, flush=True)
    ours = outcome(path)
    theirs = ""
    if ours.startswith("ok"):
        _hdf5.File = refuse
        theirs = outcome(path)
        _hdf5.File = real
    print("RESULT " + ours + " | " + theirs, flush=True)
print("DONE")
"""


def _data_ranges(file):
    """The byte ranges of the stored numbers (not metadata)."""
    out = []
    with h5py.File(file, "r") as f:
        def visit(name, obj):
            if not isinstance(obj, h5py.Dataset):
                return
            if obj.chunks is None:
                offset = obj.id.get_offset()
                if offset is not None:
                    out.append((offset, offset + obj.id.get_storage_size()))
                return
            for k in range(obj.id.get_num_chunks()):
                info = obj.id.get_chunk_info(k)
                out.append((info.byte_offset, info.byte_offset + info.size))
        f.visititems(visit)
    return out


def _structures(data):
    """Where the file's B-tree nodes, symbol table nodes, local heaps and
    object headers are: {kind: [offset, ...]} (object headers found through
    the symbol table nodes)."""
    found = {"TREE": [], "SNOD": [], "HEAP": [], "OHDR": [], "GCOL": [], "header": []}
    for sig in ("TREE", "SNOD", "HEAP", "OHDR", "GCOL"):
        at = data.find(sig.encode())
        while at >= 0:
            found[sig].append(at)
            at = data.find(sig.encode(), at + 1)
    for node in found["SNOD"]:
        count = struct.unpack_from("<H", data, node + 6)[0]
        for k in range(count):
            found["header"].append(struct.unpack_from("<Q", data, node + 8 + 40 * k + 8)[0])
    found["header"].append(struct.unpack_from("<Q", data, 64)[0])     # the root's
    found["header"] = sorted(set(found["header"]))
    return found


def _messages(data, header):
    """(type, offset of its data, size) of an object header's first block."""
    size = struct.unpack_from("<I", data, header + 8)[0]
    out, off = [], header + 16
    while off + 8 <= header + 16 + size:
        mtype, msize = struct.unpack_from("<HH", data, off)
        out.append((mtype, off + 8, msize))
        off += 8 + msize
    return out


def _lies(data):
    """Targeted damage: (name, bytes) with counts, sizes and addresses that
    lie, and B-trees and continuation chains that loop."""
    found = _structures(data)
    out = []

    def put(name, at, fmt, value):
        b = bytearray(data)
        struct.pack_into(fmt, b, at, value)
        out.append((name, bytes(b)))
    for node in found["TREE"][:6]:
        put(f"tree-{node}-entries", node + 6, "<H", 0xFFFF)
        put(f"tree-{node}-level", node + 5, "<B", 1)
        put(f"tree-{node}-level-max", node + 5, "<B", 255)
        # a level-1 node whose first child is itself: a cycle
        b = bytearray(data)
        b[node + 5] = 1
        child_at = node + 24 + (8 if data[node + 4] == 0 else 8 + 8 * 3)
        struct.pack_into("<Q", b, child_at, node)
        out.append((f"tree-{node}-cycle", bytes(b)))
        put(f"tree-{node}-child-far", child_at, "<Q", len(data) * 4)
    for node in found["SNOD"][:3]:
        put(f"snod-{node}-count", node + 6, "<H", 0xFFFF)
        put(f"snod-{node}-name", node + 8, "<Q", 1 << 40)
        put(f"snod-{node}-header", node + 16, "<Q", len(data) - 3)
    for heap in found["HEAP"][:3]:
        put(f"heap-{heap}-size", heap + 8, "<Q", 1 << 62)
        put(f"heap-{heap}-address", heap + 24, "<Q", len(data) - 2)
    for header in found["OHDR"][:6]:
        flags = data[header + 5]
        size_at = header + 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
        put(f"ohdr-{header}-size", size_at, "<B", 0xFF)
        put(f"ohdr-{header}-version", header + 4, "<B", 3)
    for heap in found["GCOL"][:2]:
        put(f"gcol-{heap}-size", heap + 8, "<Q", 1 << 50)
        put(f"gcol-{heap}-object-size", heap + 24, "<Q", 1 << 40)
        put(f"gcol-{heap}-object-index", heap + 16, "<H", 77)
        put(f"gcol-{heap}-signature", heap, "<B", 0)
    for header in found["header"][:12]:
        if data[header:header + 4] == b"OHDR":
            continue
        put(f"header-{header}-messages", header + 2, "<H", 0xFFFF)
        put(f"header-{header}-size", header + 8, "<I", 0xFFFFFFF0)
        for mtype, at, size in _messages(data, header):
            name = f"header-{header}-msg{mtype}"
            put(name + "-length", at - 6, "<H", 0xFFF8)
            if mtype == 0x01:                                       # dataspace
                put(name + "-rank", at + 1, "<B", 200)
                put(name + "-dim", at + 8, "<Q", 1 << 61)
                put(name + "-dim-small", at + 8, "<Q", 1)
            elif mtype == 0x08:                                     # layout
                put(name + "-class", at + 1, "<B", 7)
                put(name + "-address", at + 2, "<Q", len(data) - 8)
                if data[at + 1] == 2:
                    put(name + "-rank", at + 2, "<B", 40)
                    put(name + "-chunk-zero", at + 11, "<I", 0)
                    put(name + "-chunk-huge", at + 11, "<I", 0xFFFFFFFF)
                    put(name + "-btree-self", at + 3, "<Q", header)
            elif mtype == 0x03:                                     # datatype
                put(name + "-itemsize", at + 4, "<I", 0x7FFFFFFF)
                put(name + "-class", at, "<B", 0x1A)
            # a continuation that points back at the header's own block: a loop
            b = bytearray(data)
            struct.pack_into("<HH", b, at - 8, 0x10, size)
            struct.pack_into("<QQ", b, at, header + 16, struct.unpack_from(
                "<I", data, header + 8)[0])
            out.append((name + "-continuation-loop", bytes(b)))
    return out


def _our_episodes():
    from episode import SingleAgentEpisode
    space = gym.spaces.Dict({"v": gym.spaces.Box(-9, 9, (2,), F32), "k": gym.spaces.Discrete(3)})
    r = np.random.default_rng(4)
    out = []
    for n in (4, 1, 6, 30):
        ep = SingleAgentEpisode(observation_space=space, action_space=gym.spaces.Discrete(3))
        ep.add_env_reset({"v": r.uniform(-9, 9, 2).astype(F32), "k": 1}, {"x": 0.5, "y": {"z": 1}})
        for t in range(n):
            ep.add_env_step({"v": r.uniform(-9, 9, 2).astype(F32), "k": t % 3}, t % 3, 0.5 * t,
                            {"x": 1.5 * t, "y": {"z": t}}, terminated=t == n - 1,
                            extra_model_outputs={"logp": F32(-t)})
        out.append(ep)
    return out


@pytest.mark.parametrize("seed", [27, 28, 29])
@pytest.mark.parametrize("source", ["minari", "ours"])
def test_damaged_files_give_an_error_the_data_or_h5pys_reading(root, tmp_path, source, seed):
    # Minari's files (symbol-table groups, version 1 headers), and ours
    # (creation-ordered groups: version 2 headers with checksums, link
    # messages, an id_ per episode in the global heap)
    if source == "minari":
        obs_space, act_space, buffers = _minari_buffers("dict_tuple", [4, 1, 6, 30])
        src = _create("h5/garbage-v0", buffers, obs_space, act_space)
    else:
        src = to_minari(_our_episodes(), "h5/garbage-ours-v0")
    file = src / "data" / H5
    data = file.read_bytes()
    data_chunked = None
    if source == "minari":
        _rewrite(src, _small_chunks)  # multi-level chunk B-trees, edge chunks
        data_chunked = file.read_bytes()
        file.write_bytes(data)
    originals = {}
    work = tmp_path / "cases"
    work.mkdir()
    cases = []
    r = np.random.default_rng(seed)

    def variant(name, base, content):
        dst = work / name
        shutil.copytree(src, dst)
        (dst / "data" / H5).write_bytes(content)
        cases.append((name, str(dst)))
        originals[name] = base

    for base, content in (("plain", data), ("chunked", data_chunked)):
        if content is None:
            continue
        variant(f"{base}-intact", base, content)
        data_bytes = np.zeros(len(content), bool)
        dst_file = work / f"{base}-intact" / "data" / H5
        for start, stop in _data_ranges(dst_file):
            data_bytes[start:stop] = True
        metadata = np.flatnonzero(~data_bytes)
        for cut in sorted(set(r.integers(1, len(content), 40).tolist()) | {8, 95, 96, 200}):
            variant(f"{base}-cut-{cut}", base, content[:cut])
        for k, pos in enumerate(r.choice(metadata, 250, replace=False)):
            flipped = bytearray(content)
            flipped[pos] ^= 1 << int(r.integers(0, 8))
            variant(f"{base}-flip-{k}-{pos}", base, bytes(flipped))
        for pos in r.choice(metadata, 12, replace=False):
            zeroed = bytearray(content)
            zeroed[pos:pos + 16] = bytes(len(zeroed[pos:pos + 16]))
            variant(f"{base}-zeroed-{pos}", base, bytes(zeroed))
        for name, content_lie in _lies(content):
            variant(f"{base}-{name}", base, content_lie)
    results = case_results(CHILD, cases, timeout=900)
    assert set(results) == {name for name, _ in cases}
    want = results["plain-intact"].split(" | ")[0]
    assert want.startswith("ok ")
    if data_chunked is not None:
        assert results["chunked-intact"].split(" | ")[0] == want
    for name, outcome in results.items():
        ours, theirs = outcome.split(" | ")
        if ours.startswith("ValueError"):
            assert str(work / name) in ours, (name, ours)   # the error names the file
            continue
        assert ours.startswith("ok "), (name, outcome)
        # the data as written, or what h5py's path reads from the same bytes
        assert ours == want or ours == theirs, (name, outcome)


# -- the parser against h5py on random datasets -----------------------------------------

_DTYPES = ["i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8", "?"]


@st.composite
def _datasets(draw):
    """(shape, dtype, layout, chunk shape or None): any rank up to 4, empty
    dimensions included, chunks of any shape up to the data's (and past
    it: edge chunks)."""
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=rank, max_size=rank)))
    layout = draw(st.sampled_from(["contiguous", "compact", "chunked"]))
    chunks = None
    if layout == "chunked":
        chunks = tuple(draw(st.integers(1, max(d, 1) + 2)) for d in shape)
    return shape, draw(st.sampled_from(_DTYPES)), layout, chunks


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(_datasets(), min_size=1, max_size=6), seed=st.integers(0, 2**32 - 1))
def test_parser_reads_what_h5py_reads(tmp_path, specs, seed):
    r = np.random.default_rng(seed)
    file = tmp_path / f"random-{seed}.hdf5"
    want = {}
    with h5py.File(file, "w") as f:
        g = f.create_group("episode_0").create_group("nested")
        for k, (shape, dtype, layout, chunks) in enumerate(specs):
            data = (r.integers(0, 2, shape).astype(bool) if dtype == "?" else
                    r.integers(-100, 100, shape).astype(dtype) if dtype[0] in "iu" else
                    r.standard_normal(shape).astype(dtype))
            name = f"d{k}"
            if layout == "compact":
                _compact(g, name, data)
            elif layout == "chunked":
                g.create_dataset(name, data=data, chunks=chunks,
                                 maxshape=(None,) * len(shape))
            else:
                g.create_dataset(name, data=data)
            want[name] = data
    parser = _hdf5.File(file)
    try:
        tree, _ = parser.group(b"episode_0")
    finally:
        parser.close()
    assert list(tree) == ["nested"] and list(tree["nested"]) == sorted(want)
    for name, data in want.items():
        got = tree["nested"][name]
        assert got.dtype == data.dtype and got.shape == data.shape, name
        assert np.array_equal(got, data), name
    file.unlink()
