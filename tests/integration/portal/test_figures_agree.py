"""Issue 29's "what users saw", one regression test each: the figures the pages show are the
scheduler's, in one GPU unit (``scheduling.engine.accounting``), on two simulated clusters."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from portal import selectors
from scheduling import services
from scheduling.engine import accounting
from scheduling.models import Cluster, Job, JobState
from scheduling.selectors import all_cluster_use
from tenants import services as tenant_services
from tests.integration.scheduling.conftest import gpu_group
from tests.integration.scheduling.test_multicluster import EAST, WEST

pytestmark = pytest.mark.django_db


@pytest.fixture
def two(world: Any) -> tuple[Cluster, Cluster]:
    east = services.cluster_create(actor=world.admin, name="east", backend="simulated", inventory=EAST)
    west = services.cluster_create(actor=world.admin, name="west", backend="simulated", inventory=WEST)
    for c in (east, west):
        services.inventory_sync(cluster=c)
    return east, west


def _run(world: Any, cluster: Cluster, name: str, **group: Any) -> Job:
    job = services.job_submit(actor=world.a.owner, project=world.a.project, cluster=cluster, name=name,
                              groups=[gpu_group(**group)], preemptible=True)
    services.cycle_run(cluster=cluster)
    job.refresh_from_db()
    assert job.state == JobState.STARTING, (job.state, job.reason)
    return job


def _page(user: Any, url: str = "/") -> str:
    c = Client()
    c.force_login(user)
    r = c.get(url)
    assert r.status_code == 200
    return r.content.decode()


def test_the_queue_tree_of_a_cluster_shows_that_clusters_usage(world: Any, two: Any) -> None:
    """Saw: the 16-GPU cluster's tree showed the all-cluster figure; both trees the same."""
    east, west = two
    _run(world, east, "e", gpu_count=2)
    _run(world, west, "w", gpu_count=1)
    rows = {c.name: {r.name: r for r in selectors.queue_tree(c)} for c in (east, west)}
    name = f"{world.a.tenant.name}/{world.a.project.name}"
    assert rows["east"][name].bars[0].used == 2.0 and rows["west"][name].bars[0].used == 1.0
    assert rows["east"]["east"].bars[0].used == 2.0 and rows["west"]["west"].bars[0].used == 1.0
    # The cluster card and the tree's cluster row say the same.
    assert selectors.cluster_now(west).gpu_share_allocated == rows["west"]["west"].bars[0].used
    page = _page(world.admin, reverse("portal:queues", args=["west"]))
    assert "1.0 used on west" in page and "3.0 used" not in page


def test_a_slice_counts_one_figure_for_every_limit(world: Any, two: Any) -> None:
    """Saw: a 40 GiB / 10 % slice was 0.5 GPU for the per-cluster quota and 0.1 for the limit
    across all clusters."""
    east, _ = two
    _run(world, east, "s", gpu_memory_mib=40960, gpu_cores_percent=10)
    per_cluster = selectors.project_usage([world.a.project.pk], cluster=east)[world.a.project.pk].gpus
    across = all_cluster_use([world.a.tenant.pk]).total("project", world.a.project.pk)
    assert per_cluster == across == 0.5
    assert accounting.slice_gpus(memory_mib=40960, cores_percent=10, exclusive=False,
                                 card_memory_mib=81920) == 0.5


