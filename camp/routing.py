"""WebSocket routes (live pages are added by the portal issue)."""

from typing import Any

websocket_urlpatterns: list[Any] = []
