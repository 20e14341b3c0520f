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


# -- SingleAgentEpisode -------------------------------------------------------

def rllib_single_agent_episode():
    """RLlib 2.60's SingleAgentEpisode class, or None without ray[rllib]."""
    try:
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    except ImportError:
        return None
    return SingleAgentEpisode


@pytest.fixture(params=IMPLS)
def sae_impl(request):
    """The SingleAgentEpisode class to time: ours, or RLlib 2.60's."""
    if request.param == "ours":
        from episode import SingleAgentEpisode
        return SingleAgentEpisode
    cls = rllib_single_agent_episode()
    if cls is None:
        pytest.skip("ray[rllib] is not installed")
    return cls


@pytest.fixture(scope="session")
def sae_classes():
    """Both SingleAgentEpisode classes, {"ours": cls, "rllib": cls or None},
    for the checks that run a workload on both before timing it."""
    from episode import SingleAgentEpisode
    return {"ours": SingleAgentEpisode, "rllib": rllib_single_agent_episode()}


@pytest.fixture(scope="session")
def int_actions():
    """N_MAX Python int actions in Discrete(2), made once."""
    rng = np.random.default_rng(2)
    return rng.integers(0, 2, size=N_MAX).tolist()


@pytest.fixture(scope="session")
def float_rewards():
    """N_MAX Python float rewards, made once."""
    rng = np.random.default_rng(3)
    return rng.uniform(-1.0, 1.0, size=N_MAX).tolist()


@pytest.fixture(scope="session")
def discrete2():
    return gym.spaces.Discrete(2)
