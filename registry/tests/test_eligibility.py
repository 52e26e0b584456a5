"""Text lending eligibility (spec: LLM lending, Eligibility), the pure rule and the configs and
records it is applied to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from registry.eligibility import (
    REASON_CONCURRENT,
    REASON_MULTIMODAL_PAIR,
    REASON_NO_CONTEXT,
    REASON_NOT_TEXT,
    record_text_ineligible_reason,
    text_ineligible_reason,
    text_pair_ineligible_reason,
)
from registry.hashing import FileHasher
from registry.kcpps import load_model_config

UNSET = None


def rule(
    *,
    has_llm: bool = True,
    contextsize: Any = 4096,
    max_model_length: Any = UNSET,
    parallel: Any = UNSET,
    max_number_sequences: Any = UNSET,
) -> str | None:
    return text_ineligible_reason(
        has_llm=has_llm,
        contextsize=contextsize,
        max_model_length=max_model_length,
        parallel=parallel,
        max_number_sequences=max_number_sequences,
    )


@pytest.mark.parametrize(
    ("parallel", "max_number_sequences", "reason"),
    [
        (UNSET, UNSET, None),
        (1, UNSET, None),
        (2, UNSET, REASON_CONCURRENT),
        (UNSET, 1, None),
        (UNSET, 2, REASON_CONCURRENT),
        (1, 1, None),
        (1, 2, REASON_CONCURRENT),
        (2, 1, REASON_CONCURRENT),
        (2, 2, REASON_CONCURRENT),
        (0, UNSET, REASON_CONCURRENT),
    ],
)
def test_parallel_and_max_number_sequences_must_both_be_one_or_unset(
    parallel: Any, max_number_sequences: Any, reason: str | None
) -> None:
    assert rule(parallel=parallel, max_number_sequences=max_number_sequences) == reason


@pytest.mark.parametrize(
    ("contextsize", "max_model_length", "reason"),
    [
        (4096, UNSET, None),
        (UNSET, 32768, None),
        (4096, 32768, None),
        (UNSET, UNSET, REASON_NO_CONTEXT),
        (0, UNSET, REASON_NO_CONTEXT),
        (UNSET, 0, REASON_NO_CONTEXT),
        (1, UNSET, None),
    ],
)
def test_a_context_window_is_contextsize_or_the_vllm_max_model_length(
    contextsize: Any, max_model_length: Any, reason: str | None
) -> None:
    assert rule(contextsize=contextsize, max_model_length=max_model_length) == reason


@pytest.mark.parametrize("value", [True, False, 1.0, "1", "4096"])
def test_only_whole_numbers_count_as_settings(value: Any) -> None:
    # Records of other nodes carry the config's own JSON values: `true` or `1.0` is not the
    # one-at-a-time `1`, and states no context window.
    assert rule(parallel=value) == REASON_CONCURRENT
    assert rule(max_number_sequences=value) == REASON_CONCURRENT
    assert rule(contextsize=value) == REASON_NO_CONTEXT
    assert rule(contextsize=UNSET, max_model_length=value) == REASON_NO_CONTEXT


def test_a_record_from_an_older_build_is_judged_by_its_options_values() -> None:
    options = {"contextsize": 4096, "parallel": True}
    assert record_text_ineligible_reason(record(options=options)) == REASON_CONCURRENT
    vllm = {"contextsize": 4096, "vllm": {"settings": {"max_number_sequences": 1.0}}}
    assert record_text_ineligible_reason(record(options=vllm)) == REASON_CONCURRENT


def test_the_first_reason_that_applies_is_given() -> None:
    assert rule(has_llm=False, contextsize=UNSET, parallel=4) == REASON_NOT_TEXT
    assert rule(contextsize=UNSET, parallel=4) == REASON_NO_CONTEXT


# -- configs: the rule reads the file's own values, whichever backend family runs it ----------


def load(tmp_path: Path, raw: dict[str, Any]) -> str | None:
    weights = tmp_path / "w.sim.json"
    weights.write_text(json.dumps({"load_ms": 1}))
    path = tmp_path / "m.kcpps"
    path.write_text(json.dumps({"model_param": str(weights), **raw}))
    config = load_model_config(path, default_backend_mode="sim", hasher=FileHasher(None))
    return config.text_eligible_reason


@pytest.mark.parametrize("backend_mode", ["vllm", "llama_sdcpp", "kobold", "sim"])
@pytest.mark.parametrize(
    ("parallel", "max_number_sequences", "reason"),
    [
        # The backend launches with one of the two (vLLM's own setting on vLLM, `parallel`
        # elsewhere); the other one being concurrent still makes the config ineligible.
        (2, 1, REASON_CONCURRENT),
        (1, 8, REASON_CONCURRENT),
        (UNSET, 8, REASON_CONCURRENT),
        (4, UNSET, REASON_CONCURRENT),
        (1, 1, None),
        (UNSET, UNSET, None),
    ],
)
def test_a_config_is_judged_by_both_settings_on_every_backend_family(
    tmp_path: Path,
    backend_mode: str,
    parallel: int | None,
    max_number_sequences: int | None,
    reason: str | None,
) -> None:
    raw: dict[str, Any] = {"backend_mode": backend_mode, "contextsize": 4096}
    if parallel is not None:
        raw["parallel"] = parallel
    if max_number_sequences is not None:
        raw["vllm"] = {"settings": {"max_number_sequences": max_number_sequences}}
    assert load(tmp_path, raw) == reason


@pytest.mark.parametrize("backend_mode", ["vllm", "llama_sdcpp"])
def test_a_config_states_its_window_with_either_setting(tmp_path: Path, backend_mode: str) -> None:
    only_vllm = {"backend_mode": backend_mode, "vllm": {"settings": {"max_model_length": 8192}}}
    assert load(tmp_path, only_vllm) is None
    assert load(tmp_path, {"backend_mode": backend_mode}) == REASON_NO_CONTEXT


# -- records: the node's own verdict, or the rule applied to what an older build sent ----------


def record(**fields: Any) -> dict[str, Any]:
    return {"node_id": "n1", "local_id": "m", "has_llm": True, "context_size": 4096, **fields}


def test_a_record_carries_its_own_nodes_verdict() -> None:
    assert record_text_ineligible_reason(record(text_ineligible_reason=None, parallel=8)) is None
    judged = record(text_ineligible_reason=REASON_NO_CONTEXT)
    assert record_text_ineligible_reason(judged) == REASON_NO_CONTEXT


def test_a_record_without_a_verdict_is_judged_from_its_options() -> None:
    vllm = {"vllm": {"settings": {"max_number_sequences": 4}}}
    assert record_text_ineligible_reason(record(parallel=1, options=vllm)) == REASON_CONCURRENT
    assert record_text_ineligible_reason(record(parallel=1, options={"parallel": 1})) is None
    assert record_text_ineligible_reason(record(parallel=2)) == REASON_CONCURRENT
    assert record_text_ineligible_reason(record(context_size=None)) == REASON_NO_CONTEXT
    assert record_text_ineligible_reason(record(has_llm=False)) == REASON_NOT_TEXT


def test_a_multimodal_model_links_only_with_another_multimodal_model() -> None:
    seer, other_seer = record(has_multimodal=True), record(has_multimodal=True)
    plain = record(has_multimodal=False)
    assert text_pair_ineligible_reason(seer, plain) == REASON_MULTIMODAL_PAIR
    assert text_pair_ineligible_reason(plain, seer) == REASON_MULTIMODAL_PAIR
    assert text_pair_ineligible_reason(seer, other_seer) is None
    assert text_pair_ineligible_reason(plain, record()) is None


def test_a_pair_names_the_model_that_is_not_eligible() -> None:
    wide = record(node_id="n2", local_id="wide", parallel=2)
    assert text_pair_ineligible_reason(record(), wide) == f"n2/wide {REASON_CONCURRENT}"
    assert text_pair_ineligible_reason(wide, record()) == f"n2/wide {REASON_CONCURRENT}"
