"""RLlib's offline API on RLlib's classes and on ours (episode.rllib.offline),
in one process.

    pytest benchmarks/test_rllib_offline.py --benchmark-group-by=group \
        --benchmark-columns=median,iqr,rounds

- ``recording_cartpole``: a recording env runner (RLlib's
  OfflineSingleAgentEnvRunner, or ours) made from a PPO config with
  ``output=`` (CartPole-v1, 8 envs, complete_episodes, the default PPO
  module exploring) samples until 2,000 steps are recorded, then stops;
  a round is a fresh runner and folder. ``ours`` writes RLlib's episode
  format (RLlib's default), ``ours-native`` our format
  (``output_write_method="write_episodes"``). `extra_info`: steps/s, files
  and bytes left.
- ``bc_train``: BC's `algo.train()` on a local learner, on 40,000 steps of
  an expert CartPole policy in RLlib's episode format (written by
  `episode.offline.rllib_format`, byte for byte what RLlib's recording
  writes), ``train_batch_size_per_learner=512``,
  ``input_read_batch_size=8``, one prelearner actor of half a CPU (RLlib's
  default of two actors of a CPU each leaves no CPU for Ray Data's read
  task on two CPUs, and its first iteration never ends); the median of 20
  iterations after a first one (timed apart: `extra_info["first"]`), seed
  0; then seeds 0-2 train 30 iterations each and the greedy policy's mean
  return over 10 episodes is `extra_info["returns"]`.
- ``read_1m_episodes`` / ``read_1m_rows``: 1M CartPole steps (random
  actions) in RLlib's episode format / row format (obs and new_obs packed,
  RLlib's default): the prelearner (RLlib's OfflinePreLearner, or ours) of
  a BC config maps every batch of the files, as Ray Data's map_batches
  would hand them (1,024 rows each; for episodes ``input_read_batch_size``
  256), read from the files beforehand; `extra_info`: steps/s.

RLlib's side runs without `episode.rllib.install()`; ours inside
`episode.rllib.installed()`. Ray starts before either, so RLlib's Ray
Data workers run RLlib's classes. Torch runs one thread in this process.
"""
from __future__ import annotations

import glob
import logging
import os
import shutil
import statistics
import tempfile
import time

import gymnasium as gym
import pytest

pytest.importorskip("ray.rllib")
pytest.importorskip("torch")
pytest.importorskip("pyarrow")
pytest.importorskip("msgpack_numpy")      # RLlib's recording needs it

import ray  # noqa: E402
import torch  # noqa: E402
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule  # noqa: E402
from prelearners import bc_prelearner  # noqa: E402


RECORD_STEPS = 2_000
BC_STEPS, BC_ITERS, BC_SEEDS, BC_EVAL_ITERS = 40_000, 20, (0, 1, 2), 30
READ_STEPS = 1_000_000


@pytest.fixture(scope="module", autouse=True)
def ray_started():
    logging.disable(logging.WARNING)
    # One thread for torch on both sides: on a busy two-core machine its
    # threads wait on each other (a 256-unit layer then takes milliseconds).
    torch.set_num_threads(1)
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield


class Expert(TorchRLModule):
    """CartPole's textbook controller as an RLModule: push toward the side
    the pole falls to (angle plus a share of its angular velocity)."""

    def setup(self):
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def _forward(self, batch, **kwargs):
        obs = batch["obs"]
        right = (obs[:, 2] + 0.25 * obs[:, 3] > 0).long()
        logits = torch.nn.functional.one_hot(right, 2).float() * 20.0 - 10.0
        return {"action_dist_inputs": logits}

    def get_exploration_action_dist_cls(self):
        from ray.rllib.models.torch.torch_distributions import TorchCategorical

        return TorchCategorical

    get_inference_action_dist_cls = get_train_action_dist_cls = get_exploration_action_dist_cls


# -- recording ---------------------------------------------------------------------------------


def _recording_runner(side: str, out: str):
    from ray.rllib.algorithms.ppo import PPOConfig

    options = {"output_write_method": "write_episodes"} if side == "ours-native" else {}
    config = (PPOConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=8,
                           batch_mode="complete_episodes")
              .offline_data(output=out, **options)
              .debugging(seed=0))
    if side == "rllib":
        from ray.rllib.offline.offline_env_runner import OfflineSingleAgentEnvRunner
    else:
        from episode.rllib.offline import OfflineSingleAgentEnvRunner
    return OfflineSingleAgentEnvRunner(config=config)


def _record(runner) -> int:
    steps = 0
    while steps < RECORD_STEPS:
        steps += sum(len(e) for e in runner.sample())
    runner.stop()
    return steps


@pytest.mark.benchmark(group="recording_cartpole")
@pytest.mark.parametrize("side", ["ours", "ours-native", "rllib"], indirect=True)
def test_recording(benchmark, side):
    folders, steps = [], []

    def setup():
        out = tempfile.mkdtemp(prefix="recording-")
        folders.append(out)
        return (_recording_runner(side, out),), {}

    def run(runner):
        steps.append(_record(runner))

    benchmark.pedantic(run, setup=setup, rounds=3 if side == "rllib" else 10)
    files = [f for f in glob.glob(os.path.join(folders[-1], "**", "*"), recursive=True)
             if os.path.isfile(f)]
    benchmark.extra_info.update(
        steps_per_s=steps[-1] / benchmark.stats.stats.median, steps=steps[-1],
        files=len(files), bytes=sum(os.path.getsize(f) for f in files))
    for out in folders:
        shutil.rmtree(out, ignore_errors=True)


