"""API pagination: numbered pages whose size the client may choose, within a bound.

DRF's PageNumberPagination ignores ``page_size`` unless ``page_size_query_param`` is set;
``max_page_size`` keeps one request from reading a whole table. Lists are ordered by
indexed columns (see the models' Meta.indexes), so the first pages are index scans even
at 100,000 rows."""

from __future__ import annotations

from rest_framework.pagination import PageNumberPagination


class CampPagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 500
