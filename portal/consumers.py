"""The WebSocket behind live pages: /ws/live/."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from tenants.models import Project
from tenants.permissions import restrict, scope_of
from tenants.sockets import session_group, user_group

from .live import ALL_GROUP, project_group


@database_sync_to_async
def _groups_for(user: Any) -> list[str]:
    """The groups a user may listen to: every project they can see (all, for platform admins)."""
    if scope_of(user).platform_admin:
        return [ALL_GROUP]
    return [project_group(pk) for pk in restrict(Project.objects.all(), user).values_list("pk", flat=True)]


@database_sync_to_async
def _still_allowed(scope: dict[str, Any], project_id: int | None) -> bool:
    from django.contrib.sessions.models import Session
    from django.utils import timezone

    from tenants.models import User

    session = scope.get("session")
    key = getattr(session, "session_key", None)
    if not key or not Session.objects.filter(session_key=key, expire_date__gt=timezone.now()).exists():
        return False
    user_id = getattr(scope.get("user"), "pk", None)
    if user_id is None or project_id is None:
        return False
    user = User.objects.filter(pk=user_id, is_active=True).first()
    if user is None:
        return False
    return restrict(Project.objects.filter(pk=project_id), user).exists()


class LiveConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    groups_joined: list[str]

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.groups_joined = await _groups_for(user)
        # Deprovisioning and back-channel logout close this socket at once (``live.close``).
        self.groups_joined.append(user_group(user.pk))
        key = getattr(self.scope.get("session"), "session_key", None)
        if key:
            self.groups_joined.append(session_group(key))
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients only listen."""

    async def live_close(self, event: dict[str, Any]) -> None:
        """The account was deactivated or this session signed out elsewhere: 4401, at once."""
        await self.close(code=4401)

    async def job_update(self, event: dict[str, Any]) -> None:
        # Access is checked again for every message: a user removed from the project,
        # deactivated or logged out since connecting gets nothing more.
        if not await _still_allowed(self.scope, event.get("project_id")):
            await self.close(code=4403)
            return
        await self.send_json({"type": "job", "job": event["job"]})

    async def service_update(self, event: dict[str, Any]) -> None:
        if not await _still_allowed(self.scope, event.get("project_id")):
            await self.close(code=4403)
            return
        await self.send_json({"type": "service", "service": event["service"]})
