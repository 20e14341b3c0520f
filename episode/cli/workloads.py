"""The benchmark workloads, defined once for `episode bench` and benchmarks/.

Each workload times one thing a sampler or a learner does with an episode.
``prepare(cls)`` builds the inputs for one SingleAgentEpisode class (ours or
RLlib's) outside the timed code and returns a Round: ``run(*setup())`` is one
round, where ``setup`` (None when not needed) makes the fresh inputs a round
consumes, such as a reset episode to append to.

Inputs come from seeded numpy generators and are the same for both classes.
Episodes are CartPole-sized unless said otherwise: float32 (4,) observations
in [-1, 1], Python int actions in {0, 1}, Python float rewards, one extra
model output ``vf`` (0.5) and no infos (each step stores an empty dict).
Atari-sized observations are distinct uint8 (84, 84, 4) frames. Dict
observations are ``{"img": uint8 (8, 8, 3), "vec": float32 (5,) in [-1, 1]}``
(the space of ``_dict_space``), with CartPole's actions and rewards.
Blackjack-sized episodes have tuples of three Python ints as observations, as
gymnasium's Blackjack-v1 hands them out, and end terminated after 1 to 3 steps.

Multi-agent workloads (names starting ``ma_``) take the MultiAgentEpisode of
the same implementation as the class they are given. Their agents ``a0``,
``a1``, ... each get CartPole-sized data (distinct observation arrays per agent
and step). Simultaneous episodes: every agent observes, acts and is rewarded
at every env step. Turn-based episodes: two agents take turns; the one that
acts receives no observation until its next turn (its action hangs), and both
are rewarded at every step.
"""
from __future__ import annotations

import functools
import gc
import importlib.metadata
import logging
import pickle
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

__all__ = [
    "WORKLOADS",
    "held_input_bytes",
    "Round",
    "Workload",
    "assert_same",
    "check",
    "ray_version",
    "rllib_class",
]

N_STEPS = 10_000   # steps of the "10k" episodes
N_COLLECT = 1_000  # steps per collect / append round
N_APPEND = 4_000   # steps per round of the action_logp appends
N_CUT = 10         # steps of the episode the short cut() cuts
N_MA = 1_000       # env steps of the multi-agent episodes
N_VEC_ENVS = 64    # sub-envs of the vector env workload
N_VEC_STEPS = 100  # its vector steps
VF = 0.5


class Round(NamedTuple):
    """One prepared workload: ``run(*setup())`` does one round."""
    run: Callable[..., Any]
    setup: Callable[[], tuple] | None = None

    def once(self) -> Any:
        """One round, setup included; returns what the round made."""
        return self.run(*(self.setup() if self.setup else ()))


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    items: int                      # calls one round makes, for per-item times
    prepare: Callable[[type], Round]


# -- inputs -------------------------------------------------------------------

class _Steps(NamedTuple):
    obs: list
    actions: list
    rewards: list


@functools.cache
def _cartpole() -> _Steps:
    """Observations, actions and rewards for N_STEPS + N_COLLECT steps."""
    n = N_STEPS + N_COLLECT
    block = np.random.default_rng(0).uniform(-1.0, 1.0, size=(n + 1, 4)).astype(np.float32)
    # Separate owned arrays, as an env hands them out (not views of one block).
    obs = [row.copy() for row in block]
    actions = np.random.default_rng(1).integers(0, 2, size=n).tolist()
    rewards = np.random.default_rng(2).uniform(-1.0, 1.0, size=n).tolist()
    return _Steps(obs, actions, rewards)


@functools.cache
def _atari_obs() -> list:
    """N_COLLECT + 1 distinct uint8 (84, 84, 4) observations."""
    rng = np.random.default_rng(3)
    return [rng.integers(0, 256, size=(84, 84, 4), dtype=np.uint8)
            for _ in range(N_COLLECT + 1)]


@functools.cache
def _dict_obs() -> list:
    """N_COLLECT + 1 distinct Dict observations (separate arrays per step)."""
    rng = np.random.default_rng(4)
    return [{"img": rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8),
             "vec": rng.uniform(-1.0, 1.0, size=5).astype(np.float32)}
            for _ in range(N_COLLECT + 1)]


def _dict_space() -> gym.spaces.Dict:
    return gym.spaces.Dict({"img": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8),
                            "vec": gym.spaces.Box(-1.0, 1.0, (5,), np.float32)})


@functools.cache
def _blackjack() -> tuple[_Steps, ...]:
    """Three Blackjack-v1-like episodes, of 1, 2 and 3 steps.

    Observations are (player sum, dealer card, usable ace) tuples of Python
    ints, actions Python ints in {0, 1}, rewards Python floats: 0.0 on the
    way, -1.0 or 1.0 on the last (terminating) step.
    """
    rng = np.random.default_rng(6)
    episodes = []
    for n in (1, 2, 3):
        obs = [(int(rng.integers(4, 32)), int(rng.integers(1, 11)), int(rng.integers(0, 2)))
               for _ in range(n + 1)]
        actions = rng.integers(0, 2, size=n).tolist()
        rewards = [0.0] * (n - 1) + [float(rng.choice([-1.0, 1.0]))]
        episodes.append(_Steps(obs, actions, rewards))
    return tuple(episodes)


@functools.cache
def _logp() -> list:
    """N_APPEND + 1 np.float32 action log-probabilities, as a policy hands them out."""
    return list(np.random.default_rng(5).uniform(-2.0, 0.0, size=N_APPEND + 1)
                .astype(np.float32))


def _spaces() -> dict:
    return {"observation_space": gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
            "action_space": gym.spaces.Discrete(2)}


def _steps(episode, obs: list, start: int = 0, n: int = N_COLLECT):
    """n add_env_step calls: step i adds obs[i + 1] and the i-th action and reward."""
    _, actions, rewards = _cartpole()
    step = episode.add_env_step
    for i in range(start, start + n):
        step(obs[i + 1], actions[i], rewards[i], None, terminated=False,
             truncated=False, extra_model_outputs={"vf": VF})
    return episode


