"""Minari interop: episode.offline.minari.from_minari / to_minari.

* Round trips ours -> Minari -> ours are exact (hypothesis: every space kind,
  Dict/Tuple nesting, infos, extra model outputs, list-mode and numpy'd
  episodes), on the three backends (hdf5, arrow, parquet).
* Datasets written by Minari's own API (create_dataset_from_buffers; no jax
  needed) read by ours equal its iterate_episodes() step by step, and
  datasets written by ours read by Minari equal the episodes written.
* Bad input (missing or foreign datasets, damaged metadata, a space that does
  not match the data, truncated or corrupted files) raises one clear error;
  the corrupted-file cases run in a child process so that a crash fails.

Every dataset is made here, under a tmp_path set as MINARI_DATASETS_PATH.
"""
from __future__ import annotations

import json
import mmap
import os
import pathlib
import shutil
import subprocess
import sys
from collections import OrderedDict

import gymnasium as gym
import numpy as np
import pytest

from minari_tools import (case_results, done_flags as _flags, episode_buffers as _minari_buffers,
                          quiet_create as _quiet_create)

minari = pytest.importorskip("minari")
pytest.importorskip("h5py")
pytest.importorskip("pyarrow")
pytest.importorskip("PIL")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from minari.data_collector import EpisodeBuffer  # noqa: E402

from episode import SingleAgentEpisode  # noqa: E402
from episode.offline.minari import from_minari, to_minari  # noqa: E402

FORMATS = ["hdf5", "arrow", "parquet"]
HERE = os.path.dirname(os.path.abspath(__file__))  # children run here, not in the checkout
F32 = np.float32


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    return tmp_path


# -- canonical forms: what a step holds, whoever stored it ---------------------------

def _leaf_paths(space, path=()):
    if isinstance(space, gym.spaces.Dict):
        return [p for k, s in space.spaces.items() for p in _leaf_paths(s, path + (k,))]
    if isinstance(space, gym.spaces.Tuple):
        return [p for i, s in enumerate(space.spaces) for p in _leaf_paths(s, path + (i,))]
    return [path]


def _at(item, path):
    for p in path:
        item = item[p]
    return item


def _leaf_values(batch_or_items, space, path, rows):
    """A leaf's rows: an array (numbers, pictures) or a list of strings."""
    if isinstance(batch_or_items, list):
        values = [_at(item, path) for item in batch_or_items]
    else:
        values = _at(batch_or_items, path)
    assert len(values) == rows
    if isinstance(_at_space(space, path), gym.spaces.Text):
        return [v.decode() if isinstance(v, bytes) else v for v in values]
    return np.asarray(values) if isinstance(values, list) else values


def _at_space(space, path):
    for p in path:
        space = space[p]
    return space


def _info_leaves(step_infos):
    """{path: per-step values} of a list of info dicts."""
    out = {}

    def walk(info, path, t):
        for k, v in info.items():
            if isinstance(v, dict):
                walk(v, path + (k,), t)
            else:
                out.setdefault(path + (k,), {})[t] = v
    for t, info in enumerate(step_infos):
        walk(info, (), t)
    return out


def canonical_ours(ep, obs_space, act_space):
    n = len(ep)
    obs = ep.get_observations()
    acts = ep.get_actions()
    flags = np.zeros(n, bool)
    term, trunc = flags.copy(), flags.copy()
    if n:
        term[-1], trunc[-1] = ep.is_terminated, ep.is_truncated
    return {
        "n": n,
        "obs": {p: _leaf_values(obs, obs_space, p, n + 1) for p in _leaf_paths(obs_space)},
        "actions": ({p: _leaf_values(acts, act_space, p, n) for p in _leaf_paths(act_space)}
                    if n else {}),
        "rewards": np.asarray(ep.get_rewards(), dtype=None if n else np.float64),
        "terminations": term, "truncations": trunc,
        "infos": _info_leaves(ep.get_infos()),
    }


def canonical_minari(ed, obs_space, act_space):
    n = len(ed.rewards)
    infos = {}

    def walk(tree, path):
        for k, v in tree.items():
            if isinstance(v, dict):
                walk(v, path + (k,))
            elif isinstance(v, np.ndarray) and v.dtype == object and len(v) and isinstance(
                    v[0], dict):
                # Minari's Arrow reader gives a nested info dict as one Python
                # dict per step (lists for arrays, Python numbers): compared by
                # value only.
                loose(v, path + (k,))
            else:
                vals = list(v)
                first = n + 1 - len(vals)
                infos[path + (k,)] = {first + t: (x.decode() if isinstance(x, bytes) else x)
                                      for t, x in enumerate(vals)}
    def loose(steps, path):
        for kk in steps[0]:
            values = [d[kk] for d in steps]
            if isinstance(values[0], dict):
                loose(values, path + (kk,))
            else:
                infos[path + (kk,)] = {t: _Loose(x) for t, x in enumerate(values)}

    walk(ed.infos or {}, ())
    return {
        "n": n,
        "obs": {p: _leaf_values(ed.observations, obs_space, p, n + 1)
                for p in _leaf_paths(obs_space)},
        "actions": ({p: _leaf_values(ed.actions, act_space, p, n)
                     for p in _leaf_paths(act_space)} if n else {}),
        "rewards": np.asarray(ed.rewards), "terminations": np.asarray(ed.terminations, bool),
        "truncations": np.asarray(ed.truncations, bool), "infos": infos,
    }


class _Loose:
    """A value Minari hands back without its dtype and shape."""

    def __init__(self, value):
        self.value = value


def _same_values(a, b, what):
    if isinstance(b, _Loose):
        a, b = b, a
    if isinstance(a, _Loose):
        if isinstance(b, str):
            assert a.value == b, what
            return
        b = np.asarray(b)
        assert np.array_equal(np.asarray(a.value, dtype=b.dtype).reshape(b.shape), b), what
        return
    if isinstance(a, list) or isinstance(b, list):
        assert list(a) == list(b), what
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype, f"{what}: {a.dtype} != {b.dtype}"
    assert a.shape == b.shape, f"{what}: {a.shape} != {b.shape}"
    assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), what


def assert_same(x, y):
    assert x["n"] == y["n"]
    for track in ("obs", "actions"):
        assert x[track].keys() == y[track].keys()
        for p in x[track]:
            _same_values(x[track][p], y[track][p], f"{track}{p}")
    for track in ("rewards", "terminations", "truncations"):
        _same_values(x[track], y[track], track)
    assert x["infos"].keys() == y["infos"].keys()
    for p, steps in x["infos"].items():
        assert steps.keys() == y["infos"][p].keys(), p
        for t, v in steps.items():
            w = y["infos"][p][t]
            if (isinstance(v, str) or isinstance(w, str)) and not isinstance(
                    v, _Loose) and not isinstance(w, _Loose):
                assert v == w, (p, t)
            else:
                _same_values(v, w, f"infos{p}[{t}]")


def _key_order(info):
    return [(k, _key_order(v) if isinstance(v, dict) else None) for k, v in info.items()]


def assert_same_episode(orig, back, obs_space, act_space):
    """`back` (read by from_minari) holds what `orig` held, exactly."""
    assert type(back) is SingleAgentEpisode
    assert back.id_ == orig.id_
    assert len(back) == len(orig)
    assert back.t_started == 0
    n = len(orig)
    assert back.is_terminated == (orig.is_terminated if n else False)
    assert back.is_truncated == (orig.is_truncated if n else False)
    assert_same(canonical_ours(orig, obs_space, act_space),
                canonical_ours(back, obs_space, act_space))
    # Info dicts keep their keys' order, nested ones too.
    assert [_key_order(i) for i in back.get_infos()] == [_key_order(i) for i in orig.get_infos()]
    assert list(back.extra_model_outputs) == list(orig.extra_model_outputs)
    for key in orig.extra_model_outputs:
        want = np.asarray(orig.get_extra_model_outputs(key))
        got = back.get_extra_model_outputs(key)
        if n:
            _same_values(want, got, key)
        else:
            assert len(got) == 0
    assert back.observation_space == obs_space and back.action_space == act_space
    back.validate()


# -- hypothesis: episodes of every space kind -----------------------------------------

