"""API pagination: numbered pages whose size the client may choose, within a bound.

DRF's PageNumberPagination ignores ``page_size`` unless ``page_size_query_param`` is set;
``max_page_size`` keeps one request from reading a whole table. Lists are ordered by
indexed columns (see the models' Meta.indexes), so the first pages are index scans even
at 100,000 rows."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request


class CampPagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Request) -> int | None:
        """DRF falls back to the default size on a page_size it cannot read; the API says
        so instead (400 naming the parameter), as the schema documents an integer ≥ 1. A size
        above the bound is cut to it."""
        raw = request.query_params.get(self.page_size_query_param)
        if raw is not None:
            try:
                size = int(raw)
            except ValueError:
                size = 0
            if size < 1:
                raise ValidationError({self.page_size_query_param: ["Must be a whole number of at least 1."]})
        return super().get_page_size(request)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        params = super().get_schema_operation_parameters(view)
        for p in params:
            if p.get("name") == self.page_size_query_param:
                p["schema"] = {**p.get("schema", {}), "type": "integer", "minimum": 1}
        return params
