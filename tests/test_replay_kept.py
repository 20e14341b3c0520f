"""Replay buffers kept in a folder (`save()`) and opened again (`open()`):
the same answers as the buffer had when it was saved, rows mapped rather
than read, files written whole, and every damaged or foreign file refused
with an error naming it."""
import hashlib
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from episode import SingleAgentEpisode, values
from episode._keep import build_store, store_state
from episode.replay import (EpisodeReplayBuffer, MultiAgentEpisodeReplayBuffer,
                            PrioritizedEpisodeReplayBuffer)
from episode.replay import kept

KINDS = [EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer]


def _episodes(rng, n, start=0, obs_shape=(4,), infos=False, steps=(3, 40)):
    out = []
    for i in range(n):
        steps_ = int(rng.integers(*steps))
        obs = rng.normal(size=(steps_ + 1,) + obs_shape).astype(np.float32)
        out.append(SingleAgentEpisode(
            id_=f"e{start + i}", observations=list(obs),
            actions=[int(a) for a in rng.integers(0, 2, steps_)],
            rewards=[float(r) for r in rng.normal(size=steps_)],
            infos=[{"t": t} if infos and t % 3 == 0 else {} for t in range(steps_ + 1)],
            extra_model_outputs={"logp": list(rng.normal(size=steps_).astype(np.float32))},
            terminated=bool(rng.integers(2)), len_lookback_buffer=0))
    return out


def _same(a, b, path="state"):
    """Equal, with dtypes and types (NaN equal to NaN)."""
    if isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            _same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype, path
        np.testing.assert_array_equal(a, b, err_msg=path)
    else:
        assert type(a) is type(b), (path, a, b)
        assert a == b or (a != a and b != b), (path, a, b)


def _filled(cls, rng, storage=None, episodes=12, rounds=8):
    """A buffer that has added, evicted, sampled and (prioritized) updated."""
    buffer = cls(capacity=400, storage=storage, seed=3)
    for k in range(rounds):
        buffer.add(_episodes(rng, episodes, episodes * k, infos=True))
        if cls is PrioritizedEpisodeReplayBuffer:
            buffer.sample(8, n_step=2)
            buffer.update_priorities(rng.random(8))
        else:
            buffer.sample(4, n_step=1, sample_episodes=True)
    assert buffer.get_num_episodes_evicted() > 0
    return buffer


def _draws(buffer, rng_seed):
    """Every kind of draw, in one sequence (priorities updated between)."""
    out = []
    prioritized = isinstance(buffer, PrioritizedEpisodeReplayBuffer)
    updates = np.random.default_rng(rng_seed)
    for n_step in (1, 3, (1, 4)):
        batch = buffer.sample_batch(16, n_step=n_step, include_extra_model_outputs=True)
        batch.pop("indices")          # (tagged by their store)
        out.append(batch)
        if prioritized:
            buffer.update_priorities(updates.random(16))
    batch = buffer.sample_batch(8, batch_length_T=5, lookback=1)
    batch.pop("indices")
    out.append(batch)
    episodes = buffer.sample(6, n_step=2, **({} if prioritized else {"sample_episodes": True}))
    out.append([dict(e.get_state(), id_=None) for e in episodes])
    if prioritized:
        out.append(list(buffer._last_sampled_indices))
        buffer.update_priorities(updates.random(6))
    else:
        out.append(buffer.sample(4, batch_length_T=3))
    return out


