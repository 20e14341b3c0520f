"""Shared fixtures for the benchmarks: the implementation under test and inputs.

Run with ``pytest benchmarks/ --benchmark-group-by=param:workload`` (the
SingleAgentEpisode workloads) or ``--benchmark-group-by=group``; the plain ``pytest``
run collects ``tests/`` only (pyproject's testpaths), never this folder.
"""
from collections import defaultdict

import gymnasium as gym
import numpy as np
import pytest

from episode.cli.workloads import rllib_class

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


@pytest.fixture(params=IMPLS)
def sae_impl(request):
    """The SingleAgentEpisode class to time: ours, or RLlib 2.60's."""
    if request.param == "ours":
        from episode import SingleAgentEpisode
        return SingleAgentEpisode
    cls = rllib_class()
    if cls is None:
        pytest.skip("ray[rllib] is not installed")
    return cls


@pytest.hookimpl(tryfirst=True)
def pytest_benchmark_group_stats(config, benchmarks, group_by):
    """Makes ``--benchmark-group-by=param:NAME`` work on the whole folder: a
    benchmark without a NAME parameter (the lookback-buffer ones have no
    ``workload``) goes into its ``benchmark.group`` instead of failing with
    a KeyError in pytest-benchmark. Other groupings: pytest-benchmark's own."""
    if not group_by.startswith("param:") or "," in group_by:
        return None
    name = group_by[len("param:"):]
    groups = defaultdict(list)
    for bench in benchmarks:
        params = bench["params"] or {}
        key = f"{name}={params[name]}" if name in params else bench["group"] or bench["name"]
        groups[key].append(bench)
    for group in groups.values():
        group.sort(key=lambda bench: bench["name"])
    return sorted(groups.items())


@pytest.fixture
def one_torch_thread():
    """torch on one thread, as ours and cpprb are: its thread pool on a
    shared machine makes MultiStepTransform's conv1d ten times slower."""
    try:
        import torch
    except ImportError:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def side(request):
    """RLlib's classes for "rllib"; ours, installed (episode.rllib), for
    "ours" (parametrize indirectly)."""
    import gc

    if request.param == "rllib":
        yield request.param
        return
    import episode.rllib

    gc.collect()
    with episode.rllib.installed():
        yield request.param
    gc.collect()

