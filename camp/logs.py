"""One log format for every Camp process (web, worker, beat, watcher, migrate).

Each line carries time, level, logger and message, plus the ids of what it is about where
known: ``request_id`` (tenants.middleware.RequestContextMiddleware), ``task_id``/``task``
and a task's ``job_id``/``cluster_id`` keyword arguments (Celery's task signals),
``cluster`` (the watcher). ``LOG_FORMAT=json`` (production's default) writes one JSON object
a line through python-json-logger; ``text`` writes the same fields as ``key=value``.
The ids live in a context variable, so each request and task sees only its own.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse

_context: ContextVar[dict[str, str]] = ContextVar("camp_log_context", default={})  # noqa: B039
CONTEXT_FIELDS = ("request_id", "task_id", "task", "job_id", "cluster_id", "cluster")
TASK_ID_KWARGS = ("job_id", "cluster_id")
"""A task's keyword arguments that become fields of its log lines."""

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s%(context)s"
JSON_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


@contextmanager
def bound(**fields: object) -> Iterator[None]:
    """Add ``fields`` to every log line written inside the block (this context only)."""
    token = _context.set({**_context.get(), **{k: str(v) for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


class ContextFilter(logging.Filter):
    """Copies the current ids onto each record (attached to the handler, so records of every
    logger, Celery's and uvicorn's included, get them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from tenants.middleware import current_request

        fields = dict(_context.get())
        request_id = current_request.get().request_id
        if request_id:
            fields.setdefault("request_id", request_id)
        for key, value in fields.items():
            if not hasattr(record, key):
                setattr(record, key, value)
        record.context = "".join(f" {k}={fields[k]}" for k in CONTEXT_FIELDS if k in fields)
        return True


class NoTraceback(logging.Filter):
    """One line for an expected refusal (a bad ``Host:`` header): the message, no traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def configure(logging_settings: dict[str, Any]) -> None:
    """Django's LOGGING_CONFIG: the dict, and Python's warnings as log lines of the same
    format (logger ``py.warnings``) instead of bare text on stderr."""
    import logging.config

    logging.config.dictConfig(logging_settings)
    logging.captureWarnings(True)


def config(log_format: str, level: str) -> dict[str, Any]:
    """The LOGGING dict for ``log_format`` ("json" or "text")."""
    if log_format not in ("json", "text"):
        raise ValueError(f"LOG_FORMAT must be json or text, not {log_format!r}")
    formatter: dict[str, Any] = (
        {"()": "pythonjsonlogger.json.JsonFormatter", "format": JSON_FORMAT,
         "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
         "reserved_attrs": [*_RESERVED, "context"]}
        if log_format == "json" else {"format": TEXT_FORMAT})
    formatter["datefmt"] = "%Y-%m-%dT%H:%M:%S%z"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": "camp.logs.ContextFilter"},
                    "no_traceback": {"()": "camp.logs.NoTraceback"}},
        "formatters": {"camp": formatter},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "camp",
                                 "filters": ["context"]}},
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            # Never log request bodies or headers: they carry passwords and tokens.
            "django.request": {"level": "ERROR"},
            "django.security.DisallowedHost": {"filters": ["no_traceback"]},
            # uvicorn's own lines in the same format; its access line has no request id, so
            # camp.request writes the access line instead.
            "uvicorn": {"handlers": ["console"], "level": level, "propagate": False},
            "uvicorn.error": {"handlers": ["console"], "level": level, "propagate": False},
            "uvicorn.access": {"handlers": ["console"], "level": "WARNING", "propagate": False},
        },
    }


# LogRecord's own attributes: python-json-logger writes every other attribute as a field.
_RESERVED = ["args", "asctime", "created", "exc_info", "exc_text", "filename", "funcName",
             "levelname", "levelno", "lineno", "module", "msecs", "message", "msg", "name",
             "pathname", "process", "processName", "relativeCreated", "stack_info", "thread",
             "threadName", "taskName"]

access_logger = logging.getLogger("camp.request")


class AccessLogMiddleware:
    """One line per request: method, path (no query string: it may carry tokens), status,
    duration; inside RequestContextMiddleware, so the line has the request id."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        access_logger.info("%s %s %s", request.method, request.path, response.status_code,
                           extra={"method": request.method, "path": request.path,
                                  "status": response.status_code,
                                  "duration_ms": round((time.perf_counter() - started) * 1000, 1)})
        return response


def connect_celery_signals() -> None:
    """Bind each task's id, name and job/cluster ids to its log lines (worker processes)."""
    from celery.signals import task_postrun, task_prerun

    tokens: dict[str, Any] = {}

    @task_prerun.connect(weak=False)
    def _bind(task_id: str = "", task: Any = None, args: Any = None,
              kwargs: dict[str, Any] | None = None, **_: Any) -> None:
        fields = {"task_id": task_id, "task": getattr(task, "name", "")}
        try:  # positional or keyword: the task's own parameter names
            named = inspect.signature(task.run).bind_partial(*(args or ()), **(kwargs or {})).arguments
        except (TypeError, ValueError, AttributeError):
            named = dict(kwargs or {})
        fields.update({k: str(v) for k, v in named.items() if k in TASK_ID_KWARGS})
        tokens[task_id] = _context.set({**_context.get(), **fields})

    @task_postrun.connect(weak=False)
    def _unbind(task_id: str = "", **_: Any) -> None:
        token = tokens.pop(task_id, None)
        if token is not None:
            _context.reset(token)
