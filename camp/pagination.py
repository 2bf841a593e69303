"""API pagination: pages whose size the client may choose, within a bound, reached by page
number or, for the big lists, by cursor (keyset).

DRF's PageNumberPagination ignores ``page_size`` unless ``page_size_query_param`` is set;
``max_page_size`` keeps one request from reading a whole table. Lists are ordered by
indexed columns (see the models' Meta.indexes), so the first pages are index scans even
at 100,000 rows.

Page numbers cost more the deeper they go (``OFFSET`` reads and drops every row before the
page) and each page counts the reader's rows. ``CampPagination`` therefore also answers
``?cursor=…`` (issue 13): the rows strictly after (or before) the row the cursor names, in
the list's order, read from the same index — page 2,000 costs what page 1 does, and no
``COUNT`` is run (``count`` is null on such a page). Without ``cursor`` or ``page`` a list
answers its first page as before (with ``count``), and its ``next`` link is a cursor; an
explicit ``page`` keeps the page-number contract (``next``/``previous`` as page links), so
clients that build ``?page=N`` themselves keep working. Cursors need an order that ends in
the primary key over non-null columns: the default orders of jobs (``-submitted_at, -id``),
audit events and a job's decisions (``-id``), and ``ordering=id`` / ``-id`` where a list
offers it; an ``ordering=`` on other columns (``submitted_at`` alone has ties) pages by
number only. The schema offers ``cursor`` on the views that set ``cursor_pages = True``.
DRF's own CursorPagination was not used: it keys on the first ordering column alone and
breaks ties with an OFFSET (bulk submits share one ``submitted_at``), and it drops ``count``
and page numbers, which existing clients read.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
from typing import Any

from django.db import models
from django.db.models import Q, QuerySet
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param


class CampPagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 500
    cursor_query_param = "cursor"

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

    # --- keyset (cursor) paging -------------------------------------------------------------

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> Any:
        self.request = request
        self.keyset: list[tuple[str, bool]] | None = _keyset(queryset)
        self.cursor_mode = False
        self.next_cursor: str | None = None
        self.previous_cursor: str | None = None
        raw = request.query_params.get(self.cursor_query_param)
        if raw is not None:
            if self.keyset is None:
                raise ValidationError({self.cursor_query_param: [
                    "This list's order does not page by cursor; use page numbers."]})
            return self._cursor_page(queryset, request, raw)
        rows: list[Any] | None = super().paginate_queryset(queryset, request, view)
        if (self.keyset is not None and rows and self.page is not None and self.page.has_next()
                and self.page_query_param not in request.query_params):
            # The first page of a list that pages by cursor: continue by cursor.
            self.next_cursor = _encode(self.keyset, rows[-1], forward=True)
        return rows

    def _cursor_page(self, queryset: QuerySet[Any], request: Request, raw: str) -> list[Any]:
        assert self.keyset is not None
        values, forward = _decode(self.keyset, queryset.model, raw)
        size = self.get_page_size(request) or self.page_size or 50
        self.cursor_mode = True
        self.display_page_controls = False  # the browsable API's page links are numbers
        ordered = queryset if forward else queryset.reverse()
        rows = list(ordered.filter(_after(self.keyset, values, forward))[: size + 1])
        more = len(rows) > size
        rows = rows[:size]
        if not forward:
            rows.reverse()
        if rows:
            if forward or more:
                self.previous_cursor = _encode(self.keyset, rows[0], forward=False)
            if more or not forward:
                self.next_cursor = _encode(self.keyset, rows[-1], forward=True)
        elif not forward:  # nothing before: the next page starts at the cursor's row again
            self.next_cursor = None
        self.page_rows = rows
        return rows

    def _link(self, cursor: str | None) -> str | None:
        if cursor is None:
            return None
        assert self.request is not None
        url = remove_query_param(self.request.build_absolute_uri(), self.page_query_param)
        return replace_query_param(url, self.cursor_query_param, cursor)

    def get_next_link(self) -> str | None:
        if self.cursor_mode or self.next_cursor is not None:
            return self._link(self.next_cursor)
        return super().get_next_link()

    def get_previous_link(self) -> str | None:
        if self.cursor_mode:
            return self._link(self.previous_cursor)
        return super().get_previous_link()

    def get_paginated_response(self, data: Any) -> Response:
        return Response({
            "count": None if self.cursor_mode or self.page is None else self.page.paginator.count,
            "next": self.get_next_link(),
            "previous": self.get_previous_link(),
            "results": data,
        })

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        out = super().get_paginated_response_schema(schema)
        out["properties"]["count"] = {
            "type": "integer", "nullable": True, "example": 123,
            "description": "Rows the reader may see; null on a page reached by cursor "
                           "(no count is taken there)."}
        out["properties"]["next"]["description"] = (
            "The next page: a cursor link on lists that page by cursor (unless the request "
            "named a page number), else a page-number link.")
        out["required"] = ["next", "previous", "results"]
        return out

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        params = super().get_schema_operation_parameters(view)
        for p in params:
            if p.get("name") == self.page_size_query_param:
                p["schema"] = {**p.get("schema", {}), "type": "integer", "minimum": 1}
            if p.get("name") == self.page_query_param:
                p["description"] = ("A page number within the paginated result set (costs "
                                    "more the deeper it goes; prefer the cursor of `next`).")
        if not getattr(view, "cursor_pages", False):
            return params
        params.append({
            "name": self.cursor_query_param, "required": False, "in": "query",
            "description": "Opaque position from a `next` or `previous` link: the page after "
                           "(or before) it, read from an index, as fast at row 100,000 as at "
                           "row 1. With an `ordering` that does not end in the id: 400.",
            "schema": {"type": "string"},
        })
        return params


def _keyset(queryset: Any) -> list[tuple[str, bool]] | None:
    """The list's order as (column, descending) pairs if it can key a cursor: plain non-null
    columns of the model, ending in the primary key (so a position is one row)."""
    if not isinstance(queryset, QuerySet):
        return None
    query = queryset.query
    raw = list(query.order_by) or (list(query.get_meta().ordering or [])
                                   if query.default_ordering else [])
    order = [o for o in raw if isinstance(o, str)]
    if not order or len(order) != len(raw):
        return None
    meta = queryset.model._meta
    keys: list[tuple[str, bool]] = []
    for item in order:
        desc = item.startswith("-")
        name = item.lstrip("-")
        if name == "pk":
            name = meta.pk.name
        try:
            field = meta.get_field(name)
        except Exception:  # noqa: BLE001 - a related path or annotation: no cursor
            return None
        if not isinstance(field, models.Field) or field.null or field.is_relation:
            return None
        keys.append((name, desc))
    if keys[-1][0] != meta.pk.name:
        return None
    return keys


def _after(keyset: list[tuple[str, bool]], values: list[Any], forward: bool) -> Q:
    """Rows strictly after ``values`` in the keyset's order (``forward``) or before it: the
    usual expansion of a row comparison, with the first column bounded (an index range)."""
    def cmp(desc: bool) -> str:
        return "lt" if desc == forward else "gt"

    first, first_desc = keyset[0]
    condition = Q()
    for k, (name, desc) in enumerate(keyset):
        term = Q(**{f"{n}": v for (n, _), v in zip(keyset[:k], values[:k], strict=True)})
        term &= Q(**{f"{name}__{cmp(desc)}": values[k]})
        condition |= term
    bound = Q(**{f"{first}__{cmp(first_desc)}e": values[0]}) if len(keyset) > 1 else Q()
    return bound & condition


def _encode(keyset: list[tuple[str, bool]], row: Any, *, forward: bool) -> str:
    values = []
    for name, _ in keyset:
        value = getattr(row, name)
        values.append(value.isoformat() if isinstance(value, dt.datetime) else value)
    raw = json.dumps({"v": values, "f": forward}, separators=(",", ":"), default=str)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode(keyset: list[tuple[str, bool]], model: Any, raw: str) -> tuple[list[Any], bool]:
    bad = ValidationError({"cursor": ["Invalid cursor: use a `next` or `previous` link as given."]})
    try:
        data = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        values, forward = data["v"], data["f"]
    except (ValueError, TypeError, KeyError, binascii.Error) as exc:
        raise bad from exc
    if not isinstance(data, dict):
        raise bad
    if not isinstance(values, list) or len(values) != len(keyset) or not isinstance(forward, bool):
        raise bad
    out = []
    for (name, _), value in zip(keyset, values, strict=True):
        field = model._meta.get_field(name)
        if value is None or isinstance(value, (dict, list, bool)):  # keyset columns are never null
            raise bad
        try:
            if isinstance(field, models.DateTimeField):
                parsed = dt.datetime.fromisoformat(str(value))
                if parsed.tzinfo is None:
                    raise ValueError("naive")
                parsed = parsed.astimezone(dt.UTC)  # out-of-range offsets fail here, not in SQL
                out.append(parsed)
            else:
                converted = field.to_python(value)
                if converted is None:
                    raise ValueError("empty")
                if isinstance(converted, int) and not -(2**63) <= converted < 2**63:
                    raise OverflowError("out of the column's range")
                out.append(converted)
        except Exception as exc:  # noqa: BLE001 - any unreadable value is the same 400
            raise bad from exc
    return out, forward
