"""What an env runner's sample() calls give, as digests.

    python tests/runner_samples.py RUNNER ENV [ENV ...]

RUNNER is rllib (RLlib's SingleAgentEnvRunner on RLlib's classes) or ours
(episode.rllib.runners.SingleAgentEnvRunner); ENV is cartpole (8 envs,
Discrete actions), pendulum (4 envs, Box actions unsquashed), infos (4 envs of
an env whose infos are not empty), lists (CartPole, episodes handed on
before to_numpy()) or callbacks (CartPole with an episode callback: RLlib's
loop). Prints one JSON line, by ENV: for each call, a
digest of its episodes (every column's dtype, shape and bytes, lengths, t,
done flags), then the runner's metrics and whether it took the vector loop.
Run in a fresh process per RUNNER: one process cannot mix the two kinds of
episodes (each runner seeds torch, numpy and random anew when it is made).
"""
from __future__ import annotations

import hashlib
import json
import logging
import sys

import gymnasium as gym
import numpy as np


class InfosCartPole(gym.Wrapper):
    """CartPole whose infos tell the step and a random draw of the env."""

    def __init__(self, config=None):
        super().__init__(gym.make("CartPole-v1"))
        self.steps = 0

    def reset(self, **kwargs):
        obs, infos = self.env.reset(**kwargs)
        self.steps = 0
        return obs, {**infos, "reset": True}

    def step(self, action):
        obs, reward, terminated, truncated, infos = self.env.step(action)
        self.steps += 1
        return obs, reward, terminated, truncated, {**infos, "steps": self.steps,
                                                    "x": float(obs[0])}


MULTI_AGENT = ("multi", "turns", "multi_pendulum")


def config(env: str):
    from ray.rllib.algorithms.ppo import PPOConfig

    cfg = PPOConfig().debugging(seed=3)
    if env == "turns":
        # Turn-based: one player acts per step, the other waits.
        from ray.rllib.examples.envs.classes.multi_agent.tic_tac_toe import TicTacToe

        return (cfg.environment(TicTacToe)
                .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=20)
                .multi_agent(policies={"p1", "p2"},
                             policy_mapping_fn=lambda aid, *a, **k: "p1" if aid == "player1"
                             else "p2"))
    if env == "multi_pendulum":
        from ray.rllib.examples.envs.classes.multi_agent import MultiAgentPendulum

        return (cfg.environment(MultiAgentPendulum, env_config={"num_agents": 2})
                .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=20)
                .multi_agent(policies={"p0"}, policy_mapping_fn=lambda aid, *a, **k: "p0"))
    if env == "multi":
        from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

        return (cfg.environment(MultiAgentCartPole, env_config={"num_agents": 3})
                .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=30)
                .multi_agent(policies={"p0", "p1"},
                             policy_mapping_fn=lambda aid, *a, **k: f"p{aid % 2}"))
    if env == "pendulum":
        return cfg.environment("Pendulum-v1").env_runners(
            num_envs_per_env_runner=4, rollout_fragment_length=30)
    if env == "infos":
        return cfg.environment(InfosCartPole).env_runners(
            num_envs_per_env_runner=4, rollout_fragment_length=30)
    cfg = cfg.environment("CartPole-v1").env_runners(num_envs_per_env_runner=8,
                                                     rollout_fragment_length=40)
    if env == "lists":
        cfg = cfg.env_runners(episodes_to_numpy=False)
    if env == "callbacks":
        from ray.rllib.callbacks.callbacks import RLlibCallback

        class Marks(RLlibCallback):
            def on_episode_step(self, *, episode, **kwargs):
                episode.custom_data["steps"] = episode.custom_data.get("steps", 0) + 1

        cfg = cfg.callbacks(Marks)
    return cfg


