"""Why a pod failed or cannot start, in words a user acts on (issue 28, findings 1, 2, 7).

What the kubelet reports is read from the pod (``PodStatus``: the main container's
waiting/terminated state, the pod's reason and its ``PodScheduled`` condition); what only
events and claims say (``FailedMount``, an unbound PersistentVolumeClaim) comes from the
backend's ``pod_problem`` and is phrased there. One place says which waiting reasons mean
"this pod will not start by itself" and what the job does about it when the start
deadline passes (``start_deadline``): an image or configuration problem fails the job (a
new attempt would meet it again), a volume or node problem requeues it.
"""

from __future__ import annotations

import signal as signals

from django.conf import settings

from .base import PodStatus

# The kubelet's waiting reasons that do not clear by themselves (kubelet/images and
# kuberuntime; ``ContainerCreating`` and ``PodInitializing`` are progress, not problems).
IMAGE_PROBLEMS = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull",
                            "RegistryUnavailable", "SignatureValidationFailed"})
CONFIG_PROBLEMS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError",
                             "PreCreateHookError", "PreStartHookError", "PostStartHookError",
                             "CrashLoopBackOff"})
HOPELESS = frozenset({"InvalidImageName", "ErrImageNeverPull"})
"""Reasons no wait can cure: the job fails at once."""

OOM_ADVICE = "out of memory: raise ram_mib"


def start_deadline() -> int:
    """Seconds a pod may report a problem that stops it starting before the job gives up
    (setting ``CAMP_POD_START_PROBLEM_SECONDS``, camp/settings/tasks.py)."""
    return int(settings.CAMP_POD_START_PROBLEM_SECONDS)


def signal_name(number: int | None) -> str:
    if not number:
        return ""
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _clip(text: str, n: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def termination(p: PodStatus) -> str:
    """The main container's end in words: reason, exit code, signal, message; "" if unknown."""
    if p.terminated_reason == "OOMKilled":
        code = f" (exit code {p.exit_code})" if p.exit_code is not None else ""
        return f"container was OOMKilled{code}: {OOM_ADVICE}"
    if not p.terminated_reason and p.exit_code is None:
        return ""
    sig = p.signal or (p.exit_code - 128 if p.exit_code is not None and 128 < p.exit_code < 160 else None)
    parts = []
    if p.exit_code is not None:
        parts.append(f"exit code {p.exit_code}")
    if sig:
        parts.append(f"killed by {signal_name(sig)}")
    what = "container could not start" if p.terminated_reason in ("StartError", "ContainerCannotRun") else (
        "container exited")
    head = f"{what} ({p.terminated_reason}" + (f", {', '.join(parts)})" if parts else ")") if (
        p.terminated_reason) else f"{what} ({', '.join(parts)})"
    return f"{head}: {_clip(p.terminated_message)}" if p.terminated_message else head


def failure(p: PodStatus) -> str:
    """Why a Failed pod failed (its job's reason reads ``Pod <name> failed: <this>``)."""
    ended = termination(p)
    own = _clip(p.message) if p.message else ""
    if p.reason and own:
        own = f"{p.reason}: {own}"
    elif p.reason:
        own = p.reason
    if ended and own and p.reason not in ("", "Error"):
        return f"{own}; {ended}"
    return ended or own or "no reason given by the cluster"


def waiting_problem(p: PodStatus) -> str:
    """Why a Pending pod is not starting, from its own status; "" when nothing is wrong
    that the pod says (then ``pod_problem``'s events and claims may still say)."""
    if p.waiting_reason in IMAGE_PROBLEMS or p.waiting_reason in CONFIG_PROBLEMS:
        detail = f": {_clip(p.waiting_message)}" if p.waiting_message else ""
        return f"{p.waiting_reason}{detail}"
    if p.unschedulable:
        return f"not admitted on its node: {_clip(p.unschedulable)}"
    return ""


def gives_up_by_failing(problem: str) -> bool:
    """At the deadline a job whose pod cannot start fails when the cause is the image or
    the container's configuration (a new attempt meets it again); otherwise (volumes,
    the node) it is requeued."""
    head = problem.split(":", 1)[0].strip()
    return head in IMAGE_PROBLEMS or head in CONFIG_PROBLEMS


def hopeless(problem: str) -> bool:
    return problem.split(":", 1)[0].strip() in HOPELESS
