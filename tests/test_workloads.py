"""The benchmark workloads: ours does what each says, and RLlib's does the same."""
from __future__ import annotations

import numpy as np
import pytest

from episode import SingleAgentEpisode
from episode.workloads import (
    N_COLLECT,
    N_STEPS,
    WORKLOADS,
    assert_same,
    check,
    rllib_class,
)


def _obs(i):
    # The inputs are cached: the same arrays the workloads append.
    from episode.workloads import _cartpole

    return _cartpole().obs[i]


EXPECTED = {
    "add_env_step": lambda r: len(r) == N_COLLECT and not r.is_numpy,
    "collect_to_numpy_cartpole": lambda r: len(r) == N_COLLECT and r.is_numpy
    and r.get_observations().dtype == np.float32,
    "collect_to_numpy_atari": lambda r: r.is_numpy
    and r.get_observations().shape == (N_COLLECT + 1, 84, 84, 4),
    "get_observations_last": lambda r: np.array_equal(r, _obs(N_STEPS)),
    "frame_stack": lambda r: np.array_equal(r, np.stack([np.zeros(4, np.float32)] * 3 + [_obs(0)])),
    "frame_stack_mid": lambda r: np.array_equal(r, np.stack([_obs(i) for i in range(4997, 5001)])),
    "slice_64": lambda r: len(r) == 64 and r.t_started == 100,
    "cut_lookback_1": lambda r: len(r) == 0 and r.t_started == N_STEPS and r.is_numpy,
    "cut_lookback_1_list": lambda r: len(r) == 0 and r.t_started == N_STEPS and not r.is_numpy,
    "append_after_to_numpy": lambda r: len(r) == N_STEPS + N_COLLECT and r.is_numpy,
    "pickle_roundtrip_10k": lambda r: len(r) == N_STEPS and r.is_numpy,
    "concat": lambda r: len(r) == 2 * N_COLLECT and r.t == 2 * N_COLLECT,
}


def test_every_workload_has_an_expectation():
    assert set(EXPECTED) == set(WORKLOADS)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workload_does_what_it_says(name):
    prepared = WORKLOADS[name].prepare(SingleAgentEpisode)
    result = prepared.once()
    assert EXPECTED[name](result)
    # Rounds are repeatable: every timed round does the same work.
    assert_same(prepared.once(), result)


@pytest.mark.rllib
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workload_matches_rllib(name):
    if rllib_class() is None:
        pytest.skip("ray[rllib] is not installed")
    check(WORKLOADS[name])


def test_assert_same_tells_where_results_differ():
    with pytest.raises(AssertionError, match=r"value\[1\]"):
        assert_same([1, 2.0], [1, 2])
    with pytest.raises(AssertionError, match="float32"):
        assert_same(np.zeros(2, np.float32), np.zeros(2))
