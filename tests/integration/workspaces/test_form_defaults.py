"""Issue 32 item 4 (and issue 29's "free now" for this user): a launch form's defaults are the
choice most likely to start now for the user reading it — the preset this user can start
(quota and guarantee included, ``workspaces.presets.startable_now``), the project that may
start it and the cluster where it may (or "Any cluster" where the form offers it) — so that
pressing the button without changing anything starts the workload rather than failing
validation. The form is submitted as a browser would: every field's value as rendered."""

from __future__ import annotations

import re
from decimal import Decimal
from html.parser import HTMLParser
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from scheduling import services
from scheduling.models import Cluster, JobState
from tenants import services as tenant_services
from tests.integration.scheduling.conftest import gpu_group
from tests.integration.scheduling.test_multicluster import EAST, WEST
from workspaces import services as ws
from workspaces.models import DevEnvironment, ModelService, TrainingJob

pytestmark = pytest.mark.django_db


class _LaunchForm(HTMLParser):
    """What a browser submits for the page's launch form (``form.launch``) untouched: text and
    number inputs, checked radios and boxes, each select's selected option (else its first),
    textareas."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = False
        self.data: dict[str, list[str]] = {}
        self._select: str | None = None
        self._first: str | None = None
        self._chosen = False
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self.inside = "launch" in a.get("class", "").split()
        if not self.inside or not (a.get("name") or tag == "option"):
            return
        if tag == "input":
            kind = a.get("type", "text")
            if kind in ("radio", "checkbox") and "checked" not in a:
                return
            if kind not in ("submit", "button"):
                self.data.setdefault(a["name"], []).append(a.get("value", "on" if kind == "checkbox" else ""))
        elif tag == "select":
            self._select, self._first, self._chosen = a["name"], None, False
        elif tag == "option" and self._select is not None:
            if self._first is None:
                self._first = a.get("value", "")
            if "selected" in a:
                self.data.setdefault(self._select, []).append(a.get("value", ""))
                self._chosen = True
        elif tag == "textarea":
            self._textarea = a["name"]
            self.data[a["name"]] = [""]

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self.data[self._textarea][-1] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False
        elif tag == "select" and self._select is not None:
            if not self._chosen and self._first is not None:
                self.data.setdefault(self._select, []).append(self._first)
            self._select = None
        elif tag == "textarea":
            self._textarea = None


def _submit_defaults(user: Any, url: str, **typed: str) -> tuple[dict[str, list[str]], Any]:
    """GET the form, POST what it shows (plus ``typed``: what the user must type, no default
    being possible)."""
    c = Client()
    c.force_login(user)
    page = c.get(url)
    assert page.status_code == 200
    form = _LaunchForm()
    form.feed(page.content.decode())
    assert form.data, "no launch form on the page"
    r = c.post(url, {**form.data, **{k: [v] for k, v in typed.items()}})
    errors = re.findall(r'class="errors?"[^>]*>(.*?)</', r.content.decode(), re.S)
    assert r.status_code == 302, (form.data, errors)
    return form.data, r


@pytest.fixture
def two(world: Any) -> tuple[Cluster, Cluster]:
    """Two clusters: A100s on east, GH200s on west; a preset of each, the A100 slice first."""
    east = services.cluster_create(actor=world.admin, name="east", backend="simulated", inventory=EAST)
    west = services.cluster_create(actor=world.admin, name="west", backend="simulated", inventory=WEST)
    for c in (east, west):
        services.inventory_sync(cluster=c)
    from workspaces.models import Profile

    Profile.objects.update(enabled=False)  # only these two
    ws.profile_create(actor=world.admin, name="a100-quarter", display_name="Small notebook (¼ A100)",
                      gpu_model="A100-80G", gpu_count=1, gpu_memory_mib=20480, gpu_cores_percent=25,
                      cpu_millicores=1000, ram_mib=2048)
    ws.profile_create(actor=world.admin, name="gh200-half", display_name="Half a GH200",
                      gpu_model="GH200-96G", gpu_count=1, gpu_memory_mib=49152, gpu_cores_percent=50,
                      cpu_millicores=1000, ram_mib=2048)
    return east, west


def _east_full(world: Any, east: Cluster) -> None:
    """The member's project may hold 1 GPU per cluster and holds it on east: the A100 slice
    fits on east's free cards but this member cannot start it there."""
    tenant_services.quota_set(actor=world.admin, scope="project", project=world.a.project,
                              values={"gpus_guaranteed": Decimal(0), "gpus_limit": Decimal(1)})
    services.job_submit(actor=world.a.owner, project=world.a.project, cluster=east, name="holder",
                        groups=[gpu_group(gpu_count=1)], preemptible=True)
    services.cycle_run(cluster=east)


def test_the_notebook_forms_defaults_start_now(world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Saw: the preselected "¼ A100" could not start, the cluster was not chosen, and the
    default submit failed with "This field is required"."""
    east, west = two
    _east_full(world, east)
    data, r = _submit_defaults(world.a.member, reverse("workspaces:environment-new"))
    env = DevEnvironment.objects.get(owner=world.a.member)
    assert env.profile is not None and env.profile.name == "gh200-half", data
    assert env.cluster_id == west.pk and env.project_id == world.a.project.pk
    services.cycle_run(cluster=west)
    env.job.refresh_from_db()
    assert env.job.state == JobState.STARTING, (env.job.state, env.job.reason)


def test_with_room_everywhere_the_notebook_form_keeps_the_first_slice(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    """The choice follows what may start, not a fixed order: with nothing in the way the
    first slice preset stays the default, on a cluster it fits on."""
    east, _west = two
    data, r = _submit_defaults(world.a.member, reverse("workspaces:environment-new"))
    env = DevEnvironment.objects.get(owner=world.a.member)
    assert env.profile is not None and env.profile.name == "a100-quarter"
    assert env.cluster_id == east.pk
    services.cycle_run(cluster=east)
    env.job.refresh_from_db()
    assert env.job.state == JobState.STARTING, (env.job.state, env.job.reason)


def test_the_training_forms_defaults_submit_for_any_cluster(world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, _west = two
    _east_full(world, east)
    data, r = _submit_defaults(world.a.member, reverse("workspaces:training-new"))
    assert data.get("cluster") == [""]  # "Any cluster": Camp places it where it starts soonest
    t = TrainingJob.objects.get(owner=world.a.member)
    assert t.gpu_memory_mib == 49152  # the GH200 half: 2 workers × ½ fit west's 1 GPU
    assert t.project_id == world.a.project.pk and t.job is not None
    assert t.job.state == JobState.QUEUED and t.job.cluster_id is None


def test_the_service_forms_defaults_start_now(world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    _east_full(world, east)
    # What to serve has no default: the one field the member types.
    data, r = _submit_defaults(world.a.member, reverse("workspaces:service-new"),
                               model_source="hf://Qwen/Qwen2.5-0.5B-Instruct")
    svc = ModelService.objects.get(owner=world.a.member)
    assert svc.cluster_id == west.pk and svc.project_id == world.a.project.pk
    services.cycle_run(cluster=west)
    states = {rep.job.state for rep in svc.replicas.select_related("job")}
    assert states == {JobState.STARTING}, states
