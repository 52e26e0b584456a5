"""Usage over analytics rows: the query's rules, one node's GROUP BY, and the master's merge."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from analytics.tests.factories import RequestRecordFactory
from analytics.usage import (
    DEFAULT_RANGE_MS,
    UsageQuery,
    parse_usage_query,
    public_ids,
    usage_local,
    usage_merge,
)
from routerproject.errors import RouterError

NOW_MS = 1_780_000_000_000
DAY1 = datetime(2026, 5, 1, 23, 59, 59, tzinfo=UTC)
DAY2 = datetime(2026, 5, 2, 0, 0, 1, tzinfo=UTC)
ALL = UsageQuery(0, NOW_MS, ("key",))


def ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def refusal(query: dict[str, str]) -> tuple[str | None, str]:
    with pytest.raises(RouterError) as caught:
        parse_usage_query(query, now_ms=NOW_MS)
    assert caught.value.status == 400
    return caught.value.param, caught.value.message


# -- the query -------------------------------------------------------------------------------


def test_without_parameters_the_range_is_the_last_30_days_grouped_by_key() -> None:
    assert parse_usage_query({}, now_ms=NOW_MS) == UsageQuery(
        NOW_MS - DEFAULT_RANGE_MS, NOW_MS, ("key",)
    )


def test_group_by_takes_a_comma_separated_list_in_its_order_once_each() -> None:
    query = parse_usage_query({"group_by": "day, key,day", "since_ms": "5"}, now_ms=NOW_MS)
    assert query == UsageQuery(5, NOW_MS, ("day", "key"))


@pytest.mark.parametrize("group_by", ["user", "", "key,", "Key"])
def test_an_unknown_dimension_is_refused_naming_group_by(group_by: str) -> None:
    param, message = refusal({"group_by": group_by})
    assert param == "group_by"
    assert "key, model, node, day" in message


@pytest.mark.parametrize("name", ["since_ms", "until_ms"])
@pytest.mark.parametrize("value", ["soon", "1.5", "-3", "1e9", "999999999999999999"])
def test_a_bound_that_is_not_a_whole_number_of_ms_is_refused_by_name(name: str, value: str) -> None:
    param, message = refusal({name: value})
    assert param == name
    assert message.startswith(f"{name} must be a whole number")


def test_since_after_until_is_refused_naming_since() -> None:
    assert refusal({"since_ms": "11", "until_ms": "10"}) == (
        "since_ms",
        "since_ms must not be after until_ms",
    )
    assert parse_usage_query({"since_ms": "10", "until_ms": "10"}, now_ms=NOW_MS).since_ms == 10


# -- one node's rows ---------------------------------------------------------------------------


def row(**fields: Any) -> Any:
    values: dict[str, Any] = {
        "node_id": "node-a",
        "finished_at": DAY1,
        "success": True,
        "prompt_tokens": 10,
        "output_tokens": 5,
        "duration_ms": 100.0,
        **fields,
    }
    return RequestRecordFactory(**values)


@pytest.mark.django_db
def test_one_node_sums_its_rows_by_key_counting_errors_and_lent_within_requests() -> None:
    row(key_name="alice")
    row(key_name="alice", success=False, status=502, prompt_tokens=7, output_tokens=0)
    row(key_name="alice", borrowed=True, duration_ms=50.5)
    row(key_name=None)
    # SQLite sorts NULL first, PostgreSQL last: the master's merge orders the answer.
    rows = sorted(usage_local(node_id="node-a", query=ALL), key=lambda r: r["key_name"] or "")
    assert rows == [
        {
            "node_id": "node-a",
            "key_name": None,
            "requests": 1,
            "errors": 0,
            "prompt_tokens": 10,
            "completion_tokens": 5,
            "backend_ms": 100.0,
            "lent": 0,
        },
        {
            "node_id": "node-a",
            "key_name": "alice",
            "requests": 3,
            "errors": 1,
            "prompt_tokens": 27,
            "completion_tokens": 10,
            "backend_ms": 250.5,
            "lent": 1,
        },
    ]


@pytest.mark.django_db
def test_one_node_counts_only_its_own_rows_inside_the_inclusive_range() -> None:
    # A shared database holds other nodes' rows too: each node answers for its own.
    row(node_id="node-b")
    row(finished_at=DAY1)
    row(finished_at=DAY2)
    inside = UsageQuery(ms(DAY1), ms(DAY2), ("node",))
    assert [r["requests"] for r in usage_local(node_id="node-a", query=inside)] == [2]
    only_day1 = UsageQuery(ms(DAY1), ms(DAY2) - 1, ("node",))
    assert [r["requests"] for r in usage_local(node_id="node-a", query=only_day1)] == [1]
    assert usage_local(node_id="node-a", query=UsageQuery(ms(DAY2) + 1, NOW_MS, ("node",))) == []


@pytest.mark.django_db
def test_days_are_utc_dates_and_models_keep_their_lane_for_the_master() -> None:
    row(model_id="chat", finished_at=DAY1)
    row(model_id="chat", finished_at=DAY2)
    row(model_id="sd-image", lane="image", finished_at=DAY2)
    query = UsageQuery(0, NOW_MS, ("day", "model"))
    got = [
        (r["day"], r["model_id"], r["lane"], r["requests"])
        for r in usage_local(node_id="node-a", query=query)
    ]
    assert got == [
        ("2026-05-01", "chat", "text", 1),
        ("2026-05-02", "chat", "text", 1),
        ("2026-05-02", "sd-image", "image", 1),
    ]


# -- the master's merge ----------------------------------------------------------------------


def measures(requests: int, lent: int = 0, errors: int = 0) -> dict[str, Any]:
    return {
        "requests": requests,
        "errors": errors,
        "prompt_tokens": 10 * requests,
        "completion_tokens": 2 * requests,
        "backend_ms": 1.5 * requests,
        "lent": lent,
    }


RECORDS = [
    {"node_id": "node-a", "local_id": "chat-q4", "public_id": "chat"},
    {"node_id": "node-b", "local_id": "chat-q8", "public_id": "chat"},
    {
        "node_id": "node-b",
        "local_id": "sd",
        "public_id": "sd",
        "image_id": "sd-img",
        "public_image_id": "sd-image",
    },
]


def test_the_merge_sums_nodes_into_public_models_with_only_the_grouped_fields() -> None:
    per_node = {
        "node-a": [{"node_id": "node-a", "model_id": "chat-q4", "lane": "text", **measures(3)}],
        "node-b": [
            {"node_id": "node-b", "model_id": "chat-q8", "lane": "text", **measures(2, 2)},
            {"node_id": "node-b", "model_id": "sd-img", "lane": "image", **measures(1, 0, 1)},
            {"node_id": "node-b", "model_id": "gone", "lane": "text", **measures(1)},
        ],
    }
    query = UsageQuery(0, NOW_MS, ("model",))
    merged = usage_merge(per_node, query=query, names=public_ids(RECORDS))
    assert merged == [
        {"model": "chat", **measures(5, 2)},
        # A model the cluster no longer lists keeps its node's ID.
        {"model": "gone", **measures(1)},
        {"model": "sd-image", **measures(1, 0, 1)},
    ]


def test_the_merge_by_key_and_node_keeps_each_nodes_rows_apart() -> None:
    per_node = {
        "node-a": [{"node_id": "node-a", "key_name": "alice", **measures(1)}],
        "node-b": [
            {"node_id": "node-b", "key_name": "alice", **measures(2, 2)},
            {"node_id": "node-b", "key_name": None, **measures(4)},
        ],
    }
    query = UsageQuery(0, NOW_MS, ("key", "node"))
    merged = usage_merge(per_node, query=query, names={})
    assert merged == [
        {"key_name": None, "node_id": "node-b", **measures(4)},
        {"key_name": "alice", "node_id": "node-a", **measures(1)},
        {"key_name": "alice", "node_id": "node-b", **measures(2, 2)},
    ]
