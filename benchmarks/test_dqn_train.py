"""DQN's train() on RLlib's classes and on ours, part by part, same seed.

    pytest benchmarks/test_dqn_train.py --benchmark-group-by=group \
        --benchmark-columns=median,iqr,rounds

- ``dqn_train``: one train() of RLlib's DQN (CartPole, 8 envs,
  rollout_fragment_length 4, prioritized episode replay, 3-step, batch 256,
  torch on one thread; benchmarks/dqn_parts.py), 8 rounds after 2 warm-ups.
  `extra_info`: the seconds of each part of train() over the rounds (the
  replay buffer's sample / get_metrics / update_priorities / add, the
  learner group's update, the env runner's sample, the weights' sync), the
  replay buffer's share of train(), the garbage collector's full
  collections and the parts they landed in, and the curve.

Both stacks train the same curve (asserted when both run): the parts are
the same work, done by different classes.
"""
import time

import pytest

pytest.importorskip("ray.rllib")
pytest.importorskip("torch")

import dqn_parts  # noqa: E402

ROUNDS, WARMUP = 8, 2
CURVES: dict = {}


@pytest.mark.benchmark(group="dqn_train")
@pytest.mark.parametrize("side", ["ours", "rllib"], indirect=True)
def test_dqn_train(benchmark, side):
    algo = dqn_parts.build()
    breakdown = dqn_parts.Breakdown(algo)
    for _ in range(WARMUP):
        algo.train()
    breakdown.reset()
    curve = []
    start = time.perf_counter()
    benchmark.pedantic(lambda: curve.append(dqn_parts.curve_point(algo.train())),
                       rounds=ROUNDS)
    report = breakdown.report(time.perf_counter() - start)
    breakdown.close()
    algo.stop()
    benchmark.extra_info.update(report, curve=curve)
    CURVES[side] = curve
    if len(CURVES) == 2:
        assert CURVES["ours"] == CURVES["rllib"]
