"""A SAML 2.0 identity provider for the tests: pysaml2's own IdP (``saml2.server.Server``).

Runs as ``python -m tests.integration.sso.saml_idp PORT WORKDIR`` in its own process. It
reads WORKDIR/control.json at every request (the SP metadata, the users, whether to sign
the assertion, the assertion lifetime) and counts what it served in WORKDIR/stats.json. pysaml2 does all the
protocol work (parsing and verifying requests, building and signing responses with
xmlsec1); this module only routes HTTP, keeps a login session and shows a password form.
"""

from __future__ import annotations

import html
import json
import secrets
import sys
import threading
from collections import Counter
from http.cookies import SimpleCookie
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from saml2 import BINDING_HTTP_POST, BINDING_HTTP_REDIRECT
from saml2.config import IdPConfig
from saml2.metadata import entity_descriptor
from saml2.saml import AUTHN_PASSWORD, NAME_FORMAT_URI, NAMEID_FORMAT_PERSISTENT, NameID
from saml2.server import Server

Reply = tuple[str, list[tuple[str, str]], bytes]
COOKIE = "samlidp_session"


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class IdP:
    def __init__(self, port: int, workdir: Path) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.dir = workdir
        self.sessions: dict[str, str] = {}  # cookie → username
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def control(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.dir / "control.json").read_text())
        return data

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1
            tmp = self.dir / "stats.tmp"
            tmp.write_text(json.dumps(self.counts))
            tmp.replace(self.dir / "stats.json")

    def server(self, control: dict[str, Any]) -> Server:
        conf = IdPConfig()
        conf.load({
            "entityid": f"{self.base}/metadata",
            "xmlsec_binary": "/usr/bin/xmlsec1",
            "key_file": str(self.dir / "idp.key"),
            "cert_file": str(self.dir / "idp.crt"),
            "metadata": {"inline": [control["sp_metadata"]]} if control.get("sp_metadata") else {},
            "service": {"idp": {
                "name": "Camp test IdP",
                "endpoints": {
                    "single_sign_on_service": [(f"{self.base}/sso/redirect", BINDING_HTTP_REDIRECT)],
                    "single_logout_service": [(f"{self.base}/slo/redirect", BINDING_HTTP_REDIRECT)],
                },
                "policy": {"default": {
                    "lifetime": {"minutes": control.get("lifetime_minutes", 5)},
                    "attribute_restrictions": None, "name_form": NAME_FORMAT_URI}},
                "name_id_format": [NAMEID_FORMAT_PERSISTENT],
                "want_authn_requests_signed": True,
                "sign_assertion": control.get("sign_assertion", True),
                "sign_response": control.get("sign_response", False),
            }},
            "allow_unknown_attributes": True,
        })
        return Server(config=conf)

    # --- WSGI -----------------------------------------------------------------------
    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        path = environ["PATH_INFO"]
        query = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
        form: dict[str, str] = {}
        if environ["REQUEST_METHOD"] == "POST":
            size = int(environ.get("CONTENT_LENGTH") or 0)
            form = {k: v[0] for k, v in parse_qs(environ["wsgi.input"].read(size).decode()).items()}
        cookie = SimpleCookie(environ.get("HTTP_COOKIE", ""))
        session = cookie[COOKIE].value if COOKIE in cookie else ""
        routes = {"/metadata": self.metadata, "/sso/redirect": self.sso, "/sso/login": self.login,
                  "/slo/redirect": self.slo, "/slo/initiate": self.slo_initiate}
        handler = routes.get(path)
        if handler is None:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found"]
        self.count(path)
        try:
            status, headers, body = handler(query, form, session)
        except Exception as exc:  # noqa: BLE001 — show the test what pysaml2 refused
            status, headers, body = "400 Bad Request", [("Content-Type", "text/plain")], \
                f"{type(exc).__name__}: {exc}".encode()
        start_response(status, headers)
        return [body]

    def metadata(self, query: dict[str, str], form: dict[str, str], session: str) -> Reply:
        xml = str(entity_descriptor(self.server(self.control()).config))
        return "200 OK", [("Content-Type", "text/xml")], xml.encode()

    def _page(self, body: str, cookie: str | None = None) -> Reply:
        headers = [("Content-Type", "text/html; charset=utf-8")]
        if cookie is not None:
            headers.append(("Set-Cookie", f"{COOKIE}={cookie}; Path=/; HttpOnly; SameSite=Lax"))
        return "200 OK", headers, f"<!doctype html><html><body>{body}</body></html>".encode()

    def sso(self, query: dict[str, str], form: dict[str, str], session: str) -> Reply:
        username = self.sessions.get(session)
        if username is None:  # ask for the password, carrying the request along
            hidden = "".join(f'<input type="hidden" name="{k}" value="{html.escape(v)}">'
                             for k, v in query.items())
            return self._page(
                f'<form method="post" action="/sso/login">{hidden}'
                '<input id="idp-username" name="username"><input id="idp-password" '
                'name="password" type="password"><button id="idp-submit">Sign in</button></form>')
        return self._answer(query, username)

    def login(self, query: dict[str, str], form: dict[str, str], session: str) -> Reply:
        user = self.control()["users"].get(form.get("username", ""))
        if user is None or user["password"] != form.get("password"):
            return self._page('<p id="idp-error">Wrong username or password</p>')
        session = secrets.token_urlsafe(16)
        self.sessions[session] = form["username"]
        status, headers, body = self._answer(form, form["username"])
        headers.append(("Set-Cookie", f"{COOKIE}={session}; Path=/; HttpOnly; SameSite=Lax"))
        return status, headers, body

    def _answer(self, params: dict[str, str], username: str) -> Reply:
        control = self.control()
        server = self.server(control)
        request = server.parse_authn_request(
            params["SAMLRequest"], BINDING_HTTP_REDIRECT, relay_state=params.get("RelayState"),
            sigalg=params.get("SigAlg"), signature=params.get("Signature"))
        user = control["users"][username]
        args = server.response_args(request.message, [BINDING_HTTP_POST])
        if control.get("audience"):  # an assertion meant for another service provider
            args["sp_entity_id"] = control["audience"]
        response = server.create_authn_response(
            identity=user["attributes"], userid=username,
            name_id=NameID(format=NAMEID_FORMAT_PERSISTENT, text=user["name_id"]),
            authn={"class_ref": AUTHN_PASSWORD, "authn_auth": f"{self.base}/metadata"},
            sign_assertion=control.get("sign_assertion", True),
            sign_response=control.get("sign_response", False),
            # pysaml2 7 signs with rsa-sha1 and digests with sha1 unless told otherwise (its
            # config's signing_algorithm is not read for an IdP); an IdP today (Okta, Entra
            # ID, SimpleSAMLphp, Keycloak) uses SHA-256, and Camp refuses SHA-1.
            # ``sign_alg``/``digest_alg`` in the control file choose others.
            sign_alg=control.get("sign_alg") or "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256",
            digest_alg=control.get("digest_alg") or "http://www.w3.org/2001/04/xmlenc#sha256",
            **args)
        self.count("sso:answered")
        http = server.apply_binding(BINDING_HTTP_POST, str(response), args["destination"],
                                    params.get("RelayState", ""), response=True)
        return "200 OK", [("Content-Type", "text/html")], "".join(http["data"]).encode()

    def slo(self, query: dict[str, str], form: dict[str, str], session: str) -> Reply:
        server = self.server(self.control())
        if "SAMLResponse" in query:  # the end of an IdP-initiated logout
            server.parse_logout_request_response(query["SAMLResponse"], BINDING_HTTP_REDIRECT)
            self.count("slo:response_ok")
            return self._page('<p id="idp-signed-out">Signed out everywhere</p>')
        request = server.parse_logout_request(
            query["SAMLRequest"], BINDING_HTTP_REDIRECT, relay_state=query.get("RelayState"),
            sigalg=query.get("SigAlg"), signature=query.get("Signature"))
        ended = [k for k, v in self.sessions.items() if k == session or (
            v and request.message.name_id is not None
            and self.control()["users"].get(v, {}).get("name_id") == request.message.name_id.text)]
        for key in ended:
            self.sessions.pop(key, None)
        self.count("slo:request_ok")
        response = server.create_logout_response(request.message, [BINDING_HTTP_REDIRECT])
        binding, destination = server.pick_binding(
            "single_logout_service", [BINDING_HTTP_REDIRECT], "spsso",
            entity_id=request.message.issuer.text)
        http = server.apply_binding(binding, str(response), destination,
                                    query.get("RelayState", ""), response=True)
        headers = [(k, v) for k, v in http["headers"]]
        headers.append(("Set-Cookie", f"{COOKIE}=; Path=/; Max-Age=0"))
        return "303 See Other", headers, b""

    def slo_initiate(self, query: dict[str, str], form: dict[str, str], session: str) -> Reply:
        """Log out everywhere, started at the IdP: a LogoutRequest to the SP."""
        username = self.sessions.pop(session, None)
        if username is None:
            return self._page('<p id="idp-no-session">No session</p>')
        control = self.control()
        server = self.server(control)
        sp = server.metadata.with_descriptor("spsso")
        sp_entity = next(iter(sp))
        binding, destination = server.pick_binding(
            "single_logout_service", [BINDING_HTTP_REDIRECT], "spsso", entity_id=sp_entity)
        _, request = server.create_logout_request(
            destination, sp_entity, name_id=NameID(
                format=NAMEID_FORMAT_PERSISTENT, text=control["users"][username]["name_id"]),
            sign=False)
        signed = query.get("unsigned") != "1"  # ?unsigned=1: what a forged request looks like
        http = server.apply_binding(binding, str(request), destination, "", sign=signed,
                                    sigalg="http://www.w3.org/2001/04/xmldsig-more#rsa-sha256"
                                    if signed else None)
        return "303 See Other", [(k, v) for k, v in http["headers"]], b""


def main() -> None:
    port, workdir = int(sys.argv[1]), Path(sys.argv[2])
    server = make_server("127.0.0.1", port, IdP(port, workdir), server_class=_Server,
                         handler_class=_Quiet)
    server.serve_forever()


if __name__ == "__main__":
    main()
