"""The OpenAPI schema view, built once per process (issue 32, finding 10).

drf-spectacular walks every view and serializer on each request: 1.6–2.4 s for the 385 KB
schema behind /api/docs/. The schema only changes with the code, and it is the public one
(``SERVE_PUBLIC``: the same for every reader), so each process builds it on first use per
API version and language and answers from memory after that — a deploy (new processes) builds
it again. docs/openapi.yaml is still generated from the code by ``make schema``."""

from __future__ import annotations

import threading
from typing import Any

from django.utils import translation
from drf_spectacular.views import SpectacularAPIView
from rest_framework.request import Request
from rest_framework.response import Response

_built: dict[tuple[Any, str | None], Any] = {}
_lock = threading.Lock()


class CachedSchemaView(SpectacularAPIView):
    """``SpectacularAPIView`` whose generated schema is kept per (version, language)."""

    def _get_schema_response(self, request: Request) -> Response:
        version = self.api_version or request.version or self._get_version_parameter(request)
        key = (version, translation.get_language())
        with _lock:
            if key not in _built:
                generator = self.generator_class(urlconf=self.urlconf, api_version=version,
                                                 patterns=self.patterns)
                _built[key] = generator.get_schema(request=request, public=self.serve_public)
        return Response(data=_built[key], headers={
            "Content-Disposition": f'inline; filename="{self._get_filename(request, version)}"'})


def schema_built_count() -> int:
    """How many schemas this process has built (tests: it is built once, not per request)."""
    return len(_built)
