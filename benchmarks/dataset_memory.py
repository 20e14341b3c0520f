"""Memory of a long image recording: written while sampling, read back.

    python benchmarks/dataset_memory.py write FOLDER [STEPS] [FORMAT] [COMPRESSION]
    python benchmarks/dataset_memory.py read FOLDER

``write`` steps episodes of 500-1,000 steps of unique 84x84 uint8 frames
(game-like, as in test_offline_images.py; 7,056 bytes each) one
``add_env_step`` at a time, as a sampler does, and hands each finished
episode to an EpisodeWriter (its defaults, or FORMAT / COMPRESSION); the
frames are made on the fly, so nothing but the episode being stepped and
what the writer keeps lives in memory. Default STEPS 1,000,000 (7 GB of
frames). ``read`` opens the folder with read_episodes and takes every
episode's observations, actions and rewards in turn, keeping none.

Both print one JSON line: steps, seconds, bytes on disk, and the process's
peak resident memory, split as Linux accounts it: anonymous (the process's
own allocations) and file pages (a memory-mapped Arrow file's pages, which
the kernel drops under pressure), sampled after every episode, with
VmHWM (the kernel's peak of both).
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

FRAME = 84 * 84


def status() -> dict:
    """kB fields of /proc/self/status."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if value.strip().endswith("kB"):
                out[key] = int(value.split()[0])
    return out


class Peak:
    def __init__(self):
        self.anon = self.file = 0

    def sample(self):
        s = status()
        self.anon = max(self.anon, s.get("RssAnon", 0))
        self.file = max(self.file, s.get("RssFile", 0) + s.get("RssShmem", 0))

    def report(self, **fields):
        s = status()
        print(json.dumps({**fields, "peak_anon_MB": round(self.anon / 1024, 1),
                          "peak_file_MB": round(self.file / 1024, 1),
                          "VmHWM_MB": round(s["VmHWM"] / 1024, 1)}), flush=True)


class Frames:
    """Game-like 84x84 frames, one at a time: a fixed background, six
    objects on random walks and a noisy band (test_offline_images's)."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.background = np.zeros((84, 84), np.uint8)
        self.background[70:], self.background[:8] = 90, 30
        self.objects = self.rng.integers(10, 60, (6, 2))

    def next(self) -> np.ndarray:
        frame = self.background.copy()
        self.objects = np.clip(self.objects + self.rng.integers(-2, 3, (6, 2)), 8, 64)
        for k, (y, x) in enumerate(self.objects):
            frame[y:y + 6, x:x + 4] = 120 + 20 * k
        frame[8:12] = self.rng.integers(0, 255, (4, 84), np.uint8)
        return frame


def write(folder: str, steps: int, options: dict) -> None:
    from episode import SingleAgentEpisode
    from episode.offline import EpisodeWriter

    peak, frames, rng = Peak(), Frames(), np.random.default_rng(1)
    start, done = time.perf_counter(), 0
    with EpisodeWriter(folder, **options) as writer:
        while done < steps:
            length = min(int(rng.integers(500, 1000)), steps - done)
            episode = SingleAgentEpisode(observations=[frames.next()])
            for t in range(length):
                episode.add_env_step(frames.next(), int(rng.integers(6)), float(rng.random()),
                                     extra_model_outputs={"action_logp": np.float32(-1.0)},
                                     terminated=t == length - 1)
            writer.write(episode.to_numpy())
            done += length
            peak.sample()
    peak.sample()
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    peak.report(what="write", steps=done, seconds=round(time.perf_counter() - start, 1),
                bytes_on_disk=size, options=options)


def read(folder: str) -> None:
    from episode.offline import read_episodes

    peak, steps = Peak(), 0
    start = time.perf_counter()
    for episode in read_episodes(folder):
        episode.get_actions()
        episode.get_rewards()
        steps += len(episode.get_observations()) - 1
        peak.sample()
    peak.report(what="read", steps=steps, seconds=round(time.perf_counter() - start, 1))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        opts = {}
        if len(sys.argv) > 4:
            opts["format"] = sys.argv[4]
        if len(sys.argv) > 5:
            opts["compression"] = None if sys.argv[5] == "none" else sys.argv[5]
        write(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1_000_000, opts)
    else:
        read(sys.argv[2])
