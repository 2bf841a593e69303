"""Demo data: a platform admin, two tenants with projects and members of every role."""

from decimal import Decimal
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction

from scheduling.models import Cluster
from tenants import services
from tenants.models import Membership, Project, Role, Tenant, User

DEMO_INVENTORY = Path(__file__).resolve().parents[3] / "scheduling" / "inventories" / "demo.yaml"
DEMO_WEST_INVENTORY = DEMO_INVENTORY.with_name("demo-west.yaml")
# Cluster labels jobs may select by (``camp submit --cluster region=us-west``).
DEMO_LABELS = {"sim": {"region": "eu-central", "arch": "amd64", "accelerator": "nvidia"},
               "sim-west": {"region": "us-west", "arch": "arm64", "accelerator": "nvidia"}}


def _g(name: str = "worker", replicas: int = 1, **kw: Any) -> dict[str, Any]:
    return {"name": name, "replicas": replicas, "cpu_millicores": 4000, "ram_mib": 16384, **kw}


# (tenant, project, user, job, priority class, pod groups, seconds): a mix that fills the
# cluster, queues, backfills and preempts, so the console shows every state within minutes.
DEMO_JOBS: list[tuple[str, str, str, str, str, list[dict[str, Any]], int]] = [
    ("vision", "detection", "vince", "yolo-train", "normal", [_g(replicas=2, gpu_count=8)], 120),
    ("vision", "detection", "victor", "notebook", "high",
     [_g(gpu_count=1, gpu_memory_mib=20480, gpu_cores_percent=30)], 300),
    ("vision", "segmentation", "vera", "sam-finetune", "batch", [_g(gpu_count=4)], 90),
    ("language", "llm-pretrain", "lily", "llama-pretrain", "batch",
     [_g(replicas=2, gpu_count=8, gpu_models=["H100-80G"])], 150),
    ("language", "llm-pretrain", "leo", "eval-sweep", "normal",
     [_g(gpu_count=1, gpu_memory_mib=11264, gpu_cores_percent=50, gpu_models=["L4"])], 45),
    # A plain job may not take "inference" (model services only) nor, as a member, "high"
    # (project admins and above): scheduling.services.jobs.priority_class_refusal.
    ("language", "chatbot", "lena", "chatbot-eval", "normal",
     [_g(replicas=2, gpu_count=1, gpu_models=["L4"])], 600),
    ("language", "llm-pretrain", "lily", "ascend-test", "normal",
     [_g(gpu_count=1, gpu_memory_mib=16000, gpu_cores_percent=20, gpu_models=["Ascend910B"])], 60),
    ("vision", "detection", "victor", "big-sweep", "high",
     [_g(replicas=3, gpu_count=8, gpu_models=["A100-80G", "H100-80G"])], 100),
    ("language", "llm-pretrain", "leo", "too-big", "normal", [_g(gpu_count=12)], 60),
]
# Floating jobs (no cluster named: Camp places each where it starts soonest): (tenant, project,
# user, job, priority class, pod groups, seconds, cluster choice).
DEMO_FLOATING: list[tuple[str, str, str, str, str, list[dict[str, Any]], int, dict[str, Any]]] = [
    ("language", "llm-pretrain", "leo", "anywhere-finetune", "normal", [_g(gpu_count=4)], 120, {}),
    ("vision", "detection", "vince", "west-only-eval", "normal", [_g(gpu_count=2)], 90,
     {"labels": {"region": "us-west"}}),
    ("vision", "segmentation", "vera", "x86-preprocess", "batch",
     [_g(gpu_count=1, image="ghcr.io/ultralytics/ultralytics:8.3.0")], 60, {}),
]
# Jobs larger than their project's guarantee: preemptible, so they borrow idle GPUs (or wait).
DEMO_BORROWERS = {"yolo-train", "big-sweep"}
# Jobs whose GPUs may be of several models (24 GPUs: more than one model's cards in the demo).
DEMO_MIXED = {"big-sweep"}

