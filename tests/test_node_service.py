"""docs/router.service: systemd accepts it as written, and what it assumes of the router holds."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import REPO

UNIT = REPO / "docs" / "router.service"
INSTALLED_AT = "/opt/router"


def service_section() -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return dict(parser["Service"])


def test_systemd_verifies_the_unit_without_a_warning(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here (Debian: the systemd package)")
    # The unit names the checkout's usual place; here the checkout is the repository itself.
    text = UNIT.read_text().replace(f"{INSTALLED_AT}/.venv/bin/python", sys.executable)
    unit = tmp_path / "router.service"
    unit.write_text(text.replace(INSTALLED_AT, str(REPO)))
    done = subprocess.run(
        [analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )
    # A setting systemd cannot parse is only a warning ("…, ignoring"): the output must be empty.
    ours = [line for line in (done.stdout + done.stderr).splitlines() if "router.service" in line]
    assert done.returncode == 0 and ours == [], done.stdout + done.stderr


def test_the_unit_starts_runrouter_and_lets_it_drain_before_its_children_stop() -> None:
    service = service_section()
    start = service["ExecStart"].split()
    assert start[1:4] == [f"{INSTALLED_AT}/manage.py", "runrouter", "--config"]
    assert service["KillMode"] == "mixed" and service["KillSignal"] == "SIGTERM"
    assert int(service["TimeoutStopSec"]) > 10  # server.shutdown_grace's default


def test_an_invalid_config_exits_with_the_status_the_unit_does_not_restart_on(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("cluster:\n  role: boss\n")
    env = {k: v for k, v in os.environ.items() if k not in ("ROUTER_CONFIG", "DATABASE_URL")}
    done = subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "runrouter", "--config", str(config)],
        cwd=str(REPO),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "cluster.role" in done.stderr
    assert done.returncode == int(service_section()["RestartPreventExitStatus"]) == 2
