"""The simulated backend's media paths: just enough of each to test routing."""

from __future__ import annotations

from aiohttp import web


def register(app: web.Application) -> None:
    """Add this family's routes to the simulated backend."""
