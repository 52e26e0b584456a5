"""Failover figures on real loopback clusters (`runrouter` processes, simulated backends).

outage   two slaves hold replicas of one model, the master polls at the default 15 s; one slave
         is SIGKILLed for 10 s while 4 clients send through the master: how many fail.
frozen   one slave is SIGSTOPped, then another is SIGKILLed (polls every 1 s, 3 s deadline):
         how long until the master marks the killed one down, how long a request for the
         frozen slave's model takes to get its answer, and how long a stream it was sending
         takes to end once it froze.

    .venv/bin/python -m bench.failover

Prints a table, then one JSON line.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.harness import Cluster, ModelSpec, sim_weights, start_cluster

OUTAGE_SECS = 10.0
CLIENTS = 4


def _model(name: str, per_token_ms: int = 5) -> ModelSpec:
    weights = sim_weights(load_ms=50, base_ms=5, output_ms_per_token=per_token_ms)
    return ModelSpec(name, {"contextsize": 4096, "parallel": 1}, {"model_param": weights})


def _chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "x"}], **extra}


def _nodes(c: Cluster) -> dict[str, dict[str, Any]]:
    state = httpx.get(c.master.base_url + "/router/v1/site/nodes/state", timeout=30).json()
    return {n["node_id"]: n for n in state["cluster"]["nodes"]}


def outage(root: Path) -> dict[str, Any]:
    c = start_cluster(
        root, [], {"s1": [_model("twin")], "s2": [_model("twin")]}, health_interval="15s"
    )
    try:
        url = c.master.base_url + "/v1/chat/completions"
        for _ in range(4):
            httpx.post(url, json=_chat("twin"), timeout=30).raise_for_status()
        results: list[int] = []
        stop = threading.Event()

        def client() -> None:
            with httpx.Client(timeout=60) as http:
                while not stop.is_set():
                    try:
                        results.append(http.post(url, json=_chat("twin", max_tokens=4)).status_code)
                    except httpx.HTTPError:
                        results.append(0)

        threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
        os.killpg(c.slaves["s1"].proc.pid, signal.SIGKILL)
        for t in threads:
            t.start()
        stop.wait(OUTAGE_SECS)
        stop.set()
        for t in threads:
            t.join()
        failed = sum(1 for s in results if s != 200)
        return {"requests": len(results), "failed": failed}
    finally:
        c.cleanup()


def frozen(root: Path) -> dict[str, Any]:
    c = start_cluster(
        root,
        [],
        {"s1": [_model("solo1", per_token_ms=50)], "s2": [_model("solo2")]},
        health_interval="1s",
        master_sections={"cluster": {"health_timeout": "3s"}},
    )
    s1 = c.slaves["s1"]
    try:
        url = c.master.base_url + "/v1/chat/completions"
        httpx.post(url, json=_chat("solo1"), timeout=30).raise_for_status()
        with httpx.Client(timeout=120) as http:
            body = _chat("solo1", stream=True, max_tokens=400)
            with http.stream("POST", url, json=body) as stream:
                lines = stream.iter_lines()
                next(ln for ln in lines if ln.startswith("data: {"))
                os.killpg(s1.proc.pid, signal.SIGSTOP)
                frozen_at = time.monotonic()
                for _ in lines:
                    pass
                stream_end = time.monotonic() - frozen_at
        os.killpg(c.slaves["s2"].proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        while _nodes(c)["s2"]["healthy"]:
            time.sleep(0.05)  # sampling the master's view, not waiting on a condition
        marked_down = time.monotonic() - killed_at
        sent = time.monotonic()
        answer = httpx.post(url, json=_chat("solo1"), timeout=120)
        answered = time.monotonic() - sent
        return {
            "stream_end_s": round(stream_end, 2),
            "killed_marked_down_s": round(marked_down, 2),
            "frozen_model_answer_s": round(answered, 3),
            "frozen_model_status": answer.status_code,
        }
    finally:
        os.killpg(s1.proc.pid, signal.SIGCONT)
        c.cleanup()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="router-failover-") as tmp:
        out = outage(Path(tmp) / "outage")
        fro = frozen(Path(tmp) / "frozen")
    print(f"{'figure':<58} {'value':>10}")
    print(f"{'outage: requests through the master during 10 s':<58} {out['requests']:>10}")
    print(f"{'outage: failed (a healthy replica was there)':<58} {out['failed']:>10}")
    print(f"{'frozen: stream from the frozen slave ends after (s)':<58} {fro['stream_end_s']:>10}")
    print(f"{'frozen: killed slave marked down after (s)':<58} {fro['killed_marked_down_s']:>10}")
    label = f"frozen: a request for its model answered {fro['frozen_model_status']} after (s)"
    print(f"{label:<58} {fro['frozen_model_answer_s']:>10}")
    print(json.dumps({"bench": "failover", "outage": out, "frozen": fro}))


if __name__ == "__main__":
    main()
