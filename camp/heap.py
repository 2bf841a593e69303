"""The startup heap of a long-lived process, kept out of the cyclic garbage collector.

A loaded Camp process tracks ~180,000 container objects before it serves anything: modules,
classes, functions, URL patterns, DRF and drf-spectacular's registries, the settings. None of
them is ever garbage, yet every full (generation-2) collection walks all of them: ~70 ms of
CPU on this machine. A page of jobs allocates enough to set one off every ten to twenty
requests, so a list request paid 8–18 ms of collector time on average and the request that
triggered it paid all 70 (docs/BENCHMARKS.md §15, "Round 18").

``freeze_startup_heap`` collects what start-up left behind and moves everything else into
CPython's permanent generation (``gc.freeze``, the remedy the ``gc`` documentation gives for
exactly this and for prefork servers: frozen objects are not touched again, so they also stay
shared with forked children instead of being copied on write). Objects created later are
collected as before; a frozen object still dies by reference counting when nothing refers to
it, only a reference cycle among frozen objects is never reclaimed (start-up makes none that
becomes garbage after it returns: the collection before the freeze takes what it left).

Called once the process has imported what it serves: at the end of ``camp.asgi`` and
``camp.wsgi`` (after the URLconf, and with it every view and serializer, is imported) and in
a Celery worker before its pool forks and in each forked child (``camp.celery``).
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect, then freeze every object the collector tracks; returns how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def import_urlconf() -> None:
    """Import the URLconf (and through it every view, serializer and filter), as the first
    request would, so that what it builds is part of the startup heap."""
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - the property imports ROOT_URLCONF


def freeze_web_app() -> int:
    """What a web entry point (``camp.asgi``, ``camp.wsgi``) does once its app is built."""
    import_urlconf()
    return freeze_startup_heap()