# Compute presets (workspaces.Profile) the launch forms offer as cards: (name, title, shape).
DEMO_PRESETS: list[tuple[str, str, dict[str, Any]]] = [
    ("a100-quarter", "¼ A100 · 20 GB", dict(gpu_model="A100-80G", gpu_count=1, gpu_memory_mib=20480,
                                           gpu_cores_percent=25, cpu_millicores=4000, ram_mib=16384)),
    ("a100-1", "1× A100", dict(gpu_model="A100-80G", gpu_count=1, cpu_millicores=8000, ram_mib=65536)),
    ("h100-4", "4× H100 NVLink", dict(gpu_model="H100-80G", gpu_count=4, cpu_millicores=32000,
                                      ram_mib=262144)),
    ("l4-half", "½ L4 · 11 GB", dict(gpu_model="L4", gpu_count=1, gpu_memory_mib=11264,
                                     gpu_cores_percent=50, cpu_millicores=4000, ram_mib=16384)),
    ("cpu-small", "CPU only", dict(gpu_count=0, cpu_millicores=2000, ram_mib=8192)),
]

DEMO_PASSWORD = "camp-demo-2026"  # noqa: S105 (demo data only, printed on purpose)

# (tenant, projects, owner, project admin, member)
DEMO_TENANTS = [
    ("vision", ["detection", "segmentation"], "vera", "victor", "vince"),
    ("language", ["llm-pretrain", "chatbot"], "lena", "leo", "lily"),
]