def _rng_array(shape, dtype, lo, hi):
    return st.integers(0, 2 ** 32 - 1).map(
        lambda s: np.random.default_rng(s).integers(lo, hi, shape).astype(dtype))


LEAVES = {
    "box": (gym.spaces.Box(-10, 10, (3,), F32),
            st.lists(st.floats(-10, 10, width=32), min_size=3, max_size=3).map(
                lambda v: np.array(v, F32))),
    "box_int_2x2": (gym.spaces.Box(-5, 5, (2, 2), np.int64), _rng_array((2, 2), np.int64, -5, 6)),
    "box_scalar": (gym.spaces.Box(-1.0, 1.0, (), np.float64),
                   st.floats(-1, 1).map(np.float64)),
    "discrete": (gym.spaces.Discrete(4), st.integers(0, 3)),
    "discrete_i32": (gym.spaces.Discrete(3, start=-1, dtype=np.int32),
                     st.integers(-1, 1).map(np.int32)),
    "multidiscrete": (gym.spaces.MultiDiscrete([2, 3]),
                      st.tuples(st.integers(0, 1), st.integers(0, 2)).map(
                          lambda t: np.array(t, np.int64))),
    "multibinary": (gym.spaces.MultiBinary(3), _rng_array((3,), np.int8, 0, 2)),
    "text": (gym.spaces.Text(4, charset="abc"), st.text("abc", max_size=4)),
    "image": (gym.spaces.Box(0, 255, (32, 32, 3), np.uint8),
              _rng_array((32, 32, 3), np.uint8, 0, 256)),
    "gray": (gym.spaces.Box(0, 255, (32, 40), np.uint8), _rng_array((32, 40), np.uint8, 0, 256)),
}


def _structures():
    leaf = st.sampled_from(sorted(LEAVES))
    keys = st.lists(st.sampled_from(["a", "obs", "z", "b"]), min_size=1, max_size=3, unique=True)
    node = st.recursive(
        leaf,
        lambda children: st.one_of(
            keys.flatmap(lambda ks: st.tuples(*[children] * len(ks)).map(
                lambda vs: dict(zip(ks, vs)))),
            st.lists(children, min_size=1, max_size=3).map(tuple)),
        max_leaves=4)
    return node


def _space(structure):
    if isinstance(structure, dict):
        return gym.spaces.Dict(OrderedDict((k, _space(v)) for k, v in structure.items()))
    if isinstance(structure, tuple):
        return gym.spaces.Tuple([_space(v) for v in structure])
    return LEAVES[structure][0]


def _item(structure):
    if isinstance(structure, dict):
        keys = list(structure)
        return st.tuples(*[_item(v) for v in structure.values()]).map(
            lambda vs: dict(zip(keys, vs)))
    if isinstance(structure, tuple):
        return st.tuples(*[_item(v) for v in structure])
    return LEAVES[structure][1]


INFO_VALUES = {
    "py_float": st.floats(-1e6, 1e6),
    "py_int": st.integers(-1000, 1000),
    "py_bool": st.booleans(),
    "np_f32": st.floats(-100, 100, width=32).map(np.float32),
    "np_i8": st.integers(-100, 100).map(np.int8),
    "arr_f32": _rng_array((2,), F32, -5, 5),
    "arr_u8_2x2": _rng_array((2, 2), np.uint8, 0, 256),
    "string": st.text("xyz", max_size=3),
}


def _info_structure():
    """Info keys of every kind, one dict level deep (an empty nested dict has
    no Parquet form: pinned in the refusals)."""
    leaf = st.sampled_from(sorted(INFO_VALUES))
    keys = st.lists(st.sampled_from(["x", "y", "lives", "nested"]), max_size=3, unique=True)
    nested = st.lists(st.sampled_from(["p", "q"]), min_size=1, max_size=2, unique=True).flatmap(
        lambda kk: st.tuples(*[leaf] * len(kk)).map(lambda vs: dict(zip(kk, vs))))
    return keys.flatmap(lambda ks: st.tuples(*[st.one_of(leaf, nested)] * len(ks)).map(
        lambda vs: dict(zip(ks, vs))))


def _info(structure):
    keys = list(structure)
    return st.tuples(*[_info(v) if isinstance(v, dict) else INFO_VALUES[v]
                       for v in structure.values()]).map(lambda vs: dict(zip(keys, vs)))


@st.composite
def episodes_of(draw, obs_space_structure, act_structure, count):
    """Episodes of one dataset: their info structure and extras are shared
    (an Arrow dataset has one schema)."""
    obs_space, act_space = _space(obs_space_structure), _space(act_structure)
    info_structure = draw(_info_structure())
    with_extras = draw(st.booleans())
    out = []
    for _ in range(count):
        n = draw(st.integers(1, 4))
        ep = SingleAgentEpisode(observation_space=obs_space, action_space=act_space)
        ep.add_env_reset(draw(_item(obs_space_structure)), draw(_info(info_structure)))
        # (to_minari writes complete episodes)
        end = draw(st.sampled_from([(True, False), (False, True), (True, True)]))
        for t in range(n):
            last = t == n - 1
            ep.add_env_step(
                draw(_item(obs_space_structure)), draw(_item(act_structure)),
                draw(st.floats(-10, 10)), draw(_info(info_structure)),
                terminated=last and end[0], truncated=last and end[1],
                extra_model_outputs={"logp": draw(st.floats(-3, 0, width=32).map(F32)),
                                     "vf": np.arange(2, dtype=F32) + t} if with_extras else None)
        if draw(st.booleans()):
            ep.to_numpy()
        out.append(ep)
    return obs_space, act_space, out


_EPISODES = st.tuples(_structures(), _structures(), st.integers(1, 3)).flatmap(
    lambda t: episodes_of(*t))


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=_EPISODES, fmt=st.sampled_from(FORMATS))
def test_round_trip_is_exact(case, fmt, tmp_path_factory):
    obs_space, act_space, episodes = case
    base = tmp_path_factory.mktemp("rt")
    path = to_minari(episodes, "rt/case-v0", data_format=fmt, root=base)
    back = from_minari(path)
    assert len(back) == len(episodes)
    for orig, ep in zip(episodes, back):
        assert_same_episode(orig, ep, obs_space, act_space)
    # Minari itself reads the same steps (its own reader, its own spaces).
    ds = minari.MinariDataset(path / "data")
    assert ds.total_episodes == len(episodes)
    assert ds.total_steps == sum(len(e) for e in episodes)
    for k, (orig, ed) in enumerate(zip(episodes, ds.iterate_episodes())):
        assert ed.id == k
        assert_same(canonical_ours(orig, obs_space, act_space),
                    canonical_minari(ed, obs_space, act_space))


# -- datasets written by Minari -------------------------------------------------------

def _rng(seed=0):
    return np.random.default_rng(seed)


