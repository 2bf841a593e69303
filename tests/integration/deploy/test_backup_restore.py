"""Issue 33, item 8: `manage.py backup` / `manage.py restore` end to end, as an operator runs
them (separate processes, the documented commands), on the suite's real PostgreSQL (a
database of its own on that server) and on the demo's SQLite.

A working Camp (users, a tenant, a simulated cluster with jobs, a Kubernetes cluster with
stored credentials, an audit trail and its anchor) is backed up; then data is changed and
destroyed; a restore with another encryption key is refused and touches nothing; the restore
with the right key brings users, jobs, audit trail and credentials back and verifies them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography.fernet import Fernet
from django.conf import settings

from .tools import ROOT

KEY = Fernet.generate_key().decode()
OTHER_KEY = Fernet.generate_key().decode()

SEED = """
from scheduling import services as s
from scheduling.backends.credentials import encrypt_credentials
from scheduling.models import Backend, Cluster
from tenants import services as t
from tenants.models import Role, User
admin = User.objects.create(username="root", is_platform_admin=True)
tenant = t.tenant_create(actor=admin, name="acme")
ann = User.objects.create(username="ann")
ann.set_password("ann-first-password")
ann.save()
User.objects.create(username="bob")
project = t.project_create(actor=admin, tenant=tenant, name="ml")
t.membership_create(actor=admin, user=ann, tenant=tenant, project=project, role=Role.PROJECT_MEMBER)
sim = s.cluster_create(actor=admin, name="sim", inventory='''
nodes:
  - name: a100-0
    cpu_cores: 64
    ram_gib: 512
    gpus: {model: A100-80G, count: 4, memory_mib: 81920}
''')
s.inventory_sync(cluster=sim)
Cluster.objects.create(name="prod", backend=Backend.KUBERNETES, api_server="https://k8s.example:6443",
                       credentials_encrypted=encrypt_credentials({"token": "prod-token-123"}))
g = {"name": "w", "replicas": 1, "gpu_count": 1, "gpu_memory_mib": 20000, "gpu_cores_percent": 25,
     "cpu_millicores": 1000, "ram_mib": 1024}
for i in range(5):
    s.job_submit(actor=ann, project=project, cluster=sim, name=f"train-{i}", groups=[g])
