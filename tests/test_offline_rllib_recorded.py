"""read_episodes on what RLlib 2.60's own recorder wrote (recorded in a
child process that never imports the project, tests/rllib_recordings.py):
each recorder setting read back as the episodes RLlib sampled, values equal
to RLlib's own decode of the files (its unpack_if_needed)."""
from __future__ import annotations

import glob
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("ray.rllib")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytestmark = pytest.mark.rllib

from children import child_env  # noqa: E402

from episode.offline import DatasetError, read_episodes  # noqa: E402
from episode.offline import rllib_format  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SETTINGS = ["rows", "episodes", "rows_unpacked", "rows_max", "rows_max_no_rest",
            "episodes_max", "dict", "tuple", "dict_episodes"]
# Settings whose files hold every step sampled (RLlib's recorder loses
# rows with output_max_rows_per_file: of several full files in one
# sample() it writes the last; without output_write_remaining_data the
# rest is never written).
COMPLETE = ["rows", "episodes", "rows_unpacked", "dict", "tuple", "dict_episodes"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("rllib-recorded")
    done = subprocess.run([sys.executable, os.path.join(HERE, "rllib_recordings.py"), str(out),
                           *SETTINGS], capture_output=True, text=True, timeout=900,
                          env=child_env(), cwd=HERE, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _truth(recorded, name):
    with open(f"{recorded}/{name}.truth", "rb") as f:
        return pickle.load(f)


def _sampled_episodes(chunks):
    """RLlib's sampled chunks joined by id, in sampled order."""
    episodes, by_id = [], {}
    for chunk in chunks:
        earlier = by_id.get(chunk["id"])
        if earlier is not None and earlier["t_started"] + earlier["len"] == chunk["t_started"]:
            earlier["len"] += chunk["len"]
            earlier["obs"] += chunk["obs"][1:]
            for key in ("actions", "rewards"):
                earlier[key] += chunk[key]
            for key, values in chunk["extras"].items():
                earlier["extras"][key] += values
            earlier["terminated"], earlier["truncated"] = chunk["terminated"], chunk["truncated"]
        else:
            chunk = dict(chunk, extras=dict(chunk["extras"]))
            episodes.append(chunk)
            by_id[chunk["id"]] = chunk
    return [e for e in episodes if e["len"]]


def same_value(ours, theirs, where=""):
    """Equal values of the same structure; arrays of the same dtype and shape."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and set(ours) == set(theirs), where
        for key in theirs:
            same_value(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(theirs, tuple):
        assert isinstance(ours, tuple) and len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            same_value(a, b, f"{where}.{i}")
    elif isinstance(theirs, np.ndarray) and theirs.ndim:
        assert isinstance(ours, np.ndarray), (where, ours)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, (where, ours, theirs)
        np.testing.assert_array_equal(ours, theirs, err_msg=where)
    else:
        assert not isinstance(ours, (str, bytes)), (where, ours)
        assert np.asarray(ours).item() == np.asarray(theirs).item(), (where, ours, theirs)


def _steps(episode):
    n = len(episode)
    return [(episode.get_observations(i), episode.get_actions(i), episode.get_rewards(i),
             episode.get_observations(i + 1),
             {k: episode.get_extra_model_outputs(k, i) for k in episode.extra_model_outputs})
            for i in range(n)]


@pytest.mark.parametrize("name", COMPLETE)
def test_a_complete_recording_reads_back_as_sampled(recorded, name):
    """Whole episodes (chunks of several sample() calls joined, rows from
    many files, RLlib's repeated writes read once), packed cells unpacked,
    every extra model output there."""
    expected = _sampled_episodes(_truth(recorded, name))
    ds = read_episodes(recorded / name)
    assert ds.format == ("rllib_episodes" if "episodes" in name else "rllib_rows")
    assert [(e.id_, len(e)) for e in ds] == [(e["id"], e["len"]) for e in expected]
    assert ds.num_steps == sum(e["len"] for e in expected)
    for ours, theirs in zip(ds, expected):
        assert bool(ours.is_terminated) == theirs["terminated"]
        assert bool(ours.is_truncated) == theirs["truncated"]
        assert set(ours.extra_model_outputs) == set(theirs["extras"])
        for i, step in enumerate(_steps(ours)):
            where = f"{ours.id_} step {i}"
            same_value(step[0], theirs["obs"][i], f"{where} obs")
            same_value(step[3], theirs["obs"][i + 1], f"{where} next obs")
            same_value(step[1], theirs["actions"][i], f"{where} action")
            same_value(step[2], theirs["rewards"][i], f"{where} reward")
            for key, value in step[4].items():
                same_value(value, theirs["extras"][key][i], f"{where} {key}")


def _files(folder):
    return sorted(glob.glob(f"{folder}/**/*.parquet", recursive=True),
                  key=rllib_format.file_order)


def _rllib_rows(folder, compress):
    """RLlib's decode of each row of each file (its unpack_if_needed on the
    cells of the columns `compress` names, new_obs with obs, as its reader
    does with input_compress_columns), in written order, RLlib's repeated
    writes included."""
    from ray.rllib.utils.compression import unpack_if_needed

    packed = set(compress) | ({"new_obs"} if "obs" in compress else set())
    rows = []
    for path in _files(folder):
        batch = rllib_format.to_numpy_batch(pq.read_table(path))
        for i in range(len(batch["obs"])):
            rows.append({key: unpack_if_needed(values[i]) if key in packed else values[i]
                         for key, values in batch.items()})
    return rows


@pytest.mark.parametrize("name", ["rows", "rows_max", "rows_max_no_rest", "dict"])
def test_each_written_row_is_a_step_once(recorded, name):
    """Every row RLlib wrote (a row written again by a later write counted
    once) is one step of the episode of its eps_id, in written order, with
    RLlib's decode of its cells; a gap RLlib left (rows it never wrote)
    ends an episode."""
    rows, seen = [], set()
    compress = ["obs", "actions", "logits"] if name == "dict" else ["obs"]
    for row in _rllib_rows(recorded / name, compress):
        key = (row["eps_id"], pickle.dumps(row["obs"]), pickle.dumps(row["new_obs"]))
        if key not in seen:
            seen.add(key)
            rows.append(row)
    by_id: dict = {}
    for row in rows:
        by_id.setdefault(row["eps_id"], []).append(row)
    ds = read_episodes(recorded / name)
    assert ds.num_steps == len(rows)
    steps: dict = {}
    for episode in ds:
        steps.setdefault(episode.id_, []).extend(_steps(episode))
    assert set(steps) == set(by_id)
    extras = [k for k in rows[0] if k not in rllib_format.SCHEMA]
    for eps_id, written in by_id.items():
        for i, (row, step) in enumerate(zip(written, steps[eps_id], strict=True)):
            where = f"{eps_id} row {i}"
            same_value(step[0], row["obs"], where)
            same_value(step[3], row["new_obs"], where)
            same_value(step[1], row["actions"], where)
            same_value(step[2], row["rewards"], where)
            for key in extras:
                same_value(step[4][key], row[key], f"{where} {key}")
    # Sampled steps that RLlib lost are missing, the rest are the sampled ones.
    sampled = {(e["id"], e["t_started"] + i) for e in _truth(recorded, name)
               for i in range(e["len"])}
    assert len(sampled) >= len(rows)
    if name == "rows_max":
        assert len(sampled) > len(rows)      # RLlib's loop wrote only its last full file


def test_a_pickled_object_column_never_runs_code(tmp_path):
    """Ray Data keeps values Arrow has no type for (RLlib's Tuple
    observations) as pickles; Ray refuses to read them by default, ours
    reads numpy's through the restricted unpickler and refuses the rest."""
    from ray.data._internal.object_extensions.arrow import ArrowPythonObjectArray

    class Boom:
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / "ran"),))

    obs = [(np.zeros(2, np.float32), np.int64(1)), Boom()]
    table = pa.table({"eps_id": ["a", "a"], "obs": ArrowPythonObjectArray.from_objects(obs),
                      "actions": [0, 1], "rewards": [1.0, 1.0],
                      "new_obs": ArrowPythonObjectArray.from_objects(obs[::-1]),
                      "terminateds": [False, True], "truncateds": [False, False]})
    pq.write_table(table, tmp_path / "rows.parquet")
    with pytest.raises(DatasetError, match="rows.parquet.*only numpy"):
        read_episodes(tmp_path / "rows.parquet")
    assert not (tmp_path / "ran").exists()
    good = table.slice(0, 1)
    good = good.set_column(4, "new_obs", ArrowPythonObjectArray.from_objects(obs[:1]))
    pq.write_table(good, tmp_path / "rows.parquet")
    (episode,) = read_episodes(tmp_path / "rows.parquet")
    same_value(episode.get_observations(0), obs[0])


