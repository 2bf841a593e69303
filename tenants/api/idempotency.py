"""Idempotency-Key for create endpoints.

Written by hand: no maintained DRF package implements the IETF
"Idempotency-Key" draft with per-user scoping, and the rule is short. The first
response to (user, endpoint, key) is stored in the same transaction as the
created object; a retry with the same body gets that response back and creates
nothing; the same key with a different body is refused with 422.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from ..models import IdempotencyRecord
from ..permissions import actor_of

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255


def _fingerprint(request: Request) -> str:
    # Keyed, so a stored fingerprint cannot be used to guess secrets sent in the body
    # (a registry password, say) offline.
    body = json.dumps(request.data, sort_keys=True, default=str)
    return hmac.new(settings.SECRET_KEY.encode(), body.encode(), hashlib.sha256).hexdigest()


class IdempotentCreateMixin:
    """Mix into a ViewSet before CreateModelMixin.

    ``idempotency_redact`` names response fields that must never be stored (secrets shown
    once, such as a new API token): a replay answers with them set to null.
    """

    idempotency_redact: tuple[str, ...] = ()

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self.idempotent(request, lambda: super(IdempotentCreateMixin, self).create(  # type: ignore[misc]
            request, *args, **kwargs))

    def idempotent(self, request: Request, produce: Callable[[], Response]) -> Response:
        """``produce()``'s response, stored under the request's Idempotency-Key (if any)
        in the same transaction; a retry gets it back (for creates and bulk actions)."""
        key = request.headers.get(HEADER)
        if not key:
            return produce()
        if len(key) > MAX_KEY_LENGTH:
            return Response({HEADER: [f"At most {MAX_KEY_LENGTH} characters."]},
                            status=status.HTTP_400_BAD_REQUEST)
        endpoint = request.path
        fingerprint = _fingerprint(request)
        previous = IdempotencyRecord.objects.filter(
            user=actor_of(request), endpoint=endpoint, key=key
        ).first()
        if previous is not None:
            return self._replay(previous, fingerprint)
        try:
            with transaction.atomic():
                response = produce()
                if status.is_success(response.status_code):
                    IdempotencyRecord.objects.create(
                        user=actor_of(request), endpoint=endpoint, key=key, fingerprint=fingerprint,
                        status_code=response.status_code,
                        response_body=self._redacted(response.data),
                    )
        except IntegrityError:
            # A concurrent request with the same key won the race; ours rolled back.
            previous = IdempotencyRecord.objects.filter(
                user=actor_of(request), endpoint=endpoint, key=key
            ).first()
            if previous is None:
                raise
            return self._replay(previous, fingerprint)
        return response

    def _redacted(self, data: Any) -> Any:
        body = json.loads(json.dumps(data, default=str))
        if isinstance(body, dict):
            for name in self.idempotency_redact:
                if name in body:
                    body[name] = None
        return body

    @staticmethod
    def _replay(record: IdempotencyRecord, fingerprint: str) -> Response:
        if record.fingerprint != fingerprint:
            return Response(
                {HEADER: ["This key was already used with a different request body."]},
                status=status.HTTP_422_UNPROCESSABLE_ENTITY,
            )
        response = Response(record.response_body, status=record.status_code)
        response["Idempotent-Replayed"] = "true"
        return response
