"""The collector is off while a node starts and must be on once it serves."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest

from routerproject.gctune import GEN0_THRESHOLD, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold, enabled, switch = gc.get_threshold(), gc.isenabled(), sys.getswitchinterval()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)
    sys.setswitchinterval(switch)
    if enabled:
        gc.enable()


@pytest.mark.usefixtures("restored_gc")
def test_tune_gc_turns_collection_back_on_after_a_start_without_it() -> None:
    gc.disable()
    tune_gc()
    assert gc.isenabled()
    assert gc.get_threshold()[0] == GEN0_THRESHOLD


def test_manage_py_starts_only_runrouter_without_collection() -> None:
    probe = (
        "import gc, sys, manage\n"
        "sys.argv = ['manage.py', sys.argv[1]]\n"
        "import django.core.management as m\n"
        "m.execute_from_command_line = lambda argv: print(gc.isenabled())\n"
        "manage.main()\n"
    )
    seen = {
        command: subprocess.run(
            [sys.executable, "-c", probe, command], capture_output=True, text=True, check=True
        ).stdout.strip()
        for command in ("runrouter", "migrate")
    }
    assert seen == {"runrouter": "False", "migrate": "True"}
