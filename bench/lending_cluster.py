"""The benchmark's clusters: node layouts, simulated costs, warm-up and shared measurements.

A routing-only master (no models) and slaves on simulated backends, started with
``tests.harness.start_cluster``. The shared cluster holds every model the reusable scenarios
need; a scenario that kills or stops a node, or needs default settings, gets its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.lending_support import (
    IMAGE,
    IMAGE_PATH,
    TEXT,
    TEXT_PATH,
    ClusterOps,
    Run,
    fit_brief,
    fit_row,
    image_body,
    runtime_status,
    text_body,
    token_samples,
    wait_until,
)
from tests.harness import ModelSpec, sim_weights, start_cluster

MIN_SAMPLES = 3
# Fits are refitted on every tick: a short tick lets the warm-up's fits appear quickly.
MASTER_LENDING = {
    "scheduling_refresh_interval": "1s",
    "scheduling_min_samples": str(MIN_SAMPLES),
    # A helper that must switch models is probed only after 12 x this of idleness, far
    # beyond a scenario; the cost rule alone decides the must-load scenario.
    "offload_probe_idle": "10s",
}
# Enough identical requests for a uniform fit (min samples) with a margin.
UNIFORM_WARMUP = MIN_SAMPLES + 2
FIT_TIMEOUT_SECS = 30.0

FAST_LOAD_MS = 50
SWITCH_LOAD_MS = 2_000
# Every fixed-size text body in the suite: a stream and a plain request, and every model
# name of equal length, then cost the simulated backend the same prompt tokens.
TEXT_BYTES = 160
TEXT_MAX_TOKENS = 8
IMAGE_SIDE = 500
IMAGE_STEPS = 8
# 500 x 500 x 8 steps = 2 megapixel-steps.
IMAGE_MP_STEPS = IMAGE_SIDE * IMAGE_SIDE / 1e6 * IMAGE_STEPS
IMAGE_BASE_MS = 20


def fixed_text(name: str, job_ms: int, load_ms: int = FAST_LOAD_MS) -> ModelSpec:
    """A text model whose every request costs ``job_ms`` whatever its size."""
    return ModelSpec(
        name,
        {"contextsize": 4096, "parallel": 1},
        {
            "model_param": sim_weights(
                load_ms=load_ms, base_ms=job_ms, prompt_ms_per_token=0, output_ms_per_token=0
            )
        },
    )


@dataclass(frozen=True)
class TextCost:
    """Simulated text costs: base + prompt x ceil(bytes / 4) + output x max_tokens (ms)."""

    base_ms: float
    prompt_ms_per_token: float
    output_ms_per_token: float

    def job_ms(self, body: bytes, max_tokens: int) -> float:
        prompt_tokens = math.ceil(len(body) / 4)
        return (
            self.base_ms
            + self.prompt_ms_per_token * prompt_tokens
            + self.output_ms_per_token * max_tokens
        )


def sized_text(name: str, cost: TextCost) -> ModelSpec:
    return ModelSpec(
        name,
        {"contextsize": 4096, "parallel": 1},
        {
            "model_param": sim_weights(
                load_ms=FAST_LOAD_MS,
                base_ms=cost.base_ms,
                prompt_ms_per_token=cost.prompt_ms_per_token,
                output_ms_per_token=cost.output_ms_per_token,
            )
        },
    )


def image_model(name: str, job_ms: int) -> ModelSpec:
    """An image model that takes ``job_ms`` for the suite's one image size."""
    per_step = (job_ms - IMAGE_BASE_MS) / IMAGE_MP_STEPS
    return ModelSpec(
        name,
        {},
        {
            "sdmodel": sim_weights(
                load_ms=FAST_LOAD_MS, base_ms=IMAGE_BASE_MS, image_ms_per_megapixel_step=per_step
            )
        },
    )


def image_id(name: str) -> str:
    """The image ID the registry gives a config's diffusion weights (config + weights stem)."""
    return f"{name}-{name}-sdmodel"


# -- the shared cluster ----------------------------------------------------------------------------

OWNER_MS = 400  # A, D and the image owner PA
FAST_MS = 100  # B, B2 and the image helper PB
MID_MS = 200  # C (second helper), A3 (owner of the slower-helper scenario)
SLOW_MS = 400  # B3
SIZES_OWNER = TextCost(60, 1.0, 25.0)
SIZES_HELPER = TextCost(30, 0.5, 12.5)
TEMPLATE_OWNER = TextCost(40, 1.0, 10.0)
TEMPLATE_HELPER = TextCost(10, 0.25, 2.5)