@pytest.mark.parametrize("cls", KINDS)
@pytest.mark.parametrize("storage", [False, True])
def test_an_opened_buffer_answers_as_the_saved_one(cls, storage, tmp_path):
    rng = np.random.default_rng(0)
    buffer = _filled(cls, rng, tmp_path / "scratch" if storage else None)
    if cls is PrioritizedEpisodeReplayBuffer:
        buffer.sample_batch(12, n_step=3)        # (the last draw: public keys)
    buffer.save(tmp_path / "kept")
    opened = cls.open(tmp_path / "kept")
    assert type(opened) is cls
    _same(buffer.get_state(), opened.get_state())
    _same(buffer.get_metrics(), opened.get_metrics())
    for name in ("get_num_episodes", "get_num_episodes_evicted", "get_num_timesteps",
                 "get_sampled_timesteps", "get_added_timesteps"):
        assert getattr(buffer, name)() == getattr(opened, name)()
    # The same rng state was kept: the same draws without reseeding.
    _same(_draws(buffer, 1), _draws(opened, 1))
    # Both go on alike: adding, evicting, drawing.
    more = _episodes(rng, 30, 1000)
    buffer.add(more)
    opened.add(more)
    _same(buffer.get_state(), opened.get_state())
    _same(_draws(buffer, 2), _draws(opened, 2))
    _same(buffer.get_metrics(), opened.get_metrics())


@pytest.mark.parametrize("cls", KINDS)
def test_update_priorities_after_open_uses_the_saved_draw(cls, tmp_path):
    """The last draw's steps (sample_batch()'s, with a step evicted since)
    are kept: update_priorities() without indices lands where it would."""
    if cls is EpisodeReplayBuffer:
        pytest.skip("uniform buffers keep no priorities")
    rng = np.random.default_rng(5)
    buffer = _filled(cls, rng)
    buffer.sample_batch(32, n_step=1)
    buffer.add(_episodes(rng, 6, 500))              # (evicts some drawn steps)
    buffer.save(tmp_path)
    opened = cls.open(tmp_path)
    priorities = rng.random(32)
    buffer.update_priorities(priorities)
    opened.update_priorities(priorities)
    _same(buffer.get_state(), opened.get_state())


def test_add_transition_goes_on_after_open(tmp_path):
    """add_transition()'s open episodes are kept."""
    buffer = EpisodeReplayBuffer(capacity=100, seed=0)
    obs = np.zeros((2, 3), np.float32)
    for t in range(5):
        nxt = obs + 1
        buffer.add_transition(obs, nxt, np.array([0, 1]), np.array([1.0, 2.0]),
                              np.array([False, t == 3]), np.array([False, False]))
        obs = nxt
    buffer.save(tmp_path)
    opened = EpisodeReplayBuffer.open(tmp_path)
    for b in (buffer, opened):
        b.add_transition(obs, obs + 1, np.array([1, 1]), np.array([0.5, 0.5]),
                         np.array([False, False]), np.array([True, True]))
    _same(buffer.get_state(), opened.get_state())


def test_the_rows_are_mapped_not_read(tmp_path):
    """Opening reads the metadata: the rows stay in the files (read-only
    mappings), and what open() allocates is a small part of them."""
    rng = np.random.default_rng(0)
    buffer = EpisodeReplayBuffer(capacity=20_000)
    for k in range(10):
        buffer.add(_episodes(rng, 4, 4 * k, obs_shape=(32, 32), steps=(150, 250)))  # 4 KB a row
    rows = sum(len(m) for b in store_state(buffer._store)[1]
               for m in (leaf[0] for leaf in b["leaves"] if type(leaf) is tuple))
    buffer.save(tmp_path)
    del buffer
    tracemalloc.start()
    opened = EpisodeReplayBuffer.open(tmp_path)
    allocated = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert rows > 15 << 20
    assert allocated < rows // 10, (allocated, rows)
    for block in store_state(opened._store)[1]:
        for memory, mapped in (leaf for leaf in block["leaves"] if type(leaf) is tuple):
            assert isinstance(mapped, np.memmap) and mapped.mode == "r"
            assert os.path.dirname(mapped.filename) == str(tmp_path)


