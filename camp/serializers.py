"""A faster read path for the model serializers that build the API's long pages (issue 35).

DRF's ``Serializer.to_representation`` repeats, for every object of a page, work that depends
only on the serializer: it walks the ``_readable_fields`` generator, and for each field calls
``Field.get_attribute``, which walks the source path checking for mappings, callables (an
``inspect`` call per field) and missing relations. On a page of 50 jobs that was ~2,700 such
calls, about a fifth of the page's CPU (docs/BENCHMARKS.md §15).

``FastRead`` gives the same fields the same values: it decides once per serializer (a list's
child serves the whole page) which fields read one concrete, non-relation column of the model
by its name, reads those with a plain ``getattr``, and hands every other field (relations,
nested serializers, method fields, dotted sources) to DRF's own ``get_attribute``. Written by
hand because DRF has no such path; ``test_the_fast_read_path_answers_exactly_as_drf``
(tests/integration/scheduling/test_fast_paths.py) holds whole responses equal to DRF's.
"""

from __future__ import annotations

import copy
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.core.signals import setting_changed
from django.db import models
from rest_framework import serializers
from rest_framework.fields import SkipField
from rest_framework.relations import PKOnlyObject


def _column(field: serializers.Field[Any, Any, Any, Any], model: type[models.Model]) -> str | None:
    """The column ``field`` reads when it is one concrete, non-relation field of ``model``
    read by its own name; None for everything DRF must resolve itself."""
    if isinstance(field, (serializers.BaseSerializer, serializers.SerializerMethodField,
                          serializers.RelatedField, serializers.ManyRelatedField)):
        return None
    if len(field.source_attrs) != 1:
        return None
    name = field.source_attrs[0]
    try:
        column = model._meta.get_field(name)
    except FieldDoesNotExist:
        return None  # a property or a method of the model: DRF calls it
    if not isinstance(column, models.Field) or not column.concrete or column.is_relation \
            or column.attname != name:
        return None
    return name


# Each serializer class's fields as DRF first builds them, unbound (see ``FieldsOnce``).
_PROTOTYPES: dict[type, dict[str, serializers.Field[Any, Any, Any, Any]]] = {}


def _fresh(field: serializers.Field[Any, Any, Any, Any]) -> serializers.Field[Any, Any, Any, Any]:
    """A field of its own for one serializer instance, equal to ``field``.

    A field that holds another bound to it (a nested serializer, a list serializer's
    ``child``, a many-related field's ``child_relation``, a ``ListField``'s ``child``) must be
    deep-copied as DRF copies it: the inner field's ``parent`` must be the new one, or it
    would read another request's context. So is every field not known to hold none
    (``_LEAVES``). A known leaf is a shallow copy: a new object with the prototype's
    attributes, which ``bind`` then gives its name and parent. What the copies share
    (choices, validators, error messages, a related field's queryset) DRF only reads after
    construction; nothing in Camp changes a serializer's fields in place."""
    if type(field) not in _LEAVES:
        return copy.deepcopy(field)
    new = object.__new__(type(field))
    new.__dict__.update(field.__dict__)
    return new


# The DRF fields, by exact type, that hold no other field and that DRF changes only in
# ``__init__`` and ``bind`` (read in DRF 3.18's sources): these are shallow-copied. Any other
# field (a subclass of these, our own, a serializer, a ``ListField``/``DictField`` with its
# ``child``, a ``ManyRelatedField`` with its ``child_relation``) is deep-copied, as DRF does.
_LEAVES: frozenset[type] = frozenset({
    serializers.BooleanField, serializers.CharField, serializers.ChoiceField,
    serializers.DateField, serializers.DateTimeField, serializers.DecimalField,
    serializers.DurationField, serializers.EmailField, serializers.FloatField,
    serializers.IntegerField, serializers.IPAddressField, serializers.JSONField,
    serializers.ModelField, serializers.MultipleChoiceField, serializers.PrimaryKeyRelatedField,
    serializers.ReadOnlyField, serializers.SerializerMethodField, serializers.SlugField,
    serializers.SlugRelatedField, serializers.TimeField, serializers.URLField,
    serializers.UUIDField,
})


