"""Opening a kept replay buffer runs no code from its folder: its metadata
is data (msgpack), its arrays raw bytes. A code-running pickle planted where
the first format version kept a pickle (the metadata, the objects file), its
length and SHA-256 made to match, is refused with a clear error and never
runs; folders of that version are refused with the way to convert them, and
convert_v1() converts a folder its user trusts."""
from __future__ import annotations

import hashlib
import os
import pickle

import numpy as np
import pytest

from difftools import compare
from replay_tools import (chunk_episode, multi_agent_stream, plain_state, single_agent_stream,
                          unmapped)
from test_replay_frames import LAYOUTS, stacked_stream

from episode import MultiAgentEpisode, SingleAgentEpisode, values
from episode.replay import (MultiAgentEpisodeReplayBuffer, MultiAgentPrioritizedEpisodeReplayBuffer,
                            PrioritizedEpisodeReplayBuffer, EpisodeReplayBuffer, kept)


class _Planted:
    """A pickle that makes a folder when it is loaded."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _filled(cls, frames: bool = False):
    if cls in (MultiAgentEpisodeReplayBuffer, MultiAgentPrioritizedEpisodeReplayBuffer):
        buffer = cls(capacity=200, seed=3)
        for call in multi_agent_stream(3, [MultiAgentEpisode], calls=6):
            buffer.add([chunk[0] for chunk in call])
        return buffer
    if frames:
        shape, dtype, k, axis = LAYOUTS["last_axis"]
        buffer = cls(capacity=200, seed=3, frame_stack=k, frame_stack_axis=axis)
        for i, call in enumerate(stacked_stream(3, "last_axis", calls=10)):
            buffer.add([chunk_episode(SingleAgentEpisode, c, numpy=i % 2 == 0, extras=True,
                                      lookback=True) for c in call])
        return buffer
    buffer = cls(capacity=200, seed=3)
    for i, call in enumerate(single_agent_stream(4, calls=6)):
        buffer.add([chunk_episode(SingleAgentEpisode, c, numpy=i % 2 == 0, extras=True,
                                  lookback=True) for c in call])
    return buffer


KINDS = [(EpisodeReplayBuffer, False), (PrioritizedEpisodeReplayBuffer, False),
         (EpisodeReplayBuffer, True), (MultiAgentEpisodeReplayBuffer, False),
         (MultiAgentPrioritizedEpisodeReplayBuffer, False)]


def _kind_id(kind):
    return kind[0].__name__ + ("-frames" if kind[1] else "")


def _planted_meta(folder, version: int, payload: bytes) -> None:
    # The metadata file replaced by `payload` behind a header that matches it.
    header = kept.MAGIC + kept._HEADER.pack(version, len(payload),
                                            hashlib.sha256(payload).digest())
    (folder / kept.META_NAME).write_bytes(header + payload)


@pytest.mark.parametrize("kind", KINDS, ids=_kind_id)
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("verify", [False, True])
def test_a_planted_metadata_pickle_never_runs(tmp_path, kind, version, verify):
    cls, frames = kind
    folder = tmp_path / "kept"
    _filled(cls, frames).save(folder)
    marker = str(tmp_path / "ran")
    _planted_meta(folder, version, pickle.dumps({"kind": cls.__name__, "x": _Planted(marker)}))
    with pytest.raises(ValueError, match="format version 1.*convert_v1" if version == 1
                       else "cannot be read") as error:
        cls.open(folder, verify=verify)
    assert str(folder / kept.META_NAME) in str(error.value)
    assert not os.path.exists(marker)


@pytest.mark.parametrize("verify", [False, True])
def test_a_planted_objects_file_pickle_never_runs(tmp_path, monkeypatch, verify):
    # (The state's arrays, every one, in a file of their own.)
    monkeypatch.setattr(kept, "OBJECTS_APART", 0)
    monkeypatch.setattr(values, "APART_BYTES", 0)
    folder = tmp_path / "kept"
    _filled(MultiAgentPrioritizedEpisodeReplayBuffer).save(folder)
    meta = kept._read_meta(str(folder))
    name, nbytes = meta["objects"]["file"][1], meta["objects"]["file"][2]
    assert nbytes > 1000
    marker = str(tmp_path / "ran")
    planted = pickle.dumps(_Planted(marker))
    (folder / name).write_bytes((planted * (nbytes // len(planted) + 1))[:nbytes])
    try:
        MultiAgentPrioritizedEpisodeReplayBuffer.open(folder, verify=verify)
    except ValueError:
        pass          # (arrays of other numbers may fail a check; they never run)
    else:
        assert not verify, "verify=True must refuse a file whose CRC-32 differs"
    assert not os.path.exists(marker)


def _as_version_1(folder, buffer) -> None:
    # The folder as the first format version wrote it: its metadata (the
    # buffer's state and its stores' episode metas as objects) pickled.
    meta = kept._read_meta(str(folder))
    meta["buffer"] = buffer._kept_state()
    meta.pop("objects", None)
    meta["store"] = kept._store_state(meta["store"], "")
    for entry in meta.get("stores", ()):
        entry["store"] = kept._store_state(entry["store"], "")
    _planted_meta(folder, 1, pickle.dumps(meta, protocol=5))


@pytest.mark.parametrize("kind", KINDS, ids=_kind_id)
def test_a_version_1_folder_is_refused_then_converted_on_trust(tmp_path, kind):
    cls, frames = kind
    buffer = _filled(cls, frames)
    folder = tmp_path / "kept"
    buffer.save(folder)
    _as_version_1(folder, buffer)
    with pytest.raises(ValueError, match=r"format version 1.*convert_v1\("):
        cls.open(folder)
    kept.convert_v1(folder)
    opened = cls.open(folder, verify=True)
    compare(unmapped(plain_state(buffer.get_state())), unmapped(plain_state(opened.get_state())),
            "state")
    with pytest.raises(ValueError, match="not 1: nothing to convert"):
        kept.convert_v1(folder)


def test_a_buffer_holding_objects_that_are_not_data_is_not_saved(tmp_path):
    """An info of a type that is not data: save() raises TypeError naming it
    and writes nothing; plain containers, numpy values, sets and spaces are
    kept."""
    import gymnasium as gym

    class Custom:
        pass

    buffer = EpisodeReplayBuffer(capacity=100)
    buffer.add(SingleAgentEpisode(observations=[0.0, 1.0], actions=[0], rewards=[1.0],
                                  infos=[{"a": {1, 2}, "b": (np.int8(3), b"x")},
                                         {"space": gym.spaces.Discrete(3)}]))
    buffer.save(tmp_path / "good")
    opened = EpisodeReplayBuffer.open(tmp_path / "good")
    assert opened.episodes[0].get_infos() == buffer.episodes[0].get_infos()
    bad = EpisodeReplayBuffer(capacity=100)
    bad.add(SingleAgentEpisode(observations=[0.0, 1.0], actions=[0], rewards=[1.0],
                               infos=[{}, {"c": Custom()}]))
    with pytest.raises(TypeError, match="cannot be saved.*Custom"):
        bad.save(tmp_path / "bad")
    assert not os.path.exists(tmp_path / "bad" / kept.META_NAME)
