from __future__ import annotations

import pytest

from .helpers import tiny_overrides


@pytest.fixture
def tiny():
    return tiny_overrides