class Command(BaseCommand):
    help = "Create the demo platform admin, tenants, projects, members and quotas (idempotent)."

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            admin = User.objects.filter(username="admin").first()
            if admin is None:
                admin = User(username="admin", email="admin@camp.example", is_platform_admin=True,
                             first_name="Ada", last_name="Admin")
                admin.set_password(DEMO_PASSWORD)
                admin.save()
            cluster, _ = Cluster.objects.get_or_create(
                name="sim", defaults={"display_name": "Simulated cluster"}
            )
            if not cluster.inventory:
                # The heterogeneous simulated cluster (scheduling/inventories/demo.yaml).
                cluster.backend = "simulated"
                cluster.inventory = DEMO_INVENTORY.read_text(encoding="utf-8")
                cluster.save(update_fields=["backend", "inventory"])
            west, _ = Cluster.objects.get_or_create(
                name="sim-west", defaults={"display_name": "Simulated cluster (ARM, us-west)"})
            if not west.inventory:
                west.backend = "simulated"
                west.inventory = DEMO_WEST_INVENTORY.read_text(encoding="utf-8")
                west.save(update_fields=["backend", "inventory"])
            for c in (cluster, west):
                if not c.labels:
                    c.labels = DEMO_LABELS[c.name]
                    c.save(update_fields=["labels"])
                if not hasattr(c, "quota"):
                    services.quota_set(actor=admin, scope="cluster", cluster=c, values={
                        "gpus_guaranteed": Decimal(64), "gpus_limit": Decimal(64),
                        "gpu_memory_mib_guaranteed": 64 * 81920, "gpu_memory_mib_limit": 64 * 81920,
                        "cpu_cores_guaranteed": Decimal(1024), "cpu_cores_limit": Decimal(1024),
                        "ram_mib_guaranteed": 8 * 1024 * 1024, "ram_mib_limit": 8 * 1024 * 1024,
                    })
            for tenant_name, projects, owner, padmin, member in DEMO_TENANTS:
                self._tenant(admin, tenant_name, projects, owner, padmin, member)
        self._jobs(cluster)
        self._workloads(cluster, admin)
        self._floating(west)
        self._living(admin)
        self.stdout.write(f"Demo logins (password for all: {DEMO_PASSWORD}):")
        self.stdout.write("  admin            platform admin")
        for tenant_name, projects, owner, padmin, member in DEMO_TENANTS:
            self.stdout.write(f"  {owner:<16} tenant owner of {tenant_name}")
            self.stdout.write(f"  {padmin:<16} project admin of {tenant_name}/{projects[0]}")
            self.stdout.write(f"  {member:<16} project member of {tenant_name}/{projects[0]}")

    def _jobs(self, cluster: Cluster) -> None:
        """The simulated cluster's inventory and a few jobs that move through their states."""
        from scheduling import services as scheduling_services
        from scheduling.models import Job

        scheduling_services.inventory_sync(cluster=cluster)
        if Job.objects.filter(cluster=cluster).exists():
            return
        with transaction.atomic():
            for tenant_name, project_name, user, name, cls, groups, seconds in DEMO_JOBS:
                project = Project.objects.get(tenant__name=tenant_name, name=project_name)
                scheduling_services.job_submit(
                    actor=User.objects.get(username=user), project=project, cluster=cluster,
                    name=name, groups=groups, priority_class=cls, duration_seconds=seconds,
                    checkpoint_capable=cls == "batch", gang=True,
                    # Beyond its project's guarantee only a preemptible job may borrow.
                    preemptible=cls == "batch" or name in DEMO_BORROWERS,
                    mixed_gpu_models=name in DEMO_MIXED,
                    kind="pytorch" if len(groups) > 1 or groups[0]["replicas"] > 1 else "batch",
                )

    def _floating(self, west: Cluster) -> None:
        """The second cluster's inventory and jobs submitted for any cluster (or by label): the
        placement step spreads them over both clusters; the x86-only image never goes west."""
        from registry.models import Image
        from scheduling import services as scheduling_services
        from scheduling.models import Job

        scheduling_services.inventory_sync(cluster=west)
        if Job.objects.filter(floating=True).exists():
            return
        # The catalog records the YOLO trainer's platforms: x86 only (so never the ARM cluster).
        Image.objects.filter(name="yolo-train").update(architectures=["linux/amd64"])
        with transaction.atomic():
            for tenant_name, project_name, user, name, cls, groups, seconds, choice in DEMO_FLOATING:
                project = Project.objects.get(tenant__name=tenant_name, name=project_name)
                scheduling_services.job_submit(
                    actor=User.objects.get(username=user), project=project, cluster=None,
                    cluster_choice=choice, name=name, groups=groups, priority_class=cls,
                    duration_seconds=seconds, preemptible=cls == "batch")

    def _workloads(self, cluster: Cluster, admin: User) -> None:
        """Workloads (workspaces/, registry/): a tenant image, two profiles, a notebook, a
        checkpointing DDP training job and a model service (idempotent: each is made once)."""
        from registry import services as registry_services
        from registry.models import Image
        from workspaces import services as workspace_services
        from workspaces.models import DevEnvironment, ModelService, Profile, TrainingJob

        vision = Tenant.objects.get(name="vision")
        detection = Project.objects.get(tenant=vision, name="detection")
        vera = User.objects.get(username="vera")
        vince = User.objects.get(username="vince")
        with transaction.atomic():
            if not Image.objects.filter(tenant=vision, name="yolo-train").exists():
                registry_services.image_create(
                    actor=vera, tenant=vision, name="yolo-train", display_name="YOLO trainer",
                    reference="ghcr.io/ultralytics/ultralytics:8.3.0", variant="training",
                    framework="pytorch")
            jupyter = Image.objects.get(scope="platform", name="pytorch-jupyter")
            if not Profile.objects.filter(name="small-notebook").exists():
                workspace_services.profile_create(
                    actor=admin, name="small-notebook", display_name="Small notebook (¼ A100)",
                    image=jupyter, gpu_count=1, gpu_memory_mib=20480, gpu_cores_percent=25,
                    cpu_millicores=4000, ram_mib=16384, home_gib=20)
            if not Profile.objects.filter(name="vision-full-gpu").exists():
                workspace_services.profile_create(
                    actor=admin, name="vision-full-gpu", display_name="Full GPU (vision only)",
                    image=jupyter, gpu_count=1, cpu_millicores=8000, ram_mib=65536, home_gib=50,
                    tenants=[vision])
            for name, display, kw in DEMO_PRESETS:
                if not Profile.objects.filter(name=name).exists():
                    workspace_services.profile_create(actor=admin, name=name, display_name=display,
                                                      image=jupyter, **kw)
            if not DevEnvironment.objects.filter(project=detection, name="explore").exists():
                workspace_services.environment_launch(
                    actor=vince, project=detection, cluster=cluster, name="explore", kind="jupyter",
                    profile=Profile.objects.get(name="small-notebook"))
            if not TrainingJob.objects.filter(project=detection, name="resnet-ddp").exists():
                workspace_services.training_submit(
                    actor=vince, project=detection, cluster=cluster, name="resnet-ddp",
                    framework="pytorch", image=Image.objects.get(name="pytorch-training"),
                    workers=2, gpu_count=2, cpu_millicores=8000, ram_mib=32768,
                    command=["torchrun", "train.py"], checkpoint_dir="/ckpt", checkpoint_every=30,
                    priority_class="batch", duration_seconds=240, log_dir="/logs")
            if not ModelService.objects.filter(project=detection, name="chat").exists():
                # A model service on a quarter card: the autoscaler follows the simulated day
                # (docs/SERVING.md), up to 3 replicas at 14:00 UTC, preempting batch training.
                workspace_services.model_service_create(
                    actor=vince, project=detection, cluster=cluster, name="chat",
                    image=Image.objects.get(scope="platform", name="vllm"),
                    model_source="hf://Qwen/Qwen2.5-7B-Instruct", gpu_memory_mib=20480,
                    gpu_cores_percent=25, cpu_millicores=4000, ram_mib=16384, min_replicas=1,
                    max_replicas=3, autoscale_target=8)

    def _living(self, admin: User) -> None:
        """The load generator's row (portal/demo.py) and a workspace policy that culls idle
        demo notebooks after 5 minutes, so culling shows within the first quarter hour."""
        from portal.models import DemoLoad
        from workspaces import services as workspace_services
        from workspaces.models import WorkspacePolicy

        if not DemoLoad.objects.exists():
            DemoLoad.objects.create()
        for project in Project.objects.filter(tenant__name__in=[t[0] for t in DEMO_TENANTS]):
            if not WorkspacePolicy.objects.filter(project=project).exists():
                workspace_services.workspace_policy_set(
                    actor=admin, project=project, idle_minutes=5, max_lifetime_hours=None,
                    warning_minutes=2, storage_gib_limit=None)

    def _user(self, username: str) -> User:
        user = User.objects.filter(username=username).first()
        if user is None:
            user = User(username=username, email=f"{username}@camp.example",
                        first_name=username.capitalize())
            user.set_password(DEMO_PASSWORD)
            user.save()
        return user

    def _tenant(self, admin: User, name: str, projects: list[str], owner: str, padmin: str,
                member: str) -> None:
        tenant = Tenant.objects.filter(name=name).first()
        if tenant is not None:
            return
        tenant = services.tenant_create(actor=admin, name=name, display_name=name.capitalize())
        services.quota_set(actor=admin, scope="tenant", tenant=tenant, values={
            "gpus_guaranteed": Decimal(24), "gpus_limit": Decimal(48),
            "gpu_memory_mib_guaranteed": 24 * 81920, "gpu_memory_mib_limit": 48 * 81920,
            "cpu_cores_guaranteed": Decimal(256), "cpu_cores_limit": Decimal(512),
            "ram_mib_guaranteed": 2 * 1024 * 1024, "ram_mib_limit": 4 * 1024 * 1024,
        })
        owner_user = self._user(owner)
        services.membership_create(actor=admin, user=owner_user, tenant=tenant,
                                   role=Role.TENANT_OWNER)
        for i, project_name in enumerate(projects):
            project = services.project_create(actor=owner_user, tenant=tenant, name=project_name)
            services.quota_set(actor=owner_user, scope="project", project=project, values={
                "gpus_guaranteed": Decimal(8 + 4 * i), "gpus_limit": Decimal(32),
                "gpu_memory_mib_guaranteed": (8 + 4 * i) * 81920,
                "gpu_memory_mib_limit": 32 * 81920,
                "cpu_cores_guaranteed": Decimal(64), "cpu_cores_limit": Decimal(256),
                "ram_mib_guaranteed": 512 * 1024, "ram_mib_limit": 2 * 1024 * 1024,
            })
            if i == 0:
                services.membership_create(actor=owner_user, user=self._user(padmin), tenant=tenant,
                                           project=project, role=Role.PROJECT_ADMIN)
                services.membership_create(actor=owner_user, user=self._user(member), tenant=tenant,
                                           project=project, role=Role.PROJECT_MEMBER)
        assert Membership.objects.filter(tenant=tenant).count() >= 3