def shared_layout() -> dict[str, list[ModelSpec]]:
    """Owners o and o2, helpers h and h2. Linked pairs have names of equal length, since
    lending rewrites the model ID inside the body and the backend prices its bytes."""
    return {
        "o": [
            fixed_text("A", OWNER_MS),
            fixed_text("A3", MID_MS),
            sized_text("AV", SIZES_OWNER),
            sized_text("AT", TEMPLATE_OWNER),
            image_model("PA", OWNER_MS),
        ],
        "h": [
            fixed_text("B", FAST_MS, SWITCH_LOAD_MS),
            fixed_text("B2", FAST_MS, SWITCH_LOAD_MS),
            fixed_text("B3", SLOW_MS),
            sized_text("BV", SIZES_HELPER),
            sized_text("BT", TEMPLATE_HELPER),
            image_model("PB", FAST_MS),
        ],
        "h2": [fixed_text("C", MID_MS)],
        "o2": [fixed_text("D", OWNER_MS)],
    }


def pair_layout() -> dict[str, list[ModelSpec]]:
    """One owner, one loaded fast helper: the clusters a scenario kills, stops or leaves at
    default settings."""
    return {"o": [fixed_text("A", OWNER_MS)], "h": [fixed_text("B", FAST_MS)]}


def plain(model: str, *, stream: bool = False) -> bytes:
    return text_body(model, TEXT_MAX_TOKENS, size=TEXT_BYTES, stream=stream)


def picture(model: str) -> bytes:
    return image_body(model, width=IMAGE_SIDE, height=IMAGE_SIDE, steps=IMAGE_STEPS)


@dataclass
class Ctx:
    """One running cluster and what the scenarios on it have already done."""

    ops: ClusterOps
    # How many times each run with the links in place is repeated (the median is reported).
    repeat: int = 1
    sent: dict[tuple[str, str], int] = field(default_factory=dict)
    warmed: set[tuple[str, str, str]] = field(default_factory=set)
    alone_runs: dict[str, Run] = field(default_factory=dict)
    _depth: int | None = None

    @property
    def depth(self) -> int:
        if self._depth is None:
            self._depth = int(self.ops.setting("scheduling_backend_depth"))
        return self._depth

    def warm(
        self,
        node: str,
        model: str,
        bodies: Sequence[bytes],
        *,
        lane: str = TEXT,
        tag: str = "plain",
    ) -> dict[str, Any]:
        """Direct requests that give ``model`` on ``node`` its fits for this traffic, once per
        ``tag``; waits (bounded) until the node has fitted them. Returns the fit as published
        then (``fit`` None when the node cannot price this traffic)."""
        key = (node, model, tag)
        if key not in self.warmed:
            path = TEXT_PATH if lane == TEXT else IMAGE_PATH
            for body in bodies:
                self.ops.ask(node, body, path)
            self.sent[(node, model)] = self.sent.get((node, model), 0) + len(bodies)
            self.warmed.add(key)
        return self.wait_fitted(node, model, lane=lane)

    def wait_fitted(self, node: str, model: str, *, lane: str = TEXT) -> dict[str, Any]:
        needed = self.sent.get((node, model), 0)
        section = "llm" if lane == TEXT else IMAGE

        def fitted() -> dict[str, Any] | None:
            status = runtime_status(self.ops.node(node))
            row = fit_row(status, model, section)
            if lane == TEXT:
                # The token profile is computed in the same pass as the fit and counts every
                # sample, so once it has them all a missing fit is the node's own verdict.
                if token_samples(status, model) >= needed:
                    return {"fit": fit_brief(row)}
                return None
            if row is not None and int(row.get("samples", 0)) >= needed:
                return {"fit": fit_brief(row)}
            return None

        found: dict[str, Any] = wait_until(
            fitted, timeout_secs=FIT_TIMEOUT_SECS, what=f"{model} on {node} fitted"
        )
        return found

    def alone(self, key: str, measure: Callable[[], Run]) -> Run:
        """The owner working alone on the same traffic, measured once per cluster."""
        run = self.alone_runs.get(key)
        if run is None:
            run = self.alone_runs[key] = measure()
        return run

    def fits(self, pairs: Sequence[tuple[str, str]], lane: str = TEXT) -> dict[str, Any]:
        section = "llm" if lane == TEXT else IMAGE
        return {
            f"{model}@{node}": fit_brief(
                fit_row(runtime_status(self.ops.node(node)), model, section)
            )
            for node, model in pairs
        }


def new_ctx(
    root: Path, slaves: Mapping[str, list[ModelSpec]], *, tuned: bool = True, repeat: int = 1
) -> Ctx:
    sections = {"cluster": dict(MASTER_LENDING)} if tuned else None
    cluster = start_cluster(root, [], dict(slaves), master_sections=sections)
    return Ctx(ClusterOps(cluster), repeat=repeat)