def _forget_prototypes(*, setting: str, **_: Any) -> None:
    # DRF reads some of its settings when a field is built (e.g. COERCE_DECIMAL_TO_STRING):
    # a change of them (override_settings) must rebuild the fields, as DRF reloads its own.
    if setting == "REST_FRAMEWORK":
        _PROTOTYPES.clear()


setting_changed.connect(_forget_prototypes)


class FieldsOnce:
    # Mixed into a serializer (before it). No docstring: drf-spectacular would take it as
    # the description of every serializer without one of its own.
    #
    # DRF builds every field of a serializer for each instance: ModelSerializer introspects
    # the model, computes each field's kwargs and validators and constructs it, and the
    # declared fields are deep-copied (each re-running its __init__). That is ~1-2 ms of CPU
    # per serializer per request, the same fields each time: a submit or one job builds five
    # serializers. Here ``get_fields`` runs once per class and each instance gets copies
    # (``_fresh``). Written by hand because DRF has no such cache;
    # ``test_the_fast_read_path_answers_exactly_as_drf`` and
    # ``test_fields_built_once_still_resolve_in_each_requests_own_context`` hold it to DRF's answers.

    def get_fields(self) -> dict[str, Any]:
        prototypes = _PROTOTYPES.get(type(self))
        if prototypes is None:
            prototypes = _PROTOTYPES[type(self)] = super().get_fields()  # type: ignore[misc]
        return {name: _fresh(field) for name, field in prototypes.items()}


class FastRead(FieldsOnce):
    # Mixed into a ModelSerializer (before it). No docstring: drf-spectacular would take it as
    # the description of every serializer without one of its own. Its fields are built once
    # per class (``FieldsOnce``).

    def to_representation(self, instance: Any) -> dict[str, Any]:
        if not isinstance(instance, models.Model):  # a dict (validated data): DRF's own path
            return super().to_representation(instance)  # type: ignore[misc,no-any-return]
        model = type(instance)
        plans = self.__dict__.setdefault("_fast_plans", {})
        plan = plans.get(model)
        if plan is None:
            plan = plans[model] = [
                (f.field_name, f, _column(f, model)) for f in self._readable_fields]  # type: ignore[attr-defined]
        ret: dict[str, Any] = {}
        for name, field, column in plan:
            if column is not None:
                attribute = getattr(instance, column)
            else:
                try:
                    attribute = field.get_attribute(instance)
                except SkipField:
                    continue
            # As DRF: None stays None without the field's to_representation (a PK-only
            # related object is None when its pk is).
            check_for_none = attribute.pk if isinstance(attribute, PKOnlyObject) else attribute
            ret[name] = None if check_for_none is None else field.to_representation(attribute)
        return ret


PAGE_PREFIX = "page_"
"""The ``to_attr`` prefix of the lists a view prefetches for ``PrefetchedList``."""


class PrefetchedList(serializers.ListSerializer):  # type: ignore[type-arg]
    """A nested ``many=True`` serializer that reads the plain list a view prefetched with
    ``Prefetch(source, to_attr="page_" + source)`` when there is one, and the related manager
    as DRF does otherwise (a new job's answer, a view that prefetched nothing).

    Django's ``prefetch_related`` without ``to_attr`` builds a ``QuerySet`` per object of the
    page to hold its results (``_apply_rel_filters``, each clone copying the query): ~100 a
    jobs page, ~7 % of its CPU (docs/BENCHMARKS.md §15, "Round 19"). With ``to_attr`` it sets a
    list. Set as the child's ``Meta.list_serializer_class``."""

    def get_attribute(self, instance: Any) -> Any:
        kept = getattr(instance, "__dict__", {}).get(PAGE_PREFIX + str(self.source))
        return kept if kept is not None else super().get_attribute(instance)
