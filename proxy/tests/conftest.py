"""Fixtures of the proxy's unit tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.tests.doorharness import Door


@pytest.fixture
async def doors(tmp_path: Path) -> AsyncIterator[Callable[..., Door]]:
    made: list[Door] = []

    def make(**sections: Any) -> Door:
        built = Door(tmp_path, **sections)
        made.append(built)
        return built

    yield make
    for built in made:
        await built.close()


@pytest.fixture
async def door(doors: Callable[..., Door]) -> Door:
    return doors()
