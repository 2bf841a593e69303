"""Behind the chart's ingress Camp sees each client's own address, and `manage.py doctor`
says so when the proxies in front of Camp disagree with TRUSTED_PROXY_COUNT (issue 33, 2)."""

from __future__ import annotations

import io
from typing import Any

import pytest
import yaml
from django.core.cache import cache
from django.core.management import call_command
from django.core.management.base import CommandError
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings

from tenants import middleware
from tenants.middleware import PROXY_MISMATCH_CACHE_KEY

from .test_helm import BASE_VALUES, CHART, _run
from .tools import install_tools

CLIENT, OTHER_CLIENT, INGRESS = "203.0.113.7", "198.51.100.4", "10.42.0.9"


def _chart_setting(args: list[str]) -> int:
    helm = install_tools()["helm"]
    result = _run([helm, "template", "r1", CHART, *BASE_VALUES, *args])
    assert result.returncode == 0, result.stderr
    config = next(d for d in yaml.safe_load_all(result.stdout)
                  if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "r1-camp")
    return int(config["data"]["TRUSTED_PROXY_COUNT"])


@pytest.fixture(autouse=True)
def _no_earlier_note() -> Any:
    cache.delete(PROXY_MISMATCH_CACHE_KEY)
    middleware._proxy_noted_at.clear()
    yield
    cache.delete(PROXY_MISMATCH_CACHE_KEY)


def _through_ingress(client_ip: str, hops: str | None = None) -> str:
    """A request as ingress-nginx forwards it (uvicorn's peer is the controller's pod, which
    appended the client's address to X-Forwarded-For); returns the address Camp recorded."""
    seen: list[str | None] = []

    def view(request: HttpRequest) -> HttpResponse:
        seen.append(middleware.current_request.get().client_ip)
        return HttpResponse("ok")

    request = RequestFactory().get("/login/", HTTP_X_FORWARDED_FOR=hops or client_ip,
                                   REMOTE_ADDR=INGRESS)
    middleware.RequestContextMiddleware(view)(request)
    return str(seen[0])


def _doctor_proxy_line() -> str | None:
    out = io.StringIO()
    try:
        call_command("doctor", "--timeout", "1", stdout=out)
    except CommandError:
        pass  # the test settings lack production pieces; only the proxy line matters here
    wanted = ("PROBLEM  proxy:", "ok       client addresses")
    lines = [line for line in out.getvalue().splitlines() if line.startswith(wanted)]
    assert len(lines) == 1, out.getvalue()
    return lines[0]


@pytest.mark.django_db
def test_the_documented_ingress_install_sees_each_client() -> None:
    """The default chart with its ingress enabled: two clients are two addresses (not the
    ingress controller's for everybody), and the doctor has nothing to say about it."""
    count = _chart_setting(["--set", "ingress.enabled=true"])
    assert count == 1
    with override_settings(TRUSTED_PROXY_COUNT=count):
        assert _through_ingress(CLIENT) == CLIENT
        assert _through_ingress(OTHER_CLIENT) == OTHER_CLIENT
        assert _doctor_proxy_line() == "ok       client addresses (TRUSTED_PROXY_COUNT=1)"
    # Explicit values win; without the chart's ingress there is no proxy to trust.
    assert _chart_setting(["--set", "ingress.enabled=true", "--set", "trustedProxyCount=2"]) == 2
    assert _chart_setting([]) == 0


@pytest.mark.django_db
def test_doctor_warns_when_requests_come_through_an_untrusted_proxy() -> None:
    with override_settings(TRUSTED_PROXY_COUNT=0):
        assert _through_ingress(CLIENT) == INGRESS  # everyone looks like the ingress
        line = _doctor_proxy_line()
    assert line.startswith(f"PROBLEM  proxy: requests arrive through a proxy ({INGRESS}) that "
                           "Camp does not trust")
    assert "TRUSTED_PROXY_COUNT" in line


@pytest.mark.django_db
def test_doctor_warns_when_the_count_is_higher_than_the_proxies() -> None:
    """A request that bypassed the proxy (or a count too high): its client could choose its
    own address, so the doctor names it."""
    with override_settings(TRUSTED_PROXY_COUNT=2):
        _through_ingress(CLIENT)
        line = _doctor_proxy_line()
    assert line.startswith("PROBLEM  proxy: TRUSTED_PROXY_COUNT is 2 but a request came through 1")

