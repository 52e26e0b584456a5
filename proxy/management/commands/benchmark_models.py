"""`manage.py benchmark_models [--models a,b]`: calibrate this node's models, so that lending
can price them from the first burst.

Scope: the running router of this machine's config (`server.bind`), and only its own models
(all enabled text and image models when `--models` is omitted). It asks the router
(`POST /router/v1/benchmarks/run`, with the first of `auth.admin_keys`, or `$ROUTER_ADMIN_KEY`)
to run the calibration, waits for it, and prints one row per model and lane: requests sent,
the measured load and the cost fit. The router keeps each result in
`<store_dir>/benchmarks/<model>-<UTC time>.json`. Running it again measures again (new
rows, a new file). `--dry-run` only prints what it would ask; it never prompts. Exits 1 when a
model could not be fitted.
"""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.request
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from proxy.management.commands.healthcheck import probe_url

ROUTE = "/router/v1/benchmarks"
RUN_ROUTE = "/router/v1/benchmarks/run"
CALL_TIMEOUT_SECS = 30.0
POLL_SECS = 0.5
DEFAULT_WAIT_SECS = 1800.0


def _tls() -> ssl.SSLContext | None:
    server = settings.ROUTER.server
    if server.tls_cert_file is None:
        return None
    ca = settings.ROUTER.cluster.tls_ca_file
    context = ssl.create_default_context(cafile=str(ca) if ca else None)
    # Loopback is an address the node's certificate need not name; the CA still vouches for it.
    context.check_hostname = False
    return context


def _admin_key() -> str | None:
    keys = settings.ROUTER.auth.admin_keys
    return os.environ.get("ROUTER_ADMIN_KEY") or (keys[0] if keys else None)


def call(method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """One call to this node's management API; (status, decoded JSON)."""
    headers = {"Content-Type": "application/json"}
    key = _admin_key()
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(probe_url(path), data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=CALL_TIMEOUT_SECS, context=_tls()) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"error": {"message": raw[:200].decode("utf-8", "replace")}}
    except (OSError, urllib.error.URLError) as exc:
        raise CommandError(f"{probe_url(path)}: {exc}") from exc


def _refusal(status: int, doc: Any) -> CommandError:
    err = doc.get("error") if isinstance(doc, dict) else None
    message = err.get("message") if isinstance(err, dict) else doc
    return CommandError(f"the router answered {status}: {message}")


def _fit_text(fit: dict[str, Any] | None) -> str:
    if fit is None:
        return "no fit"
    slopes = ", ".join(f"{slope:.3g}" for slope in fit["slopes_ms"])
    kind = " (uniform)" if fit.get("uniform_work") else ""
    return f"{fit['base_ms']:.1f} ms + [{slopes}] x work, {fit['samples']} samples{kind}"


def table(results: list[dict[str, Any]]) -> list[str]:
    """One line per model and lane."""
    lines = [f"{'model':<24} {'lane':<6} {'sent':>5} {'ok':>4} {'load ms':>9}  fit"]
    for result in results:
        if "error" in result:
            lines.append(f"{result['model']:<24} failed: {result['error']}")
            continue
        for lane in result["lanes"]:
            load = "-" if lane["load_ms"] is None else f"{lane['load_ms']:.0f}"
            lines.append(
                f"{result['model']:<24} {lane['lane']:<6} {lane['requests']:>5} "
                f"{lane['ok']:>4} {load:>9}  {_fit_text(lane['fit'])}"
            )
        lines.append(f"{'':<24} -> {result['file']}")
    return lines


class Command(BaseCommand):
    help = "Calibrate this node's models (requests of varying sizes and a load) for lending."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--models", help="comma-separated local model IDs (default: all)")
        parser.add_argument("--config", help="config file (read by manage.py)")
        parser.add_argument(
            "--wait", type=float, default=DEFAULT_WAIT_SECS, help="seconds to wait at most"
        )
        parser.add_argument("--dry-run", action="store_true", help="Print the call; send nothing.")
        parser.add_argument(
            "--no-input", action="store_true", help="Accepted for uniformity; never prompts."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        models = [m.strip() for m in (options["models"] or "").split(",") if m.strip()] or None
        body: dict[str, Any] = {} if models is None else {"models": models}
        if options["dry_run"]:
            self.stdout.write(f"would POST {probe_url(RUN_ROUTE)} {json.dumps(body)}")
            return
        status, doc = call("POST", RUN_ROUTE, body)
        if status != 202:
            raise _refusal(status, doc)
        wanted = set(doc.get("pending", [])) | ({doc["current"]} if doc.get("current") else set())
        names = ", ".join(sorted(wanted))
        self.stdout.write(f"benchmarking {len(wanted)} model(s) on {doc['node_id']}: {names}")
        doc = self._wait(options["wait"])
        results = [r for r in doc["results"] if r["model"] in wanted]
        for line in table(results):
            self.stdout.write(line)
        fitted = {r["model"] for r in results if "error" not in r and r.get("fitted")}
        missing = sorted(wanted - fitted)
        if missing:
            raise CommandError(f"not fitted: {', '.join(missing)}")
        self.stdout.write(self.style.SUCCESS(f"{len(results)} model(s) benchmarked and fitted"))

    def _wait(self, wait_secs: float) -> dict[str, Any]:
        deadline = time.monotonic() + wait_secs
        while True:
            status, doc = call("GET", ROUTE)
            if status != 200:
                raise _refusal(status, doc)
            if not doc["running"]:
                return dict(doc)
            if time.monotonic() > deadline:
                raise CommandError(f"still running after {wait_secs:g}s: {doc['current']}")
            time.sleep(POLL_SECS)
