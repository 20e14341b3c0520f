"""Reading Minari datasets: ours (episode.offline.from_minari) beside
Minari's own reader and TorchRL's MinariExperienceReplay, in one run.

    pytest benchmarks/test_offline_minari.py --benchmark-group-by=group \
        --benchmark-columns=median,iqr,rounds

The datasets are written once per session by Minari's own
`create_dataset_from_buffers` (no download: everything stays under a
temporary MINARI_DATASETS_PATH), in both of its backends:

- "cartpole": 1,000 CartPole-like episodes of 50..150 steps (101,616 steps):
  float32 (4,) observations, int64 actions, float64 rewards, no infos (as
  CartPole's are empty);
- "images": 100 episodes of 50 steps of 84x84x3 uint8 frames (5,100
  pictures, which Minari stores as JPEG), Discrete(6) actions.

Groups (the `impl` parameter names the implementation; medians per call;
extra_info["ns_per_step"]):

- minari_read_<dataset>_<backend>: every episode of the dataset into
  per-episode objects: ours `from_minari(id)` (numpy'd SingleAgentEpisodes)
  against Minari's `list(load_dataset(id).iterate_episodes())` (EpisodeData).
- minari_replay_cartpole_hdf5: the dataset into a replay buffer and 100
  batches of 256 transitions drawn from it: ours `from_minari` + an
  EpisodeReplayBuffer (`add`, `sample_batch(256)`) against TorchRL's
  `MinariExperienceReplay(id, batch_size=256, load_from_local_minari=True)`
  (which reads the HDF5 file into tensors and makes memory-mapped ones
  under its root) and `sample()`. TorchRL reads the HDF5 backend only.
  TorchRL 0.14.1 keeps a contentless `memmap_like()` copy of the tensors
  it filled, so it samples zeros (tests/test_offline_minari.py pins it);
  writing the data into the memory map would only add to its time.
- minari_sample_cartpole: one batch of 256 transitions from the built
  buffers (ours `sample_batch(256)`, TorchRL's `sample()`).

Everything runs on one thread but ours' picture decoding, which gives
half of an episode's pictures to one helper thread (pillow decodes without
the GIL); torch is held to one thread.
"""
import os
import shutil
import tempfile
import warnings

import gymnasium as gym
import numpy as np
import pytest

minari = pytest.importorskip("minari")
pytest.importorskip("h5py")
pytest.importorskip("pyarrow")

from minari.data_collector import EpisodeBuffer  # noqa: E402

from episode.offline.minari import from_minari  # noqa: E402

# torch (TorchRL, SB3) on one thread, as ours and cpprb are.
pytestmark = pytest.mark.usefixtures("one_torch_thread")

EPISODES = 1_000
BATCH = 256
SAMPLES = 100
BACKENDS = ("hdf5", "arrow")


def _cartpole_buffers():
    rng = np.random.default_rng(0)
    out = []
    for length in rng.integers(50, 151, EPISODES):
        out.append(EpisodeBuffer(
            observations=rng.normal(size=(length + 1, 4)).astype(np.float32),
            actions=rng.integers(0, 2, length), rewards=np.ones(length),
            terminations=np.arange(length) == length - 1, truncations=np.zeros(length, bool)))
    return out


def _image_buffers():
    rng = np.random.default_rng(1)
    out = []
    for _ in range(100):
        # A fixed background with a moving patch: pictures as a game's.
        frames = np.repeat(rng.integers(0, 256, (1, 84, 84, 3), dtype=np.uint8), 51, axis=0)
        for t in range(51):
            frames[t, t:t + 12, 20:32] = 255
        out.append(EpisodeBuffer(observations=frames, actions=rng.integers(0, 6, 50),
                                 rewards=np.ones(50), terminations=np.arange(50) == 49,
                                 truncations=np.zeros(50, bool)))
    return out


DATASETS = {
    "cartpole": (gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2),
                 _cartpole_buffers),
    "images": (gym.spaces.Box(0, 255, (84, 84, 3), np.uint8), gym.spaces.Discrete(6),
               _image_buffers),
}


@pytest.fixture(scope="module")
def minari_root(tmp_path_factory):
    """A MINARI_DATASETS_PATH holding every dataset, written by Minari."""
    root = tmp_path_factory.mktemp("minari_datasets")
    previous = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (obs_space, act_space, make) in DATASETS.items():
            buffers = make()
            for backend in BACKENDS:
                minari.create_dataset_from_buffers(
                    f"bench/{name}-{backend}-v0", buffers, observation_space=obs_space,
                    action_space=act_space, data_format=backend, author="bench")
    yield root
    if previous is None:
        os.environ.pop("MINARI_DATASETS_PATH", None)
    else:
        os.environ["MINARI_DATASETS_PATH"] = previous


def _read_ours(dataset_id):
    return from_minari(dataset_id)


