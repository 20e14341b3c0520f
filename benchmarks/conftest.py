"""Shared fixtures for the benchmarks: the implementation under test and inputs.

Run with ``pytest benchmarks/ --benchmark-group-by=group``; the plain ``pytest``
run collects ``tests/`` only (pyproject's testpaths), never this folder.
"""
import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("pytest_benchmark")

IMPLS = ["ours", "rllib"]

# Input sizes.
N_ROWS = 10_000
N_MAX = 100_000


@pytest.fixture(params=IMPLS)
def impl(request):
    """The InfiniteLookbackBuffer class to time: ours, or RLlib 2.60's."""
    if request.param == "ours":
        from episode import InfiniteLookbackBuffer
    else:
        mod = pytest.importorskip(
            "ray.rllib.env.utils.infinite_lookback_buffer",
            reason="ray[rllib] is not installed",
        )
        InfiniteLookbackBuffer = mod.InfiniteLookbackBuffer
    return InfiniteLookbackBuffer


@pytest.fixture(scope="session")
def obs_rows():
    """N_MAX CartPole-sized observations: float32 arrays of shape (4,), made once."""
    rng = np.random.default_rng(0)
    block = rng.uniform(-1.0, 1.0, size=(N_MAX, 4)).astype(np.float32)
    # Separate owned arrays, as an env hands them out (not views of one block).
    return [row.copy() for row in block]


@pytest.fixture(scope="session")
def float_rows():
    """N_ROWS Python float rewards, made once."""
    rng = np.random.default_rng(1)
    return [float(x) for x in rng.uniform(-1.0, 1.0, size=N_ROWS)]


@pytest.fixture(scope="session")
def box4():
    return gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