def test_quota_left_is_per_cluster_as_the_scheduler_checks_it(world: Any, two: Any) -> None:
    """Saw: "33.17 used · limit 32 · 0 left" while the limit is checked per cluster: the
    project held its limit on one cluster and nothing on the other."""
    east, west = two
    tenant_services.quota_set(actor=world.admin, scope="project", project=world.a.project,
                              values={"gpus_guaranteed": Decimal(0), "gpus_limit": Decimal(2)})
    _run(world, east, "e", gpu_count=2)
    left = selectors.projects_left([world.a.project], [east, west])[world.a.project.pk]
    by = {c.cluster.name: c for c in left.clusters}
    assert by["east"].left == 0.0 and by["west"].left == 2.0 and left.left == 2.0
    assert "limit on east (2 GPUs, 2.00 in use there)" in by["east"].why
    # The scheduler agrees: a 1-GPU job waits on east, starts on west.
    on_east = services.job_submit(actor=world.a.owner, project=world.a.project, cluster=east, name="e2",
                                  groups=[gpu_group(gpu_count=1)], preemptible=True)
    services.cycle_run(cluster=east)
    on_east.refresh_from_db()
    assert on_east.state == JobState.QUEUED and on_east.reason_kind == "quota"
    home = _page(world.a.member)
    assert "2.0 GPUs left on west" in home or "2 GPUs left on west" in home, home
    assert "east: 0.0 GPUs left" in home or "east: 0 GPUs left" in home
    form = _page(world.a.member, reverse("workspaces:environment-new"))
    assert "(on west)" in form


def test_free_now_says_what_this_user_can_start_and_why(world: Any, two: Any) -> None:
    """Saw: "Free now: Small notebook (¼ A100) 42 free" beside "0.0 GPUs left"; the notebook
    launched from that card then queued on a quota rule."""
    from workspaces import services as ws

    east, west = two
    Cluster.objects.filter(pk=west.pk).update(enabled=False)  # one cluster: east
    ws.profile_create(actor=world.admin, name="a100-quarter", display_name="Small notebook (¼ A100)",
                      gpu_model="A100-80G", gpu_count=1, gpu_memory_mib=20480, gpu_cores_percent=25,
                      cpu_millicores=1000, ram_mib=2048)
    tenant_services.quota_set(actor=world.admin, scope="project", project=world.a.project,
                              values={"gpus_guaranteed": Decimal(0), "gpus_limit": Decimal(1)})
    tenant_services.quota_set(actor=world.admin, scope="project", project=world.a.other_project,
                              values={"gpus_guaranteed": Decimal(0), "gpus_limit": Decimal(0)})
    _run(world, east, "e", gpu_count=1)
    page = _page(world.a.member)
    assert "Small notebook (¼ A100) <span class=\"small\">(" not in page
    assert "nothing you can start right now" in page
    assert "fit on the free cards, you can start 0" in page
    assert "limit on east (1 GPUs, 1.00 in use there)" in page


def test_free_now_counts_the_guarantee_a_notebook_must_fit_in(world: Any, two: Any) -> None:
    """Saw: "Free now" ignored the guarantee; a notebook (non-preemptible) launched from it then
    waited on the guarantee rule. The home's count is the accounting module's ``startable``
    over the quota left and the guarantee's room, and the scheduler agrees."""
    from workspaces import services as ws

    east, west = two
    Cluster.objects.filter(pk=west.pk).update(enabled=False)
    ws.profile_create(actor=world.admin, name="a100-quarter", display_name="Small notebook (¼ A100)",
                      gpu_model="A100-80G", gpu_count=1, gpu_memory_mib=20480, gpu_cores_percent=25,
                      cpu_millicores=1000, ram_mib=2048)
    for p in (world.a.project, world.a.other_project):
        tenant_services.quota_set(actor=world.admin, scope="project", project=p,
                                  values={"gpus_guaranteed": Decimal(1), "gpus_limit": Decimal(8)})
    for p in (world.a.project, world.a.other_project):
        services.job_submit(actor=world.a.owner, project=p, cluster=east, name=f"np-{p.pk}",
                            groups=[gpu_group(gpu_memory_mib=20480, gpu_cores_percent=50)],
                            preemptible=False)
    services.cycle_run(cluster=east)
    # Each project holds 0.5 of its 1-GPU guarantee with non-preemptible work: 0.5 GPU of room,
    # two quarter-card notebooks (0.25 each), though many more fit on the free cards.
    assert accounting.startable(30, 0.25, [(8.0, "limit"), (0.5, "guarantee")]) == (2, "guarantee")
    page = _page(world.a.member)
    assert "Small notebook (¼ A100) <span class=\"small\">(2 you can start)" in page, page
    assert "you can start 2 (a notebook runs non-preemptible, within the project&#x27;s guarantee on " \
           "east (1 GPUs, 0.50 held by non-preemptible jobs there))" in page
    # The scheduler agrees: a third quarter-card non-preemptible job waits on the guarantee.
    jobs = [services.job_submit(actor=world.a.member, project=world.a.project, cluster=east, name=f"nb{i}",
                                groups=[gpu_group(gpu_memory_mib=20480, gpu_cores_percent=25)],
                                preemptible=False, kind="jupyter") for i in range(3)]
    services.cycle_run(cluster=east)
    states = [Job.objects.get(pk=j.pk) for j in jobs]
    assert [j.state for j in states] == [JobState.STARTING, JobState.STARTING, JobState.QUEUED]
    assert states[2].reason_kind == "guarantee"


