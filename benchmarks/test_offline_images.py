"""Recorded experience with image observations: 84x84 uint8 frames (an
Atari agent's), written and read in our format beside RLlib's episode
format (msgpack + msgpack_numpy of RLlib's own episodes' ``get_state()``,
what its recorder writes with ``output_write_episodes=True``), same data.

    pytest benchmarks/test_offline_images.py --benchmark-group-by=group \
        --benchmark-columns=median,iqr,rounds

- ``image_write``: the episodes into a dataset folder (ours: ``arrow_lz4``,
  the default; ``arrow``, uncompressed; ``parquet``, zstd), against
  RLlib's packing of its episodes' states (the bytes only: no file);
- ``image_read``: every episode read back and its observations taken
  (ours from the folder, RLlib's ``SingleAgentEpisode.from_state(
  msgpack.unpackb(..., object_hook=msgpack_numpy.decode))`` from the packed
  bytes in memory).

`extra_info`: MB/s of raw observation bytes, bytes on disk. IMAGE_STEPS
(environment variable EPISODE_BENCH_IMAGE_STEPS, default 20,000) sets the
steps, in episodes of 500-1,000 steps; frames are unique and compress as
game frames do (a fixed background, objects on random walks, a noisy band).
"""
from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pytest

pytest.importorskip("pytest_benchmark")
pytest.importorskip("pyarrow")

STEPS = int(os.environ.get("EPISODE_BENCH_IMAGE_STEPS", "20000"))
OURS = {"arrow_lz4": {}, "arrow": {"compression": None}, "parquet": {"format": "parquet"}}


def atari_frames(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    background = np.zeros((84, 84), np.uint8)
    background[70:], background[:8] = 90, 30
    objects = rng.integers(10, 60, (6, 2))
    out = np.empty((n, 84, 84), np.uint8)
    for i in range(n):
        frame = background.copy()
        objects = np.clip(objects + rng.integers(-2, 3, objects.shape), 8, 64)
        for k, (y, x) in enumerate(objects):
            frame[y:y + 6, x:x + 4] = 120 + 20 * k
        frame[8:12] = rng.integers(0, 255, (4, 84), np.uint8)
        out[i] = frame
    return out


def _episodes(cls) -> list:
    rng = np.random.default_rng(1)
    frames = atari_frames(STEPS + STEPS // 400 + 2)
    episodes, t, k = [], 0, 0
    while t < STEPS:
        length = min(int(rng.integers(500, 1000)), STEPS - t)
        episode = cls(observations=[frames[k]])
        for i in range(length):
            episode.add_env_step(frames[k + i + 1], int(rng.integers(6)), float(rng.random()),
                                 extra_model_outputs={"action_logp": np.float32(-1.0)},
                                 terminated=i == length - 1)
        episode.to_numpy()
        episodes.append(episode)
        k, t = k + length + 1, t + length
    return episodes


@pytest.fixture(scope="module")
def ours():
    from episode import SingleAgentEpisode

    return _episodes(SingleAgentEpisode)


@pytest.fixture(scope="module")
def rllib():
    episode_mod = pytest.importorskip("ray.rllib.env.single_agent_episode")
    pytest.importorskip("msgpack_numpy")
    return _episodes(episode_mod.SingleAgentEpisode)


def _raw(episodes) -> int:
    return sum(e.get_observations().nbytes for e in episodes)


@pytest.mark.parametrize("impl", list(OURS) + ["rllib"])
def test_image_write(benchmark, impl, request):
    benchmark.group = "image_write"
    if impl == "rllib":
        import msgpack
        import msgpack_numpy

        episodes = request.getfixturevalue("rllib")
        packed = benchmark.pedantic(
            lambda: [msgpack.packb(e.get_state(), default=msgpack_numpy.encode)
                     for e in episodes], rounds=5, warmup_rounds=1, iterations=1)
        size = sum(len(p) for p in packed)
    else:
        from episode.offline import write_episodes

        episodes = request.getfixturevalue("ours")
        folder = tempfile.mkdtemp()

        def run():
            shutil.rmtree(folder, ignore_errors=True)
            write_episodes(episodes, folder, **OURS[impl])

        benchmark.pedantic(run, rounds=5, warmup_rounds=1, iterations=1)
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        shutil.rmtree(folder)
    benchmark.extra_info.update({
        "MB_per_s": round(_raw(episodes) / benchmark.stats.stats.median / 1e6, 1),
        "bytes_on_disk": size})


@pytest.mark.parametrize("impl", list(OURS) + ["rllib"])
def test_image_read(benchmark, impl, request, tmp_path):
    benchmark.group = "image_read"
    if impl == "rllib":
        import msgpack
        import msgpack_numpy
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode

        episodes = request.getfixturevalue("rllib")
        packed = [msgpack.packb(e.get_state(), default=msgpack_numpy.encode) for e in episodes]

        def run():
            return sum(len(SingleAgentEpisode.from_state(
                msgpack.unpackb(p, object_hook=msgpack_numpy.decode)).get_observations())
                for p in packed)
    else:
        from episode.offline import read_episodes, write_episodes

        episodes = request.getfixturevalue("ours")
        write_episodes(episodes, tmp_path, **OURS[impl])

        def run():
            return sum(len(e.get_observations()) for e in read_episodes(tmp_path))

    n = benchmark.pedantic(run, rounds=5, warmup_rounds=1, iterations=1)
    assert n == sum(len(e.get_observations()) for e in episodes)
    benchmark.extra_info["MB_per_s"] = round(
        _raw(episodes) / benchmark.stats.stats.median / 1e6, 1)
