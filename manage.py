#!/usr/bin/env python
"""Django's command-line utility for the router."""

from __future__ import annotations

import os
import sys


def _config_from_argv(argv: list[str]) -> str | None:
    # Settings are built from the node's config file before any command runs, so `--config`
    # has to be read here rather than by the command's own parser.
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def _use_uvloop() -> None:
    # Daphne installs Twisted's asyncio reactor when Django loads its app, on a loop made by
    # the current policy; choosing uvloop's policy first makes the router's loop uvloop, which
    # measured markedly lower proxy latency here. It is optional: without it, stock asyncio.
    try:
        import uvloop
    except ImportError:
        return
    import asyncio

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerproject.settings")
    if len(sys.argv) > 1 and sys.argv[1] == "runrouter":
        _use_uvloop()
    explicit = _config_from_argv(sys.argv)
    if explicit:
        os.environ["ROUTER_CONFIG"] = explicit
    from routerproject.config import ConfigError

    try:
        from django.core.management import execute_from_command_line

        execute_from_command_line(sys.argv)
    except ConfigError as exc:
        print(f"invalid config: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
