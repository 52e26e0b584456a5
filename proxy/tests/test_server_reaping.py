"""Daphne's record of each request (`Server.connections`) on the node's server: a finished
request is dropped at once, not at the once-a-second check."""

from __future__ import annotations

import asyncio
from typing import Any

from daphne.server import Server

from proxy.management.commands.runrouter import _PromptReaping


class Reaping(_PromptReaping, Server):
    def __init__(self, application: Any) -> None:
        # Never run: an endpoint only so that Daphne accepts the construction.
        super().__init__(application, endpoints=["tcp:port=0:interface=127.0.0.1"])
        self.connections = {}


async def _finishes(scope: Any, receive: Any, send: Any) -> None:
    await asyncio.sleep(0)


async def _raises(scope: Any, receive: Any, send: Any) -> None:
    raise RuntimeError("the app failed")


async def _serve(server: Reaping, protocol: object, *, disconnect_first: bool) -> None:
    server.protocol_connected(protocol)
    server.create_application(protocol, {"type": "http"})
    instance = server.connections[protocol]["application_instance"]
    if disconnect_first:
        server.protocol_disconnected(protocol)
    await asyncio.wait([instance])
    await asyncio.sleep(0)  # the instance's done callbacks run on the next turn of the loop
    if not disconnect_first:
        server.protocol_disconnected(protocol)


def test_a_request_is_dropped_once_its_connection_and_its_app_are_both_done() -> None:
    server = Reaping(_finishes)
    disconnected_then_done, done_then_disconnected = object(), object()

    async def run() -> None:
        await _serve(server, disconnected_then_done, disconnect_first=True)
        await _serve(server, done_then_disconnected, disconnect_first=False)

    asyncio.run(run())
    assert server.connections == {}


def test_a_request_still_running_is_kept() -> None:
    server = Reaping(_finishes)
    protocol = object()

    async def run() -> None:
        server.protocol_connected(protocol)
        server.create_application(protocol, {"type": "http"})
        server.protocol_disconnected(protocol)  # the client went away: the app still runs
        assert protocol in server.connections
        await asyncio.wait([server.connections[protocol]["application_instance"]])

    asyncio.run(run())


def test_an_app_that_raised_is_left_for_daphnes_check_to_report() -> None:
    server = Reaping(_raises)
    protocol = object()
    asyncio.run(_serve(server, protocol, disconnect_first=True))
    assert isinstance(
        server.connections[protocol]["application_instance"].exception(), RuntimeError
    )


def test_a_request_told_again_that_it_disconnected_after_it_was_dropped_is_let_be() -> None:
    # A WebSocket the app refused is told when refused and again when its socket closes.
    server = Reaping(_finishes)
    protocol = object()
    asyncio.run(_serve(server, protocol, disconnect_first=True))
    assert server.connections == {}
    server.protocol_disconnected(protocol)
    assert server.connections == {}
