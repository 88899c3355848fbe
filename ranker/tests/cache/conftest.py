"""What every cache test shares: the tiny model at version ``v1`` that writes and reads the
entries."""

from __future__ import annotations

import pytest


@pytest.fixture
def model(factory, tiny_cfg):
    return factory.model(tiny_cfg, version="v1")


@pytest.fixture
def patient_s() -> float:
    """A Redis operation timeout no busy machine reaches, for the tests of what a store keeps
    and returns rather than of how fast: an operation a loaded two-core machine stalls for a
    second (a cluster client's first topology read) must not turn a hit into a miss.
    ``test_redis_store.py`` tests the timeouts themselves."""
    return 15.0
