"""A kept buffer opened again against the same buffer unpickled: ~200 MB of
84x84 uint8 frames (30,000 steps), prioritized, in one folder and one
pickle file (the page cache warm for both: a second open reads the same
files). `open()` reads the metadata and maps the rows; `pickle.load`
reads every row.

Run with ``pytest benchmarks/test_replay_kept.py --benchmark-group-by=group``.
The resident memory of each (in a fresh process) is printed by
``python benchmarks/test_replay_kept.py``."""
import os
import pickle
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from episode import MultiAgentEpisode, SingleAgentEpisode
from episode.replay import (MultiAgentPrioritizedEpisodeReplayBuffer,
                            PrioritizedEpisodeReplayBuffer)

pytest.importorskip("pytest_benchmark")

STEPS = 30_000
EPISODE = 500


def _buffer() -> PrioritizedEpisodeReplayBuffer:
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (EPISODE + 1, 84, 84), dtype=np.uint8)
    buffer = PrioritizedEpisodeReplayBuffer(capacity=STEPS, alpha=0.6, seed=0)
    for i in range(STEPS // EPISODE):
        frames[:, 0, 0] = i
        buffer.add(SingleAgentEpisode(
            observations=list(frames), actions=[0] * EPISODE, rewards=[1.0] * EPISODE,
            terminated=True, len_lookback_buffer=0).to_numpy())
    return buffer


def _kept_and_pickled(buffer) -> tuple:
    """(folder, pickle file) of `buffer`, saved both ways."""
    folder = tempfile.mkdtemp()
    buffer.save(folder)
    path = os.path.join(folder, "buffer.pkl")
    with open(path, "wb") as f:
        pickle.dump(buffer, f, protocol=5)
    return folder, path


def _reopen(benchmark, cls, kept, how):
    """Times opening the kept buffer again (`how` "open") or unpickling it
    ("pickle.load"); gives the buffer."""
    folder, path = kept

    def load():
        if how == "open":
            return cls.open(folder)
        with open(path, "rb") as f:
            return pickle.load(f)

    return benchmark.pedantic(load, rounds=5, warmup_rounds=1)


@pytest.fixture(scope="module")
def kept():
    folder, path = _kept_and_pickled(_buffer())
    yield folder, path
    shutil.rmtree(folder)


@pytest.mark.benchmark(group="kept-200MB-reopen")
@pytest.mark.parametrize("how", ["open", "pickle.load"])
def test_reopen(benchmark, kept, how):
    buffer = _reopen(benchmark, PrioritizedEpisodeReplayBuffer, kept, how)
    assert buffer.get_num_timesteps() == STEPS


@pytest.mark.benchmark(group="kept-200MB-save")
def test_save(benchmark, kept, tmp_path):
    buffer = PrioritizedEpisodeReplayBuffer.open(kept[0])
    buffer.add(SingleAgentEpisode(
        observations=list(np.zeros((11, 84, 84), np.uint8)), actions=[0] * 10,
        rewards=[1.0] * 10, terminated=True, len_lookback_buffer=0).to_numpy())
    # Into its own folder: only the new block is written (the rest is kept).
    benchmark.pedantic(lambda: buffer.save(kept[0]), rounds=3)


# -- a multi-agent buffer -----------------------------------------------------------------
# Two agents on two modules, 84x84 uint8 observations, 6,000 env steps: its
# rows (12,000 agent steps, ~85 MB) in the modules' block files, mapped at
# open; its multi-agent episodes (as RLlib's buffer keeps them, ~85 MB) in the
# metadata, unpickled at open as pickle.load unpickles them.

MA_STEPS = 6_000


def _module_of(agent_id, episode):
    return f"m{agent_id[-1]}"


def _ma_buffer() -> MultiAgentPrioritizedEpisodeReplayBuffer:
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (EPISODE + 1, 84, 84), dtype=np.uint8)
    buffer = MultiAgentPrioritizedEpisodeReplayBuffer(capacity=MA_STEPS, alpha=0.6, seed=0)
    for i in range(MA_STEPS // EPISODE):
        episode = MultiAgentEpisode(agent_to_module_mapping_fn=_module_of)
        episode.add_env_reset(observations={"a0": frames[0], "a1": frames[0]})
        for t in range(1, EPISODE + 1):
            episode.add_env_step(observations={"a0": frames[t], "a1": frames[-t]},
                                 actions={"a0": 0, "a1": 1}, rewards={"a0": 1.0, "a1": 0.5},
                                 terminateds={"__all__": t == EPISODE})
        buffer.add(episode.to_numpy())
    return buffer


@pytest.fixture(scope="module")
def kept_ma():
    folder, path = _kept_and_pickled(_ma_buffer())
    yield folder, path
    shutil.rmtree(folder)


@pytest.mark.benchmark(group="kept-ma-170MB-reopen")
@pytest.mark.parametrize("how", ["open", "pickle.load"])
def test_reopen_multi_agent(benchmark, kept_ma, how):
    buffer = _reopen(benchmark, MultiAgentPrioritizedEpisodeReplayBuffer, kept_ma, how)
    assert buffer.get_num_timesteps() == MA_STEPS


_CHILD = r"""
import os, pickle, sys, time
import numpy as np
from episode.replay import PrioritizedEpisodeReplayBuffer

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10

how, folder, path = sys.argv[1:4]
before = rss()
start = time.perf_counter()
if how == "open":
    buffer = PrioritizedEpisodeReplayBuffer.open(folder)
else:
    with open(path, "rb") as f:
        buffer = pickle.load(f)
took = time.perf_counter() - start
grown = rss() - before
buffer.rng = np.random.default_rng(0)
for _ in range(20):
    buffer.sample_batch(256, n_step=3)
print(f"{how}: {took * 1e3:.1f} ms, RSS +{grown / 2**20:.1f} MiB at open, "
      f"+{(rss() - before) / 2**20:.1f} MiB after 20 batches of 256")
"""


if __name__ == "__main__":
    folder, path = _kept_and_pickled(_buffer())
    rows = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)
               if n.startswith("rows-"))
    print(f"rows: {rows / 2**20:.0f} MiB in {folder}; pickle {os.path.getsize(path) / 2**20:.0f} MiB")
    for _ in range(3):
        for how in ("open", "pickle.load"):
            out = subprocess.run([sys.executable, "-c", _CHILD, how, folder, path],
                                 capture_output=True, text=True, check=True)
            print(out.stdout.strip())
    shutil.rmtree(folder)