def test_guarantees_the_clusters_cannot_honour_are_flagged(world: Any, two: Any) -> None:
    """Saw: guarantees of 64 GPUs on clusters of 8 GPUs, no warning anywhere."""
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed": Decimal(64)})
    admin_home = _page(world.admin)
    assert "Guarantee cannot be honoured: Cluster east has 8 GPUs; the tenants&#x27; guarantees" \
           " there add up to 64 GPUs" in admin_home
    form = _page(world.admin, reverse("console:tenant-quota", args=[world.a.tenant.name]))
    assert "Cannot be honoured: Cluster west has 8 GPUs" in form
    assert "Cannot be honoured" not in _page(world.a.member)


def test_the_gpu_map_never_mixes_free_memory_and_free_compute(world: Any, two: Any) -> None:
    """Saw: "2554 MiB · 75 % free" on one card."""
    east, _ = two
    _run(world, east, "s", gpu_memory_mib=40960, gpu_cores_percent=10)
    page = _page(world.admin, reverse("portal:gpu-map", args=["east"]))
    assert "free: 0.5 GPU (40 GiB memory, 90 % compute)" in page
    assert "free: 1.0 GPU (80 GiB memory, 100 % compute)" in page
    assert accounting.UNIT_WORDS.split(";")[0] in page


ACTION = re.compile(r"\b(mark it|ask (for|a|an)|resubmit|click|choose|stop another)\b", re.I)
"""Words that would make a reason suggest an action (a control some page may not have)."""


def test_a_waiting_reason_suggests_nothing_a_page_cannot_do(world: Any, two: Any) -> None:
    """Saw: a notebook told to "mark it preemptible"; the notebook form has no such option.
    One rule, not a filter per page: a reason states the rule and the figures, no action; the
    same words on the job's page, the home and the API."""
    east, _ = two
    tenant_services.quota_set(actor=world.admin, scope="project", project=world.a.project,
                              values={"gpus_guaranteed": Decimal(1), "gpus_limit": Decimal(8)})
    held = services.job_submit(actor=world.a.owner, project=world.a.project, cluster=east, name="np1",
                               groups=[gpu_group(gpu_count=1)], preemptible=False)
    waits = services.job_submit(actor=world.a.member, project=world.a.project, cluster=east, name="np2",
                                groups=[gpu_group(gpu_count=1)], preemptible=False, kind="jupyter")
    services.cycle_run(cluster=east)
    held.refresh_from_db()
    waits.refresh_from_db()
    assert held.state == JobState.STARTING
    assert waits.state == JobState.QUEUED and waits.reason_kind == "guarantee", waits.reason
    assert "non-preemptible work does not borrow idle GPUs beyond a guarantee" in waits.reason
    assert not ACTION.search(waits.reason), waits.reason
    from workspaces.selectors import job_why
    assert not ACTION.search(job_why(waits)["reason"])
    page = _page(world.a.member, reverse("scheduling:job", args=[waits.pk]))
    from django.utils.html import escape
    assert f'<span data-live-field="reason">{escape(waits.reason)}</span>' in page
    c = Client()
    c.force_login(world.a.member)
    api = c.get(f"/api/v1/jobs/{waits.pk}/").json()
    assert api["reason"] == waits.reason
    # The submit-time refusal states the rule too (the notebook form shows it as is).
    from workspaces.quota import refuse_if_never_within_limits
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed": Decimal(2),
                                      "gpus_guaranteed_all_clusters": Decimal(2)})
    tenant_services.quota_set(actor=world.admin, scope="project", project=world.a.project,
                              values={"gpus_guaranteed": Decimal(1),
                                      "gpus_guaranteed_all_clusters": Decimal(1), "gpus_limit": Decimal(8)})
    with pytest.raises(ValidationError) as err:
        refuse_if_never_within_limits(project=world.a.project, cluster=east,
                                      groups=[gpu_group(gpu_count=4)], preemptible=False)
    text = " ".join(err.value.message_dict["gpu_count"])
    assert "could never start" in text and not ACTION.search(text), text


