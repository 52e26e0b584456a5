"""The chaos soak's count (bench/chaos.py): completion logs read across the router's rotations,
numbered completion lines from the simulated backend, and what fails a run."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.chaos import (
    FAILURES,
    LOSS_GRACE_SECS,
    Record,
    Tally,
    percentile,
    reruns_after_loss,
    summarize,
)
from bench.chaos_logs import LINE_RE, CompletionLog
from proxy.runtimes.logfiles import rotate_if_large
from tests.harness import REPO, free_port, sim_weights, wait_for


def _log(root: Path) -> Path:
    path = root / "s1" / "store" / "logs" / "text-backend.log"
    path.parent.mkdir(parents=True)
    return path


def _append(path: Path, *lines: str) -> None:
    with open(path, "ab") as f:
        f.write("".join(f"{line}\n" for line in lines).encode())


def _done(seq: int, user: str, pid: int = 4242) -> str:
    return f"sim: completed /v1/chat/completions pid={pid} seq={seq} at=1000{seq} user={user}"


def test_lines_written_before_a_rotation_are_read_from_its_copy(tmp_path: Path) -> None:
    path = _log(tmp_path)
    log = CompletionLog(tmp_path)
    _append(path, "--- start sim", _done(1, "a"))
    log.poll()
    _append(path, _done(2, "b"), "x" * 2000)
    # The router's own rotation: copy to .1, truncate in place; the writer keeps appending.
    assert rotate_if_large(path, 1024, 2)
    _append(path, _done(3, "c"))
    log.poll()
    assert dict(log.runs) == {"a": 1, "b": 1, "c": 1}
    assert (log.rotations, log.torn, log.gaps()) == (1, 0, 0)


def test_a_line_lost_to_rotation_is_a_gap_and_a_reread_line_counts_once(tmp_path: Path) -> None:
    path = _log(tmp_path)
    log = CompletionLog(tmp_path)
    _append(path, "--- start sim", _done(1, "a"), _done(3, "c"))
    log.poll()
    log._files[path].offset = 0  # read it all again, as after a misread rotation
    log.poll()
    assert dict(log.runs) == {"a": 1, "c": 1}
    assert log.gaps() == 1


def test_a_new_backend_process_numbers_from_one_again(tmp_path: Path) -> None:
    path = _log(tmp_path)
    log = CompletionLog(tmp_path)
    _append(path, "--- start sim", _done(1, "a"), "--- start sim", _done(1, "a", pid=4343))
    log.poll()
    # The same request completed by two processes: it ran twice.
    assert log.runs["a"] == 2
    assert log.where["a"] == [("s1", 10001), ("s1", 10001)]
    assert log.gaps() == 0


def _tally(*records: tuple[str, str, float, float]) -> Tally:
    tally = Tally()
    for user, outcome, started, ended in records:
        tally.add(Record(user, outcome, "", started, ended))
    return tally


def test_a_200_that_never_ran_is_unran_and_fails_the_run() -> None:
    row = summarize(_tally(("u1", "200", 0.0, 1.0), ("u2", "200", 0.0, 1.0)), {"u1": 1}, [], set())
    assert row["unran"] == 1
    assert "unran" in FAILURES
    assert [e.split()[0] for e in row["examples"]["unran"]] == ["u2"]


def test_an_error_for_work_that_ran_is_wasted_not_a_failure() -> None:
    row = summarize(_tally(("u1", "error", 0.0, 1.0)), {"u1": 1}, [], set())
    assert (row["wasted"], row["error"]) == (1, 1)
    assert not any(row[k] for k in FAILURES)


def test_a_connection_broken_by_a_master_kill_is_cut_and_others_are_lost() -> None:
    tally = _tally(("u1", "lost", 9.0, 10.5), ("u2", "lost", 9.0, 14.0), ("u3", "lost", 11, 12))
    row = summarize(tally, {}, [10.0], set())
    assert (row["cut"], row["lost"]) == (1, 2)


def test_latency_percentiles_are_of_200s_nearest_rank() -> None:
    records = [(f"u{i}", "200", 0.0, i / 1000) for i in range(1, 101)]
    row = summarize(_tally(*records, ("slow", "error", 0.0, 9.0)), {}, [], set())
    assert (row["p50_ms"], row["p95_ms"], row["p99_ms"]) == (50, 95, 99)
    assert percentile([], 50) is None


@contextlib.contextmanager
def running_sim(tmp_path: Path, **costs: Any) -> Iterator[tuple[str, Path, int]]:
    """A simulated backend process: its URL, its output file and its pid."""
    weights = tmp_path / "m.sim.json"
    weights.write_text(json.dumps(sim_weights(load_ms=0, **costs)))
    port = free_port()
    out = tmp_path / "out.log"
    argv = [sys.executable, "-m", "proxy.sim", "-m", str(weights), "--port", str(port)]
    with open(out, "wb") as sink:
        proc = subprocess.Popen(argv, cwd=str(REPO), stdout=sink, env=dict(os.environ))
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(url + "/health", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(up, timeout=20, interval=0.05)
        yield url, out, proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_simulated_backend_numbers_its_completion_lines(tmp_path: Path) -> None:
    with running_sim(tmp_path) as (url, out, pid):
        for user in ("first", "second"):
            body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "user": user}
            assert httpx.post(url + "/v1/chat/completions", json=body).status_code == 200
        wait_for(lambda: out.read_text().count("sim: completed") == 2, timeout=10)
    found = [m.group(1, 2, 4) for m in LINE_RE.finditer(out.read_bytes())]
    assert found == [(str(pid).encode(), b"1", b"first"), (str(pid).encode(), b"2", b"second")]


@pytest.mark.parametrize("stream", [False, True])
def test_the_simulated_backend_stops_a_request_whose_client_hangs_up(
    tmp_path: Path, stream: bool
) -> None:
    # 200 tokens at 50 ms: 10 s of work, cut after it has started.
    with running_sim(tmp_path, output_ms_per_token=50) as (url, out, _pid):
        body = {
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 200,
            "user": "gone",
            "stream": stream,
        }
        raw = json.dumps(body).encode()
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            head = (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
            )
            sock.sendall(head.encode() + raw)
            wait_for(lambda: httpx.get(url + "/sim/stats").json()["active"] == 1, timeout=10)
        wait_for(lambda: "sim: cancelled" in out.read_text(), timeout=10)
        stats = httpx.get(url + "/sim/stats").json()
    assert (stats["active"], stats["completed"], stats["cancelled"]) == (0, 0, 1)
    assert "sim: completed" not in out.read_text()
    assert out.read_text().rstrip().endswith("user=gone")


def test_a_connection_opened_just_after_the_kill_signal_is_cut() -> None:
    row = summarize(_tally(("u1", "lost", 10.2, 10.3)), {}, [10.0], set())
    assert (row["cut"], row["lost"]) == (1, 0)


def test_a_request_taken_back_from_a_stalled_helper_that_ran_twice_is_named_so() -> None:
    tally = _tally(("u1", "200", 0.0, 1.0), ("u2", "200", 0.0, 1.0))
    row = summarize(tally, {"u1": 2, "u2": 2}, [], set(), {"u1"})
    # Still duplicated (a failure): the name only says where it came from.
    assert (row["duplicated"], row["dup_stalled"]) == (2, 1)


# s2 was lost (killed until restarted, or frozen past health_timeout) from 10 s to 14 s.
LOSSES = [("s2", 10.0, 14.0)]


def _runs(*runs: tuple[str, float]) -> list[tuple[str, int]]:
    return [(node, int(secs * 1000)) for node, secs in runs]


def test_work_a_lost_node_finished_and_another_ran_again_is_a_rerun_not_a_duplicate() -> None:
    where = {
        "frozen": _runs(("s2", 12.0), ("s1", 13.0)),  # finished as the frozen node resumed
        "killed": _runs(("s2", 10.0 - LOSS_GRACE_SECS + 0.1), ("s1", 11.0)),  # as it died
        "before": _runs(("s2", 10.0 - LOSS_GRACE_SECS - 0.1), ("s1", 11.0)),
        "twice_on_s1": _runs(("s1", 12.0), ("s1", 13.0)),
        "answered_before_the_loss": _runs(("s2", 12.0), ("s1", 8.0)),
        "three_runs": _runs(("s2", 12.0), ("s1", 13.0), ("s1", 13.5)),
        "once": _runs(("s2", 12.0)),
    }
    assert reruns_after_loss(where, LOSSES) == {"frozen", "killed"}
    assert reruns_after_loss(where, []) == set()


def test_work_a_backend_finished_as_it_was_killed_and_another_ran_again_is_a_rerun() -> None:
    # s1's backend was SIGKILLed at 214.3 s: a loss of no length.
    where = {
        "as_killed": _runs(("s1", 214.3), ("s2", 215.0)),
        "long_before": _runs(("s1", 214.3 - LOSS_GRACE_SECS - 0.1), ("s2", 215.0)),
    }
    assert reruns_after_loss(where, [("s1", 214.3, 214.3)]) == {"as_killed"}


def test_a_rerun_after_a_loss_is_its_own_column_and_fails_nothing() -> None:
    tally = _tally(("frozen", "200", 9.0, 13.0), ("twice", "200", 9.0, 13.0))
    row = summarize(tally, {"frozen": 2, "twice": 2}, [], set(), reruns={"frozen"})
    assert (row["duplicated"], row["rerun_loss"]) == (1, 1)
    assert [e.split()[0] for e in row["examples"]["duplicated"]] == ["twice"]
    assert [e.split()[0] for e in row["examples"]["rerun_loss"]] == ["frozen"]
    row = summarize(
        _tally(("frozen", "200", 9.0, 13.0)), {"frozen": 2}, [], set(), reruns={"frozen"}
    )
    assert not any(row[k] for k in FAILURES)
