"""Short RLlib training runs, on RLlib's episode classes or on ours.

    python tests/rllib_runs.py ALGO CLASSES ITERATIONS

ALGO is ppo, ppo_remote, dqn or ppo_multi_agent; CLASSES is rllib, ours (installed
with episode.rllib.install() before anything else) or runner (ours, and the
env runners of episode.rllib.runners). Prints one JSON line:
each iteration's mean episode return and total loss, and the classes of the
episodes the learners were given. Run in a fresh process per run: one
process cannot mix the two kinds of episodes.
"""
from __future__ import annotations

import json
import logging
import sys


def config(algo: str):
    if algo == "ppo":
        from ray.rllib.algorithms.ppo import PPOConfig

        return (PPOConfig().environment("CartPole-v1")
                .env_runners(num_env_runners=0, num_envs_per_env_runner=8)
                .training(train_batch_size_per_learner=1000, minibatch_size=250, num_epochs=2,
                          use_gae=True))
    if algo == "ppo_remote":
        # Sampling in a Ray actor: the episodes cross the object store.
        # No sample timeout: on a loaded machine the actor may take over RLlib's
        # 60 s to start, and train() would then return without learning.
        return config("ppo").env_runners(num_env_runners=1, num_envs_per_env_runner=2,
                                         sample_timeout_s=None)
    if algo == "dqn":
        from ray.rllib.algorithms.dqn import DQNConfig

        return (DQNConfig().environment("CartPole-v1")
                .env_runners(num_env_runners=0, num_envs_per_env_runner=1,
                             rollout_fragment_length=50)
                .training(n_step=3, num_steps_sampled_before_learning_starts=200,
                          train_batch_size_per_learner=32,
                          replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer",
                                                "capacity": 10000, "alpha": 0.6,
                                                "beta": 0.4}))
    if algo == "ppo_multi_agent":
        from ray.rllib.algorithms.ppo import PPOConfig
        from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

        return (PPOConfig().environment(MultiAgentCartPole, env_config={"num_agents": 2})
                .env_runners(num_env_runners=0)
                .multi_agent(policies={"p0", "p1"},
                             policy_mapping_fn=lambda aid, *a, **k: f"p{aid}")
                .training(train_batch_size_per_learner=600, minibatch_size=200, num_epochs=2))
    raise ValueError(f"unknown algo {algo!r}")


def main(algo: str, classes: str, iterations: int) -> dict:
    logging.disable(logging.WARNING)
    if classes in ("ours", "runner"):
        import episode.rllib

        episode.rllib.install()
    from ray.rllib.core.learner.learner_group import LearnerGroup

    seen: set = set()
    update = LearnerGroup.update

    def recording_update(self, *args, **kwargs):
        for e in kwargs.get("episodes") or ():
            seen.add(f"{type(e).__module__}.{type(e).__name__}")
            for agent_episode in getattr(e, "agent_episodes", {}).values():
                seen.add(f"{type(agent_episode).__module__}.{type(agent_episode).__name__}")
        return update(self, *args, **kwargs)

    LearnerGroup.update = recording_update
    config_ = config(algo).debugging(seed=0)
    if classes == "runner":
        from episode.rllib.runners import MultiAgentEnvRunner, SingleAgentEnvRunner

        config_ = config_.env_runners(env_runner_cls=MultiAgentEnvRunner
                                      if algo == "ppo_multi_agent" else SingleAgentEnvRunner)
    algo_ = config_.build_algo()
    # Whether the env runners that sample (the remote ones, if any) take our loop.
    if config_.num_env_runners:
        flags = algo_.env_runner_group.foreach_env_runner(
            lambda runner: getattr(runner, "vectorized", None), local_env_runner=False)
        vectorized = flags[0] if len(set(flags)) == 1 else flags
    else:
        vectorized = getattr(algo_.env_runner, "vectorized", None)
    buffer = getattr(algo_, "local_replay_buffer", None)
    if buffer is not None:
        # RLlib's episode replay buffers draw from an unseeded generator.
        import numpy as np

        buffer.rng = np.random.default_rng(0)
    curve = []
    for _ in range(iterations):
        result = algo_.train()
        losses = {mid: r.get("total_loss") for mid, r in result["learners"].items()
                  if isinstance(r, dict) and "total_loss" in r}
        curve.append([result["env_runners"].get("episode_return_mean"), losses])
    algo_.stop()
    if algo == "ppo_remote":
        import ray

        ray.shutdown()
    return {"curve": curve, "learner_episodes": sorted(seen), "vectorized": vectorized}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
