"""DQN's train(), part by part, on RLlib's classes or on ours.

    python benchmarks/dqn_parts.py rllib|ours [ITERATIONS] [WARMUP]

CartPole, 8 envs, rollout_fragment_length 4, prioritized episode replay,
3-step, train batch 256, torch on one thread, seed 0 (and the buffer's
generator seeded). Each part of train() is timed by a wrapper around its
call (no profiler: it would distort the Python-heavy parts): the replay
buffer's sample / get_metrics / update_priorities / add, the learner
group's update, the env runner's sample and the weights' sync; and the
garbage collector's full collections, with the part each landed in.
Prints one JSON line: the seconds of each part over the timed iterations,
the total of train(), the collections, and the curve (each iteration's
mean return and loss), which both stacks must share. Run in a fresh
process per stack: one process cannot mix the two kinds of episodes.
benchmarks/test_dqn_train.py runs the same as a pytest-benchmark.
"""
from __future__ import annotations

import json
import logging
import sys
import time

from train_parts import Parts


def build():
    """The DQN algorithm, on whichever classes are installed."""
    logging.disable(logging.WARNING)
    import numpy as np
    import torch
    from ray.rllib.algorithms.dqn import DQNConfig

    torch.set_num_threads(1)
    config = (DQNConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=8,
                           rollout_fragment_length=4)
              .training(n_step=3, num_steps_sampled_before_learning_starts=1000,
                        train_batch_size_per_learner=256,
                        replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer",
                                              "capacity": 50000, "alpha": 0.6,
                                              "beta": 0.4})
              .reporting(min_sample_timesteps_per_iteration=1000)
              .debugging(seed=0))
    algo = config.build_algo()
    # RLlib's episode replay buffers draw from an unseeded generator.
    algo.local_replay_buffer.rng = np.random.default_rng(0)
    return algo


class Breakdown(Parts):
    """The parts of `algo`'s train() (train_parts.Parts): the replay
    buffer's calls, the learner group's update, the env runner's sample,
    the weights' sync."""

    REPLAY = ("sample", "get_metrics", "update_priorities", "add")

    def __init__(self, algo):
        super().__init__()
        buffer = algo.local_replay_buffer
        for name in self.REPLAY:
            self.wrap(buffer, name, "replay." + name)
        self.wrap(algo.learner_group, "update", "learner_group.update")
        self.wrap(algo.env_runner, "sample", "env_runner.sample")
        self.wrap(algo.env_runner_group, "sync_weights", "sync_weights")

    def report(self, total: float) -> dict:
        replay = sum(v for k, v in self.seconds.items() if k.startswith("replay."))
        out = super().report()
        return {"total": total, "parts": out["parts"], "calls": out["calls"],
                "replay": replay, "replay_share": replay / total,
                "full_collections": out["full_collections"],
                "full_collection_seconds": out["full_collection_seconds"]}


def curve_point(result: dict) -> list:
    """An iteration's mean return and loss."""
    return [result["env_runners"].get("episode_return_mean"),
            result["learners"]["default_policy"].get("total_loss")]


def main(classes: str, iterations: int, warmup: int) -> dict:
    if classes == "ours":
        import episode.rllib

        episode.rllib.install()
    algo = build()
    breakdown = Breakdown(algo)
    for _ in range(warmup):
        algo.train()
    breakdown.reset()
    curve = []
    start = time.perf_counter()
    for _ in range(iterations):
        curve.append(curve_point(algo.train()))
    out = breakdown.report(time.perf_counter() - start)
    breakdown.close()
    algo.stop()
    return {"classes": classes, **out, "curve": curve}


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(main(args[0], int(args[1]) if len(args) > 1 else 8,
                          int(args[2]) if len(args) > 2 else 2)))
