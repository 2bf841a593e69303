"""Under ASGI a request runs the whole middleware chain and its view in one thread hop
(camp/asgi.py, issue 35), and answers exactly as the chain did before: every middleware's
headers, cookies and refusals are there. Driven through the real ASGI application with
asgiref's communicator (no server, so nothing here depends on timing)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref import sync
from asgiref.testing import ApplicationCommunicator
from django.test import Client


async def _asgi(method: str, path: str, body: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None
                ) -> tuple[int, dict[str, list[str]], bytes]:
    from camp.asgi import application

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"host", b"testserver"), *(headers or [])],
             "client": ("127.0.0.1", 50000), "server": ("testserver", 80)}
    comm = ApplicationCommunicator(application, scope)
    await comm.send_input({"type": "http.request", "body": body, "more_body": False})
    start = await comm.receive_output(timeout=60)
    assert start["type"] == "http.response.start"
    got: dict[str, list[str]] = {}
    for k, v in start["headers"]:
        got.setdefault(k.decode().lower(), []).append(v.decode())
    content = b""
    while True:
        part = await comm.receive_output(timeout=60)
        content += part.get("body", b"")
        if not part.get("more_body"):
            break
    await comm.wait(timeout=60)
    return start["status"], got, content


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["/login/", "/api/v1/no-such-thing/", "/healthz"])
def test_asgi_answers_with_every_middlewares_headers_as_the_sync_chain_does(path: str) -> None:
    status, headers, _ = _run(_asgi("GET", path))
    reference = Client().get(path)
    assert status == reference.status_code
    # The same headers (values that differ per request, such as the request id and the CSRF
    # token, are compared by name); the security headers are really there.
    assert set(headers) - {"set-cookie"} == {k.lower() for k in reference.headers} - {"set-cookie"}
    if path != "/healthz":  # probes answer before every other middleware, on purpose
        for name in ("content-security-policy", "x-frame-options", "x-content-type-options"):
            assert name in headers, name
    if path == "/login/":
        assert any(c.startswith("csrftoken=") for c in headers["set-cookie"])


@pytest.mark.django_db(transaction=True)
def test_a_form_post_without_its_csrf_token_is_refused_under_asgi() -> None:
    status, _, content = _run(_asgi(
        "POST", "/login/", b"username=a&password=b",
        [(b"content-type", b"application/x-www-form-urlencoded")]))
    assert status == 403 and b"CSRF" in content


@pytest.mark.django_db(transaction=True)
def test_a_request_crosses_into_a_thread_a_few_times_not_once_per_middleware(monkeypatch: Any) -> None:
    """Django's async chain ran each middleware's request and response step through a
    sync_to_async of its own (17 hand-offs, ~4-7 ms of CPU a request). Now: the chain once,
    plus Django's own request_started / request_finished and its 4xx log line."""
    _run(_asgi("GET", "/api/v1/no-such-thing/"))  # warm: imports, URL resolver
    hops: list[str] = []
    real = sync.SyncToAsync.__call__

    async def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(self.func, "__qualname__", repr(self.func)))
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(sync.SyncToAsync, "__call__", counting)
    status, headers, _ = _run(_asgi("GET", "/api/v1/no-such-thing/"))
    assert status == 404 and "content-security-policy" in headers
    assert len(hops) <= 4, hops
