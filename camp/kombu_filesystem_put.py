"""The demo's filesystem broker must never hand a worker half a message (kombu 5.7.0).

The defect (seen in the newcomer walk, issue 32): kombu's filesystem ``Channel._put`` opens the
message file under its final name (``<ms>_<uuid>.<queue>.msg``) and only then writes the JSON
into it, holding an ``flock`` that ``_get`` never asks for: ``_get`` lists the folder and moves
the first file of its queue away at once. A worker polling while the web server (or the beat)
is between ``open`` and ``write`` takes an empty file, ``loads("")`` raises ``JSONDecodeError``
outside any task, Celery logs "Unrecoverable error" and the worker process exits: the demo
goes on serving pages while nothing is scheduled any more (the admin home's lag grew by a
second a second). The faster the worker polls (``polling_interval``), the likelier the race.
Open upstream as celery/kombu#1551; no released kombu writes atomically.

The fix: write the message under a name ``_get`` does not take (``….msg.part``: its
``partition('.')`` is not ``<queue>.msg``), then ``os.replace`` it to its final name, which
POSIX makes atomic within the folder: a reader sees no file or the whole message. Remove
this module when kombu's ``_put`` writes atomically (check:
``tests/unit/test_kombu_filesystem_put.py`` without it).
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem as kombu_filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


def _put(self: Any, queue: str, payload: Any, **kwargs: Any) -> None:
    """``Channel._put`` with the same file name and content, written whole before it is seen."""
    name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
    final = os.path.join(self.data_folder_out, name)
    part = final + ".part"
    try:
        with open(part, "wb", buffering=0) as f:
            f.write(str_to_bytes(dumps(payload)))
        os.replace(part, final)
    except OSError as exc:
        try:
            os.unlink(part)
        except OSError:
            pass
        raise ChannelError(f"Cannot add file {final!r} to directory") from exc


kombu_filesystem.Channel._put = _put  # type: ignore[method-assign]
