"""Request context (request id, client IP) for audit events and log lines."""

from __future__ import annotations

import ipaddress
import re
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from django.http import HttpRequest, HttpResponse


@dataclass(frozen=True)
class RequestContext:
    request_id: str = ""
    client_ip: str | None = None


# RequestContext is frozen, so sharing one default instance is safe.
current_request: ContextVar[RequestContext] = ContextVar(
    "camp_request_context", default=RequestContext()  # noqa: B039
)

# A caller's X-Request-ID is kept only when it is short and plain, so it cannot
# smuggle anything into logs or the audit table.
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def client_ip(request: HttpRequest) -> str | None:
    """The client's address. Behind TRUSTED_PROXY_COUNT reverse proxies, the entry those
    proxies appended to X-Forwarded-For (counting from the right: the leftmost entries are
    whatever the client claimed); otherwise REMOTE_ADDR. Used by audit and login throttling."""
    from django.conf import settings

    proxies = getattr(settings, "TRUSTED_PROXY_COUNT", 0)
    if proxies > 0:
        hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if h.strip()]
        if len(hops) >= proxies:
            candidate = hops[-proxies]
            try:
                return str(ipaddress.ip_address(candidate))
            except ValueError:
                pass
    return request.META.get("REMOTE_ADDR")


class RequestContextMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        supplied = request.headers.get("X-Request-ID", "")
        request_id = supplied if _REQUEST_ID_RE.match(supplied) else uuid.uuid4().hex
        ctx = RequestContext(request_id=request_id, client_ip=client_ip(request))
        token = current_request.set(ctx)
        request.request_id = request_id  # type: ignore[attr-defined]
        try:
            response = self.get_response(request)
        finally:
            current_request.reset(token)
        response["X-Request-ID"] = request_id
        return response
