"""`manage.py healthcheck` runs without Django's apps: Docker runs it every 30 s for as long as
the container lives (tests/test_observability.py checks its answers against real nodes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.harness import REPO, free_port

PROBE = """
import runpy, sys
sys.argv = ["manage.py", "healthcheck", *sys.argv[1:]]
try:
    runpy.run_path("manage.py", run_name="__main__")
except SystemExit as exc:
    from django.apps import apps
    print(exc.code, apps.ready, "rest_framework" in sys.modules)
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "config.yaml"
    (tmp_path / "kcpps").mkdir(exist_ok=True)
    doc = {
        "server": {"bind": f"127.0.0.1:{free_port()}"},
        "cluster": {"store_dir": str(tmp_path)},
        "models": {"config_dir": str(tmp_path / "kcpps")},
    }
    config.write_text(yaml.safe_dump(doc))
    return subprocess.run(
        [sys.executable, "-c", PROBE, "--config", str(config), *args],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_health_check_asks_the_node_without_setting_up_djangos_apps(tmp_path: Path) -> None:
    for args in ((), ("--live",)):
        done = _run(tmp_path, *args)
        # Nothing listens on the port: exit 1, said on stderr, and no app was loaded to say it.
        assert done.stdout.split() == ["1", "False", "False"], done.stdout + done.stderr
        assert "Connection refused" in done.stderr
