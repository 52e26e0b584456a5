"""Stored-key check cost at the front door, in process: a Gate with 10,000 stored keys.

Measures, per request head, what the node's key rule costs (`Gate.key_refusal` on a client
path, which the front door runs on every request and the ASGI app runs again to record the
caller): with a stored key (one SHA-256 and a dict lookup, whatever the number of keys), with
a config-file key (`auth.inference_keys`), and with an unknown key (refused). Target: a stored
key adds at most 20 µs per request. Run: `.venv/bin/python bench/keys.py [--keys 10000]`.
Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as `python bench/keys.py`, this file's folder comes first on sys.path, where the sibling
# `queue.py` would shadow the standard library's `queue`.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

# ruff: noqa: E402  (the path fix above must run before these imports)

import argparse
import json
import os
import random
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerproject.settings")
REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("ROUTER_CONFIG", str(REPO / "tests" / "config.test.yaml"))

import django

django.setup()

import yaml

from access.keys import KeyRecord, KeyTable, new_secret, secret_hash
from proxy.edge.gate import Gate
from routerproject.config import load_config

CONFIG_KEY = "sk-bench-config-key-0123456789"
TARGET_US = 20.0
PATH = "/v1/chat/completions"


def gate_with(keys: KeyTable) -> Gate:
    root = Path(tempfile.mkdtemp(prefix="bench-keys-"))
    (root / "kcpps").mkdir()
    doc = {
        "cluster": {"node_id": "bench", "store_dir": str(root / "store")},
        "models": {"config_dir": str(root / "kcpps")},
        "auth": {"inference_keys": [CONFIG_KEY]},
    }
    (root / "config.yaml").write_text(yaml.safe_dump(doc))
    return Gate(load_config(root / "config.yaml", environ={}), keys=lambda: keys)


def per_call_us(check: Callable[[], object], rounds: int) -> float:
    """The median over five runs of `rounds` calls, in µs per call."""
    runs = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(rounds):
            check()
        runs.append((time.perf_counter_ns() - t0) / rounds / 1000.0)
    return sorted(runs)[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=10_000, help="stored keys in the table")
    parser.add_argument("--rounds", type=int, default=50_000, help="calls per timed run")
    args = parser.parse_args()

    secrets = [new_secret() for _ in range(args.keys)]
    t0 = time.perf_counter()
    table = KeyTable(
        KeyRecord(name=f"k{i}", key_hash=secret_hash(s)) for i, s in enumerate(secrets)
    )
    build_ms = (time.perf_counter() - t0) * 1000.0
    gate = gate_with(table)

    # A different stored key each call (round-robin over a shuffled sample), as many clients.
    sample = random.sample(secrets, min(1000, len(secrets)))
    heads = [{b"authorization": f"Bearer {s}".encode()} for s in sample]
    config_head = {b"authorization": f"Bearer {CONFIG_KEY}".encode()}
    unknown_head = {b"authorization": f"Bearer {new_secret()}".encode()}
    cursor = iter(range(1 << 62))

    def stored() -> object:
        head = heads[next(cursor) % len(heads)]
        return gate.key_refusal("POST", PATH, head.get)

    assert stored() is None
    assert gate.key_refusal("POST", PATH, config_head.get) is None
    assert gate.key_refusal("POST", PATH, unknown_head.get) is not None

    def baseline() -> object:
        # The same per-call work without any key rule: the head pick and the call overhead.
        head = heads[next(cursor) % len(heads)]
        return head.get(b"authorization")

    results = {
        "stored_key_us": per_call_us(stored, args.rounds),
        "config_key_us": per_call_us(
            lambda: gate.key_refusal("POST", PATH, config_head.get), args.rounds
        ),
        "unknown_key_us": per_call_us(
            lambda: gate.key_refusal("POST", PATH, unknown_head.get), args.rounds
        ),
        "caller_stored_us": per_call_us(
            lambda: gate.client_caller(heads[next(cursor) % len(heads)].get), args.rounds
        ),
        "baseline_us": per_call_us(baseline, args.rounds),
    }
    stored_over_config = results["stored_key_us"] - results["config_key_us"]
    print(f"{'check (one request head)':<34}{'µs/call':>10}")
    for label, key in (
        (f"stored key ({args.keys} in the table)", "stored_key_us"),
        ("config key (auth.inference_keys)", "config_key_us"),
        ("unknown key (refused)", "unknown_key_us"),
        ("caller only, stored key", "caller_stored_us"),
        ("no key rule (baseline)", "baseline_us"),
    ):
        print(f"{label:<34}{results[key]:>10.2f}")
    print(f"{'stored minus config':<34}{stored_over_config:>10.2f}")
    result = {
        "bench": "keys",
        "keys": args.keys,
        "table_build_ms": round(build_ms, 1),
        **{k: round(v, 3) for k, v in results.items()},
        "stored_minus_config_us": round(stored_over_config, 3),
        "targets": {"stored_key_us": TARGET_US},
        "pass": results["stored_key_us"] <= TARGET_US,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
