"""Request context (request id, client IP) for audit events and log lines."""

from __future__ import annotations

import ipaddress
import logging
import re
import time
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from django.http import HttpRequest, HttpResponse

logger = logging.getLogger("camp.proxy")


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


PROXY_MISMATCH_CACHE_KEY = "proxy-mismatch"
"""Where the web process notes the last request whose proxies disagree with
TRUSTED_PROXY_COUNT; ``manage.py doctor`` reports it (camp/management/commands/doctor.py)."""
PROXY_MISMATCH_TTL_SECONDS = 24 * 3600
_PROXY_NOTE_INTERVAL_SECONDS = 60.0
_proxy_noted_at: dict[str, float] = {}


def proxy_mismatch(request: HttpRequest) -> str | None:
    """Why this request's client address is not what TRUSTED_PROXY_COUNT assumes, or None.

    - X-Forwarded-For arrived, nobody consumed it (uvicorn's --forwarded-allow-ips rewrites
      the peer address to one of its entries), and TRUSTED_PROXY_COUNT is 0: every client
      behind that proxy looks like the proxy (one user's typos lock out everyone).
    - TRUSTED_PROXY_COUNT is higher than the proxies the request came through: either the
      count is wrong or the request bypassed the proxy (then its client could choose its
      own address).
    """
    from django.conf import settings

    proxies = getattr(settings, "TRUSTED_PROXY_COUNT", 0)
    hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if h.strip()]
    peer = request.META.get("REMOTE_ADDR") or ""
    if proxies == 0 and hops and peer not in hops:
        return (f"requests arrive through a proxy ({peer}) that Camp does not trust: every client "
                "looks like that address. Set TRUSTED_PROXY_COUNT (Helm: trustedProxyCount) to "
                "the number of proxies in front of Camp")
    if proxies > len(hops):
        return (f"TRUSTED_PROXY_COUNT is {proxies} but a request came through {len(hops)} "
                f"proxies (from {peer}): lower it, or make sure nothing reaches Camp around "
                "the proxy")
    return None


def _note_proxy_mismatch(request: HttpRequest) -> None:
    problem = proxy_mismatch(request)
    if problem is None:
        return
    kind = problem.split(" ", 1)[0]
    now = time.monotonic()
    if now - _proxy_noted_at.get(kind, -_PROXY_NOTE_INTERVAL_SECONDS) < _PROXY_NOTE_INTERVAL_SECONDS:
        return  # at most once a minute per process: not a cache write per request
    _proxy_noted_at[kind] = now
    logger.warning("client address: %s", problem)
    try:
        from django.core.cache import cache

        cache.set(PROXY_MISMATCH_CACHE_KEY, {"problem": problem, "at": time.time()},
                  PROXY_MISMATCH_TTL_SECONDS)
    except Exception:  # noqa: BLE001 - a cache outage must not fail the request
        logger.debug("proxy mismatch not recorded (cache unavailable)")


class RequestContextMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        supplied = request.headers.get("X-Request-ID", "")
        request_id = supplied if _REQUEST_ID_RE.match(supplied) else uuid.uuid4().hex
        ctx = RequestContext(request_id=request_id, client_ip=client_ip(request))
        _note_proxy_mismatch(request)
        token = current_request.set(ctx)
        request.request_id = request_id  # type: ignore[attr-defined]
        try:
            response = self.get_response(request)
        finally:
            current_request.reset(token)
        response["X-Request-ID"] = request_id
        return response