# The datasets Minari writes for these tests (minari_tools.CASES).
MINARI_CASES = ["box_actions_infos", "cartpole", "dict_tuple", "image", "text"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", sorted(MINARI_CASES))
def test_minari_written_dataset_reads_as_iterate_episodes(root, case, fmt):
    obs_space, act_space, buffers = _minari_buffers(case, [5, 1, 7, 3])
    _quiet_create(f"mw/{case}-{fmt}-v0", buffers, observation_space=obs_space,
                  action_space=act_space, data_format=fmt, author="a")
    ds = minari.load_dataset(f"mw/{case}-{fmt}-v0")
    ours = from_minari(f"mw/{case}-{fmt}-v0")
    theirs = list(ds.iterate_episodes())
    assert len(ours) == len(theirs) == 4
    for k, (ep, ed) in enumerate(zip(ours, theirs)):
        assert ep.id_ == str(ed.id) == str(k)
        assert ep.is_numpy and ep.t_started == 0 and len(ep) == len(ed)
        assert ep.is_terminated == bool(ed.terminations[-1])
        assert ep.is_truncated == bool(ed.truncations[-1])
        assert ep.observation_space == ds.observation_space
        assert ep.action_space == ds.action_space
        assert_same(canonical_ours(ep, obs_space, act_space),
                    canonical_minari(ed, obs_space, act_space))
    # The same through a MinariDataset, a path to the dataset and to its data.
    path = pathlib.Path(ds.storage.data_path)
    for source in (ds, path, path.parent, str(path)):
        again = from_minari(source, episode_indices=[2, 0])
        assert [e.id_ for e in again] == ["2", "0"]
        assert_same(canonical_ours(again[0], obs_space, act_space),
                    canonical_ours(ours[2], obs_space, act_space))


def test_a_filtered_minari_dataset_gives_its_episodes(root):
    obs_space, act_space, buffers = _minari_buffers("cartpole", [3, 8, 2, 9])
    ds = _quiet_create("mw/filter-v0", buffers, observation_space=obs_space,
                       action_space=act_space)
    long = ds.filter_episodes(lambda e: len(e) > 5)
    assert [e.id_ for e in from_minari(long)] == ["1", "3"]
    assert [len(e) for e in from_minari(long)] == [8, 9]


def test_arrays_are_adopted_not_copied_per_step(root):
    obs_space, act_space, buffers = _minari_buffers("cartpole", [50])
    _quiet_create("mw/view-v0", buffers, observation_space=obs_space, action_space=act_space,
                  data_format="arrow")
    (ep,) = from_minari("mw/view-v0")
    obs = ep.get_observations()
    assert obs.dtype == F32 and obs.shape == (51, 4)
    assert np.array_equal(obs, buffers[0].observations)
    # The episode behaves like any numpy'd episode: writes land in its own copy.
    ep.set_observations(new_data=np.zeros(4, F32), at_indices=0)
    assert np.array_equal(ep.get_observations(0), np.zeros(4, F32))
    assert np.array_equal(from_minari("mw/view-v0")[0].get_observations(),
                          buffers[0].observations)


@pytest.mark.parametrize("fmt", ["hdf5", "arrow"])
def test_image_datasets_stored_without_jpeg_read_as_minari_iterates_them(root, fmt):
    # Minari 0.5.4's jpeg_encoding=False: image spaces stored as arrays of
    # numbers (they were refused as "not pictures").
    obs_space = gym.spaces.Box(0, 255, (40, 32, 3), np.uint8)
    r = _rng(5)
    buffers = [EpisodeBuffer(observations=r.integers(0, 256, (n + 1, 40, 32, 3), dtype=np.uint8),
                             actions=r.integers(0, 6, n), rewards=[1.0] * n,
                             terminations=_flags(n, True), truncations=_flags(n, False))
               for n in (4, 30)]
    _quiet_create(f"mw/raw-{fmt}-v0", buffers, observation_space=obs_space,
                  action_space=gym.spaces.Discrete(6), data_format=fmt, jpeg_encoding=False)
    theirs = list(minari.load_dataset(f"mw/raw-{fmt}-v0").iterate_episodes())
    ours = from_minari(f"mw/raw-{fmt}-v0")
    for ep, ed, buf in zip(ours, theirs, buffers):
        assert ep.get_observations().dtype == np.uint8
        assert np.array_equal(ep.get_observations(), ed.observations)
        assert np.array_equal(ep.get_observations(), buf.observations)
        assert np.array_equal(ep.get_actions(), ed.actions)
    meta = root / f"mw/raw-{fmt}-v0" / "data" / "metadata.json"
    content = json.loads(meta.read_text())
    content["jpeg_encoding"] = "no"
    meta.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=r"metadata\.json: jpeg_encoding is 'no'"):
        from_minari(f"mw/raw-{fmt}-v0")


@pytest.mark.parametrize("fmt", ["hdf5", "arrow"])
def test_large_arrays_are_read_only_views_of_the_mapped_file(root, fmt):
    # An episode of 88 KB of observations: its file (Arrow) or its array
    # stored in one piece (HDF5) is memory-mapped, not read into memory.
    space = gym.spaces.Box(-1, 1, (40, 50), F32)
    r = _rng(6)
    episodes = []
    for n in (10, 2):
        ep = SingleAgentEpisode(observation_space=space, action_space=gym.spaces.Discrete(2))
        ep.add_env_reset(r.uniform(-1, 1, (40, 50)).astype(F32))
        for t in range(n):
            ep.add_env_step(r.uniform(-1, 1, (40, 50)).astype(F32), t % 2, 1.0,
                            terminated=t == n - 1)
        episodes.append(ep)
    to_minari(episodes, f"mw/big-{fmt}-v0", data_format=fmt)
    big, small = from_minari(f"mw/big-{fmt}-v0")
    theirs = list(minari.load_dataset(f"mw/big-{fmt}-v0").iterate_episodes())
    for ep, ed, mine in zip((big, small), theirs, episodes):
        assert np.array_equal(ep.get_observations(), ed.observations)
        assert np.array_equal(ep.get_observations(), mine.get_observations())
    arr = big.observations._tree.view()
    assert not arr.flags.writeable

    def bases(a):
        while a is not None:
            yield a
            a = a.obj if isinstance(a, memoryview) else getattr(a, "base", None)
    mapped = any(isinstance(b, mmap.mmap) or type(b).__name__ == "MemoryMappedFile"
                 for b in bases(arr))
    if fmt == "hdf5":
        assert mapped
        # (the small episode's 12 KB are read)
        assert not any(isinstance(b, mmap.mmap) for b in bases(small.observations._tree.view()))
    # The episode behaves like any numpy'd episode: writes land in its own copy.
    big.set_observations(new_data=np.zeros((40, 50), F32), at_indices=0)
    assert not big.get_observations(0).any()
    assert np.array_equal(from_minari(f"mw/big-{fmt}-v0")[0].get_observations(),
                          episodes[0].get_observations())


def test_infos_without_a_reset_value_start_at_the_first_step(root):
    # Older datasets kept infos from the first step on (N rows, not N+1):
    # the reset's info then lacks those keys, as TorchRL reads them.
    obs_space, act_space, buffers = _minari_buffers("cartpole", [4])
    b = buffers[0]
    buffers = [EpisodeBuffer(observations=b.observations, actions=b.actions, rewards=b.rewards,
                             terminations=b.terminations, truncations=b.truncations,
                             infos={"late": np.arange(4.0), "all": np.arange(5)})]
    _quiet_create("mw/late-v0", buffers, observation_space=obs_space, action_space=act_space)
    (ep,) = from_minari("mw/late-v0")
    assert ep.get_infos() == [{"all": 0}, {"all": 1, "late": 0.0}, {"all": 2, "late": 1.0},
                              {"all": 3, "late": 2.0}, {"all": 4, "late": 3.0}]


# -- pinned differences from Minari's own reader -------------------------------------

def test_scalar_array_infos_in_arrow_read_here_where_minari_fails(root):
    obs_space, act_space, buffers = _minari_buffers("cartpole", [3])
    b = buffers[0]
    buffers = [EpisodeBuffer(observations=b.observations, actions=b.actions, rewards=b.rewards,
                             terminations=b.terminations, truncations=b.truncations,
                             infos={"x": np.arange(4.0)})]
    _quiet_create("mw/scalar-v0", buffers, observation_space=obs_space, action_space=act_space,
                  data_format="arrow")
    with pytest.raises(ValueError, match="invalid literal"):
        list(minari.load_dataset("mw/scalar-v0").iterate_episodes())
    (ep,) = from_minari("mw/scalar-v0")
    assert ep.get_infos() == [{"x": 0.0}, {"x": 1.0}, {"x": 2.0}, {"x": 3.0}]


def test_a_uint8_box_minari_stored_as_pictures_is_refused_not_misread(root):
    # Minari 0.5.3's HDF5 writer JPEG-encodes any 2-D uint8 array; its reader
    # then hands the JPEG bytes back as observations. Ours names the mismatch
    # (and reads 0.5.4's, which stores the array as it is, as Minari does).
    obs_space = gym.spaces.Box(0, 255, (4,), np.uint8)
    r = _rng()
    buffers = [EpisodeBuffer(observations=r.integers(0, 256, (4, 4), dtype=np.uint8),
                             actions=r.integers(0, 2, 3), rewards=[1.0] * 3,
                             terminations=_flags(3, True), truncations=_flags(3, False))]
    _quiet_create("mw/u8-v0", buffers, observation_space=obs_space,
                  action_space=gym.spaces.Discrete(2))
    (ed,) = minari.load_dataset("mw/u8-v0").iterate_episodes()
    if ed.observations.shape == (4, 4):
        # Minari 0.5.4 stores such arrays as they are: read alike.
        assert np.array_equal(from_minari("mw/u8-v0")[0].get_observations(), ed.observations)
        return
    with pytest.raises(ValueError, match=r"main_data\.hdf5: episode 0: observations"):
        from_minari("mw/u8-v0")


