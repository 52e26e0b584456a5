"""Import a heavy client SDK on first use instead of at collection.

Every xdist worker imports every test module to collect it; the anthropic and openai SDKs cost
1.6 s of CPU to import, in each of the four workers, though only the one worker that runs the
client tests uses them. A test file names the SDK through `LazyModule`, which imports it the
first time one of its attributes is read. (Not the standard library's `LazyLoader`: pytest's
collector looks at every module-level name, and any look at a lazily loaded module loads it.)
"""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """Stands for the module `name`; its attributes are the module's, imported on first use."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        # Only called for what the instance itself lacks. Private and dunder names are what
        # inspection asks for (pytest's `__test__`, `__wrapped__`, `_mock_name`): refused here,
        # they never import the SDK, whose public names are all a test uses.
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)
