"""The `logging` section: format, level and the backend log files' size and backups."""

from __future__ import annotations

from pathlib import Path

import pytest

from routerproject.tests.test_config import load, load_error


def test_logging_defaults(tmp_path: Path) -> None:
    cfg = load(tmp_path, "")
    assert cfg.logging.format == "text"
    assert cfg.logging.level == "INFO"
    assert cfg.logging.backend_log_max_bytes == 64 * 1024 * 1024
    assert cfg.logging.backend_log_backups == 3


def test_logging_values_are_read(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        "logging:\n  format: json\n  level: DEBUG\n  backend_log_max_bytes: 1024\n"
        "  backend_log_backups: 1\n",
    )
    assert (cfg.logging.format, cfg.logging.level) == ("json", "DEBUG")
    assert (cfg.logging.backend_log_max_bytes, cfg.logging.backend_log_backups) == (1024, 1)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("logging:\n  format: yaml\n", "logging.format"),
        ("logging:\n  level: LOUD\n", "logging.level"),
        ("logging:\n  backend_log_max_bytes: 1023\n", "logging.backend_log_max_bytes"),
        ("logging:\n  backend_log_backups: 0\n", "logging.backend_log_backups"),
        ("logging:\n  backend_log_backups: 101\n", "logging.backend_log_backups"),
        ("logging:\n  colour: true\n", "logging.colour"),
    ],
)
def test_a_bad_logging_value_names_its_key(tmp_path: Path, text: str, key: str) -> None:
    error = load_error(tmp_path, text)
    assert key in str(error)
