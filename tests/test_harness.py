"""The integration harness's own rules: which slaves may start together, and the database
template new nodes start from."""

from __future__ import annotations

import os
import sqlite3

import pytest

from tests.harness import TEMPLATES, _PgDatabase, clashing_names, text_model


def test_replicas_and_distinct_names_let_slaves_start_together() -> None:
    assert not clashing_names({"s1": [text_model("twin")], "s2": [text_model("twin")]})
    assert not clashing_names({"s1": [text_model("a")], "s2": [text_model("b")]})
    assert not clashing_names({"s1": [text_model("a"), text_model("b")]})


def test_one_name_with_other_weights_on_two_slaves_starts_them_in_order() -> None:
    # The first slave to register keeps `clash`, the next gets `clash-2`: tests name both.
    clash = {
        "s1": [text_model("twin"), text_model("clash", output_ms_per_token=2)],
        "s2": [text_model("twin"), text_model("clash", output_ms_per_token=3)],
    }
    assert clashing_names(clash)


def test_the_database_template_is_migrated_and_whole_in_one_file() -> None:
    path = TEMPLATES.sqlite()
    assert not path.with_name(path.name + "-wal").exists()
    lite = sqlite3.connect(path)
    try:
        assert lite.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        applied = {app for (app,) in lite.execute("SELECT app FROM django_migrations")}
    finally:
        lite.close()
    assert {"registry", "analytics", "lending", "guardians", "django_q"} <= applied


@pytest.mark.skipif(
    not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")),
    reason="the suite runs on SQLite",
)
def test_the_postgresql_template_is_migrated_and_nodes_get_copies_of_it() -> None:
    import psycopg

    admin = os.environ["DATABASE_URL"]
    template = TEMPLATES.pg(admin)
    db = _PgDatabase(admin, template)
    try:
        with psycopg.connect(db.url) as pg:
            applied = {app for (app,) in pg.execute("SELECT app FROM django_migrations")}
    finally:
        db.drop()
    assert {"registry", "analytics", "lending", "guardians", "django_q"} <= applied
