"""Recorded experience in our format: recording beside a live sampler,
writing, reading, and drawing batches from a memory-mapped dataset.

    pytest benchmarks/test_offline.py --benchmark-group-by=group \
        --benchmark-columns=median,iqr,rounds

- ``recording_overhead_64``: 64 CartPole-v1 sub-envs, 100 steps each per
  round; `Sampler.sample_episodes()` alone and with a writer (Arrow files,
  a part every 64k rows, the flushes inside the timed rounds and the last
  one at close() counted too) take turns round by round, timed with
  `time.thread_time()`. `extra_info`: both medians and the writer's share.
- ``write_100k``/``read_100k``: 100k recorded CartPole steps (numpy'd
  episodes of a sampler) written with `write_episodes`, then opened and
  read episode by episode, per format; `extra_info`: steps/s, bytes on disk
  against the raw array bytes.
- ``sample_batch_200k``: `sample_batch(256, n_step=3)` from a dataset of
  200k steps in Arrow files (the first call, which fills the buffer, is
  outside the timing); `extra_info`: ns per transition.
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("msgpack")

N_ENVS, N_STEPS = 64, 100


def _recorded_episodes(steps: int) -> list:
    from episode import Sampler

    sampler = Sampler("CartPole-v1", num_envs=N_ENVS, rollout_fragment_length=N_STEPS, seed=0)
    episodes, n = [], 0
    while n < steps:
        batch = sampler.sample_episodes()
        episodes += batch
        n += sum(len(e) for e in batch)
    return episodes


def _raw_bytes(episodes: list) -> int:
    # The arrays' own bytes: observations (N + 1 per chunk), actions, rewards.
    return sum((len(e) + 1) * 16 + len(e) * 8 + len(e) * 8 for e in episodes)


def test_recording_overhead_interleaved(benchmark, tmp_path):
    from episode import Sampler
    from episode.offline import EpisodeWriter

    writer = EpisodeWriter(tmp_path, format="arrow", rows_per_file=1 << 16)
    plain = Sampler("CartPole-v1", num_envs=N_ENVS, rollout_fragment_length=N_STEPS, seed=0)
    recording = Sampler("CartPole-v1", num_envs=N_ENVS, rollout_fragment_length=N_STEPS,
                        seed=0, writer=writer)
    times: dict = {"plain": [], "recording": []}

    def pair():
        for name, sampler in (("plain", plain), ("recording", recording)):
            start = time.thread_time()
            sampler.sample_episodes()
            times[name].append(time.thread_time() - start)

    benchmark.group = "recording_overhead_64"
    benchmark.pedantic(pair, rounds=60, warmup_rounds=2, iterations=1)
    start = time.thread_time()
    writer.close()
    close_s = time.thread_time() - start
    plain_s, recording_s = sum(times["plain"]), sum(times["recording"]) + close_s
    benchmark.extra_info.update({
        "plain_ms": round(statistics.median(times["plain"]) * 1e3, 2),
        "recording_ms": round(statistics.median(times["recording"]) * 1e3, 2),
        "close_ms": round(close_s * 1e3, 2),
        "recording_percent": round((recording_s / plain_s - 1) * 100, 2),
        "files": len(os.listdir(tmp_path))})
    assert len(times["plain"]) == len(times["recording"]) >= 60


@pytest.fixture(scope="module")
def recorded():
    return _recorded_episodes(100_000)


@pytest.mark.parametrize("format", ["parquet", "arrow"])
def test_write_100k(benchmark, recorded, format):
    from episode.offline import write_episodes

    folder = tempfile.mkdtemp()

    def run():
        shutil.rmtree(folder, ignore_errors=True)
        return write_episodes(recorded, folder, format=format)

    benchmark.group = "write_100k"
    benchmark.pedantic(run, rounds=5, warmup_rounds=1, iterations=1)
    steps = sum(len(e) for e in recorded)
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    benchmark.extra_info.update({
        "steps_per_s": round(steps / benchmark.stats.stats.median),
        "bytes_on_disk": size, "raw_bytes": _raw_bytes(recorded),
        "disk_over_raw": round(size / _raw_bytes(recorded), 3)})
    shutil.rmtree(folder)


@pytest.mark.parametrize("format", ["parquet", "arrow", "arrow_uncompressed_parquet"])
def test_read_100k(benchmark, recorded, format, tmp_path):
    from episode.offline import read_episodes, write_episodes

    kwargs = {"format": "parquet", "compression": None} \
        if format == "arrow_uncompressed_parquet" else {"format": format}
    write_episodes(recorded, tmp_path, **kwargs)

    def run():
        ds = read_episodes(tmp_path)
        return sum(len(e) for e in ds)

    benchmark.group = "read_100k"
    steps = benchmark.pedantic(run, rounds=5, warmup_rounds=1, iterations=1)
    assert steps == sum(len(e) for e in recorded)
    size = sum(os.path.getsize(tmp_path / f) for f in os.listdir(tmp_path))
    benchmark.extra_info.update({
        "steps_per_s": round(steps / benchmark.stats.stats.median),
        "bytes_on_disk": size, "disk_over_raw": round(size / _raw_bytes(recorded), 3)})


def test_sample_batch_200k(benchmark, tmp_path):
    from episode.offline import read_episodes, write_episodes

    write_episodes(_recorded_episodes(200_000), tmp_path, format="arrow")
    ds = read_episodes(tmp_path)
    ds.rng = np.random.default_rng(0)
    ds.sample_batch(256, n_step=3)           # fills the buffer once

    benchmark.group = "sample_batch_200k"
    benchmark.pedantic(lambda: ds.sample_batch(256, n_step=3), rounds=200, warmup_rounds=5,
                       iterations=1)
    benchmark.extra_info["ns_per_transition"] = round(
        benchmark.stats.stats.median / 256 * 1e9)
