"""The stored key's name on a node-protocol call: how a request's usage row names its key on
the node that serves it when another node let it in (a master forwarding to a slave, an owner
lending to a helper).

Only node-protocol routes read it (they need the cluster token); a client path never does,
and a node builds its calls' headers itself rather than copying the client's, so a client
cannot name a key it does not hold.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

KEY_NAME_HEADER = "X-Router-Key-Name"
KEY_NAME_HEADER_BYTES = KEY_NAME_HEADER.lower().encode("ascii")


def key_name_header(key_name: str | None) -> dict[str, str]:
    """The header to add to a node call for `key_name` (none for a request without one).

    Percent-encoded: key names are operator-made and may hold any character, a header only
    Latin-1 without line breaks.
    """
    return {KEY_NAME_HEADER: quote(key_name, safe="")} if key_name else {}


def key_name_from_header(raw: bytes | None) -> str | None:
    if not raw:
        return None
    return unquote(raw.decode("latin-1")) or None
