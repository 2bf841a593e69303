"""The per-user SSH key store: validation (types, RSA size, fingerprints as ssh-keygen
prints them), audit, privacy (a user sees only their keys; platform admins all), the
console page, and SSH environments authorising their owner's stored keys."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from django.core.exceptions import ValidationError

from registry.models import Image
from tenants.models import AuditEvent
from tests.conftest import client_for
from workspaces import selectors, services
from workspaces.models import SshKey
from workspaces.sshkeys import SshKeyError, parse_public_key

pytestmark = pytest.mark.django_db


def public_key(kind: str = "ed25519", comment: str = "me@laptop", bits: int = 2048) -> str:
    """A fresh OpenSSH public key line."""
    private: Any
    if kind == "ed25519":
        private = ed25519.Ed25519PrivateKey.generate()
    elif kind == "ecdsa":
        private = ec.generate_private_key(ec.SECP384R1())
    else:
        private = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    line = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return f"{line.decode()} {comment}".strip()


def _fingerprint(line: str) -> str:
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


@pytest.mark.parametrize(("kind", "key_type", "bits"), [
    ("ed25519", "ssh-ed25519", 256), ("ecdsa", "ecdsa-sha2-nistp384", 384), ("rsa", "ssh-rsa", 2048)])
def test_accepted_types_with_fingerprint(kind: str, key_type: str, bits: int) -> None:
    line = public_key(kind)
    key = parse_public_key("  " + line + "\n")
    assert (key.key_type, key.bits, key.comment) == (key_type, bits, "me@laptop")
    assert key.fingerprint == _fingerprint(line)
    assert key.line == line


@pytest.mark.parametrize(("text", "says"), [
    ("", "Paste a public key"),
    ("ssh-dss AAAAB3NzaC1kc3MAAACBAP", "DSA keys are not accepted"),
    ('command="rm -rf /" ' + "ssh-ed25519 AAAA", "Unsupported key type"),
    ("-----BEGIN OPENSSH PRIVATE KEY----- abc", "private key"),
    ("ssh-ed25519", "missing"),
    ("ssh-ed25519 !!!notbase64", "not valid base64"),
    ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHx5bW9ja2tleQ==", "truncated"),
    ("ssh-rsa " + public_key("ed25519").split()[1], "does not match its type"),
])
def test_refused_lines(text: str, says: str) -> None:
    with pytest.raises(SshKeyError, match=says):
        parse_public_key(text)


def test_short_rsa_refused() -> None:
    with pytest.raises(SshKeyError, match="1024 bits; at least 2048"):
        parse_public_key(public_key("rsa", bits=1024))


def test_add_audited_unique_and_field_errors(world: Any) -> None:
    line = public_key("ed25519", comment="alice@laptop")
    key = services.ssh_key_add(actor=world.a.member, name="", public_key=line)
    assert key.name == "alice@laptop" and key.fingerprint == _fingerprint(line)
    event = AuditEvent.objects.get(action="ssh_key.added")
    assert event.actor_id == world.a.member.pk and event.after["fingerprint"] == key.fingerprint
    with pytest.raises(ValidationError) as exc:
        services.ssh_key_add(actor=world.a.member, name="again", public_key=line)
    assert exc.value.message_dict == {"public_key": ["You already added this key."]}
    with pytest.raises(ValidationError) as exc:
        services.ssh_key_add(actor=world.a.member, name="alice@laptop", public_key=public_key())
    assert "name" in exc.value.message_dict
    # Another user may register the same public key (it is public).
    services.ssh_key_add(actor=world.b.member, name="shared", public_key=line)
    services.ssh_key_delete(actor=world.a.member, key=key)
    assert AuditEvent.objects.get(action="ssh_key.deleted").before["fingerprint"] == key.fingerprint


def test_api_own_keys_only_admin_sees_all(world: Any) -> None:
    alice, bob = client_for(world.a.member), client_for(world.b.member)
    r = alice.post("/api/v1/ssh-keys/", {"name": "laptop", "public_key": public_key("rsa")}, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert (body["key_type"], body["bits"]) == ("ssh-rsa", 2048)
    assert body["fingerprint"].startswith("SHA256:")
    assert body["user"] == world.a.member.username
    r = alice.post("/api/v1/ssh-keys/", {"public_key": public_key("rsa", bits=1024)}, format="json")
    assert r.status_code == 400 and "public_key" in r.json()
    r = alice.post("/api/v1/ssh-keys/", {"name": "x"}, format="json")
    assert r.status_code == 400 and "public_key" in r.json()
    bob.post("/api/v1/ssh-keys/", {"name": "bob", "public_key": public_key()}, format="json")
    assert [k["name"] for k in alice.get("/api/v1/ssh-keys/").json()["results"]] == ["laptop"]
    assert bob.get(f"/api/v1/ssh-keys/{body['id']}/").status_code == 404
    assert bob.delete(f"/api/v1/ssh-keys/{body['id']}/").status_code == 404
    # Even a tenant owner of alice's tenant does not see her keys.
    assert client_for(world.a.owner).get("/api/v1/ssh-keys/").json()["results"] == []
    everyone = client_for(world.admin).get("/api/v1/ssh-keys/").json()["results"]
    assert sorted(k["user"] for k in everyone) == sorted([world.a.member.username, world.b.member.username])
    assert alice.delete(f"/api/v1/ssh-keys/{body['id']}/").status_code == 204
    assert not SshKey.objects.filter(pk=body["id"]).exists()


def test_console_page(world: Any, client: Any) -> None:
    client.force_login(world.a.member)
    line = public_key("ecdsa", comment="work")
    r = client.post("/workspaces/ssh-keys/", {"name": "", "public_key": line}, follow=True)
    assert r.status_code == 200 and _fingerprint(line) in r.content.decode()
    r = client.post("/workspaces/ssh-keys/", {"name": "bad", "public_key": "ssh-rsa AAAA"})
    assert r.status_code == 200 and "The key data" in r.content.decode()
    key = SshKey.objects.get(user=world.a.member)
    other = services.ssh_key_add(actor=world.b.member, name="bob", public_key=public_key())
    assert client.post(f"/workspaces/ssh-keys/{other.pk}/delete/").status_code == 404
    assert client.post(f"/workspaces/ssh-keys/{key.pk}/delete/").status_code == 302
    assert not SshKey.objects.filter(pk=key.pk).exists()


def test_ssh_environment_uses_stored_keys(world: Any, sim_cluster: Any) -> None:
    image = Image.objects.get(name="pytorch-ssh")
    launch = dict(project=world.a.project, cluster=sim_cluster, kind="ssh", image=image,
                  cpu_millicores=1000, ram_mib=1024)
    with pytest.raises(ValidationError) as exc:
        services.environment_launch(actor=world.a.member, name="nokey", **launch)  # type: ignore[arg-type]
    assert "add one to your SSH keys" in exc.value.message_dict["ssh_public_keys"][0]
    stored = services.ssh_key_add(actor=world.a.member, name="laptop", public_key=public_key())
    extra = public_key("ecdsa", comment="ci")
    env, _ = services.environment_launch(actor=world.a.member, name="shell", ssh_public_keys=extra,
                                         **launch)  # type: ignore[arg-type]
    assert selectors.authorized_keys(env) == f"{stored.public_key}\n{extra}\n"
    # The same key given again (another comment) is written once.
    env.ssh_public_keys = stored.public_key.rsplit(" ", 1)[0] + " copy"
    assert selectors.authorized_keys(env) == f"{stored.public_key}\n"
    with pytest.raises(ValidationError) as exc:
        services.environment_launch(actor=world.a.member, name="bad", ssh_public_keys="ssh-dss AAAA",
                                    **launch)  # type: ignore[arg-type]
    assert exc.value.message_dict["ssh_public_keys"][0].startswith("Line 1: DSA keys")
