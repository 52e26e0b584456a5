"""Write a node's config in one command: `--role master|slave|standalone --out FILE`.

Scope: FILE (refused when it exists, unless --force: a master's new token would cut off its
slaves) and `kcpps/` beside it, one model config per GGUF file found under --models-dir
(existing configs are kept, so a second run only adds new models). Nothing else: no
database, no network. A master gets a fresh token and prints the join string its slaves are
given; a slave takes the master's URL and token from it and prints the line the master's
`cluster.slave_urls` needs. Supports --dry-run (writes nothing) and --no-input.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from registry.nodeinit.ggufscan import Found, Scan, scan_models
from registry.nodeinit.joining import Join, JoinError, join_decode, join_encode, url_problem
from registry.nodeinit.plan import (
    check_config,
    default_node_id,
    default_public_url,
    new_secret,
)
from registry.nodeinit.render import (
    BINARIES,
    CA_FILE_NAME,
    DEFAULT_MAX_CONTEXT,
    MODELS_SUBDIR,
    NodePlan,
    config_text,
    find_binaries,
    write_model_configs,
)
from routerproject.config import ConfigError
from routerproject.config.values import split_bind

ROLES = ("master", "slave", "standalone")
DEFAULT_BIND = {"master": "0.0.0.0:8080", "slave": "0.0.0.0:8080", "standalone": "127.0.0.1:8080"}
MANAGE_PY = Path(__file__).resolve().parents[3] / "manage.py"
# The config holds the cluster token and the node's keys: readable by its owner only.
CONFIG_FILE_MODE = 0o600


class Command(BaseCommand):
    help = "Write a node's config (and one model config per GGUF found) in one command."
    # manage.py runs it without Django's settings and apps (see its `_init_node`): nothing of
    # the project is there to check.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--role", choices=ROLES, required=True)
        parser.add_argument("--out", required=True, help="The config file to write.")
        parser.add_argument("--bind", help="host:port to listen on (default: by role).")
        parser.add_argument("--public-url", help="How other nodes reach this one.")
        parser.add_argument("--join", help="A slave's join string, printed by the master.")
        parser.add_argument("--models-dir", help="Write a model config per GGUF under it.")
        parser.add_argument("--node-id", help="Unique node name (default: the host name).")
        parser.add_argument(
            "--max-context",
            type=int,
            default=DEFAULT_MAX_CONTEXT,
            help=f"Cap a model's context (default {DEFAULT_MAX_CONTEXT}; 0: as trained).",
        )
        parser.add_argument("--ca-file", help="A master's CA (PEM), handed on to its slaves.")
        parser.add_argument("--force", action="store_true", help="Replace an existing --out.")
        parser.add_argument("--dry-run", action="store_true", help="Print, write nothing.")
        parser.add_argument("--no-input", action="store_true", help="Accepted for uniformity.")

    def handle(self, *args: Any, **options: Any) -> None:
        out = Path(options["out"]).expanduser().absolute()
        if out.exists() and not options["force"]:
            raise CommandError(f"--out: {out} exists (--force replaces it)")
        join = _join(options)
        plan, files = _plan(options, join)
        text = config_text(plan)
        try:
            check_config(text, files)
        except ConfigError as exc:
            raise CommandError(f"the config would not load: {exc}") from None
        scan = _scan(options)
        dry_run = bool(options["dry_run"])
        written, kept = write_model_configs(
            out.parent / MODELS_SUBDIR, scan.models, options["max_context"], dry_run=dry_run
        )
        if not dry_run:
            _write(out, text, files)
        self._report_models(scan, len(written), len(kept), options["max_context"])
        self._report_next(plan, out, join)
        verb = "Would write" if dry_run else "Wrote"
        self.stdout.write(
            self.style.SUCCESS(
                f"{verb} {out} ({plan.role} {plan.node_id!r}) and {len(written)} model "
                f"config(s); {len(kept)} kept."
            )
        )

    def _report_models(self, scan: Scan, written: int, kept: int, max_context: int) -> None:
        self.stdout.write(f"{len(scan.models)} model(s) found: {written} written, {kept} kept.")
        for found in scan.models:
            self.stdout.write(f"  {found.local_id}: {_describe(found, max_context)}")
        for path, reason in scan.skipped:
            self.stdout.write(f"  skipped {path}: {reason}")
        for path in scan.unpaired:
            self.stdout.write(
                f"  vision projector {path} matches no model: add it to its model's "
                'config as "mmproj"'
            )

    def _report_next(self, plan: NodePlan, out: Path, join: Join | None) -> None:
        for family, found in plan.binaries.items():
            shown = found or "not found on PATH (left commented out)"
            self.stdout.write(f"{BINARIES[family]}: {shown}")
        if plan.role != "standalone":
            self.stdout.write(
                f"The other nodes reach this one at {plan.public_url} "
                "(--public-url if they reach it by another address)."
            )
        start = shlex.join([sys.executable, str(MANAGE_PY), "runrouter", "--config", str(out)])
        if plan.role == "master":
            code = join_encode(Join(plan.public_url, plan.token, _read_ca(plan.ca_file)))
            self.stdout.write("Join string for the slaves (it holds the cluster token):")
            self.stdout.write(f"  {code}")
            self.stdout.write("On each slave machine, write its config with:")
            slave = ["python", "manage.py", "init_node", "--role", "slave", "--join", code]
            self.stdout.write(
                "  " + shlex.join([*slave, "--out", "config.yaml", "--models-dir", "MODELS"])
            )
            self.stdout.write(
                "Each prints a line to add under cluster.slave_urls in this file; then "
                "restart this node."
            )
        elif plan.role == "slave":
            self.stdout.write(
                "On the master, add this line under `slave_urls:` in its config, then restart it:"
            )
            self.stdout.write(f"    - {plan.public_url}")
        self.stdout.write("Start this node with:")
        self.stdout.write(f"  {start}")


def _join(options: dict[str, Any]) -> Join | None:
    role, text = options["role"], options.get("join")
    if role != "slave":
        if text:
            raise CommandError("--join is for --role slave only")
        return None
    if not text:
        raise CommandError(
            "--role slave needs --join (the string `init_node --role master` printed)"
        )
    try:
        return join_decode(text)
    except JoinError as exc:
        raise CommandError(f"--join {exc}") from None


def _read_ca(path: str) -> str | None:
    if not path:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"--ca-file: {path} cannot be read ({exc})") from None
    if "BEGIN CERTIFICATE" not in text:
        raise CommandError(f"--ca-file: {path} holds no PEM certificate")
    return text


def _addresses(options: dict[str, Any], join: Join | None) -> tuple[str, str]:
    bind = options.get("bind") or DEFAULT_BIND[options["role"]]
    try:
        split_bind(bind)
    except ValueError as exc:
        raise CommandError(f"--bind {exc}") from None
    public_url = options.get("public_url") or default_public_url(
        bind, master_url=join.url if join else ""
    )
    problem = url_problem(public_url)
    if problem:
        raise CommandError(f"--public-url {problem}")
    return bind, public_url


def _plan(options: dict[str, Any], join: Join | None) -> tuple[NodePlan, dict[str, str]]:
    """The node's settings, and the files beside the config they name (name: content)."""
    role = options["role"]
    if options.get("ca_file") and role != "master":
        raise CommandError("--ca-file is for --role master (a slave takes it from --join)")
    if options["max_context"] < 0:
        raise CommandError("--max-context must be 0 (as trained) or more")
    bind, public_url = _addresses(options, join)
    files: dict[str, str] = {}
    ca_file = ""
    if join is not None and join.ca_pem:
        files[CA_FILE_NAME] = join.ca_pem
        ca_file = f"./{CA_FILE_NAME}"
    elif options.get("ca_file"):
        _read_ca(options["ca_file"])
        ca_file = str(Path(options["ca_file"]).expanduser().absolute())
    plan = NodePlan(
        role=role,
        node_id=options.get("node_id") or default_node_id(),
        bind=bind,
        public_url=public_url,
        token=join.token if join is not None else new_secret(),
        inference_key=new_secret(),
        admin_key=new_secret(),
        master_url=join.url if join is not None else "",
        ca_file=ca_file,
        binaries=find_binaries(),
    )
    return plan, files


