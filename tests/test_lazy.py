"""tests/lazy.py: an SDK named through LazyModule is imported on first use, never by inspection."""

from __future__ import annotations

import sys

import pytest

from tests.lazy import LazyModule

# A small standard-library module the suite itself never imports.
NAME = "colorsys"


def test_inspection_does_not_import_and_a_public_name_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, NAME, raising=False)
    lazy = LazyModule(NAME)
    for private in ("__wrapped__", "__test__", "_mock_name"):
        assert not hasattr(lazy, private)
    assert NAME not in sys.modules
    assert lazy.rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)
    assert NAME in sys.modules
