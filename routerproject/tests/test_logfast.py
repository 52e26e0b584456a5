"""The access line's record maker: the record `Logger.makeRecord` would make, attribute for
attribute, and the same text and JSON lines from it."""

from __future__ import annotations

import logging
import logging.config
import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from routerproject import logfast
from routerproject.logfast import RecordMaker

NOW = 1_750_000_000.125
FORMAT = "%s %s model=%s status=%d ms=%.1f"
ARGS = ("POST", "/v1/chat/completions", "chat\u202e", 200, 12.5)


def _fields() -> dict[str, Any]:
    return {
        "event": "access",
        "request_id": "r\x1b-1",
        "path": "/v1/chat/completions\n2026",
        "model": "chat\u202e",
        "lent": False,
        "lent_to": None,
        "status": 200,
        "ms": 12.5,
    }


def _caller() -> None:
    # Stands for the function whose line it is (health._line).
    pass


@pytest.fixture
def logger(monkeypatch: pytest.MonkeyPatch) -> Iterator[logging.Logger]:
    monkeypatch.setattr(logfast.time, "time", lambda: NOW)
    yield logging.getLogger("router.test.logfast")


def _by_logging(
    logger: logging.Logger,
    fields: dict[str, Any],
    args: tuple[Any, ...] = ARGS,
    level: int = logging.INFO,
) -> logging.LogRecord:
    code = _caller.__code__
    return logger.makeRecord(
        logger.name,
        level,
        code.co_filename,
        code.co_firstlineno,
        FORMAT,
        args,
        None,
        code.co_name,
        fields,
    )


def _items(record: logging.LogRecord) -> list[tuple[str, Any]]:
    return list(record.__dict__.items())


@pytest.mark.parametrize("level", [logging.DEBUG, logging.INFO, 25])
def test_the_record_is_the_one_make_record_makes(logger: logging.Logger, level: int) -> None:
    made = RecordMaker(logger, _caller.__code__).make(level, FORMAT, ARGS, _fields())
    expected = _by_logging(logger, _fields(), level=level)
    assert type(made) is logging.LogRecord
    # The same attributes in the same order (the JSON formatter writes `extra` in that order).
    assert _items(made) == _items(expected)
    assert made.getMessage() == expected.getMessage()


def test_the_record_names_the_thread_it_was_made_on(logger: logging.Logger) -> None:
    maker = RecordMaker(logger, _caller.__code__)
    made: list[logging.LogRecord] = []
    expected: list[logging.LogRecord] = []

    def on_a_thread() -> None:
        made.append(maker.make(logging.INFO, FORMAT, ARGS, _fields()))
        expected.append(_by_logging(logger, _fields()))

    thread = threading.Thread(target=on_a_thread, name="writer-7")
    thread.start()
    thread.join()
    assert made[0].threadName == "writer-7"
    assert _items(made[0]) == _items(expected[0])


def test_the_stdlib_switches_for_thread_and_process_fields_are_obeyed(
    logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    for switch in ("logThreads", "logProcesses", "logMultiprocessing"):
        monkeypatch.setattr(logging, switch, False)
    made = RecordMaker(logger, _caller.__code__).make(logging.INFO, FORMAT, ARGS, _fields())
    assert (made.thread, made.threadName, made.process, made.processName) == (None,) * 4
    assert _items(made) == _items(_by_logging(logger, _fields()))


def test_milliseconds_are_the_stdlib_ones_for_any_time(monkeypatch: pytest.MonkeyPatch) -> None:
    draw = random.Random(7)
    instants = [0.0, 1.0, 0.0005, 0.9999999, NOW, 1_750_000_000.999999, 2**33 - 0.0001]
    instants += [draw.uniform(0, 2**33) for _ in range(20_000)]
    instants += [draw.randrange(2**31) + draw.random() for _ in range(20_000)]
    maker = RecordMaker(logging.getLogger("router.test.logfast"), _caller.__code__)
    for instant in instants:
        monkeypatch.setattr(logfast.time, "time", lambda instant=instant: instant)
        assert (
            maker.make(logging.INFO, "x", (), {}).msecs
            == int((instant - int(instant)) * 1000) + 0.0
        )


def test_a_lone_mapping_argument_is_the_stdlibs_mapping(logger: logging.Logger) -> None:
    args = ({"model": "chat"},)
    made = RecordMaker(logger, _caller.__code__).make(logging.INFO, "%(model)s", args, {})
    assert made.args == {"model": "chat"} and made.getMessage() == "chat"


@pytest.mark.parametrize("key", ["msg", "levelname", "process", "message", "asctime"])
def test_a_field_that_would_overwrite_the_record_is_refused_as_make_record_refuses_it(
    logger: logging.Logger, key: str
) -> None:
    fields = {**_fields(), key: "mine"}
    with pytest.raises(KeyError, match="Attempt to overwrite"):
        RecordMaker(logger, _caller.__code__).make(logging.INFO, FORMAT, ARGS, fields)


class _Tagged(logging.LogRecord):
    pass


def test_a_record_factory_of_ones_own_is_used(logger: logging.Logger) -> None:
    factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(_Tagged)
    try:
        made = RecordMaker(logger, _caller.__code__).make(logging.INFO, FORMAT, ARGS, _fields())
        expected = _by_logging(logger, _fields())
    finally:
        logging.setLogRecordFactory(factory)
    assert type(made) is _Tagged
    assert _items(made) == _items(expected)


class _OwnRecords(logging.Logger):
    def makeRecord(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = super().makeRecord(*args, **kwargs)
        record.tagged = True
        return record


def test_a_logger_class_with_its_own_make_record_makes_the_records() -> None:
    made = RecordMaker(_OwnRecords("own"), _caller.__code__).make(logging.INFO, "x", (), {})
    assert made.__dict__["tagged"] is True


@pytest.mark.parametrize("kind", ["text", "json"])
def test_the_lines_are_the_ones_a_made_record_writes(logger: logging.Logger, kind: str) -> None:
    # The formatters the node runs with.
    config: dict[str, Any] = settings.LOGGING
    formatter = logging.config.DictConfigurator(config).configure_formatter(
        dict(config["formatters"][kind])
    )
    made = RecordMaker(logger, _caller.__code__).make(logging.INFO, FORMAT, ARGS, _fields())
    line = formatter.format(made)
    assert line == formatter.format(_by_logging(logger, _fields()))
    assert "\\u202e" in line and "\u202e" not in line
