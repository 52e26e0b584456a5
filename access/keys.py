"""Stored API keys in memory: the secrets we mint, their hashes, and the table a node checks.

Pure (no Django): the master builds a `KeyTable` from its database rows (`access.selectors`),
a slave from the document the master pushes (`KeyTable.from_wire`); the front door asks the
one installed in this process (`current_table()`) for every request that carries a key.

A lookup hashes the presented secret once and finds the record by that hash in a dict: the
cost does not grow with the number of keys, and no secret is ever compared character by
character against a list. Only SHA-256 hashes and the short visible prefix leave this module:
a secret is returned once, by `new_secret`, to the caller that shows it to the person.

Registry of in-process state (house style rule 4): `_installed` below is the only table of
the process. It is replaced whole, never mutated, so a request that read it sees one
consistent set; `reset_for_tests()` puts the empty table back.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from access.identity import ANONYMOUS_CALLER, CONFIG, STORED, Caller

SECRET_PREFIX = "rk-"
# token_urlsafe(32) draws 32 random bytes: 256 bits, the minimum.
SECRET_RANDOM_BYTES = 32
# Enough to tell keys apart in a list, far too little to guess the rest from (7 of 43 chars).
VISIBLE_PREFIX_CHARS = 10
ROLE_INFERENCE = "inference"
ROLE_ADMIN = "admin"
ROLES = (ROLE_INFERENCE, ROLE_ADMIN)

ClockMs = Callable[[], int]


def _wall_ms() -> int:
    return int(time.time() * 1000)


def new_secret() -> str:
    """A fresh secret: `rk-` and 256 random bits, URL-safe. Shown once, stored only hashed."""
    return SECRET_PREFIX + secrets.token_urlsafe(SECRET_RANDOM_BYTES)


def secret_hash(secret: str | bytes) -> str:
    """The hex SHA-256 stored for a secret (`access_api_keys.key_hash`)."""
    data = secret.encode() if isinstance(secret, str) else secret
    return hashlib.sha256(data).hexdigest()


def visible_prefix(secret: str) -> str:
    """The part of a secret that lists and logs may show (`key_prefix`)."""
    return secret[:VISIBLE_PREFIX_CHARS]


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One usable key as every node holds it: the hash, never the secret."""

    name: str
    key_hash: str
    role: str = ROLE_INFERENCE
    models: frozenset[str] | None = None
    expires_at_ms: int | None = None
    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None
    share: float = 1.0

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key_hash": self.key_hash,
            "role": self.role,
            "models": None if self.models is None else sorted(self.models),
            "expires_at_ms": self.expires_at_ms,
            "rpm": self.rpm,
            "tpm": self.tpm,
            "max_concurrent": self.max_concurrent,
            "share": self.share,
        }

    @classmethod
    def from_wire(cls, doc: Mapping[str, Any]) -> KeyRecord:
        """A record from the master's push; ValueError names what is malformed."""
        name, key_hash, role = doc.get("name"), doc.get("key_hash"), doc.get("role")
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string")
        if not isinstance(key_hash, str) or len(key_hash) != 64:
            raise ValueError(f"key {name!r}: key_hash must be 64 hex characters")
        bytes.fromhex(key_hash)  # ValueError when it is not hex
        if role not in ROLES:
            raise ValueError(f"key {name!r}: role must be one of {', '.join(ROLES)}")
        models = doc.get("models")
        if models is not None and (
            not isinstance(models, list) or not all(isinstance(m, str) for m in models)
        ):
            raise ValueError(f"key {name!r}: models must be a list of strings or null")
        share = doc.get("share", 1.0)
        if isinstance(share, bool) or not isinstance(share, int | float) or not share > 0:
            raise ValueError(f"key {name!r}: share must be a positive number")
        return cls(
            name=name,
            key_hash=key_hash,
            role=role,
            models=None if models is None else frozenset(models),
            expires_at_ms=_optional_int(doc, "expires_at_ms", name),
            rpm=_optional_int(doc, "rpm", name),
            tpm=_optional_int(doc, "tpm", name),
            max_concurrent=_optional_int(doc, "max_concurrent", name),
            share=float(share),
        )


def _optional_int(doc: Mapping[str, Any], field: str, name: str) -> int | None:
    value = doc.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"key {name!r}: {field} must be an integer or null")
    return value


@dataclass(frozen=True, slots=True)
class _Entry:
    digest: bytes
    record: KeyRecord
    caller: Caller
    expires_at_ms: float


