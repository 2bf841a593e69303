"""The project storage limit holds under concurrent launches (issue 30, item 6).

20 home-volume launches of 10 GiB race against a 50 GiB limit: each in its own thread,
its own PostgreSQL connection and transaction, released together by a barrier. Before the
check took the project's storage lock, 16 were created (160 GiB). Now exactly five fit and
every other launch is refused on its ``home_gib`` field.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import connections
from django.db.models import Sum

from registry.models import Image
from workspaces import services
from workspaces.models import DevEnvironment, TrainingJob

pytestmark = pytest.mark.django_db(transaction=True)

LAUNCHES = 20
HOME_GIB = 10
LIMIT_GIB = 50


def test_parallel_home_volume_launches_never_exceed_the_project_storage_limit(
        world: Any, sim_cluster: Any) -> None:
    project = world.a.project
    services.workspace_policy_set(actor=world.a.owner, project=project, storage_gib_limit=LIMIT_GIB)
    image = Image.objects.get(name="pytorch-jupyter")
    barrier = threading.Barrier(LAUNCHES)

    def launch(i: int) -> str:
        try:
            barrier.wait(timeout=60)
            services.environment_launch(
                actor=world.a.member, project=project, cluster=sim_cluster, name=f"nb-{i}",
                kind="jupyter", image=image, cpu_millicores=500, ram_mib=512, home_gib=HOME_GIB)
            return "created"
        except ValidationError as exc:
            assert "home_gib" in exc.message_dict, exc.message_dict
            assert "storage" in " ".join(exc.message_dict["home_gib"]).lower()
            return "refused"
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=LAUNCHES) as pool:
        outcomes = list(pool.map(launch, range(LAUNCHES)))

    used = (DevEnvironment.objects.filter(project=project).aggregate(s=Sum("home_gib"))["s"] or 0) + (
        TrainingJob.objects.filter(project=project).aggregate(s=Sum("checkpoint_volume_gib"))["s"] or 0)
    assert used <= LIMIT_GIB, f"{used} GiB of volumes against a {LIMIT_GIB} GiB limit"
    assert outcomes.count("created") == LIMIT_GIB // HOME_GIB, outcomes
    assert outcomes.count("refused") == LAUNCHES - LIMIT_GIB // HOME_GIB
