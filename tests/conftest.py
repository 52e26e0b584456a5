"""Fixtures for the browser tests (tests/test_webui*.py): see tests/browser.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from tests.browser import chromium, page_opener

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium for every test of a module (a file stays in one xdist worker
    under --dist loadfile); tests share no more than the process, see `new_page`."""
    with chromium() as launched:
        yield launched


@pytest.fixture
def new_page(browser: Browser) -> Iterator[Callable[..., Page]]:
    """Opens this test's pages, each in a fresh context; all are closed after the test."""
    with page_opener(browser) as open_page:
        yield open_page