def _scan(options: dict[str, Any]) -> Scan:
    if not options.get("models_dir"):
        return Scan(models=[], skipped=[], unpaired=[])
    models_dir = Path(options["models_dir"]).expanduser().absolute()
    if not models_dir.is_dir():
        raise CommandError(f"--models-dir: {models_dir} is not a directory")
    return scan_models(models_dir)


def _write(out: Path, text: str, files: dict[str, str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    (out.parent / MODELS_SUBDIR).mkdir(exist_ok=True)
    for name, content in files.items():
        (out.parent / name).write_text(content, encoding="utf-8")
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, CONFIG_FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    # O_CREAT's mode does not apply to a file that was there (--force): set it either way.
    out.chmod(CONFIG_FILE_MODE)


def _describe(found: Found, max_context: int) -> str:
    if found.sim:
        return f"simulated backend ({found.path.name})"
    trained = found.context_length or 0
    context = min(trained, max_context) if max_context else trained
    parts = [f"context {context}" + (f" (trained {trained})" if context < trained else "")]
    if found.embeds:
        parts.append("embeddings only (its header pools its output)")
    elif found.has_chat_template:
        parts.append("chat template")
    else:
        parts.append("no chat template (base model?)")
    if found.mmproj is not None:
        parts.append(f"vision ({found.mmproj.name})")
    return ", ".join(parts)
