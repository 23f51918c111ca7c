"""Every test under tests/unit/ carries the `unit` marker, so scripts/test can run the niced unit tests
(`-m "not realtime"`) apart from the rest (`-m "realtime or not unit"`): see the markers in pyproject.toml."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith("tests/unit/"):
            item.add_marker(pytest.mark.unit)
