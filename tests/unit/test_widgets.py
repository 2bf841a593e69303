"""``camp.widgets.FastSelect`` writes exactly what Django's Select writes through its
templates: the same options, groups, selection and attributes, escaped the same way."""

from __future__ import annotations

from typing import Any

import pytest
from django import forms
from django.test import RequestFactory

from camp.widgets import FastSelect

CHOICES: list[Any] = [("", "Any"), ("a", "A & <b>"), ("b", 'Quote "x"'), (3, "Three"),
                      ("Group & co", [("c", "C"), ("d", "D <i>")])]


@pytest.mark.parametrize("value", [None, "", "a", "c", 3, "3", ["a"], "nope"])
@pytest.mark.parametrize("attrs", [None, {"id": "id_x"},
                                   {"id": "id_x", "required": True, "disabled": False,
                                    "aria-describedby": 'h"<', "class": "wide"}])
def test_fast_select_writes_what_djangos_select_writes(value: Any, attrs: Any) -> None:
    expected = forms.Select(choices=CHOICES).render("x<", value, attrs)
    assert FastSelect(choices=CHOICES).render("x<", value, attrs) == expected
    assert "<b>" not in expected and "&lt;b&gt;" in expected  # escaped, in both


@pytest.mark.django_db
def test_the_jobs_filter_form_renders_as_with_djangos_select(world: Any) -> None:
    from scheduling import selectors
    from scheduling.filters import JobListFilter

    request = RequestFactory().get("/scheduling/jobs/", {"state": "active", "kind": "jupyter"})
    request.user = world.a.member

    def form(widget: type[forms.Select] | None) -> str:
        f = JobListFilter(request.GET, queryset=selectors.job_list(user=world.a.member), request=request)
        fields = f.form.fields
        if widget is not None:
            for name in ("state", "project", "kind", "cluster"):
                fields[name].widget = widget(choices=fields[name].widget.choices)
        return "".join(str(bound) for bound in f.form)

    fast = form(None)
    assert 'value="active" selected' in fast and 'value="jupyter" selected' in fast
    assert fast == form(forms.Select)
