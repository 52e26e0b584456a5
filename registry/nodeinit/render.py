"""The files `init_node` writes: a commented config and one `.kcpps` per model found.

The config is written as text, not dumped from a dict, so that it carries the comments an
operator needs to change it later; every value is quoted as JSON (a YAML subset), so no
token or path can change meaning in YAML. Tests load what is written through the node's
own loader.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from registry.nodeinit.ggufscan import Found

Role = Literal["master", "slave", "standalone"]
# The families whose servers the router starts itself, and the program each runs.
BINARIES = {"llama": "llama-server", "sdcpp": "sd-server", "whispercpp": "whisper-server"}
MODELS_SUBDIR = "kcpps"
SIM_CONTEXT = 4096
CA_FILE_NAME = "cluster-ca.pem"
# A model's trained context is often 128k tokens: its KV cache would not fit beside the
# weights on most machines, and llama-server allocates it whole at start. The operator
# raises it per model (`contextsize`) or for all with --max-context.
DEFAULT_MAX_CONTEXT = 8192


@dataclass(frozen=True)
class NodePlan:
    role: Role
    node_id: str
    bind: str
    public_url: str
    token: str = field(repr=False)
    inference_key: str = field(repr=False)
    admin_key: str = field(repr=False)
    master_url: str = ""
    ca_file: str = ""
    binaries: Mapping[str, str | None] = field(default_factory=dict)


def find_binaries(path_env: str | None = None) -> dict[str, str | None]:
    """Where each family's server is on PATH; the absolute path, so that a service manager's
    short PATH (systemd's has no ~/.local/bin) still finds it."""
    return {family: shutil.which(program, path=path_env) for family, program in BINARIES.items()}


def q(value: str) -> str:
    return json.dumps(value)


def _header(plan: NodePlan) -> list[str]:
    return [
        f"# A {plan.role} node's config, written by `manage.py init_node`.",
        "# Keys: README.md, Configuration. Relative paths are relative to this file.",
        "",
        "server:",
        "  # Where the router listens; other nodes and clients reach it at cluster.public_url.",
        f"  bind: {q(plan.bind)}",
        "",
        "auth:",
        "  # This node's own Bearer keys: for its model APIs, and for its management API.",
        "  # Keys made with `manage.py create_api_key` on the master work on every node.",
        f"  inference_keys: [{q(plan.inference_key)}]",
        f"  admin_keys: [{q(plan.admin_key)}]",
        "",
    ]


def _cluster(plan: NodePlan) -> list[str]:
    lines = ["cluster:", f"  role: {plan.role}", f"  node_id: {q(plan.node_id)}"]
    if plan.role == "standalone":
        return [*lines, "  store_dir: ./router-store", ""]
    lines += [
        "  # The cluster's shared secret: every node has the same. Keep this file private.",
        f"  token: {q(plan.token)}",
        f"  public_url: {q(plan.public_url)}",
    ]
    if plan.role == "master":
        lines += [
            "  # Only these slaves may register. `init_node --role slave` prints the line to add",
            "  # here for its node; restart the master after adding one.",
            "  slave_urls:",
        ]
    else:
        lines.append(f"  master_url: {q(plan.master_url)}")
    if plan.ca_file:
        lines += [
            "  # The CA the master's certificate is signed by.",
            f"  tls_ca_file: {q(plan.ca_file)}",
        ]
    return [*lines, "  store_dir: ./router-store", ""]


def _backends(plan: NodePlan) -> list[str]:
    lines = [
        "models:",
        "  # One .kcpps per model; the file name is the model's ID. init_node wrote one per",
        "  # GGUF it found; add or edit them by hand (README.md, Adding a model).",
        f"  config_dir: ./{MODELS_SUBDIR}",
        "",
        "backend:",
        "  mode: llama_sdcpp",
    ]
    for family, program in BINARIES.items():
        found = plan.binaries.get(family)
        if found:
            lines += ["", f"{family}:", f"  binary_path: {q(found)}"]
        else:
            lines += [
                "",
                f"# {program} was not on PATH when this file was written; set its path:",
                f"# {family}:",
                f"#   binary_path: /path/to/{program}",
            ]
    return [*lines, ""]


def config_text(plan: NodePlan) -> str:
    return "\n".join([*_header(plan), *_cluster(plan), *_backends(plan)])


def model_config(found: Found, max_context: int) -> dict[str, Any]:
    """The `.kcpps` of one found model (paths absolute: the file may be moved elsewhere)."""
    if found.sim:
        return {
            "model_param": str(found.path),
            "backend_mode": "sim",
            "contextsize": SIM_CONTEXT,
            "parallel": 1,
        }
    context = found.context_length or SIM_CONTEXT
    # An embedding model is named as one, so that the node offers it for embeddings only
    # (a chat sent to it would fail), and started with --embeddings.
    weights = "embeddingsmodel" if found.embeds else "model_param"
    raw: dict[str, Any] = {
        weights: str(found.path),
        "contextsize": min(context, max_context) if max_context else context,
        "parallel": 1,
    }
    if found.embeds:
        raw["embeddings"] = True
    if found.mmproj is not None:
        raw["mmproj"] = str(found.mmproj)
    if found.has_chat_template and not found.embeds:
        # Render the model's own template from its header as written (Jinja), rather than
        # llama-server's guess among the templates it knows by heart.
        raw["extra_args"] = ["--jinja"]
    return raw


def write_model_configs(
    config_dir: Path, models: list[Found], max_context: int, *, dry_run: bool
) -> tuple[list[Found], list[Found]]:
    """(written, kept): a config already there is the operator's and is never replaced."""
    written: list[Found] = []
    kept: list[Found] = []
    for found in models:
        target = config_dir / f"{found.local_id}.kcpps"
        if target.exists():
            kept.append(found)
            continue
        written.append(found)
        if not dry_run:
            config_dir.mkdir(parents=True, exist_ok=True)
            text = json.dumps(model_config(found, max_context), indent=2) + "\n"
            target.write_text(text, encoding="utf-8")
    return written, kept
