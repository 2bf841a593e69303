"""Deprovisioning closes the person's open live pages at once (issue 31): the WebSocket of a
deactivated account is closed by the deactivation itself, not at its next message; another
person's socket goes on. Channels' communicator against Camp's ASGI application (auth from
the session cookie, Redis channel layer, real PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.test import Client

from portal.live import project_group

pytestmark = pytest.mark.django_db(transaction=True)


def session_cookie(user: Any) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


class Socket(ApplicationCommunicator):  # type: ignore[misc]
    """A browser's WebSocket to /ws/live/ as the ASGI server hands it to Camp (what
    channels.testing.WebsocketCommunicator does; that module needs daphne, not installed)."""

    async def connect(self, timeout: float) -> bool:
        await self.send_input({"type": "websocket.connect"})
        answer = await self.receive_output(timeout)
        return bool(answer["type"] == "websocket.accept")

    async def receive_json_from(self, timeout: float) -> Any:
        message = await self.receive_output(timeout)
        assert message["type"] == "websocket.send", message
        return json.loads(message["text"])

    async def disconnect(self) -> None:
        await self.send_input({"type": "websocket.disconnect", "code": 1000})
        await self.wait(timeout=20)


def socket(cookie: bytes) -> Socket:
    from camp.asgi import application

    return Socket(application, {
        "type": "websocket", "path": "/ws/live/", "query_string": b"", "subprotocols": [],
        "headers": [(b"cookie", cookie), (b"origin", b"http://testserver"),
                    (b"host", b"testserver")]})


def test_deactivation_closes_the_accounts_open_sockets_at_once(world: Any) -> None:
    from channels.layers import get_channel_layer

    from tenants.sso.services import deactivate_account

    leaving, staying = world.a.member, world.a.owner
    project = world.a.project
    cookies = session_cookie(leaving), session_cookie(leaving), session_cookie(staying)

    async def scenario() -> tuple[list[Any], Any]:
        sockets = [socket(c) for c in cookies]
        for s in sockets:
            assert await s.connect(timeout=20)
        await sync_to_async(deactivate_account)(user=leaving, actor_username="scim:okta",
                                                reason="deactivated by the identity provider")
        closed = [await s.receive_output(timeout=20) for s in sockets[:2]]
        # The other person's socket is still open: the next job update reaches it.
        await get_channel_layer().group_send(project_group(project.pk), {
            "type": "job.update", "project_id": project.pk, "job": {"id": 1, "state": "running"}})
        update = await sockets[2].receive_json_from(timeout=20)
        await sockets[2].disconnect()
        return closed, update

    closed, update = asyncio.run(scenario())
    assert [c["type"] for c in closed] == ["websocket.close", "websocket.close"]
    assert {c.get("code") for c in closed} == {4401}
    assert update == {"type": "job", "job": {"id": 1, "state": "running"}}
