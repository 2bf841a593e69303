"""Backups (docs/RELIABILITY.md §Backups): the documented pg_dump / pg_restore steps, run for
real against a throwaway PostgreSQL holding a working Camp (jobs admitted, running, cancelled,
an audit trail), restored into a fresh database that then passes the same checks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .harness import PG_BIN, REPO, Postgres
from .test_faults import INVENTORY, SEED


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert done.returncode == 0, (cmd, done.stderr[-2000:])
    return done


WORK = """
from scheduling import services as s
from scheduling.models import Cluster, Job
from tenants.models import Project, User
ann, c = User.objects.get(username="ann"), Cluster.objects.get(name="sim")
p = Project.objects.get(name="ml")
g = {"name": "w", "replicas": 1, "gpu_count": 1, "gpu_memory_mib": 20000, "gpu_cores_percent": 25,
     "cpu_millicores": 1000, "ram_mib": 1024}
jobs = [s.job_submit(actor=ann, project=p, cluster=c, name=f"b{i}", groups=[g]) for i in range(12)]
s.job_cancel(actor=ann, job=jobs[0])
s.cycle_run(cluster=c)
for j in Job.objects.filter(state="starting"):
    s.job_dispatch(job_id=j.pk)
s.cluster_reconcile(cluster=c)
print(Job.objects.filter(state__in=["starting", "running"]).count())
"""

CHECK = """
from django.db.models import Sum
from scheduling.models import Allocation, GpuDevice, GpuSlice, Job
bad = []
for gpu in GpuDevice.objects.all():
    t = GpuSlice.objects.filter(gpu=gpu).aggregate(m=Sum("memory_mib"), c=Sum("cores_percent"))
    m, c = t["m"] or 0, t["c"] or 0
    if m > gpu.memory_mib or c > 100 or (m, c) != (gpu.memory_allocated_mib, gpu.cores_allocated):
        bad.append(gpu.pk)
holders = set(Allocation.objects.values_list("job__state", flat=True))
assert holders <= {"starting", "running"}, holders
assert not bad, bad
print(Job.objects.count(), Allocation.objects.count(), GpuSlice.objects.count())
"""


def test_dump_restores_into_a_fresh_database_with_its_invariants() -> None:
    # Not pytest's tmp_path: the postgres user must be able to reach the data directory.
    tmp_path = Path(tempfile.mkdtemp(prefix="camp-backup-"))
    pg = Postgres(tmp_path)
    pg.start()
    try:
        with pg.connect("postgres") as conn:
            conn.execute("CREATE DATABASE camp")
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("DATABASE_", "REDIS_", "CELERY_"))}
        env = {**base, "DJANGO_SETTINGS_MODULE": "camp.settings.test", "DATABASE_URL": pg.url,
               # Nothing here needs a broker: queued tasks go to an unused test queue.
               "CAMP_TEST_RUN_ID": "backup-test"}

        def py(code: str, url: str) -> str:
            return _run([sys.executable, "-c", "import django; django.setup()\n" + code],
                        env={**env, "DATABASE_URL": url}, cwd=REPO).stdout

        _run([sys.executable, "manage.py", "migrate", "--noinput"], env=env, cwd=REPO)
        py(SEED.format(inventory=INVENTORY), pg.url)
        active = int(py(WORK, pg.url).split()[-1])
        assert active > 0
        before = py(CHECK, pg.url)

        # The documented steps: a custom-format dump, then pg_restore into an empty database.
        dump = tmp_path / "camp.dump"
        port = str(pg.port)
        _run([str(PG_BIN / "pg_dump"), "-h", "127.0.0.1", "-p", port, "-U", "postgres",
              "--format=custom", "--no-owner", "--file", str(dump), "camp"])
        _run([str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", port, "-U", "postgres",
              "camp_restored"])
        _run([str(PG_BIN / "pg_restore"), "-h", "127.0.0.1", "-p", port, "-U", "postgres",
              "--no-owner", "--exit-on-error", "--dbname", "camp_restored", str(dump)])
        restored = pg.url.rsplit("/", 1)[0] + "/camp_restored"

        # The restored copy: same rows, allocations within capacity, the audit chain intact,
        # and nothing left to migrate.
        assert py(CHECK, restored) == before
        verify = _run([sys.executable, "manage.py", "audit_verify"],
                      env={**env, "DATABASE_URL": restored}, cwd=REPO)
        assert "intact" in verify.stdout
        plan = _run([sys.executable, "manage.py", "migrate", "--check"],
                    env={**env, "DATABASE_URL": restored}, cwd=REPO)
        del plan
        # ... and a broken copy is caught: tampering with one audit row fails the check
        with pg.connect("camp_restored") as conn:
            conn.execute("ALTER TABLE tenants_auditevent DISABLE TRIGGER USER")
            conn.execute("UPDATE tenants_auditevent SET action = 'x' WHERE id = "
                         "(SELECT min(id) FROM tenants_auditevent)")
        tampered = subprocess.run([sys.executable, "manage.py", "audit_verify"], cwd=REPO,
                                  env={**env, "DATABASE_URL": restored}, capture_output=True,
                                  text=True, timeout=300)
        assert tampered.returncode != 0 and "broken" in tampered.stderr
    finally:
        pg.stop()
        shutil.rmtree(tmp_path, ignore_errors=True)