def _read_minari(dataset_id):
    return list(minari.load_dataset(dataset_id).iterate_episodes())


@pytest.mark.parametrize("impl", ["ours", "minari"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_read(benchmark, minari_root, dataset, backend, impl):
    dataset_id = f"bench/{dataset}-{backend}-v0"
    benchmark.group = f"minari_read_{dataset}_{backend}"
    read = _read_ours if impl == "ours" else _read_minari
    # (Ours reads the CartPole dataset in ~20 ms: more rounds keep a busy
    # machine's preemptions out of its median.)
    rounds = 15 if impl == "ours" and dataset == "cartpole" else 5
    episodes = benchmark.pedantic(read, args=(dataset_id,), rounds=rounds, warmup_rounds=1)
    steps = minari.load_dataset(dataset_id).total_steps
    assert len(episodes) == len(minari.load_dataset(dataset_id))
    assert sum(len(e) for e in episodes) == steps
    # The same data either way (spot check: the last episode).
    last = _read_minari(dataset_id)[-1] if impl == "ours" else None
    if last is not None:
        assert np.array_equal(episodes[-1].get_observations(), last.observations)
        assert np.array_equal(episodes[-1].get_actions(), last.actions)
    benchmark.extra_info["steps"] = steps
    benchmark.extra_info["ns_per_step"] = benchmark.stats.stats.median * 1e9 / steps


class _Ours:
    def build(self, dataset_id):
        from episode.replay import EpisodeReplayBuffer
        episodes = from_minari(dataset_id)
        buffer = EpisodeReplayBuffer(capacity=sum(len(e) for e in episodes))
        buffer.add(episodes)
        return buffer

    def sample(self, buffer):
        return buffer.sample_batch(BATCH)

    def check(self, buffer, batch, steps):
        assert buffer.get_num_timesteps() == steps
        assert batch["obs"].shape == (BATCH, 4) and batch["new_obs"].shape == (BATCH, 4)
        assert batch["actions"].shape == (BATCH,)


class _TorchRL:
    def __init__(self):
        import inspect
        module = pytest.importorskip("torchrl.data.datasets.minari_data")
        self.cls = module.MinariExperienceReplay
        if "load_from_local_minari" not in inspect.signature(self.cls.__init__).parameters:
            pytest.skip("this TorchRL reads Minari datasets only by downloading them")
        self.roots = []

    def build(self, dataset_id):
        # Offline: the dataset is found under MINARI_DATASETS_PATH (no
        # download); TorchRL copies it into memory-mapped tensors under a
        # root of its own, which must be new for it to build.
        root = tempfile.mkdtemp(prefix="torchrl-minari-")
        self.roots.append(root)
        return self.cls(dataset_id, batch_size=BATCH, root=root, download=False,
                        load_from_local_minari=True)

    def sample(self, buffer):
        return buffer.sample()

    def check(self, buffer, batch, steps):
        assert len(buffer) == steps
        assert tuple(batch["observation"].shape) == (BATCH, 4)
        assert tuple(batch["next", "observation"].shape) == (BATCH, 4)

    def close(self):
        for root in self.roots:
            shutil.rmtree(root, ignore_errors=True)


def _impl(name):
    return _Ours() if name == "ours" else _TorchRL()


@pytest.mark.parametrize("impl", ["ours", "torchrl"])
def test_build_and_sample(benchmark, minari_root, impl):
    dataset_id = "bench/cartpole-hdf5-v0"
    benchmark.group = "minari_replay_cartpole_hdf5"
    run = _impl(impl)

    def build_and_sample():
        buffer = run.build(dataset_id)
        for _ in range(SAMPLES):
            batch = run.sample(buffer)
        return buffer, batch

    try:
        buffer, batch = benchmark.pedantic(build_and_sample, rounds=3, warmup_rounds=1)
        steps = minari.load_dataset(dataset_id).total_steps
        run.check(buffer, batch, steps)
        benchmark.extra_info["steps"] = steps
        benchmark.extra_info["ns_per_step"] = benchmark.stats.stats.median * 1e9 / steps
    finally:
        if impl == "torchrl":
            run.close()


@pytest.mark.parametrize("impl", ["ours", "torchrl"])
def test_sample(benchmark, minari_root, impl):
    dataset_id = "bench/cartpole-hdf5-v0"
    benchmark.group = "minari_sample_cartpole"
    run = _impl(impl)
    try:
        buffer = run.build(dataset_id)
        batch = benchmark.pedantic(run.sample, args=(buffer,), rounds=200, iterations=5,
                                   warmup_rounds=5)
        run.check(buffer, batch, minari.load_dataset(dataset_id).total_steps)
        benchmark.extra_info["ns_per_transition"] = benchmark.stats.stats.median * 1e9 / BATCH
    finally:
        if impl == "torchrl":
            run.close()