def test_saving_into_the_opened_folder_writes_only_new_blocks(tmp_path):
    rng = np.random.default_rng(1)
    buffer = _filled(EpisodeReplayBuffer, rng)
    buffer.save(tmp_path)
    before = {n: os.stat(tmp_path / n).st_ino for n in os.listdir(tmp_path)
              if n.startswith("rows-")}
    opened = EpisodeReplayBuffer.open(tmp_path)
    opened.add(_episodes(rng, 8, 900))                 # (new blocks; old ones evicted)
    opened.save(tmp_path)
    after = {n: os.stat(tmp_path / n).st_ino for n in os.listdir(tmp_path)
             if n.startswith("rows-")}
    kept_files = before.keys() & after.keys()
    assert kept_files and all(before[n] == after[n] for n in kept_files)
    assert after.keys() - before.keys()                # the new blocks
    assert before.keys() - after.keys()                # evicted blocks' files went
    # Exactly the files the metadata names, and no leftover temporaries.
    meta = kept._read_meta(str(tmp_path))
    assert set(after) == kept._file_names(meta)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    _same(opened.get_state(), EpisodeReplayBuffer.open(tmp_path).get_state())


def test_two_buffers_opened_from_one_folder_go_their_own_ways(tmp_path):
    """Each opened buffer is independent; saving one into the folder
    replaces the folder's buffer and leaves the other's rows readable."""
    rng = np.random.default_rng(2)
    _filled(PrioritizedEpisodeReplayBuffer, rng).save(tmp_path)
    first = PrioritizedEpisodeReplayBuffer.open(tmp_path)
    second = PrioritizedEpisodeReplayBuffer.open(tmp_path)
    reference = PrioritizedEpisodeReplayBuffer.open(tmp_path)
    first.add(_episodes(rng, 20, 700))
    first.save(tmp_path)                               # (removes files second maps)
    _same(second.get_state(), reference.get_state())
    _same(_draws(second, 4), _draws(reference, 4))
    second.add(_episodes(rng, 3, 800))
    second.save(tmp_path)                              # (rewrites the removed blocks)
    _same(PrioritizedEpisodeReplayBuffer.open(tmp_path).get_state(), second.get_state())


def test_open_gives_the_saved_kind(tmp_path):
    rng = np.random.default_rng(3)
    _filled(PrioritizedEpisodeReplayBuffer, rng).save(tmp_path / "p")
    _filled(EpisodeReplayBuffer, rng).save(tmp_path / "u")
    assert type(EpisodeReplayBuffer.open(tmp_path / "p")) is PrioritizedEpisodeReplayBuffer
    with pytest.raises(TypeError, match="holds a EpisodeReplayBuffer"):
        PrioritizedEpisodeReplayBuffer.open(tmp_path / "u")
    with pytest.raises(TypeError, match="holds a EpisodeReplayBuffer"):
        MultiAgentEpisodeReplayBuffer.open(tmp_path / "u")


def test_an_empty_buffer_round_trips(tmp_path):
    for cls in KINDS:
        cls(capacity=100).save(tmp_path / cls.__name__)
        opened = cls.open(tmp_path / cls.__name__)
        _same(cls(capacity=100).get_state(), opened.get_state())
        opened.add(_episodes(np.random.default_rng(0), 2))
        assert opened.get_num_episodes() == 2


# -- damaged, foreign and missing files ------------------------------------------------


@pytest.fixture
def saved(tmp_path):
    _filled(PrioritizedEpisodeReplayBuffer, np.random.default_rng(4)).save(tmp_path)
    return tmp_path


def _signed(payload: bytes) -> bytes:
    """A metadata file's bytes: `payload` behind a valid header (its
    checksum matching)."""
    return kept.MAGIC + kept._HEADER.pack(kept.FORMAT_VERSION, len(payload),
                                          hashlib.sha256(payload).digest()) + payload


def _resign(folder, meta):
    """Writes `meta` as the folder's metadata with a valid header."""
    (folder / kept.META_NAME).write_bytes(_signed(values.pack(meta)))


def _flipped(data: bytes, rng, counts) -> bytes:
    """`data` with `rng.choice(counts)` bits flipped at random places
    (`rng` a random.Random; the flip children use it)."""
    out = bytearray(data)
    for _ in range(rng.choice(counts)):
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def _a_block_file(folder):
    return sorted(n for n in os.listdir(folder) if n.startswith("rows-"))[0]


