#!/usr/bin/env python
"""Django's command-line utility for the router."""

from __future__ import annotations

import gc
import os
import sys


def _config_from_argv(argv: list[str]) -> tuple[str | None, list[str]]:
    """The `--config` value and the command line without it.

    Settings are built from the node's config file before any command runs, so `--config` is
    manage.py's own option, read here for every command (`createsuperuser --config …` as much
    as `runrouter --config …`) and taken out so that Django's commands never see an argument
    they do not declare.
    """
    rest: list[str] = []
    found: str | None = None
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--config" and i + 1 < len(argv):
            found, skip = argv[i + 1], True
            continue
        if arg.startswith("--config="):
            found = arg.split("=", 1)[1]
            continue
        rest.append(arg)
    return found, rest


def _use_uvloop() -> None:
    # The router makes its loop through the current policy (runrouter); choosing uvloop's
    # first makes it uvloop, whose C transports the HTTP server reads and writes through, which
    # measured markedly lower proxy latency here. It is optional: without it, stock asyncio.
    try:
        import uvloop
    except ImportError:
        return
    import asyncio

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _init_node(argv: list[str]) -> None:
    """`init_node` without Django's settings: they are built from a node's config and make its
    store, and this command writes a config, often beside a broken `./config.yaml` it is run
    to replace. With the settings loaded, that file stopped it ("invalid config"), and every
    run left a `./router-store` with a secret key in the current directory."""
    from django.core.management.base import CommandError

    from registry.management.commands.init_node import Command

    command = Command()
    # As Django's own run_from_argv: a bad option prints the usage and exits 2.
    command._called_from_command_line = True  # type: ignore[attr-defined]  # set by Django, not declared
    options = vars(command.create_parser(argv[0], argv[1]).parse_args(argv[2:]))
    try:
        command.execute(*options.pop("args", ()), **options)
    except CommandError as exc:
        command.stderr.write(f"CommandError: {exc}")
        sys.exit(exc.returncode)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerproject.settings")
    if len(sys.argv) > 1 and sys.argv[1] == "runrouter":
        # A node's start imports some 1,600 modules whose objects all live as long as the
        # process: collections during the imports find no garbage and cost a sixth of the
        # start's CPU. `tune_gc` turns collection back on once startup is done.
        gc.disable()
        _use_uvloop()
    explicit, argv = _config_from_argv(sys.argv)
    if explicit:
        os.environ["ROUTER_CONFIG"] = explicit
    from routerproject.config import ConfigError

    try:
        if argv[1:2] == ["init_node"]:
            _init_node(argv)
            return
        if argv[1:] in (["healthcheck"], ["healthcheck", "--live"]):
            # Docker runs it every 30 s: with Django's apps set up it cost 2.3 s of CPU a time,
            # a tenth of a core for as long as the container runs; without them, 0.3 s.
            from proxy.management.commands.healthcheck import check

            sys.exit(check(live="--live" in argv, out=print, err=_to_stderr))
        from django.core.management import execute_from_command_line

        execute_from_command_line(argv)
    except ConfigError as exc:
        print(f"invalid config: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
