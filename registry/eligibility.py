"""Whether a text model may take part in lending (spec: LLM lending, Eligibility). Pure.

A text model may be linked only if it serves requests one at a time and states a context
window. One at a time means `parallel` and `vllm.settings.max_number_sequences` are *both* 1
or unset, whichever backend family runs the config: the two are judged apart, never merged
first, because a config's running value takes one of them by family and a merged value would
let the other one's concurrency slip through. A context window is `contextsize` or the vLLM
settings' `max_model_length`. A multimodal model links only with another multimodal model.

The rule lives here, below lending, because a node judges its own configs when it builds
their records (registry/kcpps.py) and the master judges the records it holds of every node
(lending/links.py, lending/master.py); both call these functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REASON_NOT_TEXT = "does not run as a text model"
REASON_NO_CONTEXT = "does not report a context window"
REASON_CONCURRENT = "serves requests concurrently"
REASON_MULTIMODAL_PAIR = "a multimodal model links only with another multimodal model"


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _one_at_a_time(value: Any) -> bool:
    return value is None or (_whole(value) and value == 1)


def _states_window(value: Any) -> bool:
    return _whole(value) and value > 0


def text_ineligible_reason(
    *,
    has_llm: bool,
    contextsize: Any,
    max_model_length: Any,
    parallel: Any,
    max_number_sequences: Any,
) -> str | None:
    """Why a text config cannot be linked (None: it can); the first reason that applies.

    The values are the config's own, as written (None when unset), not the ones the router
    derives for the backend it launches.
    """
    if not has_llm:
        return REASON_NOT_TEXT
    if not (_states_window(contextsize) or _states_window(max_model_length)):
        return REASON_NO_CONTEXT
    if not (_one_at_a_time(parallel) and _one_at_a_time(max_number_sequences)):
        return REASON_CONCURRENT
    return None


def vllm_settings(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """The `vllm.settings` object of a config (or of its sanitised options), {} when absent."""
    vllm = raw.get("vllm")
    settings = vllm.get("settings") if isinstance(vllm, Mapping) else None
    return settings if isinstance(settings, Mapping) else {}


def config_text_ineligible_reason(*, has_llm: bool, raw: Mapping[str, Any]) -> str | None:
    """The rule applied to a config's raw JSON."""
    settings = vllm_settings(raw)
    return text_ineligible_reason(
        has_llm=has_llm,
        contextsize=raw.get("contextsize"),
        max_model_length=settings.get("max_model_length"),
        parallel=raw.get("parallel"),
        max_number_sequences=settings.get("max_number_sequences"),
    )


def record_text_ineligible_reason(rec: Mapping[str, Any]) -> str | None:
    """Why the model of a registry record cannot be linked as a text model (None: it can).

    A record carries the reason its own node worked out from the config file. A record from
    a build that did not send it is judged from its `options` (the config's keys, credentials
    removed), falling back to the record's derived `context_size` and `parallel`.
    """
    if "text_ineligible_reason" in rec:
        reason = rec.get("text_ineligible_reason")
        return str(reason) if reason else None
    options = rec.get("options")
    raw: Mapping[str, Any] = options if isinstance(options, Mapping) else {}
    settings = vllm_settings(raw)
    capabilities = rec.get("capabilities")
    context = rec.get("context_size") or (
        capabilities.get("context") if isinstance(capabilities, Mapping) else None
    )
    return text_ineligible_reason(
        has_llm=bool(rec.get("has_llm")),
        contextsize=raw.get("contextsize", context),
        max_model_length=settings.get("max_model_length"),
        parallel=raw.get("parallel", rec.get("parallel")),
        max_number_sequences=settings.get("max_number_sequences"),
    )


def text_pair_ineligible_reason(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """Why two text models' records cannot be linked (None: they can)."""
    for rec in (a, b):
        reason = record_text_ineligible_reason(rec)
        if reason:
            return f"{rec.get('node_id', '')}/{rec.get('local_id', '')} {reason}"
    if bool(a.get("has_multimodal")) != bool(b.get("has_multimodal")):
        return REASON_MULTIMODAL_PAIR
    return None
