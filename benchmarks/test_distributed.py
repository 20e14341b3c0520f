"""DistributedSampler's throughput, and episodes through Ray's object store.

    pytest benchmarks/test_distributed.py --benchmark-group-by=group \
        --benchmark-columns=median,iqr,rounds

On a local Ray cluster of 2 CPUs (``ray.init(num_cpus=2)``):

- ``distributed_cartpole_8``: one call on CartPole-v1, 8 sync sub-envs per
  sampler, rollout_fragment_length 200 (and 1000), a tiny numpy policy
  (linear, argmax): ``local`` is one `episode.Sampler` in this process,
  ``ray_1`` and ``ray_2`` a `DistributedSampler` of 1 and 2 actors (each
  running such a Sampler), for `sample_episodes()` and `sample()`.
  `extra_info["env_steps"]` is the env steps of a call (steps/s = that /
  median).
- ``object_store_cartpole_10k`` and ``object_store_frames_10k``: a
  numpy'ized 10,000-step episode (CartPole-sized float32 observations of
  shape (4,), or 84x84 uint8 frames, 70 MB), ours (``ours``) and RLlib
  2.60's (``rllib``) with the same data, against its arrays (observations,
  actions, rewards) alone (``raw``), and ``memcpy``, `np.copy` of those
  arrays (the floor). ``put_get`` rows time `ray.get(ray.put(x))`, ``get``
  rows `ray.get` alone of an object put once (what a receiver pays).
  `extra_info["data_bytes"]` is the arrays' size.

`test_episodes_pickle_out_of_band` checks that both classes' episodes hand
their arrays to pickle protocol 5 as out-of-band buffers.
"""
import os
import pickle
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.rllib]

ray = pytest.importorskip("ray")

from episode import Sampler, SingleAgentEpisode  # noqa: E402
from episode.distributed import DistributedSampler  # noqa: E402
from episode.cli.workloads import rllib_class  # noqa: E402

# The policy goes to the actors by value (this module is not importable there).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

N_ENVS = 8
FRAGMENT = 200
N_STEPS = 10_000
DATA = {"cartpole_10k": ((4,), np.float32), "frames_10k": ((84, 84), np.uint8)}


@pytest.fixture(scope="module", autouse=True)
def ray_cluster(tmp_path_factory):
    # Ray puts the driver's working directory first on its workers' sys.path:
    # started from a checkout, they would import its episode/ (without the
    # compiled modules) instead of the installed package.
    if ray.is_initialized():
        ray.shutdown()
    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("ray"))
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    finally:
        os.chdir(cwd)
    yield
    ray.shutdown()


class LinearPolicy:
    """CartPole's action: argmax of obs @ weights (4 x 2), for a batch."""

    def __init__(self, seed=0):
        self.weights = np.random.default_rng(seed).normal(size=(4, 2)).astype(np.float32)

    def __call__(self, inputs):
        return np.argmax(inputs["obs"] @ self.weights, axis=1)


@pytest.mark.parametrize("fragment", [200, 1000])
@pytest.mark.parametrize("method", ["sample_episodes", "sample"])
@pytest.mark.parametrize("impl", ["local", "ray_1", "ray_2"])
def test_distributed_cartpole_8(benchmark, impl, method, fragment):
    kwargs = dict(num_envs=N_ENVS, rollout_fragment_length=fragment, seed=0)
    if impl == "local":
        sampler = Sampler("CartPole-v1", LinearPolicy(), **kwargs)
    else:
        sampler = DistributedSampler("CartPole-v1", LinearPolicy(),
                                     num_actors=int(impl[-1]), **kwargs)
    call = getattr(sampler, method)
    benchmark.group = f"distributed_cartpole_8 {method} fragment {fragment}"
    try:
        call()
        steps = sampler.get_metrics()["env_steps"]
        actors = 1 if impl == "local" else sampler.num_actors
        assert N_ENVS * fragment * actors <= steps < (N_ENVS * fragment + N_ENVS) * actors
        benchmark.extra_info["env_steps"] = steps
        benchmark.pedantic(call, rounds=20 if fragment == 200 else 8, warmup_rounds=1,
                           iterations=1)
    finally:
        sampler.close()


_episodes: dict = {}


def _data(data):
    shape, dtype = DATA[data]
    rng = np.random.default_rng(0)
    obs = (rng.integers(0, 255, (N_STEPS + 1,) + shape) if dtype == np.uint8
           else rng.normal(size=(N_STEPS + 1,) + shape)).astype(dtype)
    actions = rng.integers(0, 2, N_STEPS)
    rewards = rng.normal(size=N_STEPS)
    return obs, actions, rewards


def _episode(impl, data):
    """A numpy'ized 10,000-step episode of either class, the same data."""
    if (impl, data) not in _episodes:
        cls = SingleAgentEpisode if impl == "ours" else rllib_class()
        if cls is None:
            pytest.skip("ray[rllib] is not installed")
        obs, actions, rewards = _data(data)
        e = cls()
        e.add_env_reset(obs[0])
        for t in range(N_STEPS):
            e.add_env_step(obs[t + 1], actions[t], float(rewards[t]),
                           truncated=t == N_STEPS - 1)
        _episodes[impl, data] = e.to_numpy()
    return _episodes[impl, data]


def _arrays(episode):
    return [episode.get_observations(), episode.get_actions(), episode.get_rewards()]


@pytest.mark.parametrize("data", list(DATA))
@pytest.mark.parametrize("impl, op", [("memcpy", "copy"),
                                      ("raw", "put_get"), ("ours", "put_get"),
                                      ("rllib", "put_get"),
                                      ("raw", "get"), ("ours", "get"), ("rllib", "get")])
def test_object_store(benchmark, impl, op, data):
    arrays = _arrays(_episode("ours", data))
    benchmark.group = f"object_store_{data}"
    benchmark.extra_info["data_bytes"] = sum(a.nbytes for a in arrays)
    value = arrays if impl in ("raw", "memcpy") else _episode(impl, data)
    if op == "copy":
        def run():
            return [np.copy(a) for a in value]
    elif op == "put_get":
        def run():
            return ray.get(ray.put(value))
    else:
        # The get alone, of an object put once: what the receiving side pays.
        ref = ray.put(value)

        def run():
            return ray.get(ref)
    got = run()
    for a, b in zip(got if impl in ("raw", "memcpy") else _arrays(got), arrays):
        np.testing.assert_array_equal(a, b)
    benchmark.pedantic(run, rounds=15, warmup_rounds=2, iterations=1)


@pytest.mark.parametrize("data", list(DATA))
@pytest.mark.parametrize("impl", ["ours", "rllib"])
def test_episodes_pickle_out_of_band(impl, data):
    episode = _episode(impl, data)
    data_bytes = sum(a.nbytes for a in _arrays(episode))
    buffers: list = []
    in_band = pickle.dumps(episode, protocol=5, buffer_callback=buffers.append)
    out_of_band = sum(memoryview(b).nbytes for b in buffers)
    print(f"{impl} {data}: {len(in_band):,} bytes in band, {len(buffers)} buffers of "
          f"{out_of_band:,} bytes out of band ({data_bytes:,} bytes of arrays)")
    assert out_of_band >= data_bytes
    if impl == "ours":
        assert len(in_band) < 4096
