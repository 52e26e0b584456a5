"""The stored-key table: secrets, hashes, lookups by hash, expiry, the wire form, who a key is."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from access.identity import ANONYMOUS, CONFIG, STORED
from access.keys import (
    EMPTY_TABLE,
    KeyRecord,
    KeyTable,
    admin_caller,
    client_caller,
    current_table,
    install_table,
    new_secret,
    reset_for_tests,
    secret_hash,
    visible_prefix,
)

T0_MS = 1_750_000_000_000
SECRET = "rk-" + "a" * 43
OTHER = "rk-" + "b" * 43


def record(name: str = "alice", secret: str = SECRET, **fields: Any) -> KeyRecord:
    return KeyRecord(name=name, key_hash=secret_hash(secret), **fields)


def test_a_secret_is_rk_and_256_random_bits_and_only_its_sha256_is_kept() -> None:
    secret = new_secret()
    assert secret.startswith("rk-")
    # 32 bytes in URL-safe base64 without padding: 43 characters.
    assert len(secret) == 3 + 43
    assert new_secret() != secret
    assert secret_hash(secret) == hashlib.sha256(secret.encode()).hexdigest()
    assert visible_prefix(secret) == secret[:10]


def test_a_known_secret_finds_its_key_and_says_who_it_is() -> None:
    table = KeyTable([record(role="admin", models=frozenset({"m"}))])
    caller = table.lookup(SECRET.encode(), now_ms=T0_MS)
    assert caller is not None
    assert (caller.kind, caller.name, caller.role, caller.models) == (
        STORED,
        "alice",
        "admin",
        frozenset({"m"}),
    )
    assert caller.key_name == "alice"


def test_the_caller_carries_the_keys_limits_and_share() -> None:
    table = KeyTable([record(rpm=60, tpm=9000, max_concurrent=2, share=3.0)])
    caller = table.lookup(SECRET.encode(), now_ms=T0_MS)
    assert caller is not None
    assert (caller.rpm, caller.tpm, caller.max_concurrent, caller.share) == (60, 9000, 2, 3.0)


@pytest.mark.parametrize("presented", [OTHER.encode(), b"", SECRET[:-1].encode(), b"alice"])
def test_anything_but_the_secret_finds_no_key(presented: bytes) -> None:
    assert KeyTable([record()]).lookup(presented, now_ms=T0_MS) is None


def test_a_key_stops_working_at_its_expiry_on_the_injected_clock() -> None:
    now = [T0_MS - 1]
    table = KeyTable([record(expires_at_ms=T0_MS)], clock_ms=lambda: now[0])
    assert table.lookup(SECRET.encode()) is not None
    now[0] = T0_MS
    assert table.lookup(SECRET.encode()) is None


def test_a_lookup_is_by_hash_and_does_not_scan_the_keys() -> None:
    # Ten thousand keys: the table is a dict keyed by digest, so one lookup is one hash.
    many = [record(f"k{i}", f"rk-{i:043d}") for i in range(10_000)]
    table = KeyTable(many)
    assert len(table) == 10_000
    caller = table.lookup(b"rk-" + b"%043d" % 9_999, now_ms=T0_MS)
    assert caller is not None and caller.name == "k9999"


def test_the_fingerprint_changes_with_any_field_and_not_with_order() -> None:
    a, b = record("a", SECRET), record("b", OTHER)
    assert KeyTable([a, b]).fingerprint == KeyTable([b, a]).fingerprint
    assert KeyTable([a]).fingerprint != KeyTable([a, b]).fingerprint
    assert KeyTable([a]).fingerprint != KeyTable([record("a", SECRET, rpm=5)]).fingerprint
    assert KeyTable().fingerprint != KeyTable(required=True).fingerprint


def test_the_wire_form_carries_hashes_and_rebuilds_the_same_table() -> None:
    table = KeyTable(
        [record(models=frozenset({"x", "y"}), expires_at_ms=T0_MS, rpm=3, tpm=9, share=2.5)],
        required=True,
        admin_required=True,
    )
    wire = table.to_wire()
    assert SECRET not in repr(wire)
    again = KeyTable.from_wire(wire)
    assert again.fingerprint == table.fingerprint
    assert again.lookup(SECRET.encode(), now_ms=T0_MS - 1) is not None


@pytest.mark.parametrize(
    "doc",
    [
        [],
        {"keys": "x"},
        {"keys": [{"name": "a", "key_hash": "zz", "role": "inference"}]},
        {"keys": [{"name": "a", "key_hash": "0" * 64, "role": "root"}]},
        {"keys": [{"name": "a", "key_hash": "0" * 64, "role": "inference", "rpm": "5"}]},
        {"keys": [{"name": "a", "key_hash": "0" * 64, "role": "inference", "share": 0}]},
        {
            "keys": [
                {"name": "a", "key_hash": "0" * 64, "role": "inference"},
                {"name": "b", "key_hash": "0" * 64, "role": "inference"},
            ]
        },
        {"keys": [], "required": "yes"},
    ],
)
def test_a_malformed_push_is_refused_whole(doc: Any) -> None:
    with pytest.raises(ValueError):
        KeyTable.from_wire(doc)


def test_a_table_that_had_keys_still_requires_one_when_none_is_usable() -> None:
    # Revoking the last key must not open the node: the master says keys are required.
    table = KeyTable([], required=True, admin_required=True)
    assert client_caller(b"", (), table) is None
    assert admin_caller(b"", (), table) is None


def test_without_any_keys_every_request_is_anonymous() -> None:
    caller = client_caller(b"whatever", (), EMPTY_TABLE)
    assert caller is not None and caller.kind == ANONYMOUS
    caller = admin_caller(b"", (), EMPTY_TABLE)
    assert caller is not None and caller.kind == ANONYMOUS


def test_config_keys_work_as_before_beside_stored_keys() -> None:
    table = KeyTable([record()])
    config = (b"sk-config",)
    caller = client_caller(b"sk-config", config, table)
    assert caller is not None and caller.kind == CONFIG and caller.key_name is None
    stored = client_caller(SECRET.encode(), config, table)
    assert stored is not None and stored.name == "alice"
    assert client_caller(b"sk-nope", config, table) is None
    # A config inference key alone, no stored keys: what every node did before.
    assert client_caller(b"sk-config", config, EMPTY_TABLE) is not None
    assert client_caller(b"", config, EMPTY_TABLE) is None


def test_only_an_admin_role_key_opens_the_management_api() -> None:
    table = KeyTable([record("ops", OTHER, role="admin"), record("app", SECRET)])
    assert table.admin_required
    caller = admin_caller(OTHER.encode(), (), table)
    assert caller is not None and caller.name == "ops"
    assert admin_caller(SECRET.encode(), (), table) is None
    # An admin key opens the client paths too.
    assert client_caller(OTHER.encode(), (), table) is not None


def test_inference_keys_alone_leave_the_management_api_as_the_config_says() -> None:
    table = KeyTable([record()])
    assert not table.admin_required
    caller = admin_caller(b"", (), table)
    assert caller is not None and caller.kind == ANONYMOUS
    assert admin_caller(b"", (b"sk-admin",), table) is None


def test_the_installed_table_is_replaced_whole() -> None:
    table = KeyTable([record()])
    install_table(table)
    try:
        assert current_table() is table
    finally:
        reset_for_tests()
    assert current_table() is EMPTY_TABLE
