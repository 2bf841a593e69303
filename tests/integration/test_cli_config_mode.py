"""The CLI's config file holds a token: readable by its owner only, even when it existed
before with a wider mode (issue 30, item 10); the token comes from a hidden prompt."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tenants import services as tenant_services
from tests.conftest import World

pytestmark = pytest.mark.django_db(transaction=True)


def test_login_writes_the_config_0600_even_over_an_existing_0644_file(
        world: World, live_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from camp_cli import main

    config = tmp_path / "config.json"
    config.write_text("{}")
    config.chmod(0o644)
    monkeypatch.setattr(main, "CONFIG", config)
    _, token = tenant_services.token_create(actor=world.a.member, name="cli")
    result = CliRunner().invoke(main.cli, ["login", "--url", live_server.url], input=token + "\n")
    assert result.exit_code == 0, result.output
    assert token not in result.output  # typed at a hidden prompt, not echoed
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert token in config.read_text()