def _episode(cls: type, n: int, obs: list, **kwargs):
    """A reset list-mode episode with n steps."""
    episode = cls(**kwargs)
    episode.add_env_reset(obs[0])
    return _steps(episode, obs, n=n)


def _cartpole_10k(cls: type, numpy: bool = True):
    """A 10k-step CartPole episode with its spaces set (to_numpy()'d by default)."""
    episode = _episode(cls, N_STEPS, _cartpole().obs, **_spaces())
    return episode.to_numpy() if numpy else episode


def _dict_1000(cls: type):
    """A numpy'ized N_COLLECT-step episode of Dict observations, its observation space set."""
    return _episode(cls, N_COLLECT, _dict_obs(), observation_space=_dict_space()).to_numpy()


def _multi_class(cls: type) -> type:
    """The MultiAgentEpisode of the implementation `cls` (a SingleAgentEpisode) is from."""
    if cls.__module__.startswith("ray."):
        from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
    else:
        from episode import MultiAgentEpisode
    return MultiAgentEpisode


@functools.cache
def _ma_steps(n_agents: int, n: int = N_MA) -> list:
    """n + 1 env steps of `n_agents` simultaneous agents: one
    (observations, actions, rewards) triple of agent dicts per step (the
    first one's observations are the reset's)."""
    rng = np.random.default_rng(7 + n_agents)
    ids = [f"a{i}" for i in range(n_agents)]
    steps = []
    for _ in range(n + 1):
        steps.append((
            {a: rng.uniform(-1.0, 1.0, size=4).astype(np.float32) for a in ids},
            {a: int(rng.integers(0, 2)) for a in ids},
            {a: float(rng.uniform(-1.0, 1.0)) for a in ids},
        ))
    return steps


@functools.cache
def _ma_turns() -> list:
    """N_MA + 1 env steps of two agents taking turns: at step t the agent
    a(t % 2) acts and the other one observes; both are rewarded."""
    rng = np.random.default_rng(20)
    steps = [({"a0": rng.uniform(-1.0, 1.0, size=4).astype(np.float32)}, {}, {})]
    for t in range(N_MA):
        actor, other = ("a0", "a1") if t % 2 == 0 else ("a1", "a0")
        steps.append((
            {other: rng.uniform(-1.0, 1.0, size=4).astype(np.float32)},
            {actor: int(rng.integers(0, 2))},
            {"a0": float(rng.uniform(-1.0, 1.0)), "a1": float(rng.uniform(-1.0, 1.0))},
        ))
    return steps


def _ma_run(episode, steps: list, n: int = N_MA):
    step = episode.add_env_step
    for obs, actions, rewards in steps[1:n + 1]:
        step(obs, actions, rewards)
    return episode


def _ma_episode(cls: type, steps: list, n: int = N_MA):
    """A reset list-mode multi-agent episode with n env steps of `steps`."""
    episode = _multi_class(cls)()
    episode.add_env_reset(observations=steps[0][0])
    return _ma_run(episode, steps, n)


def _ma_add_env_step(steps_of: Callable[[], list]) -> Callable[[type], Round]:
    def prepare(cls: type) -> Round:
        steps = steps_of()

        def setup():
            episode = _multi_class(cls)()
            episode.add_env_reset(observations=steps[0][0])
            return (episode,)

        return Round(lambda episode: _ma_run(episode, steps), setup)
    return prepare


def _ma_get_observations_last(cls: type) -> Round:
    return Round(functools.partial(_ma_episode(cls, _ma_steps(2)).get_observations, -1))


def _ma_get_actions_filled(cls: type) -> Round:
    episode = _ma_episode(cls, _ma_turns())
    return Round(lambda: episode.get_actions(slice(-4, None), env_steps=True, fill=0))


def _ma_cut(cls: type) -> Round:
    return Round(_ma_episode(cls, _ma_steps(2)).cut)


def _ma_to_numpy(cls: type) -> Round:
    steps = _ma_steps(2)
    return Round(lambda episode: episode.to_numpy(),
                 lambda: (_ma_episode(cls, steps),))


def _ma_pickle_roundtrip(numpy: bool, n: int = N_MA) -> Callable[[type], Round]:
    def prepare(cls: type) -> Round:
        episode = _ma_episode(cls, _ma_steps(2, n), n)
        if numpy:
            episode.to_numpy()
        return Round(lambda: pickle.loads(pickle.dumps(episode, protocol=5)))
    return prepare


@functools.cache
def _vector_steps() -> tuple:
    """N_VEC_STEPS + 1 batches of N_VEC_ENVS CartPole-sized sub-env steps, as
    a NextStep-autoreset vector env hands them out: observations (the first
    batch is the reset's), actions, rewards and terminateds; each sub-env's
    episodes end after 20 to 60 steps, and the step after an end is the
    sub-env's reset."""
    rng = np.random.default_rng(30)
    n, steps = N_VEC_ENVS, N_VEC_STEPS
    obs = rng.uniform(-1.0, 1.0, size=(steps + 1, n, 4)).astype(np.float32)
    actions = rng.integers(0, 2, size=(steps, n))
    rewards = np.ones((steps, n))
    terminateds = np.zeros((steps, n), dtype=bool)
    for k in range(n):
        t = int(rng.integers(20, 60))
        while t < steps:
            terminateds[t, k] = True
            t += 1 + int(rng.integers(20, 60))     # the next step is the reset
    return obs, actions, rewards, terminateds


