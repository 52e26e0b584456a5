"""The README's first curl examples name models the nodes they are run on have: `model=` in the
block is one of `./scripts/run`'s node (demo/config.standalone.yaml), and the model the text
tells `./scripts/demo`'s users to set instead is one its master serves (demo/cluster_demo.py).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent


def _try_section() -> str:
    readme = (REPO / "README.md").read_text()
    start = readme.index("Try the running node.")
    return readme[start : readme.index("\n## ", start)]


def _cluster_demo_models() -> set[str]:
    spec = importlib.util.spec_from_file_location("cluster_demo", REPO / "demo" / "cluster_demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    models: dict[str, dict[str, Any]] = module.MODELS
    return {name for node in models.values() for name in node}


def test_the_examples_model_is_one_the_standalone_demo_serves() -> None:
    section = _try_section()
    (given,) = re.findall(r"^ {4}model=([\w.-]+)$", section, flags=re.MULTILINE)
    config = yaml.safe_load((REPO / "demo" / "config.standalone.yaml").read_text())
    config_dir = REPO / "demo" / config["models"]["config_dir"]
    assert (config_dir / f"{given}.kcpps").is_file()
    # Every request in the block names the model through the variable, none by a literal.
    assert '"model": "\'$model\'"' in section
    assert not re.findall(r'"model": "[\w.-]+"', section)


def test_the_model_named_for_the_demo_cluster_is_one_its_master_serves() -> None:
    (named,) = re.findall(r"so there set `model=([\w.-]+)`", _try_section())
    assert named in _cluster_demo_models()