def test_pictures_are_written_losslessly(root):
    # Minari stores pictures as JPEG (lossy); to_minari stores PNG, which
    # Minari's reader opens: the frames come back exactly, through both.
    space = gym.spaces.Box(0, 255, (48, 64, 3), np.uint8)
    frames = _rng().integers(0, 256, (4, 48, 64, 3), dtype=np.uint8)
    ep = SingleAgentEpisode(observations=list(frames), actions=[0, 1, 0], rewards=[1.0] * 3,
                            observation_space=space, action_space=gym.spaces.Discrete(2),
                            terminated=True, len_lookback_buffer=0)
    for fmt in FORMATS:
        to_minari([ep], f"img/png-{fmt}-v0", data_format=fmt)
        (ed,) = minari.load_dataset(f"img/png-{fmt}-v0").iterate_episodes()
        assert np.array_equal(ed.observations, frames)
        assert np.array_equal(from_minari(f"img/png-{fmt}-v0")[0].get_observations(), frames)


def test_pictures_decode_in_a_forked_child(root):
    # The helper thread that decodes half of the pictures is per process: a
    # child forked after the parent used it decodes too (no wait forever).
    space = gym.spaces.Box(0, 255, (32, 32), np.uint8)
    frames = _rng().integers(0, 256, (40, 32, 32), dtype=np.uint8)
    ep = SingleAgentEpisode(observations=list(frames), actions=[0] * 39, rewards=[1.0] * 39,
                            observation_space=space, action_space=gym.spaces.Discrete(2),
                            len_lookback_buffer=0, truncated=True)
    path = to_minari([ep], "img/fork-v0")
    assert np.array_equal(from_minari(path)[0].get_observations(), frames)
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        result = pool.apply_async(_frames_of, (str(path),))
        assert np.array_equal(result.get(timeout=120), frames)


def _frames_of(path):
    return from_minari(path)[0].get_observations()


# -- to_minari: metadata, layout, what Minari sees ------------------------------------

def _cartpole_episodes(count=3, seed=0, numpy=False):
    r = _rng(seed)
    obs_space = gym.spaces.Box(-np.inf, np.inf, (4,), F32)
    out = []
    for k in range(count):
        n = 3 + k
        ep = SingleAgentEpisode(observation_space=obs_space, action_space=gym.spaces.Discrete(2))
        ep.add_env_reset(r.standard_normal(4).astype(F32), {})
        for t in range(n):
            ep.add_env_step(r.standard_normal(4).astype(F32), int(r.integers(2)), 1.0, {},
                            terminated=t == n - 1)
        out.append(ep.to_numpy() if numpy else ep)
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_to_minari_writes_what_load_dataset_opens(root, fmt):
    episodes = _cartpole_episodes()
    path = to_minari(episodes, "team/cartpole/expert-v2", data_format=fmt, author="Ada",
                     author_email={"a@x.org", "b@x.org"}, algorithm_name="PPO",
                     code_permalink="https://example.org/code", description="three episodes",
                     requirements=["gymnasium>=1.0"], env_spec="CartPole-v1",
                     ref_min_score=9.0, ref_max_score=500.0)
    assert path == root / "team" / "cartpole" / "expert-v2"
    ds = minari.load_dataset("team/cartpole/expert-v2")
    assert ds.total_episodes == 3 and ds.total_steps == 3 + 4 + 5
    assert ds.observation_space == episodes[0].observation_space
    assert ds.action_space == gym.spaces.Discrete(2)
    assert ds.env_spec.id == "CartPole-v1"
    meta = ds.storage.metadata
    assert meta["author"] == {"Ada"} and meta["author_email"] == {"a@x.org", "b@x.org"}
    assert meta["algorithm_name"] == "PPO"
    assert meta["code_permalink"] == "https://example.org/code"
    assert meta["description"] == "three episodes"
    assert meta["requirements"] == ["gymnasium>=1.0"]
    assert meta["ref_min_score"] == 9.0 and meta["ref_max_score"] == 500.0
    assert meta["data_format"] == fmt and meta["dataset_id"] == "team/cartpole/expert-v2"
    assert meta["minari_version"] == minari.__version__
    assert "team/cartpole/expert-v2" in minari.list_local_datasets()
    assert ds.recover_environment().spec.id == "CartPole-v1"
    # Minari's namespaces, as its own writer leaves them.
    from minari.namespace import list_local_namespaces
    assert {"team", "team/cartpole"} <= set(list_local_namespaces())
    eds = list(ds.iterate_episodes())
    assert [ed.id for ed in eds] == [0, 1, 2]
    for ep, ed in zip(episodes, eds):
        assert_same(canonical_ours(ep, ds.observation_space, ds.action_space),
                    canonical_minari(ed, ds.observation_space, ds.action_space))
    # Minari's episode metadata, and our ids in it (HDF5) or in the files.
    ep_meta = list(ds.storage.get_episode_metadata(range(3)))
    assert [m["total_steps"] for m in ep_meta] == [3, 4, 5]
    assert [e.id_ for e in from_minari("team/cartpole/expert-v2")] == [e.id_ for e in episodes]
    # Minari can add episodes to it.
    ds.update_dataset_from_buffer([EpisodeBuffer(
        observations=np.zeros((3, 4), F32), actions=np.array([0, 1]), rewards=[1.0, 1.0],
        terminations=[False, True], truncations=[False, False])])
    again = from_minari("team/cartpole/expert-v2")
    assert len(again) == 4 and again[3].id_ == "3" and len(again[3]) == 2


def test_to_minari_takes_rllib_style_episodes_in_both_modes(root):
    for numpy in (False, True):
        episodes = _cartpole_episodes(numpy=numpy, seed=int(numpy))
        to_minari(episodes, f"modes/m{int(numpy)}-v0")
        back = from_minari(f"modes/m{int(numpy)}-v0")
        for orig, ep in zip(episodes, back):
            assert_same_episode(orig, ep, orig.observation_space, orig.action_space)


@pytest.mark.rllib
def test_to_minari_takes_rllib_episodes(root):
    pytest.importorskip("ray.rllib")
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode
    space = gym.spaces.Box(-1, 1, (2,), F32)
    ep = RLlibEpisode(observation_space=space, action_space=gym.spaces.Discrete(3))
    ep.add_env_reset(np.zeros(2, F32), {"k": 1})
    ep.add_env_step(np.ones(2, F32), 2, 0.5, {"k": 2}, extra_model_outputs={"logp": -0.1})
    ep.add_env_step(np.ones(2, F32) / 2, 1, 1.5, {"k": 3}, truncated=True,
                    extra_model_outputs={"logp": -0.2})
    to_minari([ep], "rllib/one-v0")
    (back,) = from_minari("rllib/one-v0")
    assert back.id_ == ep.id_ and back.is_truncated and not back.is_terminated
    assert np.array_equal(back.get_observations(), np.array([[0, 0], [1, 1], [.5, .5]], F32))
    assert back.get_actions().tolist() == [2, 1]
    assert back.get_rewards().tolist() == [0.5, 1.5]
    assert back.get_infos() == [{"k": 1}, {"k": 2}, {"k": 3}]
    assert back.get_extra_model_outputs("logp").tolist() == [-0.1, -0.2]