def _vector_append(cls: type) -> Round:
    # One array per step, as an env hands them out (no indexing in the loop).
    obs, actions, rewards, terminateds = map(list, _vector_steps())
    truncateds = list(np.zeros_like(terminateds))
    if cls.__module__.startswith("ray."):
        def run():
            # RLlib's SingleAgentEnvRunner: add_env_step per sub-env, a new
            # episode at each NextStep reset.
            episodes = [cls() for _ in range(N_VEC_ENVS)]
            for k, episode in enumerate(episodes):
                episode.add_env_reset(obs[0][k])
            done, resetting = [], [False] * N_VEC_ENVS
            for t in range(N_VEC_STEPS):
                for k in range(N_VEC_ENVS):
                    if resetting[k]:
                        episodes[k] = cls()
                        episodes[k].add_env_reset(obs[t + 1][k])
                        resetting[k] = False
                        continue
                    episodes[k].add_env_step(obs[t + 1][k], actions[t][k], rewards[t][k],
                                             terminated=terminateds[t][k],
                                             truncated=truncateds[t][k])
                    if terminateds[t][k]:
                        done.append(episodes[k])
                        resetting[k] = True
            return done + [e for e, r in zip(episodes, resetting) if not r]
    else:
        from episode.sampling import VectorEpisodes

        def run():
            vec = VectorEpisodes(N_VEC_ENVS)
            vec.add_reset(obs[0])
            done = []
            for t in range(N_VEC_STEPS):
                done += vec.add_step(obs[t + 1], actions[t], rewards[t], terminateds[t],
                                     truncateds[t])
            return done + [e for e, r in zip(vec.episodes, vec._resetting) if not r]
    return Round(run)


def _vector_append_running(cls: type) -> Round:
    """The appends alone: 100 steps into 64 running episodes (made in the
    setup), no episode ending, the episodes read at the end."""
    obs, actions, rewards, _ = map(list, _vector_steps())
    flags = np.zeros(N_VEC_ENVS, dtype=bool)
    if cls.__module__.startswith("ray."):
        def setup():
            episodes = [cls() for _ in range(N_VEC_ENVS)]
            for k, episode in enumerate(episodes):
                episode.add_env_reset(obs[0][k])
            return (episodes,)

        def run(episodes):
            for t in range(N_VEC_STEPS):
                for k in range(N_VEC_ENVS):
                    episodes[k].add_env_step(obs[t + 1][k], actions[t][k], rewards[t][k],
                                             terminated=flags[k], truncated=flags[k])
            return episodes
        return Round(run, setup)
    from episode.sampling import VectorEpisodes

    def setup():
        vec = VectorEpisodes(N_VEC_ENVS)
        vec.add_reset(obs[0])
        return (vec,)

    def run(vec):
        for t in range(N_VEC_STEPS):
            vec.add_step(obs[t + 1], actions[t], rewards[t], flags, flags)
        return vec.episodes
    return Round(run, setup)


# -- views, collector and sampler (names starting views_, collector_, sampler_) --
#
# These take the implementation of the class they are given: ours, or RLlib's
# AgentCollector / SingleAgentEnvRunner when given RLlib's episode class.

N_INFER = 64       # ongoing episodes of the inference input
N_FRAGMENT = 100   # steps of a training-mode collector's fragment
N_SAMPLE = 100     # rollout_fragment_length of the sampler workload


def _is_rllib(cls: type) -> bool:
    return cls.__module__.startswith("ray.")


def _training_views(view_requirement: type) -> dict:
    box = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    train_only = {"used_for_compute_actions": False}
    return {
        "obs": view_requirement(space=box),
        "new_obs": view_requirement("obs", shift=1, space=box, **train_only),
        "actions": view_requirement(space=gym.spaces.Discrete(2), **train_only),
        "rewards": view_requirement(**train_only),
        "prev_actions": view_requirement("actions", shift=-1, space=gym.spaces.Discrete(2)),
        "prev_rewards": view_requirement("rewards", shift=-1),
        "frames": view_requirement("obs", shift="-3:0", space=box),
    }


def _view_requirement(cls: type) -> type:
    if _is_rllib(cls):
        from ray.rllib.policy.view_requirement import ViewRequirement
    else:
        from episode.views import ViewRequirement
    return ViewRequirement


def _collector(cls: type, views: dict, n: int, done: bool = True) -> Any:
    """A collector (RLlib's or ours) holding an n-step trajectory, terminated
    at its last step if `done`."""
    if _is_rllib(cls):
        from ray.rllib.evaluation.collectors.agent_collector import AgentCollector
    else:
        from episode.collector import AgentCollector
    steps = _cartpole()
    collector = AgentCollector(views)
    collector.add_init_obs(episode_id=0, agent_index=0, env_id=0, init_obs=steps.obs[0])
    for i in range(n):
        collector.add_action_reward_next_obs({
            "new_obs": steps.obs[i + 1], "actions": steps.actions[i],
            "rewards": steps.rewards[i], "terminateds": done and i == n - 1,
            "truncateds": False})
    return collector


def _training_batch(batch: Any) -> dict:
    # The columns both sides build (unroll ids count per implementation).
    return {k: v for k, v in batch.items() if k != "unroll_id"}


def _collector_training(cls: type) -> Round:
    views = _training_views(_view_requirement(cls))
    collector = _collector(cls, views, N_COLLECT)
    return Round(lambda: _training_batch(collector.build_for_training(views)))


def _views_training(cls: type) -> Round:
    views = _training_views(_view_requirement(cls))
    if _is_rllib(cls):
        return _collector_training(cls)
    from episode.views import build_training_batch

    episode = cls()
    steps = _cartpole()
    episode.add_env_reset(steps.obs[0])
    _steps(episode, steps.obs, 0, N_COLLECT)
    return Round(lambda: build_training_batch([episode], views))


