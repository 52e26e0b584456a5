"""Slow clients against a node: do legitimate requests still get through?

Starts a real node (`runrouter`, simulated backend, default front-door settings) from a process
whose soft open-file limit is 1,024, the common default. Then 1,100 connections from
127.0.0.1 each send a request line and trickle one header byte every 2 s; while they hold on,
90 legitimate requests from 127.0.0.2 (another loopback address) ask for `/v1/models`.

Targets: 90 of 90 legitimate requests answered 200; every slow connection answered (429 past
the per-address cap, 408 at the header timeout) and closed within the header timeout plus a
margin; none left open. Prints a table and, last, one JSON line.
Run: `.venv/bin/python bench/slowclients.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)
# ruff: noqa: E402  (the path fix above must run before these imports)

import argparse
import asyncio
import json
import resource
import shutil
import tempfile
import time
from collections import Counter

import httpx

from tests.harness import start_node, text_model

TRICKLE_EVERY_SECS = 2.0
COMMON_SOFT_LIMIT = 1024
HEADER_TIMEOUT_SECS = 10.0  # the default of server.header_timeout
CLOSE_MARGIN_SECS = 5.0

Outcome = list[tuple[str, float]]


async def slow_client(port: int, outcome: Outcome) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        outcome.append((f"connect failed: {exc.__class__.__name__}", 0.0))
        return
    opened = time.monotonic()
    writer.write(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    status = "still open"
    deadline = opened + HEADER_TIMEOUT_SECS + 2 * CLOSE_MARGIN_SECS
    while time.monotonic() < deadline:
        try:
            writer.write(b"X")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(256), TRICKLE_EVERY_SECS)
        except TimeoutError:
            continue
        except OSError:
            # Closed by the node before this client (starved among a thousand) read the answer.
            status = "reset"
            break
        status = answer[9:12].decode() if answer.startswith(b"HTTP/1.1 ") else "closed"
        break
    outcome.append((status, time.monotonic() - opened))
    writer.close()


async def legit(port: int, n: int) -> Counter[str]:
    transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with httpx.AsyncClient(transport=transport, timeout=30.0) as client:

        async def one() -> str:
            try:
                answer = await client.get(f"http://127.0.0.1:{port}/v1/models")
            except httpx.HTTPError as exc:
                return exc.__class__.__name__
            return str(answer.status_code)

        return Counter(await asyncio.gather(*(one() for _ in range(n))))


async def attack(port: int, slow: int, n_legit: int) -> tuple[Outcome, Counter[str]]:
    outcome: Outcome = []
    tasks = [asyncio.create_task(slow_client(port, outcome)) for _ in range(slow)]
    # Let the slow connections get in first, as they would in an attack under way.
    await asyncio.sleep(1.0)
    answers = await legit(port, n_legit)
    await asyncio.gather(*tasks)
    return outcome, answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--slow", type=int, default=1100)
    parser.add_argument("--legit", type=int, default=90)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    root = Path(tempfile.mkdtemp(prefix="bench-slow-"))
    # The node inherits the common limit; the front door must raise it itself.
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(COMMON_SOFT_LIMIT, hard), hard))
    try:
        node = start_node(root, [text_model("alpha")])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    try:
        limits = Path(f"/proc/{node.proc.pid}/limits").read_text()
        row = next(r for r in limits.splitlines() if r.startswith("Max open files"))
        node_soft = row.split()[3]
        outcome, answers = asyncio.run(attack(node.port, args.slow, args.legit))
    finally:
        node.cleanup()
        shutil.rmtree(root, ignore_errors=True)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    statuses = Counter(status for status, _ in outcome)
    slowest_close = max((secs for _, secs in outcome), default=0.0)
    ok = answers.get("200", 0)
    print(f"node open-file limit: {node_soft} (started under {COMMON_SOFT_LIMIT})")
    print(f"{'who':<26}{'answer':<28}{'count':>7}")
    for status, count in sorted(statuses.items()):
        print(f"{'slow connection':<26}{status:<28}{count:>7}")
    for status, count in sorted(answers.items()):
        print(f"{'legitimate request':<26}{status:<28}{count:>7}")
    print(f"slowest slow connection closed after {slowest_close:.1f} s")
    result = {
        "bench": "slowclients",
        "slow_connections": args.slow,
        "legit_requests": args.legit,
        "legit_ok": ok,
        "slow_answers": dict(statuses),
        "slowest_close_secs": round(slowest_close, 1),
        "node_nofile_soft": int(node_soft) if node_soft.isdigit() else node_soft,
        "pass": ok == args.legit
        and set(statuses) <= {"408", "429", "reset", "closed"}
        and slowest_close <= HEADER_TIMEOUT_SECS + CLOSE_MARGIN_SECS,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
