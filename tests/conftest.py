"""Shared fixtures for the differential tests against RLlib's buffer.

The helpers live in tests/difftools.py (importable from test modules); this
file exposes them as fixtures.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import difftools  # noqa: E402


@pytest.fixture(scope="session")
def rllib_buffer():
    """RLlib's InfiniteLookbackBuffer class (skips the test without ray[rllib])."""
    return difftools.rllib_buffer_class()


@pytest.fixture(scope="session")
def compare():
    """`compare(ours_result, rllib_result)`: equal values AND container types."""
    return difftools.compare
