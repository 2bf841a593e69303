"""The demo's filesystem broker (camp/kombu_filesystem_put.py): a message is never visible to a
worker before it is whole. kombu's own ``_put`` opened the final file name and then wrote, so a
worker polling in between took an empty file and exited on the JSONDecodeError."""

from __future__ import annotations

from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu import Connection

import camp.kombu_filesystem_put  # noqa: F401 (the patch under test, as camp.celery loads it)


def _channel(folder: Path) -> Any:
    conn = Connection("filesystem://", transport_options={
        "data_folder_in": str(folder), "data_folder_out": str(folder),
        "processed_folder": str(folder / "processed"), "store_processed": False})
    return conn.default_channel


def test_a_message_appears_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kombu.transport import filesystem

    from camp import kombu_filesystem_put

    writer, reader = _channel(tmp_path), _channel(tmp_path)
    seen_mid_write: list[object] = []
    real_dumps = kombu_filesystem_put.dumps

    def dumps_while_a_worker_polls(obj: Any) -> str:
        # The writer's file exists and holds nothing yet: a worker polls at this moment.
        try:
            seen_mid_write.append(reader._get("celery"))
        except Empty:
            pass
        except ValueError as exc:  # kombu's own _put: the empty final file, taken and undecodable
            seen_mid_write.append(exc)
        return str(real_dumps(obj))

    monkeypatch.setattr(kombu_filesystem_put, "dumps", dumps_while_a_worker_polls)
    monkeypatch.setattr(filesystem, "dumps", dumps_while_a_worker_polls)
    writer._put("celery", {"body": "tick", "n": 1})
    assert seen_mid_write == []
    assert reader._get("celery") == {"body": "tick", "n": 1}
    with pytest.raises(Empty):
        reader._get("celery")
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == []  # no part file left behind
