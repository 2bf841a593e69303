"""ASGI entry point: HTTP through Django, WebSockets through Channels."""

import os
from typing import Any

import django
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "camp.settings")


class SyncChainASGIHandler(ASGIHandler):
    """Django's ASGI handler with the middleware chain and the view run in one thread hop.

    Django builds an ASGI chain in async mode, and every ``MiddlewareMixin`` middleware is
    async-capable: in that mode each runs its ``process_request`` and ``process_response``
    through a ``sync_to_async`` of its own, up to the innermost sync-only middleware (ours:
    the SAML session's), which is entered from a thread back into the event loop with
    ``async_to_sync``. Every view and every middleware here is synchronous, so that was 17
    thread hand-offs for a 404, for nothing: ~4–7 ms of server CPU a request
    (docs/BENCHMARKS.md §15, "Round 17"). Here the chain is
    built in sync mode, as under WSGI, and entered once through ``sync_to_async``
    (thread-sensitive, so in the request's own thread, as Django runs sync views under ASGI).
    Streaming, disconnects, signals and ``request.close`` stay Django's own.
    """

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)
        if is_async:
            chain = getattr(self, "_middleware_chain")  # noqa: B009 (django-stubs leave it untyped)
            setattr(self, "_middleware_chain", sync_to_async(chain, thread_sensitive=True))  # noqa: B010


def _django_http() -> Any:
    # What django.core.asgi.get_asgi_application does, with the handler above.
    django.setup(set_prefix=False)
    return SyncChainASGIHandler()


django_asgi_app = _django_http()

from camp.checks import refuse_to_start  # noqa: E402

refuse_to_start()  # e.g. LDAP enabled without its extra: say so now, not at the first login

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from camp.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)

from camp.heap import freeze_web_app  # noqa: E402

freeze_web_app()  # the loaded app is never garbage: full collections skip it (camp.heap)