def test_torchrl_reads_what_to_minari_writes(root, tmp_path):
    # TorchRL's MinariExperienceReplay, offline (load_from_local_minari):
    # it opens main_data.hdf5 itself, extras included.
    torchrl_minari = pytest.importorskip("torchrl.data.datasets.minari_data")
    import logging
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    episodes = _cartpole_episodes(3)
    for ep in episodes:
        ep.extra_model_outputs["logp"] = type(ep.rewards)(
            data=np.linspace(-1, 0, len(ep), dtype=F32).tolist(), lookback=0)
    to_minari(episodes, "torchrl/cp-v0")
    rb = torchrl_minari.MinariExperienceReplay("torchrl/cp-v0", batch_size=4,
                                               root=tmp_path / "ours", download=False,
                                               load_from_local_minari=True)
    data = rb[:]
    steps = sum(map(len, episodes))
    assert data.batch_size == (steps,)
    assert data["observation"].shape == data["next", "observation"].shape == (steps, 4)
    assert data["extra_model_outputs", "logp"].shape == (steps,)
    obs = np.concatenate([e.get_observations()[:-1] for e in episodes])
    if not data["observation"].any():
        # TorchRL 0.14 builds the tensors, then keeps a contentless
        # memmap_like() copy of them: zeros, for Minari's own datasets too.
        obs_space, act_space, buffers = _minari_buffers("cartpole", [3, 4])
        _quiet_create("torchrl/theirs-v0", buffers, observation_space=obs_space,
                      action_space=act_space)
        theirs = torchrl_minari.MinariExperienceReplay(
            "torchrl/theirs-v0", batch_size=4, root=tmp_path / "theirs", download=False,
            load_from_local_minari=True)[:]
        assert not theirs["observation"].any()
        return
    assert np.array_equal(data["observation"].numpy(), obs)
    assert data["episode"].tolist() == sum(([k] * len(e) for k, e in enumerate(episodes)), [])
    assert data["action"].tolist() == sum((list(e.get_actions()) for e in episodes), [])
    assert np.array_equal(data["extra_model_outputs", "logp"].numpy(),
                          np.concatenate([e.get_extra_model_outputs("logp") for e in episodes]))


def test_spaces_come_from_the_keywords_when_episodes_have_none(root):
    ep = SingleAgentEpisode(observations=[0.5, 0.25], actions=[1], rewards=[2.0],
                            len_lookback_buffer=0, terminated=True)
    with pytest.raises(ValueError, match="observation_space="):
        to_minari([ep], "kw/none-v0")
    assert not (root / "kw").exists()
    obs_space = gym.spaces.Box(-1.0, 1.0, (), np.float64)
    to_minari([ep], "kw/given-v0", observation_space=obs_space,
              action_space=gym.spaces.Discrete(2))
    (back,) = from_minari("kw/given-v0")
    assert back.observation_space == obs_space
    assert back.get_observations().tolist() == [0.5, 0.25]
    assert back.get_actions().tolist() == [1]
    # An env names its spaces too.
    to_minari([SingleAgentEpisode(observations=[np.zeros(4, F32)] * 2, actions=[1],
                                  rewards=[1.0], len_lookback_buffer=0, terminated=True)],
              "kw/env-v0", env_spec="CartPole-v1")
    ds = minari.load_dataset("kw/env-v0")
    assert ds.observation_space == gym.make("CartPole-v1").observation_space
    assert ds.total_steps == 1


def test_an_empty_dataset(root):
    path = to_minari([], "empty/none-v0", observation_space=gym.spaces.Discrete(3),
                     action_space=gym.spaces.Discrete(2))
    assert from_minari(path) == []
    assert minari.load_dataset("empty/none-v0").total_episodes == 0


def test_spaces_serialize_as_minari_does():
    from minari.serialization import deserialize_space, serialize_space

    from episode.offline.minari.spaces import _space_from_json, _space_to_json
    spaces = [gym.spaces.Box(-1, 2, (2, 3), F32), gym.spaces.Box(0, 255, (32, 32, 3), np.uint8),
              gym.spaces.Box(-np.inf, np.inf, (), np.float64), gym.spaces.Discrete(5, start=-2),
              gym.spaces.MultiDiscrete([[2, 3], [4, 5]], start=[[0, 1], [0, 0]]),
              gym.spaces.MultiBinary([2, 2]), gym.spaces.MultiBinary(4),
              gym.spaces.Text(7, min_length=1, charset="xyz"),
              gym.spaces.Dict(OrderedDict(z=gym.spaces.Discrete(2),
                                          a=gym.spaces.Tuple([gym.spaces.Discrete(3)])))]
    for space in spaces:
        ours = json.dumps(_space_to_json(space))
        assert deserialize_space(ours) == space
        assert _space_from_json(json.loads(serialize_space(space)), "x") == space
        assert json.loads(ours) == json.loads(serialize_space(space))
    # Dict keys keep their written order (gymnasium would sort a plain dict).
    space = _space_from_json(_space_to_json(spaces[-1]), "x")
    assert list(space.spaces) == ["z", "a"]
    # Discrete keeps its dtype (Minari writes int64 for every Discrete).
    assert _space_from_json(_space_to_json(gym.spaces.Discrete(3, dtype=np.int32)),
                            "x").dtype == np.int32


# -- to_minari refuses what Minari cannot hold ----------------------------------------

def _no_dataset_left(root, dataset_id):
    assert not (root / dataset_id).exists()
    leftovers = [p for p in root.rglob("*") if p.name.startswith(".episode-minari-")]
    assert leftovers == []


def test_to_minari_refuses_what_minari_cannot_hold(root):
    obs_space = gym.spaces.Box(-1, 1, (2,), F32)

    def ep(**kw):
        e = SingleAgentEpisode(observation_space=obs_space, action_space=gym.spaces.Discrete(2),
                               **kw)
        return e

    started_later = SingleAgentEpisode(observations=[np.zeros(2, F32)] * 3, actions=[0, 1],
                                       rewards=[1.0, 1.0], t_started=5, len_lookback_buffer=0,
                                       observation_space=obs_space,
                                       action_space=gym.spaces.Discrete(2))
    with_lookback = SingleAgentEpisode(observations=[np.zeros(2, F32)] * 3, actions=[0, 1],
                                       rewards=[1.0, 1.0], len_lookback_buffer=1,
                                       observation_space=obs_space,
                                       action_space=gym.spaces.Discrete(2))
    running = ep()
    running.add_env_reset(np.zeros(2, F32))
    running.add_env_step(np.ones(2, F32), 1, 1.0)
    cut = running.cut()
    cut.add_env_step(np.ones(2, F32), 0, 1.0)
    not_reset = ep()
    reset_only = ep()
    reset_only.add_env_reset(np.zeros(2, F32))
    changing_infos = ep()
    changing_infos.add_env_reset(np.zeros(2, F32), {"a": 1})
    changing_infos.add_env_step(np.zeros(2, F32), 0, 1.0, {"a": 1, "b": 2})
    retyped_infos = ep()
    retyped_infos.add_env_reset(np.zeros(2, F32), {"a": 1})
    retyped_infos.add_env_step(np.zeros(2, F32), 0, 1.0, {"a": 1.5})
    list_infos = ep()
    list_infos.add_env_reset(np.zeros(2, F32), {"a": [1, 2]})
    list_infos.add_env_step(np.zeros(2, F32), 0, 1.0, {"a": [1, 2]})
    wrong_shape = SingleAgentEpisode(observations=[np.zeros(3, F32)] * 2, actions=[0],
                                     rewards=[1.0], len_lookback_buffer=0)
    wrong_kind = SingleAgentEpisode(observations=[np.zeros(2, F32)] * 2, actions=[0.5],
                                    rewards=[1.0], len_lookback_buffer=0)
    cases = [
        ([started_later], {}, "t_started"),
        ([with_lookback], {}, "lookback"),
        ([cut], {}, "t_started"),
        ([not_reset], {}, "no reset observation"),
        ([reset_only], {}, "no steps"),
        ([changing_infos], {}, "one structure"),
        ([retyped_infos], {}, "changes type"),
        ([list_infos], {}, "numbers, numpy arrays, strings"),
        ([wrong_shape], {"observation_space": obs_space, "action_space": gym.spaces.Discrete(2)},
         r"rows of shape \(3,\)"),
        ([wrong_kind], {"observation_space": obs_space, "action_space": gym.spaces.Discrete(2)},
         "float64 values"),
        (_cartpole_episodes(1), {"data_format": "zip"}, "data_format"),
        (_cartpole_episodes(1), {"total_steps": 3}, "itself"),
    ]
    empty_dict_info = ep()
    empty_dict_info.add_env_reset(np.zeros(2, F32), {"a": {}})
    empty_dict_info.add_env_step(np.zeros(2, F32), 0, 1.0, {"a": {}}, terminated=True)
    cases.append(([empty_dict_info], {"data_format": "parquet"}, "no parquet form"))
    for episodes, kw, match in cases:
        with pytest.raises(ValueError, match=match):
            to_minari(episodes, "bad/case-v0", **kw)
        _no_dataset_left(root, "bad/case-v0")
    with pytest.raises(ValueError, match="dataset id"):
        to_minari(_cartpole_episodes(1), "no version/../x")
    with pytest.raises(TypeError, match="JSON"):
        to_minari(_cartpole_episodes(1), "bad/meta-v0", algorithm_name="x", extra=object())
    with pytest.raises(TypeError, match="author"):
        to_minari(_cartpole_episodes(1), "bad/meta-v0", author=3)
    with pytest.raises(TypeError, match="iterable of episodes"):
        to_minari(_cartpole_episodes(1)[0], "bad/case-v0")
    _no_dataset_left(root, "bad/meta-v0")


