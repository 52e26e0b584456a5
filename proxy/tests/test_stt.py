"""Selector-less STT scheduling: the tiers and the round-robin among equals."""

from __future__ import annotations

from typing import Any

from proxy import work
from proxy.families.voice import stt
from registry.cluster import Replica


def replica(node: str, filename: str, *, local: bool = False) -> Replica:
    cfg: Any = object() if local else None
    return Replica(
        f"{filename}-pub",
        node,
        filename,
        f"http://{node}",
        True,
        {"filename": filename, "has_voice": True},
        cfg,
    )


def cand(
    node: str,
    filename: str,
    *,
    active: int = 0,
    queued: int = 0,
    loaded: str = "",
    local: bool = False,
) -> stt._Candidate:
    status = {"node_id": node, "active_requests": active, "queued_requests": queued}
    if loaded:
        status["active_stt_config_filename"] = loaded
    return stt._Candidate(replica(node, filename, local=local), status)


def test_a_loaded_local_config_wins_even_when_the_node_is_busy() -> None:
    local = [cand("me", "w.kcpps", active=5, loaded="w.kcpps", local=True)]
    remote = [cand("r1", "w.kcpps", loaded="w.kcpps")]
    assert stt.choose(local, remote) is local[0]


def test_then_a_loaded_remote_config_with_the_least_work() -> None:
    local = [cand("me", "w.kcpps", active=1, local=True)]
    remote = [
        cand("r1", "w.kcpps", active=3, loaded="w.kcpps"),
        cand("r2", "w.kcpps", active=1, loaded="w.kcpps"),
        cand("r3", "w.kcpps"),
    ]
    assert node_of(stt.choose(local, remote)) == "r2"


def test_then_any_wholly_idle_node_then_a_local_queue_then_the_shortest_remote_queue() -> None:
    busy_local = [cand("me", "w.kcpps", active=2, local=True)]
    idle = cand("r3", "w.kcpps")
    assert stt.choose(busy_local, [cand("r1", "w.kcpps", active=1), idle]) is idle
    # nobody idle: the local node queues it (any role, not only a master)
    assert stt.choose(busy_local, [cand("r1", "w.kcpps", active=1)]) is busy_local[0]
    short = cand("r2", "w.kcpps", active=4, queued=1)
    assert stt.choose([], [cand("r1", "w.kcpps", active=1, queued=3), short]) is short
    assert stt.choose([], []) is None


def node_of(picked: stt._Candidate | None) -> str:
    assert picked is not None
    return picked.replica.node_id


def test_equal_candidates_rotate() -> None:
    picks = {
        node_of(stt.choose([], [cand("a", "w.kcpps"), cand("b", "w.kcpps")])) for _ in range(4)
    }
    assert picks == {"a", "b"}


def test_a_reservation_counts_as_work_so_concurrent_picks_spread() -> None:
    stt._reserved["a"] += 1
    try:
        assert node_of(stt.choose([], [cand("a", "w.kcpps"), cand("b", "w.kcpps")])) == "b"
    finally:
        stt._reserved["a"] -= 1


def test_the_model_field_of_a_multipart_upload_is_renamed() -> None:
    body = (
        b'--x\r\nContent-Disposition: form-data; name="model"\r\n\r\nears-2\r\n'
        b'--x\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
        b"RIFF\r\n--x--\r\n"
    )
    out = work.replace_multipart_model(body, "ears-2", "ears")
    assert b'name="model"\r\n\r\nears\r\n' in out and out.endswith(b"RIFF\r\n--x--\r\n")
    assert work.replace_multipart_model(body, "other", "ears") == body
