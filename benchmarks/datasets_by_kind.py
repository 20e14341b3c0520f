"""Recorded experience by kind of data: our dataset formats beside RLlib's
episode format and Minari, on the same episodes, in one process.

    python benchmarks/datasets_by_kind.py cartpole|atari|atari4|pong|pong4 [STEPS] [ROUNDS] [lean]

Kinds: ``cartpole``, float32 (4,) observations in episodes of 10-60 steps
(a random CartPole policy's); ``atari``, 84x84 uint8 frames in episodes of
500-1,000 steps (unique game-like frames: see test_offline_images.py);
``atari4``, the same frames stacked by four, (84, 84, 4); ``pong`` and
``pong4``, real Atari screens (Pong played by a random policy in ale-py,
84x84 grayscale, in the game's own episodes; see ale_arrays), alone and
stacked by four. Actions Discrete (2 or 6), float rewards, an
``action_logp`` extra output. Default STEPS
100,000, ROUNDS 5; each figure is the median (and minimum) of the rounds,
the sides taking turns round by round.

Rows, per format of ours (Arrow IPC lz4: the default; zstd; uncompressed;
Parquet zstd):
- write: ``write_episodes`` of the numpy'd episodes into a fresh folder
  (files fsync'd and checksummed, as always; the last round's folder is
  removed before the timer starts);
- read: ``read_episodes`` and each episode's observations, actions and
  rewards taken (damage checks on, the default).
RLlib 2.60's episode format, as its recorder makes it
(``msgpack.packb(episode.get_state(), default=msgpack_numpy.encode)``):
- pack / decode, in memory: the packing of its list-mode episodes (what
  OfflineSingleAgentEnvRunner records: ``episodes_to_numpy=False``) and of
  numpy'd ones; the decode is its prelearner's ``from_state(unpackb(...))``
  and the same three gets;
- the same with the file: the packed column written to and read from one
  Parquet file (Ray Data's default codec, snappy), as its recorder and
  reader store them.
Minari 0.5.4 (images raw, not JPEG): ``iterate_episodes()`` over the
dataset written by ``minari.create_dataset_from_buffers`` from the same
arrays, both backends, against our ``from_minari`` of the same folder.
``sample_batch(256, n_step=3)``: from the dataset (default format) against
an EpisodeReplayBuffer holding the same episodes (ns per transition).

``lean``: our default format's write and read against RLlib's list-mode
packing and decode only, our episodes gone before RLlib's are made (what
fits in memory for the frames stacked by four: the whole run holds every
copy at once).

Prints a JSON line per figure: kind, what, side, median and min seconds,
MB/s of the observations' raw bytes, bytes on disk.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_offline_images import atari_frames  # noqa: E402

FORMATS = {"arrow_lz4": {}, "arrow_zstd": {"compression": "zstd"},
           "arrow": {"compression": None}, "parquet": {"format": "parquet"}}


def arrays(kind: str, steps: int, seed: int = 0) -> list:
    """Per episode (observations N+1, actions N, rewards N): the data every
    side records."""
    if kind.startswith("pong"):
        return ale_arrays("Pong", steps, stack=4 if kind == "pong4" else 1, seed=seed)
    rng = np.random.default_rng(seed)
    lengths = []
    low, high = (10, 60) if kind == "cartpole" else (500, 1000)
    while sum(lengths) < steps:
        lengths.append(min(int(rng.integers(low, high)), steps - sum(lengths)))
    if kind == "cartpole":
        frames = rng.normal(size=(steps + len(lengths), 4)).astype(np.float32)
    else:
        frames = atari_frames(steps + len(lengths) + 3, seed)
        if kind == "atari4":
            frames = np.stack([frames[i:len(frames) - 3 + i] for i in range(4)], axis=-1)
    out, k = [], 0
    n_actions = 2 if kind == "cartpole" else 6
    for n in lengths:
        out.append((frames[k:k + n + 1], rng.integers(0, n_actions, n),
                    rng.random(n)))
        k += n + 1
    return out


def ale_arrays(game: str, steps: int, stack: int = 1, seed: int = 0) -> list:
    """Real Atari screens: `game` played by a random policy in the Arcade
    Learning Environment (ale-py, with its ROMs; the ``bench`` extra), its
    grayscale screen (210x160) taken to 84x84 by nearest rows and columns
    (AtariPreprocessing's area resize needs OpenCV), frame skip 4, the
    episodes as the game ends them (the last one cut at `steps`); `stack`
    frames stacked on the last axis, as FrameStack does."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = gym.make(f"ALE/{game}-v5", obs_type="grayscale", repeat_action_probability=0.0)
    rows, cols = np.linspace(0, 209, 84).astype(int), np.linspace(0, 159, 84).astype(int)
    rng = np.random.default_rng(seed)
    out, done, first = [], 0, True
    while done < steps:
        screen, _ = env.reset(seed=seed + len(out) if first else None)
        first = False
        frames, actions, rewards = [screen[rows][:, cols]], [], []
        while done + len(actions) < steps:
            action = int(rng.integers(env.action_space.n))
            screen, reward, terminated, truncated, _ = env.step(action)
            frames.append(screen[rows][:, cols])
            actions.append(action)
            rewards.append(float(reward))
            if terminated or truncated:
                break
        done += len(actions)
        obs = np.stack(frames)
        if stack > 1:
            padded = np.concatenate([np.repeat(obs[:1], stack - 1, axis=0), obs])
            obs = np.stack([padded[i:len(padded) - stack + 1 + i] for i in range(stack)],
                           axis=-1)
        out.append((obs, np.array(actions), np.array(rewards)))
    env.close()
    return out


def episodes(cls, data: list, numpy: bool) -> list:
    """Episodes of `cls` stepped as a sampler steps them (one add_env_step
    per step), numpy'd or left in list mode."""
    out = []
    for obs, actions, rewards in data:
        episode = cls(observations=[obs[0]])
        n = len(actions)
        for t in range(n):
            episode.add_env_step(obs[t + 1], int(actions[t]), float(rewards[t]),
                                 extra_model_outputs={"action_logp": np.float32(-1.0)},
                                 terminated=t == n - 1)
        out.append(episode.to_numpy() if numpy else episode)
    return out


def take(episode) -> int:
    episode.get_actions()
    episode.get_rewards()
    return len(episode.get_observations())


def timed(rounds: int, runs: dict, prepare: dict = {}) -> dict:
    """{name: [seconds per round]}, the runs taking turns round by round
    (one unrecorded warm-up round each first); `prepare[name]`, if given,
    runs before each of its rounds, untimed."""
    times = {name: [] for name in runs}
    for r in range(rounds + 1):
        for name, run in runs.items():
            if name in prepare:
                prepare[name]()
            start = time.perf_counter()
            run()
            if r:
                times[name].append(time.perf_counter() - start)
    return times


def report(kind: str, what: str, times: dict, raw: int, sizes: dict = {}) -> None:
    for side, ts in times.items():
        med = statistics.median(ts)
        print(json.dumps({"kind": kind, "what": what, "side": side,
                          "median_s": round(med, 5), "min_s": round(min(ts), 5),
                          "MB_per_s": round(raw / med / 1e6, 1),
                          "bytes_on_disk": sizes.get(side)}), flush=True)


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main(kind: str, steps: int, rounds: int, lean: bool = False) -> None:
    import msgpack
    import msgpack_numpy
    import pyarrow as pa
    import pyarrow.parquet as pq
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode

    from episode import SingleAgentEpisode
    from episode.offline import read_episodes, write_episodes

    data = arrays(kind, steps)
    raw = sum(obs.nbytes for obs, _, _ in data)
    ours = episodes(SingleAgentEpisode, data, numpy=True)
    work = tempfile.mkdtemp(prefix="by-kind-")
    total = sum(len(e) for e in ours)

    # -- ours: write and read, per format -------------------------------------------------
    formats = {"arrow_lz4": {}} if lean else FORMATS
    folders = {name: os.path.join(work, name) for name in formats}

    def writer(name):
        def run():
            write_episodes(ours, folders[name], **formats[name])
        return run

    def clear(name):
        # The last round's folder goes before the timer starts: a write's
        # time is its own, not the removal of the files it replaces.
        return lambda: shutil.rmtree(folders[name], ignore_errors=True)

    def reader(name):
        def run():
            assert sum(take(e) - 1 for e in read_episodes(folders[name])) == total
        return run

    times = timed(rounds, {name: writer(name) for name in formats},
                  {name: clear(name) for name in formats})
    report(kind, "write", times, raw, {n: folder_bytes(f) for n, f in folders.items()})
    report(kind, "read", timed(rounds, {name: reader(name) for name in formats}), raw)
    if lean:
        del ours
        theirs = episodes(RLlibEpisode, data, numpy=False)
        packed = []

        def pack_list():
            packed[:] = [msgpack.packb(e.get_state(), default=msgpack_numpy.encode)
                         for e in theirs]

        def decode_list():
            assert sum(take(RLlibEpisode.from_state(
                msgpack.unpackb(p, object_hook=msgpack_numpy.decode))) - 1
                for p in packed) == total

        report(kind, "rllib_pack", timed(rounds, {"list": pack_list}), raw)
        del theirs
        report(kind, "rllib_decode", timed(rounds, {"list": decode_list}), raw)
        shutil.rmtree(work)
        return

    # -- sample_batch: the dataset against a buffer of the same episodes ------------------
    from episode.replay import EpisodeReplayBuffer

    ds = read_episodes(folders["arrow_lz4"])
    ds.rng = np.random.default_rng(0)
    ds.sample_batch(256, n_step=3)
    buffer = EpisodeReplayBuffer(capacity=total + len(ours))
    buffer.add(ours)
    buffer.rng = np.random.default_rng(0)
    draws = 200 if kind == "cartpole" else 20
    times = timed(rounds, {
        "dataset": lambda: [ds.sample_batch(256, n_step=3) for _ in range(draws)],
        "buffer": lambda: [buffer.sample_batch(256, n_step=3) for _ in range(draws)]})
    for side, ts in times.items():
        print(json.dumps({"kind": kind, "what": "sample_batch", "side": side,
                          "ns_per_transition": round(statistics.median(ts) / draws / 256 * 1e9),
                          "min_ns": round(min(ts) / draws / 256 * 1e9)}), flush=True)
    del ds

    # -- RLlib's episode format ----------------------------------------------------------
    theirs = {"list": episodes(RLlibEpisode, data, numpy=False),
              "numpy": episodes(RLlibEpisode, data, numpy=True)}
    packed = {}

    def pack(mode):
        def run():
            packed[mode] = [msgpack.packb(e.get_state(), default=msgpack_numpy.encode)
                            for e in theirs[mode]]
        return run

    def decode(mode):
        def run():
            n = sum(take(RLlibEpisode.from_state(
                msgpack.unpackb(p, object_hook=msgpack_numpy.decode))) - 1 for p in packed[mode])
            assert n == total
        return run

    files = {mode: os.path.join(work, f"rllib-{mode}.parquet") for mode in theirs}

    def pack_file(mode):
        def run():
            pack(mode)()
            pq.write_table(pa.table({"item": pa.array(packed[mode], pa.binary())}),
                           files[mode], compression="snappy")
        return run

    def decode_file(mode):
        def run():
            items = pq.read_table(files[mode]).column("item").to_pylist()
            n = sum(take(RLlibEpisode.from_state(
                msgpack.unpackb(p, object_hook=msgpack_numpy.decode))) - 1 for p in items)
            assert n == total
        return run

    report(kind, "rllib_pack", timed(rounds, {m: pack(m) for m in theirs}), raw)
    report(kind, "rllib_decode", timed(rounds, {m: decode(m) for m in theirs}), raw)
    report(kind, "rllib_pack_file", timed(rounds, {m: pack_file(m) for m in theirs}), raw,
           {m: os.path.getsize(f) for m, f in files.items()})
    report(kind, "rllib_decode_file", timed(rounds, {m: decode_file(m) for m in theirs}), raw)
    del theirs, packed

    # -- Minari ---------------------------------------------------------------------------
    try:
        import gymnasium as gym
        import minari
        from minari.data_collector import EpisodeBuffer

        from episode.offline import from_minari
    except ImportError:
        return
    os.environ["MINARI_DATASETS_PATH"] = os.path.join(work, "minari")
    shape = data[0][0].shape[1:]
    obs_space = gym.spaces.Box(-np.inf, np.inf, shape, np.float32) if kind == "cartpole" \
        else gym.spaces.Box(0, 255, shape, np.uint8)
    buffers = [EpisodeBuffer(observations=obs, actions=a, rewards=r,
                             terminations=np.arange(len(a)) == len(a) - 1,
                             truncations=np.zeros(len(a), bool)) for obs, a, r in data]
    runs = {}
    for backend in ("arrow", "hdf5"):
        name = f"bench/{kind}-{backend}-v0"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            minari.create_dataset_from_buffers(
                name, buffers, observation_space=obs_space,
                action_space=gym.spaces.Discrete(2 if kind == "cartpole" else 6),
                data_format=backend, author="bench", **(
                    {} if kind == "cartpole" else {"jpeg_encoding": False}))

        def theirs_run(name=name):
            assert sum(len(e.actions) for e in minari.load_dataset(name).iterate_episodes()) \
                == total

        def ours_run(name=name):
            assert sum(take(e) - 1 for e in from_minari(name)) == total

        runs[f"minari_{backend}"] = theirs_run
        runs[f"ours_{backend}"] = ours_run
    del buffers
    report(kind, "minari_read", timed(rounds, runs), raw)
    shutil.rmtree(work)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 100_000,
         int(sys.argv[3]) if len(sys.argv) > 3 else 5, sys.argv[4:] == ["lean"])
