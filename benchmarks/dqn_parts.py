"""DQN's train(), part by part, on RLlib's classes or on ours.

    python benchmarks/dqn_parts.py rllib|ours [ITERATIONS] [WARMUP]

CartPole, 8 envs, rollout_fragment_length 4, prioritized episode replay,
3-step, train batch 256, torch on one thread, seed 0 (and the buffer's
generator seeded). Each part of train() is timed by a wrapper around its
call (no profiler: it would distort the Python-heavy parts): the replay
buffer's sample / get_metrics / update_priorities / add, the learner
group's update, the env runner's sample and the weights' sync. Prints one
JSON line: the seconds of each part over the timed iterations, the total
of train(), the garbage collections during them, and the curve (each
iteration's mean return and loss), which both stacks must share. Run in a
fresh process per stack: one process cannot mix the two kinds of episodes.
"""
from __future__ import annotations

import gc
import json
import logging
import sys
import time


def build(classes: str):
    logging.disable(logging.WARNING)
    if classes == "ours":
        import episode.rllib

        episode.rllib.install()
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
    import numpy as np

    # RLlib's episode replay buffers draw from an unseeded generator.
    algo.local_replay_buffer.rng = np.random.default_rng(0)
    return algo


# The part of train() running now (where a garbage collection lands).
CURRENT = [None]


def _timed(obj, name: str, parts: dict, calls: dict, part: str) -> None:
    call = getattr(obj, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        outer, CURRENT[0] = CURRENT[0], part
        try:
            return call(*args, **kwargs)
        finally:
            CURRENT[0] = outer
            parts[part] = parts.get(part, 0.0) + time.perf_counter() - start
            calls[part] = calls.get(part, 0) + 1

    setattr(obj, name, timed)


def main(classes: str, iterations: int, warmup: int) -> dict:
    algo = build(classes)
    parts: dict = {}
    calls: dict = {}
    buffer = algo.local_replay_buffer
    for name in ("sample", "get_metrics", "update_priorities", "add"):
        _timed(buffer, name, parts, calls, "replay." + name)
    _timed(algo.learner_group, "update", parts, calls, "learner_group.update")
    _timed(algo.env_runner, "sample", parts, calls, "env_runner.sample")
    _timed(algo.env_runner_group, "sync_weights", parts, calls, "sync_weights")
    collections = [0, 0.0, 0.0]   # full collections, their seconds, all collections' seconds
    started = [0.0]
    where: dict = {}                # part -> full collections during it

    def count(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
            return
        spent = time.perf_counter() - started[0]
        collections[2] += spent
        if info["generation"] == 2:
            collections[0] += 1
            collections[1] += spent
            where[CURRENT[0]] = where.get(CURRENT[0], 0) + 1

    curve = []
    for _ in range(warmup):
        algo.train()
    parts.clear()
    calls.clear()
    gc.callbacks.append(count)
    start = time.perf_counter()
    for _ in range(iterations):
        result = algo.train()
        learner = result["learners"]["default_policy"]
        curve.append([result["env_runners"].get("episode_return_mean"),
                      learner.get("total_loss")])
    total = time.perf_counter() - start
    gc.callbacks.remove(count)
    algo.stop()
    parts["replay"] = sum(v for k, v in parts.items() if k.startswith("replay."))
    return {"classes": classes, "total": total, "parts": parts, "calls": calls,
            "full_collections": collections[0], "full_collection_seconds": collections[1],
            "full_collections_in": where,
            "collection_seconds": collections[2], "curve": curve}


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(main(args[0], int(args[1]) if len(args) > 1 else 8,
                          int(args[2]) if len(args) > 2 else 2)))