def _ongoing_collectors(cls: type, is_training: bool) -> list:
    """64 ongoing collectors (RLlib's or ours), collector k 10 + k steps in,
    with the views of a CartPole policy: obs, new_obs, actions, rewards,
    prev_actions, prev_rewards and a 4-frame stack."""
    ViewRequirement = _view_requirement(cls)
    if _is_rllib(cls):
        from ray.rllib.evaluation.collectors.agent_collector import AgentCollector
    else:
        from episode.collector import AgentCollector
    box = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    train_only = {"used_for_compute_actions": False}
    views = {"obs": ViewRequirement(space=box),
             "new_obs": ViewRequirement("obs", shift=1, space=box, **train_only),
             "prev_actions": ViewRequirement("actions", shift=-1, space=gym.spaces.Discrete(2)),
             "prev_rewards": ViewRequirement("rewards", shift=-1),
             "frames": ViewRequirement("obs", shift="-3:0", space=box),
             "actions": ViewRequirement(space=gym.spaces.Discrete(2), **train_only),
             "rewards": ViewRequirement(**train_only)}
    collectors = []
    for k in range(N_INFER):
        collector = AgentCollector(views, is_training=is_training)
        collector.add_init_obs(episode_id=k, agent_index=0, env_id=k,
                               init_obs=_cartpole().obs[0])
        for i in range(10 + k):
            _collector_step(collector, _cartpole(), i, k)
        collectors.append(collector)
    return collectors


def _collector_step(collector: Any, steps: _Steps, i: int, env_id: int) -> None:
    # Step i of the CartPole-sized inputs `steps` (taken again from the start
    # past their end), as RLlib's old-stack sampler (EnvRunnerV2) hands it
    # over: its own keys first, then the action its connectors add.
    i %= len(steps.actions)
    collector.add_action_reward_next_obs({
        "t": i, "env_id": env_id, "agent_index": 0, "rewards": steps.rewards[i],
        "terminateds": False, "truncateds": False, "infos": {},
        "new_obs": steps.obs[i + 1], "actions": steps.actions[i]})


def _collector_inference(cls: type) -> Round:
    # What an old-stack sampler's ViewRequirementAgentConnector does each
    # step: build_for_inference on each of 64 ongoing inference-mode
    # collectors, one at a time.
    collectors = _ongoing_collectors(cls, is_training=False)
    return Round(lambda: [c.build_for_inference() for c in collectors])


def _collector_rhythm(is_training: bool) -> Callable[[type], Round]:
    """The sampler's rhythm, timed whole: in each round every collector takes
    its next step (add_action_reward_next_obs), then builds its inference
    input. Training-mode collectors end a fragment (build_for_training of a
    trajectory that goes on, before a round, not timed) every N_FRAGMENT
    steps, as a sampler does, so that rounds keep reading trajectories of the
    same lengths."""
    def prepare(cls: type) -> Round:
        collectors = _ongoing_collectors(cls, is_training)
        next_step = [10 + k for k in range(N_INFER)]

        def setup():
            if is_training:
                for collector in collectors:
                    if collector.agent_steps >= N_FRAGMENT:
                        collector.build_for_training(collector.view_requirements)
            return ()

        def run():
            # _collector_step's step dicts, made inline: the loop's own cost
            # (a Python call per step) is no part of either collector's.
            batches = []
            steps = _cartpole()
            obs, actions, rewards = steps.obs, steps.actions, steps.rewards
            n = len(actions)
            for k, collector in enumerate(collectors):
                i = next_step[k] % n
                next_step[k] += 1
                collector.add_action_reward_next_obs({
                    "t": i, "env_id": k, "agent_index": 0, "rewards": rewards[i],
                    "terminateds": False, "truncateds": False, "infos": {},
                    "new_obs": obs[i + 1], "actions": actions[i]})
                batches.append(collector.build_for_inference())
            return batches

        return Round(run, setup if is_training else None)
    return prepare


def _inference_views(view_requirement: type) -> dict:
    # Observation views: RLlib's collector reads prev_actions / prev_rewards
    # one step late at inference (docs/differences.md), so they are left out.
    box = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    return {"obs": view_requirement(space=box),
            "prev_obs": view_requirement("obs", shift=-1, space=box),
            "frames": view_requirement("obs", shift="-3:0", space=box)}


def _inference_input(cls: type) -> Round:
    views = _inference_views(_view_requirement(cls))
    if _is_rllib(cls):
        from ray.rllib.policy.sample_batch import concat_samples

        # RLlib's old stack: one collector per ongoing episode, their inputs
        # concatenated into the policy's batch.
        collectors = [_collector(cls, views, 20 + k, done=False) for k in range(N_INFER)]
        return Round(lambda: dict(concat_samples([c.build_for_inference()
                                                  for c in collectors])))
    from episode.views import build_inference_batch

    steps = _cartpole()
    episodes = []
    for k in range(N_INFER):
        episode = cls()
        episode.add_env_reset(steps.obs[0])
        _steps(episode, steps.obs, 0, 20 + k)
        episodes.append(episode)
    return Round(lambda: build_inference_batch(episodes, views))


def _sampler(cls: type) -> Round:
    """64 CartPole-v1 sub-envs, random actions, one sample() call of
    N_SAMPLE steps per sub-env (the envs stepping included)."""
    return _sampling(cls, replay=False)


def _sampling(cls: type, replay: bool) -> Round:
    if _is_rllib(cls):
        runner = rllib_runner(N_VEC_ENVS, N_SAMPLE, replay)
        return Round(lambda: _covers(runner.sample(random_actions=True)))
    sampler = our_sampler(N_VEC_ENVS, N_SAMPLE, replay)
    return Round(lambda: _covers(sampler.sample_episodes()))


def rllib_runner(num_envs: int, fragment: int, replay: bool = False) -> Any:
    """RLlib's SingleAgentEnvRunner on num_envs CartPole-v1 sub-envs (on a
    recording of them with `replay`: ReplayVectorEnv), sampled once."""
    # RLlib's runner needs torch even for random actions.
    import torch  # noqa: F401
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    config = (PPOConfig().environment("CartPole-v1")
              .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=fragment))
    # Building the runner logs RLlib's own deprecation warnings.
    logging.disable(logging.WARNING)
    try:
        runner = SingleAgentEnvRunner(config=config)
    finally:
        logging.disable(logging.NOTSET)
    if replay:
        runner.env = ReplayVectorEnv(runner.env)
    runner.sample(random_actions=True)
    return runner


