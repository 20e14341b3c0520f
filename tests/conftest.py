"""Shared fixtures for the differential tests against RLlib's buffer.

The helpers live in tests/difftools.py (importable from test modules); this
file exposes them as fixtures.
"""
import gc
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Ray starts its workers at nice 15. On a machine whose cores are all busy
# (CI runs this suite beside its other builds) they then get a few percent of a
# core, and a test that reads through Ray Data took 10x its quiet time while
# the processes waiting for it kept polling. At 0 they get their share. (Set
# here, before any ray.init(): the tests' children and Ray's inherit it.)
os.environ.setdefault("RAY_worker_niceness", "0")

import difftools  # noqa: E402


@pytest.fixture(scope="session")
def rllib_buffer():
    """RLlib's InfiniteLookbackBuffer class (skips the test without ray[rllib])."""
    return difftools.rllib_buffer_class()


@pytest.fixture(scope="session")
def compare():
    """`compare(ours_result, rllib_result)`: equal values AND container types."""
    return difftools.compare


# Two marked subsets of the suite for CI's other builds (.ci/run, .ci/sanitize),
# which the whole suite in step 1 covers already:
# - install_check: a few quick files across the layers, for the wheel and the
#   conda package (is everything there and built: each compiled module, the
#   facade, replay, datasets, the command line's entry);
# - sanitize: the tests of the compiled core, of the readers of files and of
#   garbage input, for the AddressSanitizer build (memory errors are found
#   where C code runs on bad or edge-case input).
INSTALL_CHECK = {
    "test_cheap_episodes.py", "test_core_safety.py", "test_lookback_buffer.py",
    "test_single_agent_episode_differences.py", "test_multi_agent_pickling.py",
    "test_pickling.py", "test_views.py", "test_sampling.py", "test_sampler.py",
    "test_collector.py", "test_replay_transitions.py", "test_replay_kept_no_code.py",
    "test_offline_dataset.py", "test_offline_no_code.py", "test_struct_items.py",
    "test_tree_storage.py", "test_seed_examples.py", "test_packaging.py",
}
SANITIZE = {
    # the core: buffers, Columns, episodes, replay storage, views
    "test_column.py", "test_core_safety.py", "test_tree_storage.py", "test_struct_items.py",
    "test_cheap_episodes.py", "test_lookback_buffer.py", "test_lookback_buffer_differences.py",
    "test_single_agent_episode_differences.py", "test_single_agent_episode_errors.py",
    "test_multi_agent_core.py", "test_multi_agent_pickling.py", "test_pickling.py",
    "test_one_hot.py", "test_space_checks.py", "test_checks.py", "test_views.py",
    "test_episode_views.py", "test_sampling.py", "test_collector.py", "test_collector_steps.py",
    "test_replay.py", "test_replay_frames.py", "test_replay_transitions.py",
    "test_replay_runs.py", "test_replay_gather.py", "test_replay_picks.py",
    "test_replay_kept.py",
    # the readers of files (datasets, Minari's, kept replay buffers)
    "test_offline_dataset.py", "test_offline_faults.py", "test_offline_minari_damaged.py",
    "test_replay_kept_more.py",
    # garbage input
    "test_garbage_input.py", "test_replay_bad_input.py",
}

# The files that take longest, longest first (CI's run of 2026-12-07): they
# run first. pytest-xdist (--dist loadfile) hands each worker one file at a
# time in collection order, so a long file collected last keeps one worker
# busy while the other has nothing left.
SLOW_FIRST = [
    "test_rllib_install.py", "test_rllib_offline.py", "test_offline_minari_damaged.py",
    "test_rllib_runners.py", "test_typing.py", "test_docs.py", "test_offline_faults.py",
    "test_memory.py", "test_distributed.py", "test_offline_rllib_format.py",
    "test_single_agent_episode_rllib.py", "test_cli.py", "test_garbage_input.py",
    "test_multi_agent_episode_rllib.py", "test_replay_kept_more.py",
    "test_offline_rllib_recorded.py",
]


def pytest_configure(config):
    # Registered here, not in pyproject.toml: the conda recipe's tests run a
    # copy of tests/ without it.
    config.addinivalue_line("markers", "rllib: compares against RLlib 2.60 itself (needs ray[rllib])")
    config.addinivalue_line("markers", "install_check: CI's check of the wheel and conda package")
    config.addinivalue_line("markers", "sanitize: CI's AddressSanitizer build runs these")


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.path.name
        if name in INSTALL_CHECK:
            item.add_marker(pytest.mark.install_check)
        if name in SANITIZE:
            item.add_marker(pytest.mark.sanitize)
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))


@pytest.fixture(autouse=True)
def _collect_the_tests_own_objects():
    # A test's garbage collections see only what it makes: the objects made
    # before it (Ray, torch and RLlib's modules, about 300k) are frozen
    # while it runs. A full collection over them costs a second in CI, and
    # the tests of memory and leaks collect hundreds of times (70 s of the
    # suite). Freezing and thawing move lists (no walk), and nothing frozen
    # stays frozen: garbage made before the test is collected after it.
    gc.freeze()
    yield
    gc.unfreeze()
