"""Peer transfer of a model asset between two real nodes on loopback.

Starts a master holding one model whose weights file is `--mib` MiB, exports its config in
portable form, installs that on a slave, and asks the slave to resolve it: the slave finds the
file through the master and streams it into its shared dir (resumable, size- and
SHA-256-checked, renamed into place). Reports the copy's throughput (from the start of the
resolution to the verified file in place), the growth of each router's resident memory while
the copy runs (sampled every 20 ms from /proc; the job is polled every 100 ms), and each
router's CPU seconds per GiB.

Targets: at least 300 MB/s, and at most 50 MB of RSS growth on either router.

Prints a table and, last, one JSON line. Run: `.venv/bin/python bench/assets.py [--mib 1024]`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

# Run as a script, bench/ is first on sys.path, and bench/queue.py would shadow the standard
# library's `queue`: swap that entry for the repository root.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# ruff: noqa: E402  (imports below need the path fix above)

from tests.harness import Cluster, start_cluster, wait_for

MIB = 1024 * 1024
GIB = 1024 * MIB
SITE = "/router/v1/site/model-assets"
TARGET_MB_S = 300.0
TARGET_RSS_MB = 50.0


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def write_weights(path: Path, size: int) -> str:
    header = json.dumps({"load_ms": 20, "base_ms": 5, "output_ms_per_token": 1}).encode()
    digest = hashlib.sha256(header)
    block = b" " * (8 * MIB)
    with path.open("wb") as handle:
        handle.write(header)
        left = size - len(header)
        while left > 0:
            part = block[: min(len(block), left)]
            handle.write(part)
            digest.update(part)
            left -= len(part)
    return digest.hexdigest()


def run(root: Path, size: int) -> dict[str, float]:
    master_kcpps = root / "master" / "store" / "kcpps"
    master_kcpps.mkdir(parents=True)
    weights = root / "weights.sim.json"
    digest = write_weights(weights, size)
    config = {"backend_mode": "sim", "model_param": str(weights)}
    (master_kcpps / "big.kcpps").write_text(json.dumps(config))
    cluster: Cluster = start_cluster(root, [], {"s1": []})
    try:
        with cluster.master.client(timeout=600) as client:
            exported = client.post(f"{SITE}/export", json={"id": "big"})  # hashes on the master
            exported.raise_for_status()
            slave_store = cluster.slaves["s1"].store
            portable = exported.json()["config"]
            (slave_store / "kcpps" / "big-copy.kcpps").write_text(json.dumps(portable))
            cluster.restart_slave("s1")
            cluster.wait_healthy("s1")
            sender, receiver = cluster.master.proc.pid, cluster.slaves["s1"].proc.pid
            rss0 = {sender: rss_bytes(sender), receiver: rss_bytes(receiver)}
            peak = dict(rss0)
            cpu0 = {sender: cpu_seconds(sender), receiver: cpu_seconds(receiver)}
            sampling = threading.Event()

            def sample() -> None:
                # /proc reads cost the routers nothing, unlike asking them for their state.
                while not sampling.is_set():
                    for pid in peak:
                        peak[pid] = max(peak[pid], rss_bytes(pid))
                    sampling.wait(0.02)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            started = time.monotonic()
            answer = client.post(f"{SITE}/resolve", json={"node_id": "s1", "id": "big-copy"})
            answer.raise_for_status()
            job_id = answer.json()["id"]

            def finished() -> bool:
                job = client.get(f"{SITE}/jobs/{job_id}", params={"node_id": "s1"}).json()
                if job["state"] == "failed":
                    raise RuntimeError(job["error"])
                return bool(job["state"] == "done")

            wait_for(finished, timeout=600, interval=0.1)
            elapsed = time.monotonic() - started
            sampling.set()
            sampler.join()
            cpu1 = {sender: cpu_seconds(sender), receiver: cpu_seconds(receiver)}
        copy = slave_store / "model-assets" / "sha256" / digest[:2] / digest / weights.name
        if copy.stat().st_size != size:
            raise RuntimeError("the copy has the wrong size")
        gib = size / GIB
        return {
            "bytes": size,
            "seconds": elapsed,
            "mb_per_s": size / elapsed / 1e6,
            "receiver_rss_growth_mb": (peak[receiver] - rss0[receiver]) / 1e6,
            "sender_rss_growth_mb": (peak[sender] - rss0[sender]) / 1e6,
            "receiver_cpu_s_per_gib": (cpu1[receiver] - cpu0[receiver]) / gib,
            "sender_cpu_s_per_gib": (cpu1[sender] - cpu0[sender]) / gib,
        }
    finally:
        cluster.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="asset size in MiB")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-assets-") as tmp:
        result = run(Path(tmp), args.mib * MIB)
    ok = (
        result["mb_per_s"] >= TARGET_MB_S
        and max(result["receiver_rss_growth_mb"], result["sender_rss_growth_mb"]) <= TARGET_RSS_MB
    )
    print(f"{'measure':<28}{'value':>12}  target")
    print(f"{'asset size (MiB)':<28}{result['bytes'] / MIB:>12.0f}")
    print(f"{'copy time (s)':<28}{result['seconds']:>12.2f}")
    print(f"{'throughput (MB/s)':<28}{result['mb_per_s']:>12.1f}  >= {TARGET_MB_S:.0f}")
    for side in ("receiver", "sender"):
        print(f"{side + ' RSS growth (MB)':<28}{result[side + '_rss_growth_mb']:>12.1f}  <= 50")
        print(f"{side + ' CPU s per GiB':<28}{result[side + '_cpu_s_per_gib']:>12.2f}")
    print(json.dumps({"bench": "assets", **result, "ok": ok}))


if __name__ == "__main__":
    main()