def test_to_minari_refuses_running_episodes(root):
    """The docs say complete episodes: one neither terminated nor truncated
    is refused (Minari would read its last step as a mid-episode one)."""
    space = gym.spaces.Box(-1, 1, (2,), F32)
    done = SingleAgentEpisode(observations=[np.zeros(2, F32)] * 3, actions=[0, 1],
                              rewards=[1.0, 1.0], len_lookback_buffer=0, terminated=True,
                              observation_space=space, action_space=gym.spaces.Discrete(2))
    running = SingleAgentEpisode(observations=[np.zeros(2, F32)] * 3, actions=[0, 1],
                                 rewards=[1.0, 1.0], len_lookback_buffer=0,
                                 observation_space=space, action_space=gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="episode 1 is still running.*is_truncated = True"):
        to_minari([done, running], "bad/running-v0")
    _no_dataset_left(root, "bad/running-v0")
    running.is_truncated = True
    (_, back) = from_minari(to_minari([done, running], "good/cutoff-v0"))
    assert back.is_truncated and not back.is_terminated


def test_to_minari_refuses_multi_agent_episodes(root):
    from episode.multi_agent_episode import MultiAgentEpisode
    ma = MultiAgentEpisode()
    ma.add_env_reset(observations={"a": 0}, infos={"a": {}})
    with pytest.raises(ValueError, match="single-agent"):
        to_minari([ma], "bad/ma-v0")
    _no_dataset_left(root, "bad/ma-v0")


def test_to_minari_refuses_leaves_of_two_dtypes(root):
    space = gym.spaces.Box(-1, 1, (2,), F32)
    a = SingleAgentEpisode(observations=[np.zeros(2, F32)] * 2, actions=[0], rewards=[1.0],
                           len_lookback_buffer=0, observation_space=space,
                           action_space=gym.spaces.Discrete(2))
    b = SingleAgentEpisode(observations=[np.zeros(2, np.float64)] * 2, actions=[0],
                           rewards=[1.0], len_lookback_buffer=0, observation_space=space,
                           action_space=gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="one dtype per leaf"):
        to_minari([a, b], "bad/dtypes-v0")
    _no_dataset_left(root, "bad/dtypes-v0")


def test_arrow_datasets_hold_one_schema(root):
    # Minari reads an Arrow/Parquet dataset as one table: every episode's
    # infos (and extras) have the same keys and types. HDF5 keeps each
    # episode in its own group.
    space = gym.spaces.Box(-1, 1, (2,), F32)

    def episode(info):
        return SingleAgentEpisode(observations=[np.zeros(2, F32)] * 2, actions=[0],
                                  rewards=[1.0], infos=[info, info], len_lookback_buffer=0,
                                  terminated=True, observation_space=space,
                                  action_space=gym.spaces.Discrete(2))

    episodes = [episode({"a": 1}), episode({"b": 1.5})]
    for fmt in ("arrow", "parquet"):
        with pytest.raises(ValueError, match=r"episode 1's \['infos'\] differ"):
            to_minari(episodes, f"schema/{fmt}-v0", data_format=fmt)
        _no_dataset_left(root, f"schema/{fmt}-v0")
    to_minari(episodes, "schema/hdf5-v0")
    assert [e.get_infos() for e in from_minari("schema/hdf5-v0")] == [
        [{"a": 1}, {"a": 1}], [{"b": 1.5}, {"b": 1.5}]]
    assert [{k: v.tolist() for k, v in ed.infos.items()}
            for ed in minari.load_dataset("schema/hdf5-v0").iterate_episodes()] == [
        {"a": [1, 1]}, {"b": [1.5, 1.5]}]


def test_to_minari_never_overwrites(root):
    path = to_minari(_cartpole_episodes(2), "keep/me-v0")
    before = sorted((p.relative_to(path), p.read_bytes()) for p in path.rglob("*")
                    if p.is_file())
    with pytest.raises(ValueError, match="already exists"):
        to_minari(_cartpole_episodes(1, seed=5), "keep/me-v0")
    after = sorted((p.relative_to(path), p.read_bytes()) for p in path.rglob("*") if p.is_file())
    assert before == after
    assert len(from_minari("keep/me-v0")) == 2


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_write_that_fails_midway_leaves_nothing(root, fmt, monkeypatch):
    import episode.offline.minari.writer as mod
    calls = []

    # Fail while writing the data files, after some of them exist.
    target = "_write_hdf5" if fmt == "hdf5" else "_write_arrow"
    original = getattr(mod, target)

    def failing(data, *args):
        original(data, *args)
        calls.append(sorted(p.name for p in data.iterdir()))
        raise OSError("disk full")

    monkeypatch.setattr(mod, target, failing)
    with pytest.raises(OSError, match="disk full"):
        to_minari(_cartpole_episodes(3), "fail/midway-v0", data_format=fmt)
    assert calls and calls[0]              # files had been written aside
    _no_dataset_left(root, "fail/midway-v0")
    with pytest.raises(FileNotFoundError):
        from_minari("fail/midway-v0")


# -- from_minari refuses what is not a good Minari dataset ----------------------------

def _write_cartpole(root, dataset_id="good/cp-v0", fmt="hdf5", count=3):
    return to_minari(_cartpole_episodes(count), dataset_id, data_format=fmt)


def test_missing_dataset_and_foreign_folders(root, tmp_path):
    with pytest.raises(FileNotFoundError, match="not found locally"):
        from_minari("nobody/nothing-v0")
    with pytest.raises(FileNotFoundError):
        from_minari(tmp_path / "no_such_folder")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "data.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a Minari dataset"):
        from_minari(foreign)
    with pytest.raises(TypeError, match="MinariDataset, a dataset id or a path"):
        from_minari(42)


