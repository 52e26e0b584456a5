"""The join string: what a slave needs of its master, in one copyable word.

`rjoin1:` then the base64url (unpadded) JSON of `{"url": master public URL, "token": cluster
token}`, and `"ca"` (PEM text) when the master's URL is https and the master names the CA
its certificate is signed by. The version in the prefix lets a later form be refused clearly
by an older router instead of being half-read.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from routerproject.config.values import RequiredUrl

JOIN_PREFIX = "rjoin1:"
# A CA bundle of a few certificates; a larger blob is a wrong paste, not a join string.
JOIN_MAX_CHARS = 64 * 1024

_URL = TypeAdapter(RequiredUrl)


class JoinError(ValueError):
    """A join string that cannot be used; the message says why (never the token)."""


@dataclass(frozen=True)
class Join:
    url: str
    token: str = ""
    ca_pem: str | None = None

    def __repr__(self) -> str:
        # The token is the cluster's secret: no log line or traceback shows it.
        return f"Join(url={self.url!r}, ca={'yes' if self.ca_pem else 'no'})"


def url_problem(text: str) -> str | None:
    """What is wrong with a node URL, as the config's own check words it; None when fine."""
    try:
        _URL.validate_python(text)
    except ValidationError as exc:
        return str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
    return None


def join_encode(join: Join) -> str:
    body: dict[str, str] = {"url": join.url, "token": join.token}
    if join.ca_pem:
        body["ca"] = join.ca_pem
    raw = json.dumps(body, separators=(",", ":")).encode()
    return JOIN_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_body(text: str) -> Any:
    payload = text[len(JOIN_PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        return json.loads(raw)
    except (binascii.Error, ValueError):
        raise JoinError("is damaged (copy the whole string the master printed)") from None


def join_decode(text: str) -> Join:
    text = text.strip()
    if len(text) > JOIN_MAX_CHARS:
        raise JoinError(f"is longer than {JOIN_MAX_CHARS} characters")
    if not text.startswith(JOIN_PREFIX):
        raise JoinError(
            f"must start with {JOIN_PREFIX!r} (the line `init_node --role master` printed)"
        )
    body = _decode_body(text)
    if not isinstance(body, dict):
        raise JoinError("is damaged (copy the whole string the master printed)")
    url, token, ca = body.get("url"), body.get("token"), body.get("ca")
    if not isinstance(token, str) or not token.strip():
        raise JoinError("carries no cluster token")
    if not isinstance(url, str):
        raise JoinError("carries no master URL")
    problem = url_problem(url)
    if problem:
        raise JoinError(f"url {problem}")
    if ca is not None and (not isinstance(ca, str) or "BEGIN CERTIFICATE" not in ca):
        raise JoinError("ca is not a PEM certificate")
    return Join(url=url.strip(), token=token.strip(), ca_pem=ca)
