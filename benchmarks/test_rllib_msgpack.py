"""RLlib's episode format read by ours (msgpack's C unpacker and column-wise
numpy, episode.offline.rllib_format) and by RLlib's own code, whole user
operations, in one run, on realistic data sets.

    pytest benchmarks/test_rllib_msgpack.py --benchmark-group-by=group \
        --benchmark-columns=median,iqr,rounds

Data: random-action CartPole (RLlib's recorder's layout: list-mode tracks,
np.int64 actions, the ``weights_seq_no`` extra output), EPISODE_BENCH_STEPS
steps (default 110,000: about 5,000 episodes); episodes of about 100 steps
(a CartPole controller with 10% random actions, cut at 100: 1,100 episodes);
84x84 uint8 images, 30-step episodes, EPISODE_BENCH_IMAGE_STEPS steps
(default 30,000: 1,000 episodes). Each recording is Parquet files of 512
packed episodes (64 for images) in an ``item`` column, as RLlib writes them.

Groups (``rllib``: ``SingleAgentEpisode.from_state(msgpack.unpackb(item,
object_hook=msgpack_numpy.decode))`` per row, RLlib's classes):

- ``read_episodes_<data>``: ``read_episodes(folder)`` and a pass over every
  episode (its length and last observation);
- ``prelearner_<data>``: a BC config's OfflinePreLearner (ours, installed:
  conftest's ``side``)
  over every batch of 256 packed episodes, as Ray Data's map_batches hands
  them (RLlib's prelearner for ``rllib``).

The benchmarks page sets these beside the C decoder that was deleted for
them (2026-12-06: at least 3x faster on CartPole, 1.4-2.2x on images).
"""
from __future__ import annotations

import os
import types

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("pytest_benchmark")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from test_offline_rllib_read import _random_cartpole as recorded_cartpole  # noqa: E402

STEPS = int(os.environ.get("EPISODE_BENCH_STEPS", "110000"))
IMAGE_STEPS = int(os.environ.get("EPISODE_BENCH_IMAGE_STEPS", "30000"))
IMPLS = ["ours", "rllib"]


def _random_cartpole(steps: int) -> list:
    from episode import SingleAgentEpisode

    return recorded_cartpole(SingleAgentEpisode, steps)[0]


def _long_cartpole(steps: int) -> list:
    from episode import SingleAgentEpisode

    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(1)
    episodes, total = [], 0
    while total < steps:
        ep = SingleAgentEpisode(observation_space=env.observation_space,
                                action_space=env.action_space)
        obs, info = env.reset(seed=int(rng.integers(1 << 30)))
        ep.add_env_reset(obs, infos=info)
        for t in range(100):
            action = np.int64(obs[2] + 0.25 * obs[3] > 0 if rng.random() < 0.9
                              else rng.integers(2))
            obs, reward, term, trunc, info = env.step(int(action))
            ep.add_env_step(obs, action, float(reward), infos=info, terminated=np.bool_(term),
                            truncated=np.bool_(t == 99 and not term),
                            extra_model_outputs={"weights_seq_no": 0})
            if term:
                break
        episodes.append(ep)
        total += len(ep)
    return episodes


def _images(steps: int, length: int = 30) -> list:
    from episode import SingleAgentEpisode

    space = gym.spaces.Box(0, 255, (84, 84, 1), np.uint8)
    rng = np.random.default_rng(2)
    frames = rng.integers(0, 256, (length + 1, 84, 84, 1), dtype=np.uint8)
    episodes, total = [], 0
    while total < steps:
        ep = SingleAgentEpisode(observation_space=space, action_space=gym.spaces.Discrete(6))
        ep.add_env_reset(frames[0].copy(), infos={})
        for t in range(length):
            ep.add_env_step(np.roll(frames[t + 1], total + t).copy(), np.int64(rng.integers(6)),
                            1.0, infos={}, terminated=t == length - 1,
                            extra_model_outputs={"weights_seq_no": 0})
        episodes.append(ep)
        total += len(ep)
    return episodes