"""

# Users and their password hashes, jobs, audit events, and the stored credentials decrypted.
STATE = """
import json
from scheduling.backends.credentials import decrypt_credentials
from scheduling.models import Cluster, Job
from tenants.audit import seal
from tenants.models import AuditEvent, User
seal(wait=True)
prod = Cluster.objects.filter(name="prod").first()
print(json.dumps({
    "users": sorted(User.objects.values_list("username", flat=True)),
    "ann_first_password": User.objects.get(username="ann").check_password("ann-first-password"),
    "jobs": sorted(Job.objects.values_list("name", "state")),
    "audit": AuditEvent.objects.filter(chain_seq__isnull=False).count(),
    "last_action": AuditEvent.objects.order_by("-chain_seq").values_list("action", flat=True).first(),
    "token": decrypt_credentials(prod.credentials_encrypted).get("token") if prod else None,
}))
"""

DESTROY = """
from scheduling.models import Cluster, Job
from tenants.models import User
ann = User.objects.get(username="ann")
ann.set_password("someone-elses-password")
ann.save()
User.objects.filter(username="bob").delete()
Job.objects.filter(name__in=["train-0", "train-1"]).delete()
Cluster.objects.filter(name="prod").update(credentials_encrypted="")
User.objects.create(username="mallory")
"""


class Camp:
    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.env, self.tmp = env, tmp

    def run(self, *args: str, check: bool = True, key: str = KEY,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, input=stdin,
                              env={**self.env, "CAMP_ENCRYPTION_KEY": key},
                              capture_output=True, text=True, timeout=600)
        if check:
            assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-3000:])
        return done

    def py(self, code: str) -> str:
        done = subprocess.run([sys.executable, "-c", "import django; django.setup()\n" + code],
                              cwd=ROOT, env={**self.env, "CAMP_ENCRYPTION_KEY": KEY},
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    def state(self) -> dict[str, Any]:
        return dict(json.loads(self.py(STATE).splitlines()[-1]))


def _base_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DATABASE_", "REDIS_", "CELERY_", "CAMP_", "AUDIT_", "PG"))}
    # Tasks queued by the seed go nowhere (no worker here); the anchor is a file of this test.
    return {**env, "CELERY_BROKER_URL": "memory://", "AUDIT_ANCHOR_PATH": str(tmp / "anchor.jsonl"),
            "AUDIT_ANCHOR_KEY": "anchor-key-for-the-backup-test"}


@pytest.fixture(params=["postgresql", "sqlite"])
def camp(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Camp]:
    env = _base_env(tmp_path)
    if request.param == "sqlite":
        env.update({"DJANGO_SETTINGS_MODULE": "camp.settings",
                    "DATABASE_URL": f"sqlite:///{tmp_path / 'camp.sqlite3'}"})
        yield Camp(env, tmp_path)
        return
    # The suite's PostgreSQL server, a database of this test's own on it.
    db = settings.DATABASES["default"]
    name = f"camp_backup_{os.getpid()}"
    admin = psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"],
                            password=db["PASSWORD"] or None, dbname="postgres", autocommit=True)
    admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    admin.execute(f'CREATE DATABASE "{name}"')
    password = f":{db['PASSWORD']}" if db["PASSWORD"] else ""
    server = f"{db['HOST']}:{db['PORT'] or 5432}"
    env.update({"DJANGO_SETTINGS_MODULE": "camp.settings.test",
                "CAMP_TEST_RUN_ID": f"backup-{os.getpid()}",
                "DATABASE_URL": f"postgres://{db['USER']}{password}@{server}/{name}"})
    try:
        yield Camp(env, tmp_path)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def test_backup_then_restore_brings_everything_back_and_refuses_another_key(
    camp: Camp, tmp_path: Path
) -> None:
    camp.run("migrate", "--noinput")
    camp.py(SEED)
    camp.run("audit_anchor")
    before = camp.state()
    assert before["token"] == "prod-token-123" and len(before["jobs"]) == 5 and before["audit"] > 5

    archive = tmp_path / "camp.tar"
    out = camp.run("backup", "--output", str(archive)).stdout
    assert "Backed up Camp" in out
    assert archive.stat().st_mode & 0o077 == 0  # password hashes inside: owner only
    with tarfile.open(archive) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
        names = tar.getnames()
    assert manifest["camp_version"] and manifest["migrations"]["tenants"]
    assert manifest["audit"]["head"]["count"] == before["audit"]
    assert manifest["audit"]["anchor"]["seq"] == manifest["audit"]["head"]["seq"]
    assert manifest["encryption_key"]["fingerprint"].startswith("sha256:")
    # The key itself is nowhere in the archive, only its fingerprint.
    assert KEY.encode() not in archive.read_bytes()
    assert {"manifest.json", manifest["database"]["file"]} == set(names)

    camp.py(DESTROY)
    damaged = camp.state()
    assert damaged["users"] != before["users"] and damaged["token"] is None
    assert not damaged["ann_first_password"]

    # Another installation's key: refused before anything is touched.
    refused = camp.run("restore", "--yes", str(archive), key=OTHER_KEY, check=False)
    assert refused.returncode != 0
    assert "none of the configured keys matches" in refused.stderr
    assert camp.state() == damaged
    # Without --yes, anything but "restore" typed at the prompt leaves the database as it is.
    declined = camp.run("restore", str(archive), check=False, stdin="no\n")
    assert declined.returncode != 0 and camp.state() == damaged

    # The key rotated since (NEW,OLD): the old key is still configured, so it restores.
    assert "can be restored here" in camp.run("restore", "--check", str(archive),
                                              key=f"{OTHER_KEY},{KEY}").stdout
    restored = camp.run("restore", "--yes", str(archive))
    assert "audit chain intact" in restored.stdout, restored.stdout
    after = camp.state()
    # Everything as it was at the backup, and the restore itself is the chain's next event.
    assert {k: v for k, v in after.items() if k not in ("audit", "last_action")} == \
        {k: v for k, v in before.items() if k not in ("audit", "last_action")}
    assert after["audit"] == before["audit"] + 1 and after["last_action"] == "backup.restored"
    assert "intact" in camp.run("audit_verify").stdout


@pytest.mark.parametrize("camp", ["sqlite"], indirect=True)  # the check is the same on both
def test_restore_names_a_restored_database_whose_credentials_do_not_decrypt(
    camp: Camp, tmp_path: Path
) -> None:
    """A backup is refused up front when its key is not configured; a database whose rows were
    encrypted with some other key than the manifest says is restored but reported, exit 1."""
    camp.run("migrate", "--noinput")
    camp.py(SEED)
    camp.py("from scheduling.models import Cluster\n"
            "from cryptography.fernet import Fernet\n"
            f"Cluster.objects.filter(name='prod').update(credentials_encrypted="
            f"Fernet({OTHER_KEY!r}.encode()).encrypt(b'{{}}').decode())")
    archive = tmp_path / "camp.tar"
    camp.run("backup", "-o", str(archive))
    done = camp.run("restore", "--yes", str(archive), check=False)
    assert done.returncode == 1
    assert "PROBLEM  stored credentials do not decrypt with the configured key: prod" in done.stdout
