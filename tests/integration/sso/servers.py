"""Real servers for the SSO tests: slapd, the django-oauth-toolkit IdP, Chromium.

Each runs in its own process group and is killed in ``finally`` by the fixtures
(conftest.py). A missing Debian package is a failure naming the package, never a skip.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
LDAP_SUFFIX = "dc=camp,dc=test"
LDAP_ADMIN_DN = f"cn=admin,{LDAP_SUFFIX}"
LDAP_ADMIN_PASSWORD = "admin-secret"
CHROMIUM = "/usr/bin/chromium"


def require_binary(path: str, package: str) -> None:
    if not (Path(path).exists() and os.access(path, os.X_OK)):
        pytest.fail(f"{path} is missing: install the Debian package `{package}` "
                    f"(apt-get install {package}; .ci/run does this)", pytrace=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], bool], what: str, proc: subprocess.Popen[Any] | None = None,
             timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{out[-3000:]}")
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up within {timeout}s")


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
          log: Path | None = None) -> subprocess.Popen[Any]:
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(proc: subprocess.Popen[Any]) -> None:
    """Kill the whole process group (runserver forks; slapd may too)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=5)


# --- slapd ------------------------------------------------------------------------------

SLAPD_CONF = """\
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/nis.schema
include /etc/ldap/schema/inetorgperson.schema
pidfile {dir}/slapd.pid
argsfile {dir}/slapd.args
modulepath /usr/lib/ldap
moduleload back_mdb
moduleload memberof
moduleload ppolicy
database mdb
maxsize 33554432
suffix "{suffix}"
rootdn "{rootdn}"
rootpw {rootpw}
directory {dir}/data
overlay memberof
memberof-group-oc groupOfNames
memberof-member-ad member
memberof-memberof-ad memberOf
memberof-refint true
# ppolicy: no default policy (binds behave as before); pwdAccountLockedTime is readable, as the
# LDAP re-sync reads it to find locked accounts
overlay ppolicy
"""


class Slapd:
    def __init__(self, workdir: Path) -> None:
        require_binary("/usr/sbin/slapd", "slapd")
        require_binary("/usr/bin/ldapadd", "ldap-utils")
        self.dir = workdir
        (workdir / "data").mkdir(parents=True)
        self.conf = workdir / "slapd.conf"
        self.conf.write_text(SLAPD_CONF.format(dir=workdir, suffix=LDAP_SUFFIX,
                                               rootdn=LDAP_ADMIN_DN, rootpw=LDAP_ADMIN_PASSWORD))
        self.port = free_port()
        self.uri = f"ldap://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[Any] | None = None

    def start(self) -> None:
        # -d 0: stay in the foreground (so the fixture owns the process), no debug output.
        self.proc = start(["/usr/sbin/slapd", "-f", str(self.conf), "-h", self.uri + "/", "-d", "0"],
                          log=self.dir / "slapd.log")
        wait_for(lambda: port_open(self.port), "slapd", self.proc)

    def ldif(self, text: str, modify: bool = False) -> None:
        """Apply LDIF online (as the overlays, e.g. memberOf, see it) with ldapadd/ldapmodify."""
        cmd = ["/usr/bin/ldapmodify" if modify else "/usr/bin/ldapadd", "-x", "-H", self.uri,
               "-D", LDAP_ADMIN_DN, "-w", LDAP_ADMIN_PASSWORD]
        done = subprocess.run(cmd, input=text.encode(), capture_output=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed: {done.stderr.decode(errors='replace')}")

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


# --- the OpenID provider ------------------------------------------------------------------

class IdentityProvider:
    """A django-oauth-toolkit OpenID provider (tests/integration/sso/idp) as a subprocess."""

    client_id = "camp-test-client"
    client_secret = "camp-test-secret-0123456789"

    def __init__(self, workdir: Path) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        self.dir = workdir
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.issuer = f"{self.base}/o"
        self.claims_file = workdir / "claims.json"
        self.claims_file.write_text("{}")
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.integration.sso.idp.settings",
            "IDP_DB": str(workdir / "idp.sqlite3"),
            "IDP_ISSUER": self.issuer,
            "IDP_RSA_PRIVATE_KEY": pem,
            "IDP_CLAIMS_FILE": str(self.claims_file),
            "PYTHONPATH": str(REPO),
        }
        self.proc: subprocess.Popen[Any] | None = None

    def manage(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "django", *args], env=self.env, cwd=REPO,
                              capture_output=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"IdP manage {args[0]} failed:\n{done.stderr.decode()[-3000:]}")
        return done.stdout.decode()

    def start(self) -> None:
        self.manage("migrate", "--noinput", "-v", "0")
        self.manage("idp_seed", "--client-id", self.client_id, "--client-secret", self.client_secret)
        self.proc = start([sys.executable, "-m", "django", "runserver", f"127.0.0.1:{self.port}",
                           "--noreload"], env=self.env, cwd=REPO, log=self.dir / "idp.log")
        wait_for(lambda: port_open(self.port), "the OpenID provider", self.proc, timeout=60)

    def add_user(self, username: str, password: str, **claims: Any) -> None:
        """Create the IdP account; ``claims`` (email, groups, ...) are served from a JSON file."""
        self.manage("idp_seed", "--user", username, "--password", password)
        self.set_claims(username, **claims)

    def set_claims(self, username: str, **claims: Any) -> None:
        import json

        data = json.loads(self.claims_file.read_text())
        data[username] = claims
        tmp = self.claims_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.claims_file)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)

    def camp_settings(self, **overrides: Any) -> dict[str, Any]:
        """Camp's OIDC settings from the issuer alone: every endpoint comes from discovery."""
        from tenants.sso.config import oidc_settings

        return oidc_settings(
            enabled=True, issuer=self.issuer, client_id=self.client_id,
            client_secret=self.client_secret, scopes="openid email profile", timeout=10,
            **overrides,
        )