DATA = {"cartpole": lambda: _random_cartpole(STEPS),
        "cartpole_100": lambda: _long_cartpole(STEPS),
        "images": lambda: _images(IMAGE_STEPS)}


@pytest.fixture(scope="module", params=list(DATA))
def recording(request, tmp_path_factory):
    """(name, folder, batches, steps, spaces) of one data set."""
    from episode.offline import rllib_format as F

    episodes = DATA[request.param]()
    steps = sum(len(e) for e in episodes)
    items = F.pack_episodes(episodes)
    folder = tmp_path_factory.mktemp(request.param)
    per_file = 64 if request.param == "images" else 512
    for k in range(0, len(items), per_file):
        pq.write_table(pa.table({"item": pa.array(items[k:k + per_file], pa.binary())}),
                       folder / f"part-{k // per_file:05d}.parquet")
    batches = [{"item": np.array(items[i:i + 256] + [None], dtype=object)[:-1]}
               for i in range(0, len(items), 256)]
    spaces = (episodes[0].observation_space, episodes[0].action_space)
    return types.SimpleNamespace(name=request.param, folder=str(folder), batches=batches,
                                 steps=steps, spaces=spaces)


def _rllib_read(folder: str) -> list:
    import glob

    import msgpack
    import msgpack_numpy
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    return [SingleAgentEpisode.from_state(msgpack.unpackb(item, object_hook=msgpack_numpy.decode))
            for path in sorted(glob.glob(os.path.join(folder, "*.parquet")))
            for item in pq.read_table(path).column("item").to_pylist()]


def _walk(episodes) -> int:
    n = 0
    for episode in episodes:
        n += len(episode)
        episode.get_observations(-1)
    return n


@pytest.mark.parametrize("side", IMPLS, indirect=True)
def test_read_episodes(benchmark, recording, side):
    benchmark.group = f"read_episodes_{recording.name}"
    if side == "rllib":
        pytest.importorskip("msgpack_numpy")
        pytest.importorskip("ray.rllib")

        def run():
            return _walk(_rllib_read(recording.folder))
    else:
        from episode.offline import read_episodes

        def run():
            return _walk(read_episodes(recording.folder))
    assert run() == recording.steps
    benchmark.pedantic(run, rounds=3 if side == "rllib" else 5)
    benchmark.extra_info["steps"] = recording.steps
    if benchmark.stats is not None:
        benchmark.extra_info["steps_per_s"] = round(recording.steps / benchmark.stats.stats.median)


def _prelearner(side: str, spaces: tuple):
    from ray.rllib.algorithms.bc import BCConfig
    from ray.rllib.env import INPUT_ENV_SPACES

    obs_space, act_space = spaces
    config = (BCConfig().environment(observation_space=obs_space, action_space=act_space)
              .training(train_batch_size_per_learner=1024)
              .offline_data(input_="unused", input_read_episodes=True,
                            dataset_num_iters_per_learner=1))
    all_spaces = {INPUT_ENV_SPACES: spaces, "default_policy": spaces}
    spec = config.get_multi_rl_module_spec(spaces=all_spaces, inference_only=False)
    if side == "rllib":
        from ray.rllib.offline.offline_prelearner import OfflinePreLearner
    else:
        from episode.rllib.offline import OfflinePreLearner
    return OfflinePreLearner(config=config, spaces=spaces, module_spec=spec)


@pytest.mark.parametrize("side", IMPLS, indirect=True)
def test_prelearner(benchmark, recording, side):
    import logging

    pytest.importorskip("ray.rllib")
    pytest.importorskip("torch")
    benchmark.group = f"prelearner_{recording.name}"
    logging.disable(logging.WARNING)

    def run(prelearner):
        for batch in recording.batches:
            prelearner(batch)

    def setup():
        return (_prelearner(side, recording.spaces),), {}

    rounds = 3 if side == "ours" or recording.steps <= 50_000 else 1
    benchmark.pedantic(run, setup=setup, rounds=rounds)
    logging.disable(logging.NOTSET)
    benchmark.extra_info["steps"] = recording.steps
    if benchmark.stats is not None:
        benchmark.extra_info["steps_per_s"] = round(recording.steps / benchmark.stats.stats.median)