def test_a_waiting_reason_says_when_it_was_computed_and_when_it_is_stale(world: Any, two: Any) -> None:
    from workspaces.selectors import job_why

    east, _ = two
    tenant_services.quota_set(actor=world.admin, scope="project", project=world.a.project,
                              values={"gpus_guaranteed": Decimal(0), "gpus_limit": Decimal(1)})
    _run(world, east, "first", gpu_count=1)
    job = services.job_submit(actor=world.a.owner, project=world.a.project, cluster=east, name="big",
                              groups=[gpu_group(gpu_count=1)], preemptible=True)
    services.cycle_run(cluster=east)
    job = Job.objects.select_related("cluster").get(pk=job.pk)
    assert job.state == JobState.QUEUED, (job.state, job.reason)
    why = job_why(job)
    assert why["as_of"] is not None and not why["stale"]
    # Wherever the reason is shown: the job's own page, the jobs list, the owner's home (its
    # waiting jobs), and the API's list and detail (issue 29: every waiting reason).
    pages = (reverse("scheduling:job", args=[job.pk]), reverse("scheduling:jobs"), "/")
    for url in pages:
        page = _page(world.a.owner, url)
        assert job.reason[:60] in page and "(as of " in page and "may be out of date" not in page, url
    api = Client()
    api.force_login(world.a.owner)
    listed = {j["id"]: j for j in api.get("/api/v1/jobs/").json()["results"]}[job.pk]
    detail = api.get(f"/api/v1/jobs/{job.pk}/").json()
    for row in (listed, detail):
        assert row["reason_as_of"] is not None and row["reason_stale"] is False
        assert dt.datetime.fromisoformat(row["reason_as_of"]) == job.cluster.last_cycle_at
    from portal.live import job_payload

    assert job_payload(job)["as_of"].startswith("(as of ")  # what a live page puts beside it
    Cluster.objects.filter(pk=east.pk).update(last_cycle_at=timezone.now() - dt.timedelta(hours=1))
    job = Job.objects.select_related("cluster").get(pk=job.pk)
    assert job_why(job)["stale"]
    for url in pages:
        assert "may be out of date" in _page(world.a.owner, url), url
    assert api.get(f"/api/v1/jobs/{job.pk}/").json()["reason_stale"] is True
    assert "may be out of date" in job_payload(job)["as_of"]


def test_the_training_forms_default_image_follows_its_default_framework(world: Any) -> None:
    """Issue 32 item 4: the training form preselected PaddlePaddle beside PyTorch DDP."""
    from registry import services as reg
    from registry.models import Image
    from workspaces.forms import TrainingForm

    Image.objects.filter(variant="training").update(enabled=False)
    reg.image_create(actor=world.admin, name="paddle", reference="r.example/paddle:2", variant="training",
                     framework="paddle")
    torch = reg.image_create(actor=world.admin, name="torch", reference="r.example/torch:2",
                             variant="training", framework="pytorch")
    form = TrainingForm(user=world.a.member)
    assert form.initial["framework"] == "pytorch" and form.initial["image"] == torch.pk
    page = _page(world.a.member, reverse("workspaces:training-new"))
    assert f'<option value="{torch.pk}" selected>' in page
