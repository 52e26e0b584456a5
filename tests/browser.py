"""Headless Chromium for the WebUI tests: Debian's build (apt-get install chromium), driven by
Playwright. Never a browser Playwright downloads: the pages are tested in the Chromium an
operator's machine gets from the distribution, and the tests need no network to fetch one.

A browser test module gets one Chromium (`browser`, module-scoped, from tests/conftest.py) and
each test its own pages (`new_page`), each in a fresh context: no cookie, storage, clock, route
or open page is carried from one test to the next, only the browser process is. Launching it
costs seconds on a loaded machine; a context costs a fraction of that.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Page

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def require_chromium() -> None:
    """Skip the calling test module (at import) when Playwright or Debian's Chromium is missing."""
    pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)


@contextmanager
def chromium() -> Iterator[Browser]:
    """A launched headless Chromium, closed on the way out whatever the test did."""
    # Imported here so that importing this module never fails before require_chromium() skips.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def page_opener(browser: Browser) -> Iterator[Callable[..., Page]]:
    """`open(**context_options)` gives a page in a new context of `browser` (a viewport, say);
    every context opened is closed on the way out, with its pages, routes and clock."""
    contexts: list[BrowserContext] = []

    def open_page(**options: Any) -> Page:
        context = browser.new_context(**options)
        contexts.append(context)
        return context.new_page()

    try:
        yield open_page
    finally:
        for context in contexts:
            context.close()