class KeyTable:
    """The usable stored keys of the cluster, by hash, with a fingerprint of the whole set.

    `required`: the cluster has (or had) stored keys, so client paths need a key even on a node
    without `auth.inference_keys`; `admin_required`: likewise for the management API and
    admin-role keys. Both stay true after the last such key is revoked or expires: revoking
    a key must never open a node to everyone.
    """

    __slots__ = ("_by_digest", "admin_required", "clock_ms", "fingerprint", "records", "required")

    def __init__(
        self,
        records: Iterable[KeyRecord] = (),
        *,
        required: bool = False,
        admin_required: bool = False,
        clock_ms: ClockMs = _wall_ms,
    ) -> None:
        self.records: tuple[KeyRecord, ...] = tuple(sorted(records, key=lambda r: r.name))
        self.required = required or bool(self.records)
        self.admin_required = admin_required or any(r.role == ROLE_ADMIN for r in self.records)
        self.clock_ms = clock_ms
        self._by_digest: dict[bytes, _Entry] = {}
        for record in self.records:
            digest = bytes.fromhex(record.key_hash)
            caller = Caller(
                kind=STORED,
                name=record.name,
                role=record.role,
                models=record.models,
                rpm=record.rpm,
                tpm=record.tpm,
                max_concurrent=record.max_concurrent,
                share=record.share,
            )
            expires = math.inf if record.expires_at_ms is None else record.expires_at_ms
            self._by_digest[digest] = _Entry(digest, record, caller, expires)
        self.fingerprint = _fingerprint(self.records, self.required, self.admin_required)

    def __len__(self) -> int:
        return len(self.records)

    def lookup(self, secret: bytes, now_ms: int | None = None) -> Caller | None:
        """The caller a presented secret stands for; None when it is no usable key (unknown,
        revoked, or expired at `now_ms`, the table's clock by default)."""
        if not secret or not self._by_digest:
            return None
        digest = hashlib.sha256(secret).digest()
        entry = self._by_digest.get(digest)
        # The dict found it by hash; compare_digest keeps the final check constant-time too.
        if entry is None or not hmac.compare_digest(entry.digest, digest):
            return None
        if entry.expires_at_ms != math.inf and entry.expires_at_ms <= (
            self.clock_ms() if now_ms is None else now_ms
        ):
            return None
        return entry.caller

    def to_wire(self) -> dict[str, Any]:
        """What the master pushes to a slave: hashes and scopes, never a secret."""
        return {
            "fingerprint": self.fingerprint,
            "required": self.required,
            "admin_required": self.admin_required,
            "keys": [record.to_wire() for record in self.records],
        }

    @classmethod
    def from_wire(cls, doc: Any, *, clock_ms: ClockMs = _wall_ms) -> KeyTable:
        """The table a master pushed; ValueError when the document is malformed."""
        if not isinstance(doc, dict):
            raise ValueError("the key table must be a JSON object")
        keys = doc.get("keys")
        if not isinstance(keys, list) or not all(isinstance(k, dict) for k in keys):
            raise ValueError("keys must be a list of objects")
        required, admin_required = doc.get("required", False), doc.get("admin_required", False)
        if not isinstance(required, bool) or not isinstance(admin_required, bool):
            raise ValueError("required and admin_required must be true or false")
        table = cls(
            (KeyRecord.from_wire(k) for k in keys),
            required=required,
            admin_required=admin_required,
            clock_ms=clock_ms,
        )
        if len(table._by_digest) != len(keys):
            raise ValueError("two keys share one hash")
        return table


def _fingerprint(records: Iterable[KeyRecord], required: bool, admin_required: bool) -> str:
    doc = {
        "required": required,
        "admin_required": admin_required,
        "keys": [r.to_wire() for r in records],
    }
    return hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


EMPTY_TABLE = KeyTable()

_installed: KeyTable = EMPTY_TABLE
"""The table this process checks keys against: the master's rows, or what the master pushed."""


def current_table() -> KeyTable:
    return _installed


def install_table(table: KeyTable) -> None:
    """Replace the process's table whole (a request in flight keeps the one it read)."""
    global _installed
    _installed = table


def reset_for_tests() -> None:
    install_table(EMPTY_TABLE)


# -- who a request's key says it is -------------------------------------------------------------
# The front door and the ASGI app ask these with the key a request carries (`token`), the
# config file's keys and the installed table; None means "refuse with 401".

CONFIG_INFERENCE_CALLER = Caller(kind=CONFIG, role=ROLE_INFERENCE)
CONFIG_ADMIN_CALLER = Caller(kind=CONFIG, role=ROLE_ADMIN)


def _any_equal(token: bytes, keys: tuple[bytes, ...]) -> bool:
    # Every key is compared, match or not, so timing says nothing about which one is close.
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(token, key)
    return ok


def client_caller(token: bytes, config_keys: tuple[bytes, ...], table: KeyTable) -> Caller | None:
    """A client path: open (anonymous) when neither `auth.inference_keys` nor stored keys
    exist; else a config inference key, or any usable stored key (admin keys included)."""
    if not config_keys and not table.required:
        return ANONYMOUS_CALLER
    if config_keys and _any_equal(token, config_keys):
        return CONFIG_INFERENCE_CALLER
    return table.lookup(token)


def admin_caller(token: bytes, config_keys: tuple[bytes, ...], table: KeyTable) -> Caller | None:
    """The management API: open (anonymous) when neither `auth.admin_keys` nor stored admin
    keys exist; else a config admin key, or a usable stored key of role `admin`."""
    if not config_keys and not table.admin_required:
        return ANONYMOUS_CALLER
    if config_keys and _any_equal(token, config_keys):
        return CONFIG_ADMIN_CALLER
    caller = table.lookup(token)
    return caller if caller is not None and caller.role == ROLE_ADMIN else None
