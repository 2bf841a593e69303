"""Closing a person's open live pages (Channels WebSockets) from the tenancy layer.

Deprovisioning (``tenants.sso.services.deactivate_account``) and back-channel logout end
access at once; the live pages' consumer (``portal.consumers.LiveConsumer``) joins these
groups and closes itself (4401) on a ``live.close`` message.
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)


def user_group(user_id: int) -> str:
    """Every live page of one account: the deprovisioning path closes them all."""
    return f"live.user.{user_id}"


def session_group(session_key: str) -> str:
    """The live pages of one browser session: a back-channel logout closes them."""
    return f"live.session.{session_key}"


def _close(group: str, reason: str) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, {"type": "live.close", "reason": reason})
    except Exception:  # the sockets' own per-message check still refuses them
        logger.warning("could not close live pages of %s", group, exc_info=True)


def close_user_sockets(user_id: int) -> None:
    """Close the account's open WebSockets now (deactivation), not at their next message."""
    _close(user_group(user_id), "account deactivated")


def close_session_sockets(session_key: str) -> None:
    """Close the WebSockets opened with this session (it was logged out elsewhere)."""
    _close(session_group(session_key), "signed out")