# -- BC ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def expert_dataset(tmp_path_factory):
    """BC_STEPS steps of the expert in RLlib's episode format."""
    from episode.offline import rllib_format
    import pyarrow as pa
    import pyarrow.parquet as pq

    episodes = _expert_episodes(BC_STEPS)
    out = tmp_path_factory.mktemp("expert")
    pq.write_table(pa.table({"item": pa.array(rllib_format.pack_episodes(episodes),
                                              pa.binary())}), out / "expert.parquet")
    return str(out)


def _expert_episodes(steps: int) -> list:
    from offline_parts import _cartpole_expert, _played

    return _played("CartPole-v1", steps, _cartpole_expert)


def _bc(path: str, seed: int):
    from ray.rllib.algorithms.bc import BCConfig

    env = gym.make("CartPole-v1")
    return (BCConfig()
            .environment(observation_space=env.observation_space,
                         action_space=env.action_space)
            .learners(num_learners=0)
            .training(train_batch_size_per_learner=512, lr=1e-3)
            .offline_data(input_=path, input_read_episodes=True, input_read_batch_size=8,
                          dataset_num_iters_per_learner=1,
                          # RLlib's default (two actors of a CPU each) and a
                          # read task need three CPUs: on two, Ray Data waits.
                          map_batches_kwargs={"concurrency": 1, "num_cpus": 0.5})
            .debugging(seed=seed)
            .build_algo())


def _greedy_return(algo, episodes: int = 10) -> float:
    # BC on a local learner has no env runner: the learner's module acts.
    module = algo.learner_group._learner.module["default_policy"]
    env = gym.make("CartPole-v1")
    total = 0.0
    for k in range(episodes):
        obs, _ = env.reset(seed=1000 + k)
        done = False
        while not done:
            with torch.no_grad():
                out = module.forward_inference({"obs": torch.as_tensor(obs[None])})
            obs, reward, terminated, truncated, _ = env.step(
                int(out["action_dist_inputs"][0].argmax()))
            total += reward
            done = terminated or truncated
    return total / episodes


@pytest.mark.benchmark(group="bc_train")
@pytest.mark.parametrize("side", ["ours", "rllib"], indirect=True)
def test_bc_train(benchmark, side, expert_dataset):
    algo = _bc(expert_dataset, 0)
    start = time.perf_counter()
    algo.train()
    first = time.perf_counter() - start
    benchmark.pedantic(algo.train, rounds=BC_ITERS)
    algo.stop()
    returns = []
    for seed in BC_SEEDS:
        algo = _bc(expert_dataset, seed)
        for _ in range(BC_EVAL_ITERS):
            algo.train()
        returns.append(_greedy_return(algo))
        algo.stop()
    benchmark.extra_info.update(first=first, returns=returns,
                                mean_return=statistics.mean(returns))


# -- reading --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded_1m(tmp_path_factory):
    """READ_STEPS random CartPole steps in RLlib's two formats: the
    folders and the numpy batches Ray Data would hand the prelearner."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from episode import Sampler
    from episode.offline import rllib_format

    sampler = Sampler("CartPole-v1", num_envs=64, rollout_fragment_length=500,
                      batch_mode="complete_episodes", seed=0)
    episodes, n = [], 0
    while n < READ_STEPS:
        batch = sampler.sample_episodes()
        episodes += batch
        n += sum(len(e) for e in batch)
    out = {}
    for kind in ("episodes", "rows"):
        folder = tmp_path_factory.mktemp(kind)
        for k in range(0, len(episodes), 4096):
            part = episodes[k:k + 4096]
            table = (pa.table({"item": pa.array(rllib_format.pack_episodes(part), pa.binary())})
                     if kind == "episodes" else rllib_format.episode_rows(part))
            pq.write_table(table, folder / f"part-{k // 4096:04d}.parquet")
        table = pa.concat_tables(pq.read_table(f) for f in sorted(glob.glob(str(folder / "*"))))
        size = 256 if kind == "episodes" else 1024
        batches = [rllib_format.to_numpy_batch(table.slice(i, size))
                   for i in range(0, table.num_rows, size)]
        out[kind] = (str(folder), batches)
    out["steps"] = n
    return out


def _read_all(benchmark, side: str, kind: str, recorded: dict) -> None:
    path, batches = recorded[kind]

    def setup():
        return (bc_prelearner(side, kind, input_=path),), {}

    def run(prelearner):
        for batch in batches:
            prelearner(batch)

    benchmark.pedantic(run, setup=setup, rounds=1 if side == "rllib" else 5)
    benchmark.extra_info.update(steps_per_s=recorded["steps"] / benchmark.stats.stats.median,
                                steps=recorded["steps"], batches=len(batches))


@pytest.mark.benchmark(group="read_1m_episodes")
@pytest.mark.parametrize("side", ["ours", "rllib"], indirect=True)
def test_read_episodes(benchmark, side, recorded_1m):
    _read_all(benchmark, side, "episodes", recorded_1m)


@pytest.mark.benchmark(group="read_1m_rows")
@pytest.mark.parametrize("side", ["ours", "rllib"], indirect=True)
def test_read_rows(benchmark, side, recorded_1m):
    _read_all(benchmark, side, "rows", recorded_1m)
