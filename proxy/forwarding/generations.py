"""Kobold generations a client may check on or abort by their `genkey`, on the node running them.

KoboldCpp's clients (KoboldAI Lite, SillyTavern) send a `genkey` with a generate, poll
`/api/extra/generate/check` for the text so far while they wait, and stop a generation with
`/api/extra/abort`. The router runs a generate as an OpenAI completion, so it keeps that text
itself: the node whose backend runs the generation holds it here while it runs. A genkey is
the client's own: another key's check or abort does not see it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class Generation:
    """One running generation: its text so far, and whether a client asked it to stop."""

    key_name: str | None
    pieces: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class Generations:
    """`genkey -> Generation` for the generations running on this node."""

    def __init__(self) -> None:
        self._running: dict[str, Generation] = {}

    def __len__(self) -> int:
        return len(self._running)

    def start(self, genkey: str, key_name: str | None) -> Generation:
        # A client reusing a genkey means its new generation: the older one is no longer
        # what a check about that key asks for.
        generation = self._running[genkey] = Generation(key_name)
        return generation

    def end(self, genkey: str, generation: Generation) -> None:
        if self._running.get(genkey) is generation:
            del self._running[genkey]

    def find(self, genkey: str, key_name: str | None) -> Generation | None:
        generation = self._running.get(genkey)
        if generation is None or generation.key_name != key_name:
            return None
        return generation