def digest(episodes: list) -> str:
    if episodes and hasattr(episodes[0], "agent_episodes"):
        # Multi-agent: each agent's episode, and the env-step mapping.
        h = hashlib.sha256()
        for e in episodes:
            h.update(repr((e.env_t_started, e.env_t, e.is_terminated, e.is_truncated,
                           list(e.agent_episodes), {a: list(m.data) if hasattr(m, "data") else m
                                                    for a, m in e.env_t_to_agent_t.items()},
                           e.is_numpy if e.agent_episodes else None)).encode())
            h.update(digest(list(e.agent_episodes.values())).encode())
        return h.hexdigest()
    h = hashlib.sha256()
    # Sub-envs in a fixed order: by start and first observation.
    for e in sorted(episodes, key=lambda e: (e.t_started, np.asarray(e.get_observations(0)).tobytes())):
        parts = [e.get_observations(), e.get_actions(), e.get_rewards()]
        parts += [e.get_extra_model_outputs(k) for k in sorted(e.extra_model_outputs)]
        for part in parts:
            a = np.asarray(part)
            h.update(f"{a.dtype} {a.shape}".encode())
            h.update(a.tobytes())
        h.update(repr(e.get_infos()).encode())
        # The kinds of the items (lists before to_numpy).
        last = [e.get_observations(-1), e.get_actions(-1), e.get_rewards(-1)]
        last += [e.get_extra_model_outputs(k, -1) for k in sorted(e.extra_model_outputs)]
        h.update(repr([(type(x).__name__, getattr(x, "dtype", None)) for x in last]).encode())
        h.update(repr((e.t_started, e.t, e.is_terminated, e.is_truncated, len(e),
                       sorted(e.extra_model_outputs), type(e.get_actions()).__name__,
                       e.is_numpy)).encode())
    return h.hexdigest()


def _value(metric):
    # A reduced metric as a number (per agent or module: a dict of them).
    if isinstance(metric, dict):
        return {str(k): _value(v) for k, v in sorted(metric.items(), key=str)}
    return float(getattr(metric, "peek", lambda: metric)())


def main(runner: str, env: str) -> dict:
    logging.disable(logging.WARNING)
    if runner == "ours":
        from episode.rllib.runners import MultiAgentEnvRunner, SingleAgentEnvRunner
    else:
        from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
        from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
    cls = MultiAgentEnvRunner if env in MULTI_AGENT else SingleAgentEnvRunner
    r = cls(config=config(env))
    calls = []
    for _ in range(4):
        calls.append(digest(r.sample()))
    # (In new episodes: a Box space's deterministic logp has another shape.)
    calls.append(digest(r.sample(explore=False, force_reset=True)))
    calls.append(digest(r.sample(num_episodes=3)))
    calls.append(digest(r.sample(force_reset=True)))
    calls.append(digest(r.sample(num_timesteps=17)))
    calls.append(digest(r.sample(num_timesteps=25, force_reset=True)))
    metrics = r.get_metrics()
    picked = {k: _value(metrics[k]) for k in (
        "num_env_steps_sampled", "num_episodes", "episode_return_mean", "episode_len_mean",
        "num_env_steps_sampled_lifetime", "num_episodes_lifetime", "num_agent_steps_sampled",
        "num_agent_steps_sampled_lifetime", "num_module_steps_sampled",
        "num_module_steps_sampled_lifetime") if k in metrics}
    # Random actions are drawn from the unseeded vector action space: only
    # their count and kinds can be compared (in new episodes: RLlib's own
    # episodes refuse a mix of steps with and without the module's outputs).
    random_eps = r.sample(random_actions=True, force_reset=True)
    if random_eps and hasattr(random_eps[0], "agent_episodes"):
        random_eps = [a for e in random_eps for a in e.agent_episodes.values()]
    random_shape = sorted((sorted(e.extra_model_outputs), str(np.asarray(e.get_actions()).dtype))
                          for e in random_eps)
    return {"calls": calls, "metrics": picked, "random": random_shape[:1],
            "random_steps": sum(len(e) for e in random_eps),
            "vectorized": getattr(r, "vectorized", None)}


if __name__ == "__main__":
    print(json.dumps({env: main(sys.argv[1], env) for env in sys.argv[2:]}))
