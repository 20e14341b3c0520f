"""BC's, MARWIL's and CQL's train() part by part, on RLlib's classes or on
ours, from recorded data in RLlib's episode format.

    python benchmarks/offline_parts.py run ALGO DATA rllib|ours [ITERATIONS]
    python benchmarks/offline_parts.py table [ITERATIONS]
    python benchmarks/offline_parts.py show [ITERATIONS]

ALGO is bc, marwil or cql; DATA is cartpole (40,000 steps of an expert),
pendulum (20,000 steps of a noisy swing-up controller, for CQL's
continuous actions) or images (8,000 steps of 84x84x1 uint8 frames in
250-step episodes, Discrete(6) actions; RLlib's default conv net, the
frames scaled to floats first: RLlib's conv encoder takes floats only).
CQL is not run on images: RLlib 2.60's SAC catalog (CQL's) sizes each Q
function's fusion layer by the conv encoder's flattened output (30,976
for 84x84 frames), a 62,208 x 30,976 float32 matrix (7.7 GB) per Q net,
of which it builds four. The datasets are written once into a folder
(EPISODE_PARTS_DATA, default <tmp>/episode-offline-parts) by our writer
of RLlib's episode format.

The config is RLlib's algorithm config on a local learner
(num_learners=0), seed 0, torch on one thread, input_read_batch_size 8
episodes (images: 4), one prelearner actor of half a CPU for Ray Data
(RLlib's default of two actors of a CPU each leaves no CPU for the read
task on two CPUs), dataset_num_iters_per_learner 1 (CQL: 2; with 1,
RLlib's CQL hands the learner its batch as a data iterator and fails).
Ours reads and maps in this process; RLlib's through Ray Data, its
prelearner in an actor.

Each part of train() is timed by a wrapper around its call (train_parts):
the data path, `offline_data.sample` (reading and the prelearner, or
waiting for Ray Data's) and, where the learner pulls its batches itself
(CQL), its data iterator's steps; within it for ours the Parquet reading;
the prelearner's calls (a subclass passed as `prelearner_class` times its
__call__ wherever it runs: Ray Data's actor runs ahead of train(), so on
RLlib's side they overlap the driver); the learner update
(`learner_group.update` less its data iterator), within it the batch's
conversion to tensors and the torch update (forward, loss, backward,
optimizer step). The first iteration is reported apart from the next
ITERATIONS. `run` prints one JSON line; `table` runs every case, each
stack in a fresh process (one process cannot mix the two kinds of
episodes), and prints the markdown tables of docs/benchmarks.md; `show`
prints them again from the runs `table` kept.

Both stacks get the same batches' layout (keys, dtypes, shapes: checked)
and learn alike; the losses are not equal step by step: RLlib's
prelearner adds each read batch's episodes to its buffer as a set (in
memory-address order), so its draws differ from run to run.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from train_parts import Parts

CASES = (("bc", "cartpole"), ("marwil", "cartpole"), ("cql", "pendulum"),
         ("bc", "images"), ("marwil", "images"))
STEPS = {"cartpole": 40_000, "pendulum": 20_000, "images": 8_000}
BATCH = {"cartpole": 512, "pendulum": 256, "images": 128}
READ_BATCH = {"cartpole": 8, "pendulum": 8, "images": 4}


def data_folder() -> str:
    """Where the datasets (and `table`'s kept runs) are."""
    return os.environ.get("EPISODE_PARTS_DATA",
                          os.path.join(tempfile.gettempdir(), "episode-offline-parts"))


# -- the datasets ----------------------------------------------------------------------------


def _spaces(data: str):
    import gymnasium as gym

    if data == "images":
        return gym.spaces.Box(0, 255, (84, 84, 1), np.uint8), gym.spaces.Discrete(6)
    env = gym.make("CartPole-v1" if data == "cartpole" else "Pendulum-v1")
    return env.observation_space, env.action_space


def _played(env_id: str, steps: int, policy) -> list:
    """Episodes of `policy` (obs, rng -> action) on `env_id`, seeds 0, 1, ..."""
    import gymnasium as gym

    from episode import SingleAgentEpisode

    env, rng = gym.make(env_id), np.random.default_rng(0)
    episodes, n, seed = [], 0, 0
    while n < steps:
        obs, info = env.reset(seed=seed)
        episode = SingleAgentEpisode(observations=[obs], infos=[info],
                                     observation_space=env.observation_space,
                                     action_space=env.action_space)
        done = False
        while not done:
            action = policy(obs, rng)
            obs, reward, terminated, truncated, info = env.step(action)
            episode.add_env_step(obs, action, reward, infos=info, terminated=terminated,
                                 truncated=truncated)
            done = terminated or truncated
        episodes.append(episode)
        n, seed = n + len(episode), seed + 1
    return episodes


def _cartpole_expert(obs, rng):
    # Push toward the side the pole falls to.
    return int(obs[2] + 0.25 * obs[3] > 0)


def _pendulum_swing(obs, rng):
    # Pump energy until near the top, then a PD hold; noise for coverage.
    cos, sin, velocity = obs
    angle = np.arctan2(sin, cos)
    if cos > 0.8:
        torque = -10.0 * angle - 2.0 * velocity
    else:
        torque = 2.0 * np.sign(velocity or 1.0)
    return np.clip([torque + rng.normal(0, 0.3)], -2.0, 2.0).astype(np.float32)


def _image_episodes(length: int = 250) -> list:
    """Game-like frames (a fixed background, objects on random walks, a
    noisy band), random actions, a reward now and then."""
    from episode import SingleAgentEpisode

    obs_space, action_space = _spaces("images")
    action_space.seed(0)
    rng = np.random.default_rng(0)
    background = np.zeros((84, 84, 1), np.uint8)
    background[70:], background[:8] = 90, 30
    objects = rng.integers(10, 60, (6, 2))

    def frame():
        nonlocal objects
        out = background.copy()
        objects = np.clip(objects + rng.integers(-2, 3, objects.shape), 8, 64)
        for k, (y, x) in enumerate(objects):
            out[y:y + 6, x:x + 4] = 120 + 20 * k
        out[8:12] = rng.integers(0, 255, (4, 84, 1), np.uint8)
        return out

    episodes = []
    for _ in range(STEPS["images"] // length):
        episode = SingleAgentEpisode(observations=[frame()], infos=[{}],
                                     observation_space=obs_space, action_space=action_space)
        for t in range(length):
            episode.add_env_step(frame(), action_space.sample(), float(rng.random() < 0.05),
                                 infos={}, terminated=t == length - 1)
        episodes.append(episode)
    return episodes


def dataset(data: str) -> str:
    """The folder of `data` in RLlib's episode format (made if missing)."""
    path = os.path.join(data_folder(), data)
    if glob.glob(os.path.join(path, "*.parquet")):
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    from episode.offline import rllib_format

    if data == "cartpole":
        episodes = _played("CartPole-v1", STEPS[data], _cartpole_expert)
    elif data == "pendulum":
        episodes = _played("Pendulum-v1", STEPS[data], _pendulum_swing)
    else:
        episodes = _image_episodes()
    os.makedirs(path, exist_ok=True)
    table = pa.table({"item": pa.array(rllib_format.pack_episodes(episodes), pa.binary())})
    aside = os.path.join(path, "data.parquet.tmp")
    pq.write_table(table, aside)
    os.replace(aside, os.path.join(path, "data.parquet"))
    return path


# -- one run -------------------------------------------------------------------------------


def _timed_prelearner(base, log: str):
    """A subclass of the installed OfflinePreLearner that appends the
    seconds and rows of each call to `log` (Ray Data's actor writes from
    its own process)."""

    class TimedPreLearner(base):
        def __call__(self, batch):
            start = time.perf_counter()
            out = super().__call__(batch)
            seconds = time.perf_counter() - start
            rows = len(next(iter(out.values()))) if out else 0
            with open(log, "a") as f:
                f.write(f"{seconds} {rows}\n")
            return out

    return TimedPreLearner


def _prelearner_calls(log: str) -> list:
    """[seconds, rows] of each prelearner call so far."""
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [[float(x) for x in line.split()] for line in f if line.strip()]


class _FloatFrames:
    """Mixed into an algorithm's default RLModule for uint8 frames: RLlib's
    conv encoder takes float input only, so each forward pass (and the
    value function MARWIL's prelearner calls) first scales the frames to
    floats in [0, 1]."""

    @staticmethod
    def _floats(batch):
        import torch

        batch = dict(batch)
        for key in ("obs", "new_obs"):
            if key in batch and batch[key].dtype == torch.uint8:
                batch[key] = batch[key].float() / 255.0
        return batch

    def _forward(self, batch, **kwargs):
        return super()._forward(self._floats(batch), **kwargs)

    def _forward_train(self, batch, **kwargs):
        return super()._forward_train(self._floats(batch), **kwargs)

    def _forward_inference(self, batch, **kwargs):
        return super()._forward_inference(self._floats(batch), **kwargs)

    def _forward_exploration(self, batch, **kwargs):
        return super()._forward_exploration(self._floats(batch), **kwargs)

    def compute_values(self, batch, embeddings=None):
        return super().compute_values(self._floats(batch), embeddings)


def build(algo: str, data: str, log: str):
    """The algorithm, on whichever classes are installed."""
    from ray import cloudpickle
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.offline.offline_prelearner import OfflinePreLearner

    if __name__ != "__main__":
        # Ray Data's actor cannot import this module (benchmarks/ is not
        # on its path): its classes travel by value.
        cloudpickle.register_pickle_by_value(sys.modules[__name__])

    obs_space, action_space = _spaces(data)
    if algo == "bc":
        from ray.rllib.algorithms.bc import BCConfig as Config
    elif algo == "marwil":
        from ray.rllib.algorithms.marwil import MARWILConfig as Config
    else:
        from ray.rllib.algorithms.cql import CQLConfig as Config
    config = (Config()
              .environment(observation_space=obs_space, action_space=action_space)
              .learners(num_learners=0)
              .training(train_batch_size_per_learner=BATCH[data])
              .offline_data(input_=dataset(data), input_read_episodes=True,
                            input_read_batch_size=READ_BATCH[data],
                            dataset_num_iters_per_learner=2 if algo == "cql" else 1,
                            prelearner_class=_timed_prelearner(OfflinePreLearner, log),
                            map_batches_kwargs={"concurrency": 1, "num_cpus": 0.5})
              .debugging(seed=0))
    if algo == "cql":
        # SAC's own learning rates only (its config check); offline only,
        # as MARWILConfig says of itself (else the algorithm makes an env
        # runner, which needs an env).
        config.training(lr=None)
        config._is_online = False
    if data == "images":
        base = config.get_default_rl_module_spec().module_class
        config.rl_module(rl_module_spec=RLModuleSpec(
            module_class=type("FloatFrames" + base.__name__, (_FloatFrames, base), {})))
    return config.build_algo()


class OfflineParts(Parts):
    """The parts of an offline algorithm's train() (see the module docstring),
    and the layout of the first batch the torch update gets."""

    def __init__(self, algo):
        super().__init__()
        self.layout: dict = {}
        learner = algo.learner_group._learner
        update = learner._update

        def noting_layout(batch, *args, **kwargs):
            if not self.layout:
                self.layout = {f"{m}/{k}": [str(v.dtype), list(v.shape)]
                               for m, b in batch.items() for k, v in b.items()}
            return update(batch, *args, **kwargs)

        learner._update = noting_layout
        self.wrap(learner, "_update", "torch update")
        self.wrap(learner, "_convert_batch_type", "batch to tensors")
        self.wrap(algo.learner_group, "update", "learner_group.update")
        self.wrap(algo.offline_data, "sample", "offline_data.sample")
        from ray.rllib.offline import offline_data
        from ray.rllib.utils.minibatch_utils import MiniBatchRayDataIterator

        # Where the learner pulls its batches itself (CQL's).
        self.wrap(MiniBatchRayDataIterator, "__iter__", "data iterator", generator=True)
        if offline_data.OfflineData.__module__.startswith("episode."):
            self.wrap(sys.modules[offline_data.OfflineData.__module__], "_parquet_batches",
                      "reading Parquet", generator=True)


def _loss(result: dict):
    return result["learners"]["default_policy"].get("total_loss")


class Training:
    """An algorithm built on whichever classes are installed, its parts
    wrapped: train() it, the first iteration apart (`first`), then
    `report()` of the iterations since."""

    def __init__(self, algo_name: str, data: str):
        handle, self.log = tempfile.mkstemp(prefix="prelearner-", suffix=".log")
        os.close(handle)
        self.algo = build(algo_name, data, self.log)
        self.parts = OfflineParts(self.algo)
        self.times: list = []
        self.losses: list = []
        self.first: dict = {}
        self._calls_before = 0

    def train(self) -> None:
        if len(self.times) == 1:
            self.first = {**self.parts.report(), "total": self.times[0],
                          "prelearner": _prelearner_calls(self.log)}
            self.parts.reset()
            self._calls_before = len(self.first["prelearner"])
        start = time.perf_counter()
        self.losses.append(_loss(self.algo.train()))
        self.times.append(time.perf_counter() - start)

    def report(self) -> dict:
        steady = self.times[1:]
        return {"first": self.first,
                "steady": {**self.parts.report(), "total": sum(steady),
                           "prelearner": _prelearner_calls(self.log)[self._calls_before:],
                           "median": statistics.median(steady)},
                "times": self.times, "losses": self.losses, "layout": self.parts.layout}

    def close(self) -> None:
        self.parts.close()
        self.algo.stop()
        os.remove(self.log)


def run(algo_name: str, data: str, classes: str, iterations: int) -> dict:
    logging.disable(logging.WARNING)
    import ray
    import torch

    torch.set_num_threads(1)
    if classes == "ours":
        import episode.rllib

        episode.rllib.install()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    training = Training(algo_name, data)
    for _ in range(1 + iterations):
        training.train()
    out = {"algo": algo_name, "data": data, "classes": classes, **training.report()}
    training.close()
    ray.shutdown()
    return out


# -- the tables ---------------------------------------------------------------------------


def _row(name: str, sides: list, seconds) -> str:
    return f"| {name} | " + " | ".join(seconds(s) for s in sides) + " |"


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1000:,.1f} ms" if x < 1 else f"{x:,.2f} s"


def table(results: dict, iterations: int) -> str:
    """The markdown table of one case: ours and RLlib's, first iteration
    and the next `iterations`."""
    ours, rllib = results["ours"], results["rllib"]
    cols = [(ours, "first"), (rllib, "first"), (ours, "steady"), (rllib, "steady")]

    def part(name):
        return lambda c: _ms(c[0][c[1]]["parts"].get(name))

    def data_path(c):
        r = c[0][c[1]]
        seconds = r["parts"].get("offline_data.sample", 0.0) + r["parts"].get("data iterator", 0.0)
        return f"{_ms(seconds)} ({100 * seconds / r['total']:.0f}%)"

    def learner(c):
        r = c[0][c[1]]
        seconds = r["parts"].get("learner_group.update", 0.0) - r["parts"].get("data iterator", 0.0)
        return f"{_ms(seconds)} ({100 * seconds / r['total']:.0f}%)"

    def prelearner(c):
        calls = c[0][c[1]]["prelearner"]
        if not calls:
            return "none"
        where = "" if c[0] is ours else ", in Ray Data's actor"
        count = "1 call" if len(calls) == 1 else f"{len(calls)} calls"
        return f"{_ms(sum(s for s, _ in calls))} ({count}{where})"

    def rest(c):
        r = c[0][c[1]]["parts"]
        return _ms(c[0][c[1]]["total"] - r.get("offline_data.sample", 0.0)
                   - r.get("learner_group.update", 0.0))

    lines = [
        f"| part of `train()` | ours, first | RLlib, first | ours, next {iterations} "
        f"| RLlib, next {iterations} |",
        "|---|---|---|---|---|",
        _row("**the data path, share of `train()`**", cols, data_path),
        _row("of which reading Parquet (ours: in this process)", cols,
             lambda c: part("reading Parquet")(c) if c[0] is ours else "in Ray Data's tasks"),
        _row("the prelearner's calls", cols, prelearner),
        _row("**the learner update, share of `train()`**", cols, learner),
        _row("of which the batch to tensors", cols, part("batch to tensors")),
        _row("of which the torch update (forward, loss, backward, step)", cols,
             part("torch update")),
        _row("the rest of `train()`", cols, rest),
        _row("full garbage collections (seconds)", cols,
             lambda c: f"{sum(c[0][c[1]]['full_collections'].values())} "
                       f"({c[0][c[1]]['full_collection_seconds']:.2f} s)"),
        _row("**`train()`**", cols, lambda c: _ms(c[0][c[1]]["total"])),
        _row("median `train()`", cols,
             lambda c: _ms(c[0][c[1]]["median"]) if c[1] == "steady" else ""),
    ]
    return "\n".join(lines)


def main_table(iterations: int, rerun: bool = True) -> None:
    """Runs every case, each stack in a process of its own; keeps each
    run's JSON in <data folder>/results and prints the tables (`rerun`
    False: the tables of the kept results)."""
    for data in sorted({d for _, d in CASES}):
        dataset(data)
    here = os.path.dirname(os.path.abspath(__file__))
    results_folder = os.path.join(data_folder(), "results")
    os.makedirs(results_folder, exist_ok=True)
    for algo_name, data in CASES:
        results = {}
        for classes in ("ours", "rllib"):
            kept = os.path.join(results_folder, f"{algo_name}_{data}_{classes}.json")
            if not rerun:
                with open(kept) as f:
                    results[classes] = json.load(f)
                continue
            done = subprocess.run(
                [sys.executable, os.path.join(here, "offline_parts.py"), "run", algo_name,
                 data, classes, str(iterations)],
                check=True, capture_output=True, text=True)
            line = done.stdout.strip().splitlines()[-1]
            with open(kept, "w") as f:
                f.write(line)
            results[classes] = json.loads(line)
        same = results["ours"]["layout"] == results["rllib"]["layout"]
        print(f"\n{algo_name} on {data}: the same batch layout: {same}; losses "
              f"ours {results['ours']['losses'][0]:.3f} -> {results['ours']['losses'][-1]:.3f},"
              f" RLlib {results['rllib']['losses'][0]:.3f} -> "
              f"{results['rllib']['losses'][-1]:.3f}\n")
        print(table(results, iterations))
        sys.stdout.flush()


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[0] == "run":
        print(json.dumps(run(args[1], args[2], args[3],
                             int(args[4]) if len(args) > 4 else 20)))
    else:
        main_table(int(args[1]) if len(args) > 1 else 20, rerun=args[0] == "table")
