"""The pure-core import contract names every module of the apps it lists one by one.

import-linter cannot forbid "every module except these", so the contract in pyproject.toml
lists the impure modules of the apps that hold pure modules other pure modules import. A module
added to one of those apps and listed nowhere would be free to slip into the pure core: this
test makes whoever adds it say which it is.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LISTED_APPS = ("analytics", "lending", "routerproject")


def pure_core_contract() -> dict[str, Any]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    (contract,) = (c for c in contracts if c.get("id") == "pure-core")
    return contract


def top_modules(app: str) -> set[str]:
    """`app.<name>` for every module and subpackage directly inside the app."""
    found = set()
    for path in (ROOT / app).iterdir():
        if path.suffix == ".py" and path.stem != "__init__":
            found.add(f"{app}.{path.stem}")
        elif path.is_dir() and (path / "__init__.py").exists():
            found.add(f"{app}.{path.name}")
    return found


def test_every_module_of_the_listed_apps_is_pure_or_forbidden_to_the_pure_core() -> None:
    contract = pure_core_contract()
    listed = set(contract["source_modules"]) | set(contract["forbidden_modules"])
    unlisted = sorted(m for app in LISTED_APPS for m in top_modules(app) if m not in listed)
    assert unlisted == []