def test_missing_folder_metadata_and_block_files(saved, tmp_path_factory):
    empty = tmp_path_factory.mktemp("empty")
    with pytest.raises(FileNotFoundError):
        EpisodeReplayBuffer.open(empty / "nowhere")
    with pytest.raises(FileNotFoundError, match="buffer.meta is missing"):
        EpisodeReplayBuffer.open(empty)
    name = _a_block_file(saved)
    os.unlink(saved / name)
    with pytest.raises(FileNotFoundError) as error:
        EpisodeReplayBuffer.open(saved)
    assert error.value.filename == str(saved / name)


@pytest.mark.parametrize("damage, message", [
    (lambda data: b"PK\x03\x04" + data[4:], "is not a saved replay buffer"),
    (lambda data: data[:len(kept.MAGIC) + 6], "truncated"),
    (lambda data: data[:-10], "truncated or overlong"),
    (lambda data: data + b"\0", "truncated or overlong"),
    (lambda data: data[:-100] + bytes([data[-100] ^ 0x10]) + data[-99:], "checksum"),
    (lambda data: data[:len(kept.MAGIC)] + (3).to_bytes(4, "little")
     + data[len(kept.MAGIC) + 4:], "format version 3"),
    (lambda data: b"", "is not a saved replay buffer"),
])
def test_damaged_metadata_is_refused_naming_it(saved, damage, message):
    path = saved / kept.META_NAME
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=message) as error:
        EpisodeReplayBuffer.open(saved)
    assert str(path) in str(error.value)
    # Nor is it overwritten by a save.
    before = path.read_bytes()
    with pytest.raises(ValueError):
        EpisodeReplayBuffer(capacity=10).save(saved)
    assert path.read_bytes() == before


@pytest.mark.parametrize("change", ["truncated", "overlong", "empty"])
def test_a_block_file_of_another_size_is_refused_naming_it(saved, change):
    path = saved / _a_block_file(saved)
    data = path.read_bytes()
    path.write_bytes({"truncated": data[:-1], "overlong": data + b"\0", "empty": b""}[change])
    with pytest.raises(ValueError, match="truncated|overlong") as error:
        EpisodeReplayBuffer.open(saved)
    assert str(path) in str(error.value)


def test_a_flipped_byte_in_a_block_file(saved):
    """verify=True finds it; without, the rows are read as they are (a
    number changed, nothing read out of bounds)."""
    path = saved / _a_block_file(saved)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="CRC-32") as error:
        EpisodeReplayBuffer.open(saved, verify=True)
    assert str(path) in str(error.value)
    opened = EpisodeReplayBuffer.open(saved)
    opened.get_state()
    opened.sample_batch(64, n_step=3)


