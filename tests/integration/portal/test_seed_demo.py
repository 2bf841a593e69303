"""`make demo` seeds its world through the same services as users (``seed_demo``): every
seeded workload must pass today's rules (a member's `high`, a plain job's `inference` and
the like are refused) — the demo once failed at start after a policy change no test ran it
against."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from scheduling.models import Job
from workspaces.models import DevEnvironment, ModelService

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_demo_seeds_through_every_rule_and_twice_is_the_same() -> None:
    from registry.catalog import seed_base_images
    from registry.models import Image

    # The base images a migration seeds (a transactional test before this one flushed them).
    seed_base_images(Image)
    call_command("seed_demo")
    jobs, envs, services = Job.objects.count(), DevEnvironment.objects.count(), ModelService.objects.count()
    assert jobs > 10 and envs >= 1 and services >= 1
    assert not Job.objects.filter(priority_class="inference").exclude(kind="service").exists()
    call_command("seed_demo")  # a restarted demo seeds nothing twice
    assert (Job.objects.count(), DevEnvironment.objects.count(), ModelService.objects.count()) == (
        jobs, envs, services)
