"""Oversized uploads against a node's front door: what do they cost the router?

Starts a real node (`runrouter`, simulated backend) with inference and admin keys and
`server.max_body_bytes: 1 MiB`, then sends four concurrent 400 MB uploads from raw sockets, two
with `Content-Length` and two chunked, as fast as loopback allows; each attacker also reads
what the node answers. Round one carries no key (the node must answer 401 before reading the
body); round two carries a valid inference key (413 at the header for a declared length, once
past the limit for a chunked body). Meanwhile the router's RSS is sampled.

Target: RSS growth (peak during the attack minus before) at most 20 MB.

Prints a table and, last, one JSON line. Run: `.venv/bin/python bench/attack.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)
# ruff: noqa: E402  (the path fix above must run before these imports)

import argparse
import json
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass

from tests.harness import start_node, text_model

KEY = "bench-attack-inference-key"
ADMIN = "bench-attack-admin-key"
LIMIT = 1 << 20
TARGET_GROWTH_MB = 20.0
BLOCK = b"x" * (1 << 20)
ANSWER_TIMEOUT_SECS = 30.0


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


@dataclass
class Attack:
    kind: str
    keyed: bool
    status: int = 0
    answer_ms: float = 0.0
    sent: int = 0


def _head(chunked: bool, size: int, keyed: bool) -> bytes:
    lines = [
        b"POST /v1/chat/completions HTTP/1.1",
        b"Host: 127.0.0.1",
        b"Content-Type: application/json",
    ]
    if keyed:
        lines.append(b"Authorization: Bearer " + KEY.encode())
    lines.append(b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % size)
    return b"\r\n".join(lines) + b"\r\n\r\n"


def attack(port: int, result: Attack, size: int) -> None:
    chunked = result.kind == "chunked"
    sock = socket.create_connection(("127.0.0.1", port))
    answer = bytearray()
    started = time.monotonic()

    def read() -> None:
        sock.settimeout(ANSWER_TIMEOUT_SECS)
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    return
                if not answer:
                    result.answer_ms = (time.monotonic() - started) * 1000
                answer.extend(data)
        except OSError:
            return

    reader = threading.Thread(target=read)
    reader.start()
    try:
        sock.sendall(_head(chunked, size, result.keyed))
        frame = b"%x\r\n" % len(BLOCK) + BLOCK + b"\r\n" if chunked else BLOCK
        while result.sent < size:
            sock.sendall(frame)
            result.sent += len(BLOCK)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the node closed the connection: what we wanted
    reader.join(ANSWER_TIMEOUT_SECS)
    sock.close()
    if answer.startswith(b"HTTP/1.1 "):
        result.status = int(answer[9:12])


def run_round(port: int, pid: int, keyed: bool, size: int) -> tuple[list[Attack], int]:
    attacks = [Attack(kind, keyed) for kind in ("length", "length", "chunked", "chunked")]
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_bytes(pid))
            done.wait(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    threads = [threading.Thread(target=attack, args=(port, a, size)) for a in attacks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    sampler.join()
    return attacks, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=400, help="size of each upload in MB")
    args = parser.parse_args()
    size = args.mb * 1_000_000
    root = Path(tempfile.mkdtemp(prefix="bench-attack-"))
    node = start_node(
        root,
        [text_model("alpha")],
        server={"max_body_bytes": LIMIT},
        auth={"inference_keys": [KEY], "admin_keys": [ADMIN]},
    )
    try:
        pid = node.proc.pid
        before = rss_bytes(pid)
        rows: list[tuple[str, Attack]] = []
        peak = before
        for label, keyed in (("no key", False), ("valid key", True)):
            attacks, round_peak = run_round(node.port, pid, keyed, size)
            peak = max(peak, round_peak)
            rows += [(label, a) for a in attacks]
        after = rss_bytes(pid)
    finally:
        node.cleanup()
        shutil.rmtree(root, ignore_errors=True)
    growth_mb = (peak - before) / 1e6
    print(f"{'round':<11}{'body':<9}{'status':>7}{'answer ms':>11}{'MB sent':>10}")
    for label, a in rows:
        print(f"{label:<11}{a.kind:<9}{a.status:>7}{a.answer_ms:>11.1f}{a.sent / 1e6:>10.1f}")
    print(
        f"router RSS before {before / 1e6:.1f} MB, peak {peak / 1e6:.1f} MB, "
        f"after {after / 1e6:.1f} MB"
    )
    print(f"RSS growth {growth_mb:.1f} MB (target <= {TARGET_GROWTH_MB:g} MB)")
    expected = {("no key", "length"): 401, ("no key", "chunked"): 401}
    statuses_ok = all(a.status == expected.get((label, a.kind), 413) for label, a in rows)
    result = {
        "bench": "attack",
        "uploads_mb": args.mb,
        "limit_bytes": LIMIT,
        "rss_before_mb": round(before / 1e6, 1),
        "rss_peak_mb": round(peak / 1e6, 1),
        "rss_growth_mb": round(growth_mb, 1),
        "statuses": [a.status for _, a in rows],
        "max_mb_sent": round(max(a.sent for _, a in rows) / 1e6, 1),
        "pass": statuses_ok and growth_mb <= TARGET_GROWTH_MB,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
