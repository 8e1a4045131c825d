"""The environment tests' tiny model, taught to call the calculator (a few seconds of training), built once per
test session (per xdist worker) and only read by the tests."""

import pytest

from env_helpers import trained_engine


@pytest.fixture(scope="session")
def taught_engine():
    return trained_engine()