def our_sampler(num_envs: int, fragment: int, replay: bool = False) -> Any:
    """The same with our Sampler (seeded), sampled once."""
    from episode.sampling import Sampler

    sampler = Sampler("CartPole-v1", num_envs=num_envs, rollout_fragment_length=fragment,
                      seed=0)
    if replay:
        sampler.env = ReplayVectorEnv(sampler.env)
    sampler.sample_episodes()
    return sampler


class ReplayVectorEnv:
    """A gymnasium vector env whose steps are a recording of another's:
    `step()` hands out the recorded results in turn (cycling) and its
    action space's `sample()` the recorded actions, so a sampler running on
    it spends its time on its own work only (the bookkeeping).

    The recording: `steps` steps of `env` (reset with `seed`) under random
    actions. Every other attribute is the recorded env's."""

    def __init__(self, env: Any, steps: int = 1000, seed: int = 0):
        self._env = env
        self._reset = env.reset(seed=seed)
        env.action_space.seed(seed)
        actions = [env.action_space.sample() for _ in range(steps)]
        self._steps = [env.step(a) for a in actions]
        self._next = 0
        self.action_space = _Recorded(env.action_space, actions)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def reset(self, *, seed: Any = None, options: Any = None) -> tuple:
        return self._reset

    def step(self, actions: Any) -> tuple:
        result = self._steps[self._next]
        self._next = (self._next + 1) % len(self._steps)
        return result


class _Recorded:
    # A vector action space whose sample() hands out recorded actions in turn.
    def __init__(self, space: Any, actions: list):
        self._space, self._actions, self._next = space, actions, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._space, name)

    def seed(self, seed: Any = None) -> Any:
        return None

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        action = self._actions[self._next]
        self._next = (self._next + 1) % len(self._actions)
        return action


def _sampler_bookkeeping(cls: type) -> Round:
    """As _sampler, on a 64-env CartPole-v1 recording (ReplayVectorEnv):
    env steps and random actions cost nothing, the rest is the sampler's."""
    return _sampling(cls, replay=True)


def _covers(episodes: list) -> bool:
    # Whether a call's episodes hold its N_SAMPLE steps per sub-env.
    return sum(len(e) for e in episodes) >= N_VEC_ENVS * N_SAMPLE


# -- workloads ----------------------------------------------------------------

def _add_env_step(cls: type) -> Round:
    obs = _cartpole().obs

    def setup():
        episode = cls()
        episode.add_env_reset(obs[0])
        return (episode,)

    return Round(lambda episode: _steps(episode, obs), setup)


def _collect(obs_of: Callable[[], list],
             spaces: Callable[[], dict] = dict) -> Callable[[type], Round]:
    def prepare(cls: type) -> Round:
        obs, kwargs = obs_of(), spaces()
        return Round(lambda: _episode(cls, N_COLLECT, obs, **kwargs).to_numpy())
    return prepare


def _get_observations_last(cls: type) -> Round:
    return Round(functools.partial(_cartpole_10k(cls).get_observations, -1))


def _get_observations_dict_last4(cls: type) -> Round:
    return Round(functools.partial(_dict_1000(cls).get_observations, slice(-4, None)))


def _frame_stack(i: int, episode_of: Callable[[type], Any] = _cartpole_10k
                 ) -> Callable[[type], Round]:
    where = slice(i - 3, i + 1)

    def prepare(cls: type) -> Round:
        get = episode_of(cls).get_observations
        return Round(lambda: get(where, neg_index_as_lookback=True, fill=0.0))
    return prepare


def _construct(cls: type) -> Round:
    return Round(cls)


def _short_episodes(cls: type) -> Round:
    episodes = _blackjack()
    spaces = {"observation_space": gym.spaces.Tuple((gym.spaces.Discrete(32),
                                                     gym.spaces.Discrete(11),
                                                     gym.spaces.Discrete(2))),
              "action_space": gym.spaces.Discrete(2)}

    def run():
        done = []
        for obs, actions, rewards in episodes:
            episode = cls(**spaces)
            episode.add_env_reset(obs[0])
            last = len(actions) - 1
            for i in range(len(actions)):
                episode.add_env_step(obs[i + 1], actions[i], rewards[i], None,
                                     terminated=i == last, truncated=False,
                                     extra_model_outputs={"vf": VF})
            done.append(episode.to_numpy())
        return done

    return Round(run)


def _slice_64(cls: type) -> Round:
    return Round(functools.partial(_cartpole_10k(cls).__getitem__, slice(100, 164)))


def _cut(numpy: bool) -> Callable[[type], Round]:
    def prepare(cls: type) -> Round:
        return Round(functools.partial(_cartpole_10k(cls, numpy).cut, len_lookback_buffer=1))
    return prepare


def _cut_10_list(cls: type) -> Round:
    return Round(_episode(cls, N_CUT, _cartpole().obs, **_spaces()).cut)


def _append_logp(numpy: bool) -> Callable[[type], Round]:
    def prepare(cls: type) -> Round:
        obs, actions, rewards = _cartpole()
        logp = _logp()

        def setup():
            # One step before to_numpy(): then every track is an array
            # (is_numpy), as for an episode a sampler goes on with.
            episode = cls()
            episode.add_env_reset(obs[0])
            episode.add_env_step(obs[1], actions[0], rewards[0],
                                 extra_model_outputs={"action_logp": logp[0]})
            return (episode.to_numpy() if numpy else episode,)

        def run(episode):
            step = episode.add_env_step
            for i in range(1, N_APPEND + 1):
                step(obs[i + 1], actions[i], rewards[i], None, terminated=False,
                     truncated=False, extra_model_outputs={"action_logp": logp[i]})
            return episode

        return Round(run, setup)
    return prepare


def _append_after_to_numpy(cls: type) -> Round:
    obs = _cartpole().obs
    # A fresh numpy'ized episode per round: the appends grow it.
    return Round(lambda episode: _steps(episode, obs, start=N_STEPS),
                 lambda: (_cartpole_10k(cls),))


def _pickle_roundtrip(cls: type) -> Round:
    episode = _cartpole_10k(cls)
    return Round(lambda: pickle.loads(pickle.dumps(episode, protocol=5)))


