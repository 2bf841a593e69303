"""Typed environment helpers name the variable they cannot parse."""

from __future__ import annotations

from pathlib import Path

import pytest

from camp.env import ImproperlyConfiguredEnv, env_bool, env_int, env_list, env_str


def test_values_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAMP_T_BOOL", "yes")
    monkeypatch.setenv("CAMP_T_INT", "42")
    monkeypatch.setenv("CAMP_T_LIST", "a, b,,c")
    assert env_bool("CAMP_T_BOOL") is True
    assert env_int("CAMP_T_INT", 1) == 42
    assert env_list("CAMP_T_LIST") == ["a", "b", "c"]
    assert env_str("CAMP_T_MISSING", "dflt") == "dflt"
    assert env_int("CAMP_T_MISSING", 7) == 7


def test_bad_values_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAMP_T_BOOL", "maybe")
    monkeypatch.setenv("CAMP_T_INT", "ten")
    with pytest.raises(ImproperlyConfiguredEnv, match="CAMP_T_BOOL"):
        env_bool("CAMP_T_BOOL")
    with pytest.raises(ImproperlyConfiguredEnv, match="CAMP_T_INT"):
        env_int("CAMP_T_INT", 0)


def test_file_variant_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("from-file\n")
    monkeypatch.setenv("CAMP_T_SECRET", "from-env")
    monkeypatch.setenv("CAMP_T_SECRET_FILE", str(secret))
    assert env_str("CAMP_T_SECRET") == "from-file"


def test_client_ip_behind_trusted_proxies(settings: object) -> None:
    from django.test import RequestFactory

    from tenants.middleware import client_ip

    rf = RequestFactory()
    spoofed = rf.get("/", HTTP_X_FORWARDED_FOR="6.6.6.6, 203.0.113.7", REMOTE_ADDR="10.0.0.2")
    settings.TRUSTED_PROXY_COUNT = 0  # type: ignore[attr-defined]
    assert client_ip(spoofed) == "10.0.0.2"  # no proxies trusted: headers ignored
    settings.TRUSTED_PROXY_COUNT = 1  # type: ignore[attr-defined]
    assert client_ip(spoofed) == "203.0.113.7"  # what our proxy saw, not what the client claimed
    bad = rf.get("/", HTTP_X_FORWARDED_FOR="not-an-ip", REMOTE_ADDR="10.0.0.2")
    assert client_ip(bad) == "10.0.0.2"


def test_a_postgresql_connection_pool_is_the_default_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL gets a psycopg pool of RECOMMENDED_POOL_SIZE by default (issue 35), its
    connections checked at checkout; DB_POOL_MAX_SIZE sets its size, 0 none; persistent
    connections asked for (DB_CONN_MAX_AGE) without a pool size mean no pool, and a pool beside
    them is refused (Django would at the first query); SQLite has none."""
    from camp.settings.database import (
        POOL_RECONNECT_TIMEOUT_S,
        RECOMMENDED_POOL_SIZE,
        parse_database_url,
        pool_options,
        pool_size_from_env,
    )

    monkeypatch.delenv("DB_POOL_MAX_SIZE", raising=False)
    monkeypatch.delenv("DB_CONN_MAX_AGE", raising=False)
    assert pool_size_from_env() == RECOMMENDED_POOL_SIZE == 8
    monkeypatch.setenv("DB_CONN_MAX_AGE", "60")
    assert pool_size_from_env() == 0
    monkeypatch.setenv("DB_POOL_MAX_SIZE", "4")
    assert pool_size_from_env() == 4  # refused by pool_options below, naming both
    monkeypatch.delenv("DB_CONN_MAX_AGE")
    monkeypatch.setenv("DB_POOL_MAX_SIZE", "0")
    assert pool_size_from_env() == 0

    pg = parse_database_url("postgres://camp:pw@db:5432/camp")
    assert pool_options(pg, 0) == pg
    pooled = pool_options(pg, 8, min_size=2, timeout=5)
    assert pooled["OPTIONS"]["pool"] == {"min_size": 2, "max_size": 8, "timeout": 5,
                                         "reconnect_timeout": POOL_RECONNECT_TIMEOUT_S}
    assert pooled["CONN_HEALTH_CHECKS"] is True
    lite = parse_database_url("sqlite:////tmp/x.sqlite3")
    assert pool_options(lite, 8) == lite
    with pytest.raises(ImproperlyConfiguredEnv, match="DB_CONN_MAX_AGE"):
        pool_options(parse_database_url("postgres://camp:pw@db/camp", conn_max_age=60), 8)
