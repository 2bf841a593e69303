"""API errors: 400 with a body naming each bad field; never a 500 for bad input."""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, IntegrityError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.views.defaults import page_not_found
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

logger = logging.getLogger(__name__)


def validation_error_body(exc: DjangoValidationError) -> dict[str, Any]:
    if hasattr(exc, "error_dict"):
        return {
            ("non_field_errors" if field == "__all__" else field): [str(m) for m in msgs.messages]
            if hasattr(msgs, "messages") else [str(m) for m in msgs]
            for field, msgs in exc.message_dict.items()
        }
    return {"non_field_errors": exc.messages}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(validation_error_body(exc))
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, exceptions.ValidationError) and isinstance(exc.detail, list):
        # e.g. DRF's search filter refusing a NUL: the 400 body is always an object
        exc = exceptions.ValidationError({"non_field_errors": exc.detail})
    elif isinstance(exc, (IntegrityError, DataError)):
        # A constraint the validators did not foresee: still the client's input.
        logger.warning("database refused a write: %s", type(exc).__name__)
        return Response(
            {"non_field_errors": ["The request conflicts with existing data or is out of range."]},
            status=status.HTTP_400_BAD_REQUEST,
        )
    return drf_exception_handler(exc, context)


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """handler404: under /api/ a path no route matches (e.g. a non-integer id) is the same JSON
    404 as a missing object, as the schema documents; elsewhere Django's page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=status.HTTP_404_NOT_FOUND)
    return page_not_found(request, exception or Http404())


_BARE_500 = ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Server error · Camp"
             "</title></head><body><h1>Something went wrong on our side</h1><p>Try again in a moment."
             "</p><p><a href=\"/\">Back to Camp</a></p></body></html>")


BUSY_RETRY_AFTER_S = 5
_BARE_503 = ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Busy · Camp</title>"
             "</head><body><h1>Camp is busy</h1><p>Too many requests at once: try again in a few "
             "seconds.</p><p><a href=\"/\">Back to Camp</a></p></body></html>")


def busy_response(request: HttpRequest) -> HttpResponse:
    """503 with ``Retry-After``: JSON under /api/, a bare page elsewhere (the portal's own
    pages need the database, which is what is short)."""
    busy: HttpResponse
    if request.path.startswith("/api/"):
        busy = JsonResponse({"detail": "The server is busy: try again in a few seconds.",
                             "request_id": getattr(request, "request_id", "")},
                            status=status.HTTP_503_SERVICE_UNAVAILABLE)
    else:
        busy = HttpResponse(_BARE_503, status=status.HTTP_503_SERVICE_UNAVAILABLE)
    busy["Retry-After"] = str(BUSY_RETRY_AFTER_S)
    return busy


def _no_free_connection(exc: BaseException | None) -> bool:
    """Whether ``exc`` is (or was caused by) psycopg_pool's PoolTimeout: no database connection
    of the process's pool came free within ``DB_POOL_TIMEOUT`` (Django wraps it in its own
    OperationalError)."""
    from psycopg_pool import PoolTimeout

    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, PoolTimeout):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: JSON under /api/; elsewhere Camp's own page with the nav (Django's default
    renders 500.html without the request, so no nav and no user). The page itself needs the
    database (the nav lists tenants): when that is what failed, a bare page, never a traceback.

    An overloaded process (every pooled connection busy for ``DB_POOL_TIMEOUT``, issue 35) is
    not a server error: 503 with ``Retry-After``, so clients and proxies back off and retry."""
    request_id = getattr(request, "request_id", "")
    if _no_free_connection(sys.exc_info()[1]):
        return busy_response(request)
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Server error.", "request_id": request_id},
                            status=status.HTTP_500_INTERNAL_SERVER_ERROR)
    try:
        body: str = render_to_string("500.html", {"request_id": request_id}, request=request)
    except Exception:  # noqa: BLE001 (whatever broke the request may break the page too)
        logger.warning("the 500 page could not be rendered; answering the bare one", exc_info=True)
        body = _BARE_500
    return HttpResponse(body, status=status.HTTP_500_INTERNAL_SERVER_ERROR)
