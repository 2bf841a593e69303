"""A ``<select>`` rendered without the template engine (issue 35).

Django renders a Select through ``django/forms/widgets/select.html``, which includes
``select_option.html`` and ``attrs.html`` once per option. On the portal's jobs page, with
36 options in four filters, that was 21 % of the page's CPU (15 of 71 ms; docs/BENCHMARKS.md
§15, "Round 17"). ``FastSelect`` keeps everything Django decides: the options, their
grouping, which ones are selected, every attribute. It takes all of that from Django's own
``get_context`` and writes the same markup those templates write, byte for byte, with
``format_html`` (which escapes as the templates do). Written by hand because Django has no
template-free widget renderer. ``tests/unit/test_widgets.py`` compares its output with
Django's Select.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe


def _attrs(attrs: dict[str, Any]) -> SafeString:
    # attrs.html: False leaves the attribute out, True writes its name alone.
    return mark_safe("".join(  # noqa: S308 - every piece is escaped by format_html
        format_html(" {}", name) if value is True else format_html(' {}="{}"', name, str(value))
        for name, value in attrs.items() if value is not False))


class FastSelect(forms.Select):
    def render(self, name: str, value: Any, attrs: dict[str, Any] | None = None,
               renderer: Any = None) -> SafeString:
        widget = self.get_context(name, value, attrs)["widget"]
        parts: list[str] = [format_html('<select name="{}"{}>', widget["name"], _attrs(widget["attrs"]))]
        for group_name, options, _ in widget["optgroups"]:
            if group_name:
                parts.append(format_html('\n  <optgroup label="{}">', group_name))
            for option in options:
                # select_option.html ends with a newline, hence the blank line after each.
                parts.append(format_html('\n  <option value="{}"{}>{}</option>\n', str(option["value"]),
                                         _attrs(option["attrs"]), option["label"]))
            if group_name:
                parts.append("\n  </optgroup>")
        parts.append("\n</select>")
        return mark_safe("".join(parts))  # noqa: S308 - every piece above is escaped by format_html