def _state_pickle_roundtrip(cls: type) -> Round:
    get_state = _cartpole_10k(cls).get_state
    return Round(lambda: pickle.loads(pickle.dumps(get_state(), protocol=5)))


def _concat(cls: type) -> Round:
    obs = _cartpole().obs

    def setup():
        chunk = _episode(cls, N_COLLECT, obs)
        return chunk, _steps(chunk.cut(), obs, start=N_COLLECT)

    def run(chunk, successor):
        chunk.concat_episode(successor)
        return chunk

    return Round(run, setup)


N_REPLAY = 50_000    # capacity of the replay workloads' buffers
N_DRAWN = 256        # transitions per replay draw
N_PAIRS = 676        # their stream: 676 pairs of a 200-step and a 22-step episode
N_HELD_PAIRS = 225   # the pairs a buffer holds before replay_add (49,950 steps)


def _replay_classes(cls: type) -> type:
    """The prioritized episode replay buffer of the implementation `cls` is from."""
    if _is_rllib(cls):
        from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import (
            PrioritizedEpisodeReplayBuffer)
    else:
        from episode.replay import PrioritizedEpisodeReplayBuffer
    return PrioritizedEpisodeReplayBuffer


@functools.lru_cache(maxsize=None)
def _replay_data() -> list:
    """150,072 CartPole-sized steps as plain arrays: N_PAIRS 200-step
    truncated and 22-step terminated episodes in turn."""
    rng = np.random.default_rng(0)
    out = []
    for k in range(2 * N_PAIRS):
        n = 200 if k % 2 == 0 else 22
        out.append((rng.uniform(-1, 1, (n + 1, 4)).astype(np.float32),
                    rng.integers(0, 2, n), rng.uniform(-1, 1, n), k % 2 == 1))
    return out


def _replay_episodes(cls: type, first: int, last: int) -> list:
    # Episodes first .. last - 1 of _replay_data(), numpy'ized, as an env
    # runner hands them over.
    out = []
    for i, (obs, actions, rewards, terminated) in enumerate(_replay_data()[first:last]):
        episode = cls(id_=f"r{first + i}", observations=list(obs),
                      actions=[int(a) for a in actions], rewards=[float(r) for r in rewards],
                      terminated=terminated, truncated=not terminated, len_lookback_buffer=0)
        out.append(episode.to_numpy())
    return out


def _replay_full(cls: type) -> Any:
    """A prioritized buffer (alpha 0.6) of capacity N_REPLAY after the whole
    stream, its rng seeded."""
    buffer = _replay_classes(cls)(capacity=N_REPLAY, alpha=0.6)
    episodes = _replay_episodes(cls, 0, len(_replay_data()))
    for i in range(0, len(episodes), 8):
        buffer.add(episodes[i:i + 8])
    buffer.rng = np.random.default_rng(0)
    return buffer


def _replay_add(cls: type) -> Round:
    held = 2 * N_HELD_PAIRS
    first = _replay_episodes(cls, 0, held)
    rest = _replay_episodes(cls, held, len(_replay_data()))

    def setup():
        buffer = _replay_classes(cls)(capacity=N_REPLAY, alpha=0.6)
        for i in range(0, len(first), 8):
            buffer.add(first[i:i + 8])
        return (buffer,)

    def run(buffer):
        for i in range(0, len(rest), 8):
            buffer.add(rest[i:i + 8])
        # Counts only: listing the stored indices would be timed with the adds.
        return buffer.get_num_timesteps(), buffer.get_num_episodes()

    return Round(run, setup)


def _replay_sample(cls: type) -> Round:
    buffer = _replay_full(cls)

    def setup():
        buffer.rng = np.random.default_rng(0)
        return ()

    def run():
        return buffer.sample(N_DRAWN, n_step=3, beta=0.4, gamma=0.99)

    return Round(run, setup)