@pytest.mark.parametrize("fmt", FORMATS)
def test_damaged_metadata_is_named(root, fmt):
    path = _write_cartpole(root, f"meta/{fmt}-v0", fmt)
    meta_file = path / "data" / "metadata.json"
    good = json.loads(meta_file.read_text())

    def with_meta(change):
        meta = dict(good)
        change(meta)
        meta_file.write_text(json.dumps(meta))

    cases = [
        (lambda m: m.update(data_format="zarr"), "data_format"),
        (lambda m: m.update(minari_version="9.0.0"), "minari_version"),
        (lambda m: m.pop("minari_version"), "minari_version"),
        (lambda m: m.update(total_episodes=-1), "total_episodes"),
        (lambda m: m.update(total_episodes="3"), "total_episodes"),
        (lambda m: m.pop("observation_space"), "observation_space"),
        (lambda m: m.update(action_space="{not json"), "action_space is not JSON"),
        (lambda m: m.update(action_space=json.dumps({"type": "Graph"})), "Graph"),
        (lambda m: m.update(observation_space=json.dumps(
            {"type": "Box", "dtype": "float32", "shape": [4], "low": 0, "high": 1})),
         "bounds of shape"),
        (lambda m: m.update(observation_space=json.dumps(
            {"type": "Box", "dtype": "object", "shape": [4], "low": [0] * 4, "high": [1] * 4})),
         "Box of dtype"),
        (lambda m: m.update(total_steps=11), "total_steps"),
        (lambda m: m.update(total_episodes=4), "episode 3"),
    ]
    for change, match in cases:
        with_meta(change)
        with pytest.raises(ValueError, match=match) as info:
            from_minari(path)
        assert "metadata.json" in str(info.value) or "episode 3" in str(info.value)
    meta_file.write_text("{truncated")
    with pytest.raises(ValueError, match="metadata.json: not readable JSON"):
        from_minari(path)
    meta_file.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        from_minari(path)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_space_that_does_not_match_the_data(root, fmt):
    path = _write_cartpole(root, f"mismatch/{fmt}-v0", fmt)
    meta_file = path / "data" / "metadata.json"
    meta = json.loads(meta_file.read_text())
    spaces = {
        "observation_space": [gym.spaces.Box(-1, 1, (3,), F32),
                              gym.spaces.Box(-1, 1, (2, 3), F32),
                              gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (4,), F32)}),
                              gym.spaces.Discrete(3)],
        "action_space": [gym.spaces.Box(-1, 1, (2,), F32), gym.spaces.MultiDiscrete([2, 2]),
                         gym.spaces.Tuple([gym.spaces.Discrete(2)]), gym.spaces.Text(3)],
    }
    from episode.offline.minari.spaces import _space_to_json
    for key, wrong in spaces.items():
        for space in wrong:
            changed = dict(meta, **{key: json.dumps(_space_to_json(space))})
            meta_file.write_text(json.dumps(changed))
            with pytest.raises(ValueError, match=r"episode 0: (observations|actions)") as info:
                from_minari(path)
            assert str(path / "data") in str(info.value)


def test_episodes_that_end_before_their_last_step_are_refused(root):
    obs_space, act_space, buffers = _minari_buffers("cartpole", [4])
    b = buffers[0]
    bad = [EpisodeBuffer(observations=b.observations, actions=b.actions, rewards=b.rewards,
                         terminations=[False, True, False, False], truncations=b.truncations)]
    _quiet_create("mw/early-v0", bad, observation_space=obs_space, action_space=act_space)
    with pytest.raises(ValueError, match="terminations ends the episode at step 1 of 4"):
        from_minari("mw/early-v0")


def test_episode_indices_are_checked(root):
    path = _write_cartpole(root)
    assert [len(e) for e in from_minari(path, episode_indices=np.array([2, 2, 0]))] == [5, 5, 3]
    with pytest.raises(IndexError, match="episode 3"):
        from_minari(path, episode_indices=[3])
    with pytest.raises(IndexError):
        from_minari(path, episode_indices=[-1])
    with pytest.raises(TypeError):
        from_minari(path, episode_indices=[0.5])
    with pytest.raises(TypeError):
        from_minari(path, episode_indices=3)


def test_missing_pieces_of_a_dataset_are_named(root):
    h5 = _write_cartpole(root, "parts/h5-v0", "hdf5")
    import h5py
    with h5py.File(h5 / "data" / "main_data.hdf5", "a") as f:
        del f["episode_1/actions"]
    with pytest.raises(ValueError, match=r"main_data\.hdf5: episode 1: actions is missing"):
        from_minari(h5)
    arrow = _write_cartpole(root, "parts/arrow-v0", "arrow")
    shutil.rmtree(arrow / "data" / "2")
    with pytest.raises(ValueError, match="episode 2: the episode is missing"):
        from_minari(arrow)
    (arrow / "data" / "2").mkdir()
    with pytest.raises(ValueError, match="episode 2: its folder holds no data file"):
        from_minari(arrow)
    parquet = _write_cartpole(root, "parts/pq-v0", "parquet")
    (parquet / "data" / "main_data.hdf5").write_bytes(b"")   # ignored: not an episode folder
    os.remove(parquet / "data" / "0" / "part-0.parquet")
    with pytest.raises(ValueError, match="episode 0"):
        from_minari(parquet)
    no_file = _write_cartpole(root, "parts/nofile-v0", "hdf5")
    os.remove(no_file / "data" / "main_data.hdf5")
    with pytest.raises(ValueError, match="main_data.hdf5"):
        from_minari(no_file)


def test_importing_the_module_imports_no_storage_library():
    code = ("import sys, episode.offline.minari; "
            "print([m for m in ('h5py', 'pyarrow', 'PIL', 'minari') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=HERE).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("fmt, missing", [("hdf5", "h5py"), ("arrow", "pyarrow"),
                                           ("parquet", "pyarrow.parquet"),
                                           ("hdf5", "PIL.Image")])
def test_missing_modules_name_the_extra(root, monkeypatch, fmt, missing):
    episodes = _image_and_dict_episodes() if missing == "PIL.Image" else _cartpole_episodes()
    path = to_minari(episodes, f"mods/{fmt}-{missing.replace('.', '_')}-v0",
                     data_format=fmt)
    monkeypatch.setitem(sys.modules, missing, None)
    with pytest.raises(ImportError, match=r'pip install "episode\[minari\]"'):
        from_minari(path)
    with pytest.raises(ImportError, match=r'pip install "episode\[minari\]"'):
        to_minari(episodes, f"mods/again-{fmt}-v0", data_format=fmt)
    _no_dataset_left(root, f"mods/again-{fmt}-v0")


# -- damaged files, in a child process: an error, never a crash ----------------------

CHILD = r"""
import faulthandler, json, os, shutil, sys, traceback
faulthandler.enable()
from episode.offline.minari import from_minari
cases = json.loads(sys.argv[1])
for name, path in cases:
    print("CASE", name, flush=True)
    try:
        episodes = from_minari(path)
        for e in episodes:
            e.get_observations(); e.get_actions(); e.get_rewards(); e.get_infos()
        print("RESULT ok", flush=True)
    except ValueError as exc:
        print("RESULT ValueError", str(exc).replace("\n", " ")[:300], flush=True)
    except BaseException as exc:
        print("RESULT", type(exc).__name__, str(exc).replace("\n", " ")[:300], flush=True)
"""


def _data_file(path, fmt):
    if fmt == "hdf5":
        return path / "data" / "main_data.hdf5"
    ext = "arrow" if fmt == "arrow" else "parquet"
    return path / "data" / "1" / f"part-0.{ext}"


def _image_and_dict_episodes():
    space = gym.spaces.Dict({"img": gym.spaces.Box(0, 255, (32, 32, 3), np.uint8),
                             "v": gym.spaces.Box(-1, 1, (2,), F32)})
    r = _rng(3)
    out = []
    for n in (2, 3, 2):
        ep = SingleAgentEpisode(observation_space=space, action_space=gym.spaces.Discrete(3))
        ep.add_env_reset({"img": r.integers(0, 256, (32, 32, 3), dtype=np.uint8),
                          "v": np.zeros(2, F32)}, {"x": 0.5, "s": "ab"})
        for t in range(n):
            ep.add_env_step({"img": r.integers(0, 256, (32, 32, 3), dtype=np.uint8),
                             "v": np.full(2, t, F32)}, t % 3, 1.0, {"x": 1.5, "s": "cd"},
                            terminated=t == n - 1, extra_model_outputs={"logp": F32(-t)})
        out.append(ep)
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_damaged_files_give_an_error_not_a_crash(root, fmt, tmp_path):
    sources = {"cartpole": to_minari(_cartpole_episodes(3), f"src/cp-{fmt}-v0", data_format=fmt),
               "images": to_minari(_image_and_dict_episodes(), f"src/img-{fmt}-v0",
                                   data_format=fmt)}
    work = tmp_path / "cases"
    work.mkdir()
    cases, must_fail = [], set()
    r = _rng(11)

    def variant(kind, src, name, content):
        dst = work / f"{kind}-{name}"
        shutil.copytree(src, dst)
        _data_file(dst, fmt).write_bytes(content)
        cases.append((f"{kind}-{name}", str(dst)))

    for kind, src in sources.items():
        data = _data_file(src, fmt).read_bytes()
        for frac in (0.0, 0.1, 0.5, 0.9):
            variant(kind, src, f"truncated-{frac}", data[:int(len(data) * frac)])
            must_fail.add(f"{kind}-truncated-{frac}")
        variant(kind, src, "truncated-last-byte", data[:-1])
        must_fail.add(f"{kind}-truncated-last-byte")
        positions = sorted(set(r.integers(0, len(data), 48).tolist()) | set(range(0, 64, 8)))
        for pos in positions:
            flipped = bytearray(data)
            flipped[pos] ^= 0xFF
            variant(kind, src, f"flip-{pos}", bytes(flipped))
        for pos in sorted(set(r.integers(0, len(data), 8).tolist())):
            zeroed = bytearray(data)
            zeroed[pos:pos + 64] = bytes(len(zeroed[pos:pos + 64]))
            variant(kind, src, f"zeroed-{pos}", bytes(zeroed))
        variant(kind, src, "garbage", r.integers(0, 256, len(data), dtype=np.uint8).tobytes())
        must_fail.add(f"{kind}-garbage")
    results = case_results(CHILD, cases, timeout=600)
    assert set(results) == {name for name, _ in cases}
    for name, outcome in results.items():
        # A flipped byte may land in stored values or unused bytes: the read
        # then succeeds (no crash, no other error class).
        allowed = ("ValueError",) if name in must_fail else ("ValueError", "ok")
        assert outcome.split(" ")[0] in allowed, (name, outcome)
        if outcome.startswith("ValueError"):
            assert str(work) in outcome, (name, outcome)      # the error names the file


