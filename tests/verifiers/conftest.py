"""Fixtures shared by the verifier tests."""

import pytest

from fresh_process import FreshProcess


@pytest.fixture(scope="module")
def fresh():
    """A process that only verifies, one per test module, for CPU-time bounds: measured in the test worker they
    would count the worker's own heap and threads too (tests/verifiers/fresh_process.py)."""
    proc = FreshProcess()
    yield proc
    proc.close()
