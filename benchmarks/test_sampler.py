"""The Sampler's bookkeeping: 64 CartPole-v1 envs with random actions.

    pytest benchmarks/test_sampler.py --benchmark-group-by=group \
        --benchmark-columns=median,iqr,rounds

Three ways to take 100 steps of each of 64 sync CartPole-v1 sub-envs (6,400
env steps, random actions from the vector env's action space):

- ``bare``: gymnasium's loop alone, `env.step(env.action_space.sample())`,
  nothing kept, until it has as many env steps as the samplers count (a
  sub-env's NextStep reset is no step: about 5% more `env.step` calls than
  100, as the samplers make);
- ``ours``: `Sampler.sample_episodes()`, the episodes kept, ended ones and
  the cut chunks of running ones handed on numpy'ized;
- ``rllib``: RLlib 2.60's `SingleAgentEnvRunner.sample(random_actions=True)`
  (needs torch), which does the same.

The bookkeeping is ours (or RLlib's) median minus the bare loop's, as a
share of the bare loop's; `extra_info["env_steps"]` gives steps per second.

``ours_replay`` and ``rllib_replay`` run the same on a recording of the 64
envs (`episode.cli.workloads.ReplayVectorEnv`): env steps and random actions
cost nothing there, so their medians are the samplers' own work alone,
everything but `env.step` and the policy call.
"""
import pytest

N_ENVS = 64
N_STEPS = 100


def _bare():
    import gymnasium as gym

    import numpy as np

    env = gym.make_vec("CartPole-v1", num_envs=N_ENVS, vectorization_mode="sync")
    env.reset(seed=0)
    env.action_space.seed(0)
    resetting = [np.zeros(N_ENVS, bool)]

    def run():
        steps, ended = 0, resetting[0]
        while steps < N_ENVS * N_STEPS:
            _, _, terminateds, truncateds, _ = env.step(env.action_space.sample())
            steps += N_ENVS - int(np.count_nonzero(ended))
            ended = terminateds | truncateds
        resetting[0] = ended
        return steps
    return run


def _ours(replay=False):
    from episode.cli.workloads import our_sampler

    sampler = our_sampler(N_ENVS, N_STEPS, replay)
    return lambda: sum(len(e) for e in sampler.sample_episodes())


def _rllib(replay=False):
    pytest.importorskip("ray.rllib")
    pytest.importorskip("torch")
    from episode.cli.workloads import rllib_runner

    runner = rllib_runner(N_ENVS, N_STEPS, replay)
    return lambda: sum(len(e) for e in runner.sample(random_actions=True))


@pytest.mark.parametrize("impl", ["bare", "ours", "rllib", "ours_replay", "rllib_replay"])
def test_sampler_cartpole_64(benchmark, impl):
    run = {"bare": _bare, "ours": _ours, "rllib": _rllib,
           "ours_replay": lambda: _ours(replay=True),
           "rllib_replay": lambda: _rllib(replay=True)}[impl]()
    benchmark.group = "sampler_cartpole_64"
    steps = run()
    assert steps >= N_ENVS * N_STEPS
    benchmark.extra_info["env_steps"] = steps
    benchmark.pedantic(run, rounds=15, warmup_rounds=1, iterations=1)


def test_sampler_overhead_interleaved(benchmark):
    """The Sampler's own work beside the live envs: the bare loop and
    `Sampler.sample_episodes()` alternate round by round (so that the VM's
    drifts hit both alike), each timed with `time.thread_time()`.
    `extra_info` has their medians, the Sampler's time over the bare loop's
    (overhead) and the difference per env step (own work). The benchmark's
    own timing is of one pair."""
    import statistics
    import time

    bare, ours = _bare(), _ours()
    times: dict = {"bare": [], "ours": []}

    def pair():
        for name, run in (("bare", bare), ("ours", ours)):
            start = time.thread_time()
            steps = run()
            times[name].append(time.thread_time() - start)
        return steps

    benchmark.group = "sampler_overhead_64"
    benchmark.pedantic(pair, rounds=60, warmup_rounds=2, iterations=1)
    bare_s, ours_s = statistics.median(times["bare"]), statistics.median(times["ours"])
    benchmark.extra_info.update({
        "bare_ms": round(bare_s * 1e3, 2), "ours_ms": round(ours_s * 1e3, 2),
        "overhead_percent": round((ours_s / bare_s - 1) * 100, 2),
        "own_ns_per_env_step": round((ours_s - bare_s) / (N_ENVS * N_STEPS) * 1e9)})
    assert len(times["ours"]) == len(times["bare"]) >= 60
