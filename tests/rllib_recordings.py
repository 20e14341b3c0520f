"""Recordings made by RLlib 2.60's own recorder, in a process that never
imports the project.

    python tests/rllib_recordings.py OUT NAME [NAME ...]

Records each named setting (see SETTINGS) with RLlib's
OfflineSingleAgentEnvRunner into OUT/NAME and pickles into OUT/NAME.truth
what its sample() calls returned: per chunk its id, start, flags and its
steps' observations, actions, rewards and extra model outputs (the
recording's ground truth; the test that runs this reads it back).
"""
from __future__ import annotations

import logging
import pickle
import sys

import gymnasium as gym
import numpy as np


class Nested(gym.Env):
    """Dict or Tuple observations, Box actions, an info per step."""

    def __init__(self, config=None):
        kind = (config or {}).get("kind", "dict")
        box = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.observation_space = (gym.spaces.Dict({"pos": box, "n": gym.spaces.Discrete(5)})
                                  if kind == "dict" else gym.spaces.Tuple((box, gym.spaces.Discrete(5))))
        self.action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        self.observation_space.seed(seed)
        return self.observation_space.sample(), {"start": 1}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), float(action[0]), self.t >= 7, False, {"t": self.t}


def _outputs_module():
    # A module for any spaces that acts at random and gives an array output.
    import torch
    import tree
    from ray.rllib.core.rl_module.torch import TorchRLModule

    class Outputs(TorchRLModule):
        def _forward(self, batch, **kwargs):
            n = len(tree.flatten(batch["obs"])[0])
            return {"actions": torch.rand(n, 2) * 2 - 1, "logits": torch.rand(n, 3)}

    return Outputs


# name: (env, recorder options, sample() calls of that many timesteps)
SETTINGS = {
    "rows": ("CartPole-v1", {"output_write_episodes": False}, [40, 40, 40]),
    "episodes": ("CartPole-v1", {}, [40, 40, 40]),
    "rows_unpacked": ("CartPole-v1", {"output_write_episodes": False,
                                      "output_compress_columns": []}, [30, 30]),
    "rows_max": ("CartPole-v1", {"output_write_episodes": False, "output_max_rows_per_file": 25,
                                 "output_write_remaining_data": True}, [40, 40, 40]),
    "rows_max_no_rest": ("CartPole-v1", {"output_write_episodes": False,
                                         "output_max_rows_per_file": 25}, [40, 40]),
    "episodes_max": ("CartPole-v1", {"output_max_rows_per_file": 2,
                                     "output_write_remaining_data": True}, [40, 40]),
    "dict": ("dict", {"output_write_episodes": False,
                      "output_compress_columns": ["obs", "actions", "logits"]}, [12, 12]),
    "tuple": ("tuple", {"output_write_episodes": False}, [12, 12]),
    "dict_episodes": ("dict", {}, [12, 12]),
}


def _chunk(episode):
    n = len(episode)
    return {"id": episode.id_, "t_started": episode.t_started, "len": n,
            "terminated": bool(episode.is_terminated), "truncated": bool(episode.is_truncated),
            "obs": [episode.get_observations(i) for i in range(n + 1)],
            "actions": [episode.get_actions(i) for i in range(n)],
            "rewards": [episode.get_rewards(i) for i in range(n)],
            "extras": {k: [episode.get_extra_model_outputs(k, i) for i in range(n)]
                       for k in episode.extra_model_outputs}}


def record(out: str, name: str) -> None:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.offline.offline_env_runner import OfflineSingleAgentEnvRunner

    env, options, calls = SETTINGS[name]
    config = PPOConfig()
    if env in ("dict", "tuple"):
        config = (config.environment(Nested, env_config={"kind": env})
                  .rl_module(rl_module_spec=RLModuleSpec(module_class=_outputs_module())))
    else:
        config = config.environment(env)
    config = (config.env_runners(num_env_runners=0)
              .offline_data(output=f"{out}/{name}", **options).debugging(seed=0))
    runner = OfflineSingleAgentEnvRunner(config=config)
    chunks = []
    for steps in calls:
        chunks += [_chunk(e) for e in runner.sample(num_timesteps=steps)]
    runner.stop()
    with open(f"{out}/{name}.truth", "wb") as f:
        pickle.dump(chunks, f)


if __name__ == "__main__":
    logging.disable(logging.WARNING)
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR)
    for setting in sys.argv[2:]:
        record(sys.argv[1], setting)
    ray.shutdown()
    assert "episode" not in sys.modules
