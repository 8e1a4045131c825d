"""The GRPO tests' tiny base model, built once per test session (per xdist worker) and only read by the tests."""

from __future__ import annotations

import pytest

from test_trainer import build_tiny


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """(model dir, train rows, curriculum ids): the trainer tests' base, width 32 (test_trainer.build_tiny).
    Tests train copies of it into their own folders; none writes into the model folder."""
    return build_tiny(tmp_path_factory.mktemp("tiny-base"))
