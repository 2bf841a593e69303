"""A small, standards-conformant OpenID provider that tests can make misbehave on purpose.

django-oauth-toolkit (tests/integration/sso/idp) is the well-behaved provider; this one
exists for what a real provider does that DOT will not do on request: ID tokens without a
``kid`` (single-key providers), key rotation, and wrong answers (bad signature, wrong
audience, expired or future-dated tokens, an unavailable token endpoint). It implements
Discovery 1.0, the code flow with PKCE S256 (RFC 7636), client_secret_post/basic, a JWKS,
userinfo and RP-Initiated Logout 1.0, signing with PyJWT (already a Camp dependency).

Run as ``python -m tests.integration.sso.oidc_provider PORT CONTROL_FILE STATS_FILE``.
Each request re-reads CONTROL_FILE (JSON, written by the test); counters of the requests
served go to STATS_FILE. It signs in the control file's ``user`` without a password
prompt, as a provider does for a user who already has a session there.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs, unquote_plus, urlencode
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import jwt
from cryptography.hazmat.primitives import serialization
from jwt.algorithms import RSAAlgorithm

Environ = dict[str, Any]


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class Provider:
    def __init__(self, port: int, control: Path, stats: Path) -> None:
        self.issuer = f"http://127.0.0.1:{port}"
        self.control_file, self.stats_file = control, stats
        self.codes: dict[str, dict[str, Any]] = {}
        self.access_tokens: dict[str, dict[str, Any]] = {}
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def control(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.control_file.read_text())
        return data

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1
            tmp = self.stats_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.counts))
            tmp.replace(self.stats_file)

    # --- WSGI -----------------------------------------------------------------------
    def __call__(self, environ: Environ, start_response: Any) -> list[bytes]:
        path = environ["PATH_INFO"]
        routes = {
            "/.well-known/openid-configuration": self.discovery,
            "/jwks": self.jwks,
            "/authorize": self.authorize,
            "/token": self.token,
            "/userinfo": self.userinfo,
            "/logout": self.logout,
        }
        handler = routes.get(path)
        if handler is None:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found"]
        self.count(path)
        status, headers, body = handler(environ)
        start_response(status, headers)
        return [body]

    @staticmethod
    def _json(data: Any, status: str = "200 OK") -> tuple[str, list[tuple[str, str]], bytes]:
        return status, [("Content-Type", "application/json"), ("Cache-Control", "no-store")], \
            json.dumps(data).encode()

    @staticmethod
    def _redirect(url: str) -> tuple[str, list[tuple[str, str]], bytes]:
        return "302 Found", [("Location", url)], b""

    def discovery(self, environ: Environ) -> tuple[str, list[tuple[str, str]], bytes]:
        control = self.control()
        if control.get("discovery_status", 200) != 200:
            return self._json({}, f"{control['discovery_status']} Unavailable")
        return self._json({
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "userinfo_endpoint": f"{self.issuer}/userinfo",
            "jwks_uri": f"{self.issuer}/jwks",
            "end_session_endpoint": f"{self.issuer}/logout",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": control.get(
                "token_auth_methods", ["client_secret_post", "client_secret_basic"]),
        })

    def jwks(self, environ: Environ) -> tuple[str, list[tuple[str, str]], bytes]:
        keys = []
        for entry in self.control()["keys"]:
            private = serialization.load_pem_private_key(entry["pem"].encode(), password=None)
            jwk: dict[str, Any] = json.loads(RSAAlgorithm.to_jwk(private.public_key()))
            jwk.update(use="sig", alg="RS256")
            if entry.get("kid"):
                jwk["kid"] = entry["kid"]
            keys.append(jwk)
        return self._json({"keys": keys})

    def authorize(self, environ: Environ) -> tuple[str, list[tuple[str, str]], bytes]:
        q = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
        control = self.control()
        if q.get("client_id") != control["client_id"] or q.get("response_type") != "code":
            return self._json({"error": "unauthorized_client"}, "400 Bad Request")
        if q.get("code_challenge_method") != "S256" or not q.get("code_challenge"):
            return self._json({"error": "invalid_request", "error_description": "PKCE S256 required"},
                              "400 Bad Request")
        code = secrets.token_urlsafe(24)
        self.codes[code] = {"nonce": q.get("nonce"), "challenge": q["code_challenge"],
                            "redirect_uri": q["redirect_uri"], "client_id": q["client_id"]}
        sep = "&" if "?" in q["redirect_uri"] else "?"
        return self._redirect(q["redirect_uri"] + sep + urlencode({"code": code,
                                                                  "state": q.get("state", "")}))

    def _client(self, environ: Environ, form: dict[str, str]) -> tuple[str, str, str]:
        """Client id, secret and the method used; RFC 6749 §2.3.1 (Basic: form-urlencoded)."""
        auth = environ.get("HTTP_AUTHORIZATION", "")
        if auth.startswith("Basic "):
            cid, _, secret = base64.b64decode(auth[6:]).decode().partition(":")
            return unquote_plus(cid), unquote_plus(secret), "client_secret_basic"
        return form.get("client_id", ""), form.get("client_secret", ""), "client_secret_post"

    def token(self, environ: Environ) -> tuple[str, list[tuple[str, str]], bytes]:
        size = int(environ.get("CONTENT_LENGTH") or 0)
        form = {k: v[0] for k, v in parse_qs(environ["wsgi.input"].read(size).decode()).items()}
        control = self.control()
        if control.get("token_status", 200) != 200:
            return self._json({"error": "temporarily_unavailable"},
                              f"{control['token_status']} Unavailable")
        client_id, secret, method = self._client(environ, form)
        self.count(f"token:{method}")
        allowed = control.get("token_auth_methods", ["client_secret_post", "client_secret_basic"])
        if method not in allowed or (client_id, secret) != (control["client_id"],
                                                            control["client_secret"]):
            return self._json({"error": "invalid_client"}, "401 Unauthorized")
        grant = self.codes.pop(form.get("code", ""), None)
        if grant is None or grant["redirect_uri"] != form.get("redirect_uri") \
                or grant["client_id"] != client_id:
            return self._json({"error": "invalid_grant"}, "400 Bad Request")
        digest = hashlib.sha256(form.get("code_verifier", "").encode()).digest()
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != grant["challenge"]:
            return self._json({"error": "invalid_grant", "error_description": "PKCE"},
                              "400 Bad Request")
        user = control["user"]
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": user["sub"], "aud": client_id,
                  "iat": now, "exp": now + 300, "nonce": grant["nonce"],
                  **{k: v for k, v in user.items() if k != "sub"}}
        tamper = control.get("tamper", {})
        claims.update(tamper.get("claims", {}))
        for name, offset in tamper.get("offsets", {}).items():  # e.g. {"exp": -3600}
            claims[name] = now + int(offset)
        signer = control["keys"][control.get("sign_with", 0)] if "rogue_pem" not in tamper \
            else {"pem": tamper["rogue_pem"], "kid": control["keys"][0].get("kid")}
        headers = {"kid": signer["kid"]} if signer.get("kid") else {}
        id_token = jwt.encode(claims, signer["pem"], algorithm="RS256", headers=headers)
        access = secrets.token_urlsafe(24)
        self.access_tokens[access] = {"sub": user["sub"], **user}
        return self._json({"access_token": access, "token_type": "Bearer", "expires_in": 300,
                           "id_token": id_token})

    def userinfo(self, environ: Environ) -> tuple[str, list[tuple[str, str]], bytes]:
        auth = environ.get("HTTP_AUTHORIZATION", "")
        info = self.access_tokens.get(auth[7:]) if auth.startswith("Bearer ") else None
        if info is None:
            return self._json({"error": "invalid_token"}, "401 Unauthorized")
        return self._json(info)

    def logout(self, environ: Environ) -> tuple[str, list[tuple[str, str]], bytes]:
        q = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
        hint = q.get("id_token_hint", "")
        control = self.control()
        try:
            # The hint must be an ID token this provider issued to this client (§2); an
            # expired one is acceptable.
            signer = control["keys"][control.get("sign_with", 0)]
            public = serialization.load_pem_private_key(signer["pem"].encode(),
                                                        password=None).public_key()
            jwt.decode(hint, public, algorithms=["RS256"], audience=control["client_id"],
                       issuer=self.issuer, options={"verify_exp": False})
            self.count("logout:valid_id_token_hint")
        except jwt.PyJWTError:
            self.count("logout:bad_id_token_hint")
        target = q.get("post_logout_redirect_uri")
        if target:
            return self._redirect(target)
        return "200 OK", [("Content-Type", "text/html")], b"<p id='signed-out'>Signed out</p>"


def main() -> None:
    port, control, stats = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    server = make_server("127.0.0.1", port, Provider(port, control, stats),
                         server_class=_Server, handler_class=_Quiet)
    server.serve_forever()


if __name__ == "__main__":
    main()