# -- the joined read of Arrow/Parquet episodes ----------------------------------------

def _one_by_one(monkeypatch, source, **kw):
    # No bytes may be joined: every episode is built from its own file.
    import episode.offline.minari.arrow as module
    with monkeypatch.context() as m:
        m.setattr(module, "_JOINED_BYTES", 0)
        return from_minari(source, **kw)


def _same_episodes(a, b, obs_space, act_space):
    assert [e.id_ for e in a] == [e.id_ for e in b]
    for x, y in zip(a, b):
        assert (len(x), x.is_terminated, x.is_truncated) == (len(y), y.is_terminated,
                                                             y.is_truncated)
        assert_same(canonical_ours(x, obs_space, act_space),
                    canonical_ours(y, obs_space, act_space))
        assert x.get_rewards().dtype == y.get_rewards().dtype
        assert [type(i) for i in x.get_infos()] == [type(i) for i in y.get_infos()]


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
@pytest.mark.parametrize("case", ["cartpole", "box_actions_infos", "dict_tuple"])
def test_joined_episodes_equal_those_read_one_by_one(root, monkeypatch, case, fmt):
    # Episodes of 1..7 steps, infos included (Minari writes no empty
    # episode of Box actions; test_joined_reset_only_episodes has them).
    obs_space, act_space, buffers = _minari_buffers(case, [5, 1, 7, 1, 3, 6], seed=4)
    _quiet_create(f"jn/{case}-{fmt}-v0", buffers, observation_space=obs_space,
                  action_space=act_space, data_format=fmt, author="a")
    joined = from_minari(f"jn/{case}-{fmt}-v0")
    _same_episodes(joined, _one_by_one(monkeypatch, f"jn/{case}-{fmt}-v0"), obs_space, act_space)
    theirs = list(minari.load_dataset(f"jn/{case}-{fmt}-v0").iterate_episodes())
    for ep, ed in zip(joined, theirs):
        assert_same(canonical_ours(ep, obs_space, act_space),
                    canonical_minari(ed, obs_space, act_space))
    # Each value as the info's own: Python floats and bools, numpy rows.
    if case == "box_actions_infos":
        info = joined[2].get_infos(3)
        assert type(info["x"]) is float and type(info["flag"]) is bool
        assert info["arr"].shape == (2, 2)


def test_joined_episodes_keep_their_own_rows(root):
    obs_space, act_space, buffers = _minari_buffers("cartpole", [4, 3], seed=5)
    _quiet_create("jn/own-v0", buffers, observation_space=obs_space, action_space=act_space,
                  data_format="arrow")
    a, b = from_minari("jn/own-v0")
    a.set_observations(new_data=np.full(4, 9, F32), at_indices=-1)
    a.set_actions(new_data=1, at_indices=-1)
    assert np.array_equal(b.get_observations(), buffers[1].observations)
    assert np.array_equal(b.get_actions(), buffers[1].actions)
    assert np.array_equal(a.get_observations(slice(0, 4)), buffers[0].observations[:4])
    assert np.array_equal(from_minari("jn/own-v0")[0].get_observations(),
                          buffers[0].observations)


def test_files_of_another_schema_are_read_one_by_one(root, monkeypatch):
    obs_space, act_space, buffers = _minari_buffers("cartpole", [3, 4, 2], seed=6)
    ds = _quiet_create("jn/schemas-v0", buffers, observation_space=obs_space,
                       action_space=act_space, data_format="arrow")
    import pyarrow as pa
    import pyarrow.ipc
    file = pathlib.Path(ds.storage.data_path) / "1" / "part-0.arrow"
    table = pa.ipc.open_file(file.read_bytes()).read_all()
    table = table.set_column(table.schema.get_field_index("rewards"), "rewards",
                             table["rewards"].cast(pa.float32()))
    with pa.ipc.new_file(file, table.schema) as writer:
        writer.write_table(table)
    ours = from_minari("jn/schemas-v0")
    assert [e.get_rewards().dtype for e in ours] == [np.float64, np.float32, np.float64]
    _same_episodes(ours, _one_by_one(monkeypatch, "jn/schemas-v0"), obs_space, act_space)


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_the_first_damaged_episode_in_order_is_named(root, fmt):
    obs_space, act_space, buffers = _minari_buffers("cartpole", [4, 4, 4, 4], seed=7)
    b = buffers[1]
    buffers[1] = EpisodeBuffer(observations=b.observations, actions=b.actions,
                               rewards=b.rewards, terminations=[False, True, False, False],
                               truncations=_flags(4, False))
    ds = _quiet_create(f"jn/faults-{fmt}-v0", buffers, observation_space=obs_space,
                       action_space=act_space, data_format=fmt)
    data = pathlib.Path(ds.storage.data_path)
    # A later episode's file is garbage: the early end of episode 1 is named.
    (data / "3" / f"part-0.{fmt}").write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match=r"1[/\\]part-0\.\w+: episode 1: terminations ends "
                                         r"the episode at step 1 of 4"):
        from_minari(f"jn/faults-{fmt}-v0")
    # Before episode 1: the garbage file is named.
    with pytest.raises(ValueError, match=r"3[/\\]part-0\.\w+: episode 3: not a readable"):
        from_minari(f"jn/faults-{fmt}-v0", episode_indices=[0, 2, 3, 1])
    shutil.rmtree(data / "2")
    with pytest.raises(ValueError, match=r"episode 2: the episode is missing"):
        from_minari(f"jn/faults-{fmt}-v0", episode_indices=[0, 2, 3])


def test_joined_reset_only_episodes(root, monkeypatch):
    # Neither writer makes an episode of no steps; a file cut to its reset
    # row is one (read by index: total_steps no longer holds).
    obs_space, act_space, buffers = _minari_buffers("cartpole", [3, 4, 2, 5], seed=8)
    ds = _quiet_create("jn/empty-v0", buffers, observation_space=obs_space,
                       action_space=act_space, data_format="arrow")
    import pyarrow as pa
    import pyarrow.ipc
    for k in (1, 3):
        file = pathlib.Path(ds.storage.data_path) / str(k) / "part-0.arrow"
        table = pa.ipc.open_file(file.read_bytes()).read_all().slice(0, 1)
        with pa.ipc.new_file(file, table.schema) as writer:
            writer.write_table(table)
    ours = from_minari("jn/empty-v0", episode_indices=[0, 1, 2, 3])
    assert [len(e) for e in ours] == [3, 0, 2, 0]
    assert not ours[1].is_terminated and not ours[1].is_truncated
    assert np.array_equal(ours[3].get_observations(), buffers[3].observations[:1])
    _same_episodes(ours, _one_by_one(monkeypatch, "jn/empty-v0", episode_indices=[0, 1, 2, 3]),
                   obs_space, act_space)
