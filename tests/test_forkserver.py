"""The fork server gives a test the process `python manage.py ...` would have been."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import forkserver

SCRIPT = """
import json, os, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
                  "env": os.environ.get("FORK_PROBE"), "sid": os.getsid(0) == os.getpid(),
                  "main": __name__}), flush=True)
if sys.argv[1] == "wait":
    sys.stdin.read()
    import time
    time.sleep(3600)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def manage(tmp_path: Path) -> Path:
    script = tmp_path / "app" / "manage.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    return script


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FORK_PROBE"}
    env.update(extra)
    return env


def test_a_forked_child_runs_the_script_as_main_with_its_argv_cwd_env_and_exit_code(
    manage: Path, tmp_path: Path
) -> None:
    proc = forkserver.popen([sys.executable, str(manage), "3"], _env(FORK_PROBE="x"), str(tmp_path))
    assert isinstance(proc, forkserver.Forked)
    assert proc.stdout is not None
    seen = json.loads(proc.stdout.readline())
    assert proc.wait(30) == 3
    assert proc.poll() == 3 and proc.returncode == 3
    assert seen == {
        "argv": [str(manage), "3"],
        "cwd": str(tmp_path),
        "path0": str(manage.parent),
        "env": "x",
        "sid": True,
        "main": "__main__",
    }


def test_a_signalled_child_reports_the_signal_and_a_wait_can_time_out(
    manage: Path, tmp_path: Path
) -> None:
    proc = forkserver.popen([sys.executable, str(manage), "wait"], _env(), str(tmp_path))
    assert isinstance(proc, forkserver.Forked)
    assert proc.stdout is not None
    proc.stdout.readline()
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM


def test_an_interpreter_setting_or_another_program_gets_a_plain_process(
    manage: Path, tmp_path: Path
) -> None:
    other = _env(PYTHONHASHSEED="123")
    hashed = forkserver.popen([sys.executable, str(manage), "0"], other, str(tmp_path))
    assert isinstance(hashed, subprocess.Popen)
    assert hashed.wait(30) == 0
    other_program = [sys.executable, str(manage.with_name("other.py")), "0"]
    manage.with_name("other.py").write_text("pass\n")
    plain = forkserver.popen(other_program, _env(), str(tmp_path))
    assert isinstance(plain, subprocess.Popen)
    assert plain.wait(30) == 0