def test_packed_columns_are_found_without_being_named(tmp_path):
    """RLlib's reader unpacks only the columns its input_compress_columns
    names (its default: obs and new_obs); packed actions or extra outputs it
    hands on as strings. Ours knows a packed value by its first bytes."""
    actions = [np.array([0.5, -0.5], np.float32), np.array([0.25, 0.0], np.float32)]
    obs = [np.zeros(3, np.float32), np.ones(3, np.float32), np.full(3, 2, np.float32)]
    table = pa.table({
        "eps_id": ["e", "e"], "obs": [rllib_format.pack_value(o) for o in obs[:2]],
        "actions": [rllib_format.pack_value(a) for a in actions], "rewards": [0.0, 1.0],
        "new_obs": [rllib_format.pack_value(o) for o in obs[1:]],
        "terminateds": [False, True], "truncateds": [False, False],
        "logits": [rllib_format.pack_value(a * 2) for a in actions], "note": ["BCJ", "x"]})
    ours = rllib_format.rows_to_episodes(table, compress_columns=("obs",))
    (episode,) = ours
    same_value(episode.get_actions(1), actions[1])
    same_value(episode.get_extra_model_outputs("logits", 0), actions[0] * 2)
    assert episode.get_extra_model_outputs("note", 0) == "BCJ"     # not packed: kept
    same_value(episode.get_observations(2), obs[2])
