"""The access line's record, made for less than `Logger.makeRecord` costs.

Every request writes one access line, and the event loop's single thread pays for it. The stdlib
makes each record generically: `LogRecord.__init__` splits the caller's path into file name and
module, tests its arguments for a lone mapping and `Logger.makeRecord` walks `extra` checking
each key against the record. For a line logged from one place in the code, with the same keys each
time, all of that but the clock, the thread and the process can be worked out once.

`RecordMaker.make` returns a plain `logging.LogRecord` holding exactly the attributes, values
and attribute order `Logger.makeRecord` would give it (routerproject/tests/test_logfast.py
compares the two), so every formatter, filter and handler sees the record it always saw. Whoever
installs a record factory of their own (`logging.setLogRecordFactory`) or a logger class with its
own `makeRecord` gets theirs: the stdlib path is taken then.

Stdlib only: the logging configuration may load this before Django is set up.
"""

from __future__ import annotations

import collections.abc
import logging
import os
import sys
import threading
import time
from types import CodeType
from typing import Any

# When `logging` was imported: LogRecord.relativeCreated counts from it. Private, never rebound.
_START_TIME: float = vars(logging)["_startTime"]


class RecordMaker:
    """Makes the records `logger` would make for a call from the function of `code`."""

    def __init__(self, logger: logging.Logger, code: CodeType) -> None:
        self.logger = logger
        self.pathname = code.co_filename
        self.filename = os.path.basename(self.pathname)
        self.module = os.path.splitext(self.filename)[0]
        self.lineno = code.co_firstlineno
        self.func = code.co_name
        # A logger class of someone else's may make its records its own way.
        self._stdlib_logger = type(logger).makeRecord is logging.Logger.makeRecord
        self._template: dict[str, Any] = {
            "name": logger.name,
            "msg": None,
            "args": None,
            "levelname": None,
            "levelno": None,
            "pathname": self.pathname,
            "filename": self.filename,
            "module": self.module,
            "exc_info": None,
            "exc_text": None,
            "stack_info": None,
            "lineno": self.lineno,
            "funcName": self.func,
            "created": None,
            "msecs": None,
            "relativeCreated": None,
            "thread": None,
            "threadName": None,
            "processName": None,
            "process": None,
        }

    def make(
        self, level: int, msg: str, args: tuple[Any, ...], extra: dict[str, Any]
    ) -> logging.LogRecord:
        """The record of `msg % args` at `level`, with `extra`'s items as attributes."""
        if not self._stdlib_logger or logging.getLogRecordFactory() is not logging.LogRecord:
            return self._made_by_logging(level, msg, args, extra)
        record_args: Any = args
        if len(args) == 1 and isinstance(args[0], collections.abc.Mapping) and args[0]:
            # `log("%(a)s", {"a": 1})`: the stdlib formats with the mapping itself.
            record_args = args[0]
        now = time.time()
        # The order of LogRecord.__init__ (the template's): a formatter that walks the record's
        # attributes (the JSON one adds every `extra` field in the order it finds them) sees the
        # same order. Copying a dict costs half what building one of 20 keys does.
        values = self._template.copy()
        values["msg"] = msg
        values["args"] = record_args
        values["levelname"] = logging.getLevelName(level)
        values["levelno"] = level
        values["created"] = now
        # int((now - int(now)) * 1000) + 0.0, as LogRecord has it, without two int() calls:
        # equal for every time at or after 1970 (routerproject/tests/test_logfast.py).
        values["msecs"] = now % 1.0 * 1000 // 1
        values["relativeCreated"] = (now - _START_TIME) * 1000
        if logging.logThreads:
            values["thread"] = threading.get_ident()
            values["threadName"] = threading.current_thread().name
        if logging.logMultiprocessing:
            values["processName"] = _process_name()
        if logging.logProcesses:
            values["process"] = os.getpid()
        expected = len(values) + len(extra)
        values.update(extra)
        if len(values) != expected or "message" in extra or "asctime" in extra:
            # A key of `extra` took an attribute's place: refused as makeRecord refuses it.
            return self._made_by_logging(level, msg, args, extra)
        record = logging.LogRecord.__new__(logging.LogRecord)
        record.__dict__ = values
        return record

    def _made_by_logging(
        self, level: int, msg: str, args: tuple[Any, ...], extra: dict[str, Any]
    ) -> logging.LogRecord:
        logger = self.logger
        return logger.makeRecord(
            logger.name, level, self.pathname, self.lineno, msg, args, None, self.func, extra
        )


def _process_name() -> str | None:
    # As LogRecord.__init__ names the process: multiprocessing asked only once it is loaded.
    name: str | None = "MainProcess"
    mp = sys.modules.get("multiprocessing")
    if mp is not None:
        try:
            name = mp.current_process().name
        except Exception:
            pass
    return name
