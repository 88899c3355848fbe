"""What every cache test shares: the tiny model at version ``v1`` that writes and reads the
entries."""

from __future__ import annotations

import pytest


@pytest.fixture
def model(factory, tiny_cfg):
    return factory.model(tiny_cfg, version="v1")