def _mutations():
    """Changes to a saved store's state that no store could have, each a
    (name, function of (store state, blocks))."""
    def runs(field, value, i=0):
        def change(s, b):
            s["runs"] = s["runs"].copy()
            s["runs"][field][i] = value
        return change

    def eps(field, value):
        def change(s, b):
            s["eps"] = s["eps"].copy()
            s["eps"][field][s["first_slot"]] = value
        return change

    def setter(key, value):
        def change(s, b):
            s[key] = value(s) if callable(value) else value
        return change

    def trees(key, value):
        def change(s, b):
            s["trees"] = dict(s["trees"])
            s["trees"][key] = value(s["trees"][key]) if callable(value) else value
        return change

    def leaf_of_row(value):
        def change(s, b):
            b[-1]["leaf_of_row"] = b[-1]["leaf_of_row"].copy()
            b[-1]["leaf_of_row"][0] = value
        return change

    def block_size(delta):
        def change(s, b):
            b[-1]["size"] += delta
        return change

    return {
        "run past its block": runs("row", 10**6),
        "run's block gone": runs("block", 10**6),
        "run's block negative": runs("block", -1),
        "run of a free slot": runs("ep", 10**6),
        "run's next backwards": runs("next", 0, i=1),
        "run's n negative": runs("n", -5),
        "episode length": eps("length", 10**9),
        "episode lookback": eps("lookback", -3),
        "episode first run": eps("first_run", 10**12),
        "episode next slot": eps("next", 10**6),
        "episode flag": eps("terminated", 7),
        "ep_cap": setter("ep_cap", lambda s: s["ep_cap"] + 1),
        "first slot": setter("first_slot", 10**6),
        "free slots": setter("free_slots", lambda s: s["free_slots"][:-1]),
        "live steps": setter("live_steps", lambda s: s["live_steps"] + 1),
        "run ring": setter("run_cap", 24),
        "first block": setter("first_block", lambda s: s["first_block"] + 1),
        "row bytes": setter("row_bytes", lambda s: [r + 1 for r in s["row_bytes"]]),
        "kind of a float32 leaf": setter("kinds", lambda s: [1] * len(s["kinds"])),
        "layout leaf": setter("layout", lambda s: dict(s["layout"], rewards=99)),
        "dtype": setter("dtypes", lambda s: ["|O"] * len(s["dtypes"])),
        "final rows": setter("final", lambda s: [None] * len(s["final"])),
        "ids": setter("ids", []),
        "tree leaf out of range": leaf_of_row(10**8),
        "tree queue": trees("queue", lambda q: np.concatenate([q, q[:1]])),
        "tree values": trees("values", lambda v: -v),
        "tree alloc": trees("alloc", 3),
        "tree size": trees("size", 1 << 40),
        "block size": block_size(-1),
        "not a dict": setter("layout", None),
    }


@pytest.mark.parametrize("name", sorted(_mutations()))
def test_a_state_no_store_could_have_is_refused(saved, name):
    """A metadata file that is whole and ours but describes no store (a
    bug, or a hand-made file): ValueError naming the file, before anything
    is built."""
    meta = kept._read_meta(str(saved))
    state = meta["store"]
    _mutations()[name](state, meta["blocks"])
    _resign(saved, meta)
    with pytest.raises(ValueError, match=str(saved / kept.META_NAME)):
        PrioritizedEpisodeReplayBuffer.open(saved)


def test_build_store_fills_only_a_new_store(saved):
    opened = PrioritizedEpisodeReplayBuffer.open(saved)
    state, blocks = store_state(opened._store)
    with pytest.raises(RuntimeError):
        build_store(opened._store, state, [])


FLIPS = r"""
import os, random, sys
from episode.replay import PrioritizedEpisodeReplayBuffer
from episode.replay import kept
from test_replay_kept import _flipped, _signed
folder = sys.argv[1]
path = os.path.join(folder, kept.META_NAME)
good = open(path, "rb").read()
payload = good[kept.HEADER_BYTES:]
rng = random.Random(0)
outcomes = {}
for case in range(int(sys.argv[2])):
    with open(path, "wb") as f:
        f.write(_signed(_flipped(payload, rng, [1, 1, 2, 8])))
    try:
        buffer = PrioritizedEpisodeReplayBuffer.open(folder)
        buffer.get_state()
        buffer.sample_batch(16, n_step=2)
        outcome = "opened"
    except (ValueError, TypeError, KeyError, AssertionError, OSError) as error:
        outcome = type(error).__name__
    outcomes[outcome] = outcomes.get(outcome, 0) + 1
print(sorted(outcomes.items()))
"""


def test_flipped_bits_in_a_resigned_metadata_never_crash(saved):
    """Bits flipped in the metadata, with its checksum made to
    match (so the checks after the checksum are what stands): each open
    raises or gives a buffer that works; the process never dies."""
    # (Run in tests/: from the checkout's root the source folder would
    # shadow the installed package.)
    result = subprocess.run([sys.executable, "-c", FLIPS, str(saved), "150"],
                            capture_output=True, text=True, timeout=600,
                            cwd=os.path.dirname(os.path.abspath(__file__)))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ValueError" in result.stdout, result.stdout