# --- the OpenID provider that misbehaves on request ---------------------------------------

def rsa_pem() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


class EdgeProvider:
    """tests/integration/sso/oidc_provider.py as a subprocess, steered by a control file."""

    client_id = "camp-edge-client"
    client_secret = "camp-edge-secret-0123456789"

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.control_file = workdir / "control.json"
        self.stats_file = workdir / "stats.json"
        self.key_a, self.key_b = rsa_pem(), rsa_pem()
        self.proc: subprocess.Popen[Any] | None = None
        self.reset()

    def reset(self, **control: Any) -> None:
        """Back to a well-behaved single-key provider (kid "a"), then apply ``control``."""
        import json

        data: dict[str, Any] = {
            "client_id": self.client_id, "client_secret": self.client_secret,
            "keys": [{"kid": "a", "pem": self.key_a}],
            "user": {"sub": "edge-0001", "preferred_username": "edna",
                     "email": "edna@example.test", "groups": ["acme-ml"]},
            **control,
        }
        tmp = self.control_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.control_file)

    def hits(self, path: str) -> int:
        import json

        if not self.stats_file.exists():
            return 0
        return int(json.loads(self.stats_file.read_text()).get(path, 0))

    def start(self) -> None:
        self.proc = start([sys.executable, "-m", "tests.integration.sso.oidc_provider",
                           str(self.port), str(self.control_file), str(self.stats_file)],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO,
                          log=self.dir / "provider.log")
        wait_for(lambda: port_open(self.port), "the edge-case OpenID provider", self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)

    def camp_settings(self, **overrides: Any) -> dict[str, Any]:
        from tenants.sso.config import oidc_settings

        return oidc_settings(enabled=True, issuer=self.issuer, client_id=self.client_id,
                             client_secret=self.client_secret, timeout=5, **overrides)


# --- the SAML identity provider ----------------------------------------------------------

def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A throwaway RSA key and self-signed certificate (SAML metadata carries certificates)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .sign(key, hashes.SHA256()))
    key_path, cert_path = directory / f"{name}.key", directory / f"{name}.crt"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.TraditionalOpenSSL,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


class SamlIdentityProvider:
    """tests/integration/sso/saml_idp.py (pysaml2's IdP) as a subprocess."""

    def __init__(self, workdir: Path) -> None:
        require_binary("/usr/bin/xmlsec1", "xmlsec1")
        self.dir = workdir
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.entity_id = f"{self.base}/metadata"
        self_signed(workdir, "idp")
        self.sp_key, self.sp_cert = self_signed(workdir, "camp-sp")
        self.proc: subprocess.Popen[Any] | None = None
        self.control: dict[str, Any] = {"users": {}, "sign_assertion": True,
                                        "sign_response": False}
        self.write()

    def write(self, **changes: Any) -> None:
        import json

        self.control.update(changes)
        tmp = self.dir / "control.tmp"
        tmp.write_text(json.dumps(self.control))
        tmp.replace(self.dir / "control.json")

    def add_user(self, username: str, password: str, name_id: str,
                 attributes: dict[str, list[str]]) -> None:
        self.control["users"][username] = {"password": password, "name_id": name_id,
                                           "attributes": attributes}
        self.write()

    def hits(self, what: str) -> int:
        import json

        stats = self.dir / "stats.json"
        return int(json.loads(stats.read_text()).get(what, 0)) if stats.exists() else 0

    def start(self) -> None:
        self.proc = start([sys.executable, "-m", "tests.integration.sso.saml_idp",
                           str(self.port), str(self.dir)],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO,
                          log=self.dir / "idp.log")
        wait_for(lambda: port_open(self.port), "the SAML identity provider", self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)

    def camp_settings(self, base_url: str, **overrides: Any) -> dict[str, Any]:
        from tenants.sso.config import saml_settings

        args: dict[str, Any] = {
            "idp_metadata_url": f"{self.base}/metadata",
            "attr_groups": "http://schemas.microsoft.com/ws/2008/06/identity/claims/groups",
            **overrides}
        return saml_settings(enabled=True, base_url=base_url, sp_key_file=str(self.sp_key),
                             sp_cert_file=str(self.sp_cert), timeout=5, **args)