WORKLOADS: dict[str, Workload] = {w.name: w for w in [
    Workload("add_env_step", "1,000 add_env_step calls on a reset list-mode episode",
             N_COLLECT, _add_env_step),
    Workload("collect_to_numpy_cartpole",
             "new episode, add_env_reset, 1,000 add_env_step, to_numpy (CartPole-sized)",
             N_COLLECT, _collect(lambda: _cartpole().obs)),
    Workload("collect_to_numpy_atari",
             "new episode, add_env_reset, 1,000 add_env_step, to_numpy (uint8 84x84x4)",
             N_COLLECT, _collect(_atari_obs)),
    Workload("get_observations_last", "get_observations(-1) on a numpy'ized 10k-step episode",
             1, _get_observations_last),
    Workload("frame_stack",
             "get_observations(slice(-3, 1), neg_index_as_lookback=True, fill=0.0) "
             "on a numpy'ized 10k-step episode (3 of 4 frames filled)", 1, _frame_stack(0)),
    Workload("frame_stack_mid",
             "get_observations(slice(4997, 5001), neg_index_as_lookback=True, fill=0.0) "
             "on a numpy'ized 10k-step episode", 1, _frame_stack(5000)),
    Workload("slice_64", "episode[100:164] of a numpy'ized 10k-step episode", 1, _slice_64),
    Workload("cut_lookback_1", "cut(len_lookback_buffer=1) of a numpy'ized 10k-step episode",
             1, _cut(numpy=True)),
    Workload("cut_lookback_1_list", "cut(len_lookback_buffer=1) of a list-mode 10k-step episode",
             1, _cut(numpy=False)),
    Workload("append_after_to_numpy",
             "1,000 add_env_step calls on a numpy'ized 10k-step episode with spaces set",
             N_COLLECT, _append_after_to_numpy),
    Workload("pickle_roundtrip_10k",
             "pickle.loads(pickle.dumps(episode, protocol=5)) of a numpy'ized 10k-step episode",
             1, _pickle_roundtrip),
    Workload("concat", "concat_episode of a 1,000-step list-mode chunk and its cut() successor "
             "with 1,000 steps", 1, _concat),
    Workload("collect_to_numpy_dict",
             "new episode, add_env_reset, 1,000 add_env_step, to_numpy (Dict obs "
             "{img: uint8 8x8x3, vec: float32 5}, observation space set)", N_COLLECT,
             _collect(_dict_obs, lambda: {"observation_space": _dict_space()})),
    Workload("get_observations_dict_last4",
             "get_observations(slice(-4, None)) on a numpy'ized 1,000-step Dict-obs episode",
             1, _get_observations_dict_last4),
    Workload("frame_stack_dict",
             "get_observations(slice(-3, 1), neg_index_as_lookback=True, fill=0.0) "
             "on a numpy'ized 1,000-step Dict-obs episode (3 of 4 frames filled)",
             1, _frame_stack(0, _dict_1000)),
    Workload("construct", "SingleAgentEpisode() with no arguments", 1, _construct),
    Workload("short_episode",
             "three Blackjack-sized episodes of 1, 2 and 3 steps, each: new episode (spaces "
             "set), add_env_reset, add_env_step calls, to_numpy (items: episodes)", 3,
             _short_episodes),
    Workload("cut_10_list", "cut() of a list-mode 10-step episode", 1, _cut_10_list),
    Workload("append_after_to_numpy_logp",
             "4,000 add_env_step calls with an np.float32 action_logp extra output on a "
             "numpy'ized 1-step episode without spaces", N_APPEND, _append_logp(numpy=True)),
    Workload("append_logp_list",
             "4,000 add_env_step calls with an np.float32 action_logp extra output on a "
             "list-mode 1-step episode without spaces", N_APPEND, _append_logp(numpy=False)),
    Workload("state_pickle_roundtrip_10k",
             "pickle.loads(pickle.dumps(episode.get_state(), protocol=5)) of a numpy'ized "
             "10k-step episode", 1, _state_pickle_roundtrip),
    Workload("vector_append_64",
             "100 steps of a 64-env CartPole-sized vector env (NextStep autoreset) into "
             "episodes: VectorEpisodes.add_step, or add_env_step per sub-env as RLlib's "
             "EnvRunner does (items: env steps)", N_VEC_ENVS * N_VEC_STEPS, _vector_append),
    Workload("vector_append_64_running",
             "the appends alone: 100 steps into the 64 running episodes of a vector env "
             "(made beforehand), none ending, read at the end (RLlib: add_env_step per "
             "sub-env; items: env steps)", N_VEC_ENVS * N_VEC_STEPS, _vector_append_running),
    Workload("collector_build_for_training",
             "AgentCollector.build_for_training of 1,000 timesteps: obs, new_obs, actions, "
             "rewards, prev_actions, prev_rewards and a 4-frame stack", 1, _collector_training),
    Workload("views_build_for_training",
             "the same batch from a 1,000-step episode with views.build_training_batch "
             "(RLlib: its AgentCollector)", 1, _views_training),
    Workload("collector_inference_64",
             "AgentCollector.build_for_inference, one call per collector on 64 ongoing "
             "inference-mode collectors (10-73 steps in): obs, new_obs, actions, rewards, "
             "prev_actions, prev_rewards and a 4-frame stack (items: calls)", N_INFER,
             _collector_inference),
    Workload("collector_step_inference_64",
             "the sampler's rhythm on collector_inference_64's collectors, both timed: each "
             "of the 64 takes one add_action_reward_next_obs (the step dict of RLlib's "
             "old-stack sampler: t, env_id, agent_index, rewards, terminateds, truncateds, "
             "infos, new_obs, actions), then one build_for_inference (items: step + build "
             "per collector; each round is one step further)", N_INFER,
             _collector_rhythm(is_training=False)),
    Workload("collector_step_inference_64_training",
             "the same rhythm on 64 training-mode collectors (AgentCollector's default, as "
             "RLlib's EpisodeV2 makes them), each ending a fragment every 100 steps "
             "(build_for_training, not timed) (items: step + build per collector)", N_INFER,
             _collector_rhythm(is_training=True)),
    Workload("views_inference_64",
             "the inference input of 64 ongoing episodes (20-83 steps): obs, prev_obs and a "
             "4-frame stack, views.build_inference_batch (RLlib: 64 AgentCollectors' "
             "build_for_inference, concatenated)", 1, _inference_input),
    Workload("sampler_cartpole_64",
             "Sampler.sample_episodes() on 64 CartPole-v1 envs with random actions, 100 steps "
             "per env, env stepping included (RLlib: SingleAgentEnvRunner.sample(random_"
             "actions=True); items: env steps)", N_VEC_ENVS * N_SAMPLE, _sampler),
    Workload("sampler_bookkeeping_64",
             "the same on a recording of the 64 envs (ReplayVectorEnv: env.step and the "
             "random actions cost nothing), so the sampler's own work alone (items: env "
             "steps)", N_VEC_ENVS * N_SAMPLE, _sampler_bookkeeping),
    Workload("ma_add_env_step_2",
             "MultiAgentEpisode: 1,000 add_env_step calls, 2 simultaneous agents",
             N_MA, _ma_add_env_step(lambda: _ma_steps(2))),
    Workload("ma_add_env_step_8",
             "MultiAgentEpisode: 1,000 add_env_step calls, 8 simultaneous agents",
             N_MA, _ma_add_env_step(lambda: _ma_steps(8))),
    Workload("ma_add_env_step_turns",
             "MultiAgentEpisode: 1,000 add_env_step calls, 2 agents taking turns",
             N_MA, _ma_add_env_step(_ma_turns)),
    Workload("ma_get_observations_last",
             "MultiAgentEpisode: get_observations(-1) of a list-mode 1,000-step episode "
             "(2 simultaneous agents)", 1, _ma_get_observations_last),
    Workload("ma_get_actions_filled",
             "MultiAgentEpisode: get_actions(slice(-4, None), env_steps=True, fill=0) of a "
             "list-mode 1,000-step turn-based episode (a hanging action)", 1,
             _ma_get_actions_filled),
    Workload("ma_cut", "MultiAgentEpisode: cut() of a list-mode 1,000-step episode "
             "(2 simultaneous agents)", 1, _ma_cut),
    Workload("ma_to_numpy", "MultiAgentEpisode: to_numpy() of a list-mode 1,000-step "
             "episode (2 simultaneous agents)", 1, _ma_to_numpy),
    Workload("ma_pickle_roundtrip",
             "MultiAgentEpisode: pickle.loads(pickle.dumps(episode, protocol=5)) of a "
             "numpy'ized 1,000-step episode (2 simultaneous agents)", 1,
             _ma_pickle_roundtrip(numpy=True)),
    Workload("ma_pickle_roundtrip_list",
             "MultiAgentEpisode: the same pickle round trip of the list-mode episode", 1,
             _ma_pickle_roundtrip(numpy=False)),
    Workload("ma_pickle_roundtrip_10k",
             "MultiAgentEpisode: pickle.loads(pickle.dumps(episode, protocol=5)) of a "
             "numpy'ized 10k-step episode (2 simultaneous agents; as pickle_roundtrip_10k)",
             1, _ma_pickle_roundtrip(numpy=True, n=N_STEPS)),
    Workload("replay_add",
             "PrioritizedEpisodeReplayBuffer (capacity 50,000, alpha 0.6) that holds "
             "49,950 steps takes 100,122 more, 8 numpy'ized CartPole-sized episodes per add "
             "(200- and 22-step episodes; every add evicts; items: steps)",
             (N_PAIRS - N_HELD_PAIRS) * 222, _replay_add),
    Workload("replay_sample_prioritized",
             "PrioritizedEpisodeReplayBuffer.sample(256, n_step=3, beta=0.4) from the full "
             "50,000-step buffer, seeded (items: transitions)", N_DRAWN, _replay_sample),
]}


