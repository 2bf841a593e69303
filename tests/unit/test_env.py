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