# -- the reference and the comparison ------------------------------------------

def rllib_class() -> type | None:
    """RLlib 2.60's SingleAgentEpisode class, or None without ray[rllib]."""
    try:
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    except ImportError:
        return None
    return SingleAgentEpisode


def ray_version() -> str | None:
    """The installed ray version, or None."""
    try:
        return importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        return None


_UNIQUE_KEYS = ("id_", "_start_time", "_last_step_time")   # differ between any two episodes
_MA_UNIQUE_KEYS = ("multi_agent_episode_id",)             # an agent's copy of the episode id


def _state(x: Any) -> Any:
    """An episode (or buffer) as plain data: get_state() without id and times.
    An episode's get_state() dict also loses its id and times."""
    if hasattr(x, "get_state") and hasattr(x, "t_started"):
        state = _state(x.get_state())
        state["len"] = len(x)
        state["is_numpy"] = x.is_numpy
        return state
    if hasattr(x, "get_state") and hasattr(x, "env_t_started"):
        # A multi-agent episode: its agents' episodes and mappings as plain
        # data too; the mapping function is each implementation's own.
        state = _state(x.get_state())
        del state["agent_to_module_mapping_fn"]
        state["agent_episodes"] = {aid: _state(ep) for aid, ep in x.agent_episodes.items()}
        state["env_t_to_agent_t"] = {aid: _state(steps)
                                     for aid, steps in x.env_t_to_agent_t.items()}
        state["len"] = len(x)
        state["is_numpy"] = x.is_numpy
        return state
    if isinstance(x, dict) and all(key in x for key in _UNIQUE_KEYS):
        return {k: v for k, v in x.items() if k not in _UNIQUE_KEYS + _MA_UNIQUE_KEYS}
    if hasattr(x, "get_state") and hasattr(x, "lookback"):
        # A buffer (RLlib's get_state() keeps empty extra-output buffers as is).
        return x.get_state()
    return x


def assert_same(a: Any, b: Any, path: str = "value") -> None:
    """Asserts two workload results are equal: the same container types, the
    same array dtypes and shapes, the same values; episodes compare by
    get_state() (ids and wall-clock times left out)."""
    a, b = _state(a), _state(b)
    # Raised explicitly: `episode bench` must not lose this check under python -O.
    if type(a) is not type(b):
        raise AssertionError(f"{path}: {type(a).__name__} != {type(b).__name__}")
    if isinstance(a, dict):
        if a.keys() != b.keys():
            raise AssertionError(f"{path}: keys {a.keys()} != {b.keys()}")
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            raise AssertionError(f"{path}: len {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            raise AssertionError(f"{path}: {a.dtype}{a.shape} != {b.dtype}{b.shape}")
        np.testing.assert_array_equal(a, b, err_msg=path)
    elif a != b:
        raise AssertionError(f"{path}: {a!r} != {b!r}")


def check(workload: Workload) -> None:
    """Runs one round of `workload` on ours and on RLlib's class and asserts
    the results agree, so that both sides of a comparison do the same work.

    Raises ImportError without ray[rllib].
    """
    from episode import SingleAgentEpisode

    rllib = rllib_class()
    if rllib is None:
        raise ImportError("comparing with RLlib needs ray[rllib]: "
                          'pip install "ray[rllib]==2.60.*"')
    assert_same(workload.prepare(SingleAgentEpisode).once(), workload.prepare(rllib).once())


# -- memory -------------------------------------------------------------------

_NOT_CONTAINERS = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                   np.ndarray, str, bytes, int, float)


def held_input_bytes(root: Any, inputs: Any) -> int:
    """sys.getsizeof() of the objects in `inputs` (made before tracemalloc
    started, so untraced) that `root` still refers to: the rows and floats a
    list-mode buffer keeps. Memory measurements add it to the traced bytes."""
    ids = {id(x) for x in inputs}
    seen, stack, total = set(), [root], 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if id(obj) in ids:
            total += sys.getsizeof(obj)
        elif not isinstance(obj, _NOT_CONTAINERS):
            stack.extend(gc.get_referents(obj))
    return total
