"""The mutating admission webhook for ``batch/v1`` Jobs labelled for a queue (issue 34).

Kueue's admission, from its documentation: a Job labelled ``kueue.x-k8s.io/queue-name`` is
created suspended (its webhook sets ``spec.suspend``), its workload admitted against quotas,
then un-suspended; suspended again when evicted. Camp does the same with its own cycle
(``services.external``). This webhook answers the API server's ``AdmissionReview`` for Job
creations in namespaces bound to a project (the webhook configuration's ``namespaceSelector``,
deploy/helm/camp-agent) with a JSON Patch that

- sets ``spec.suspend: true`` (a Job never starts before Camp admits it), and
- names Camp's scheduler in the pod template when it names none or the default one (Camp binds
  the pods; a template naming another scheduler is refused in words: its pods would never be
  Camp's to bind).

It reads nothing but the request and writes nothing (no database, no session): anyone able to
reach it learns only how a Job would be patched. The Django request path is reused rather than
a second server (the API server calls it over HTTPS like any client).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from .backends.kubernetes import scheduler_name
from .services.external import QUEUE_LABELS

DEFAULT_SCHEDULER = "default-scheduler"


def job_patch(job: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """(JSON Patch operations, refusal or "") for a Job being created."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    if not any(k in labels for k in QUEUE_LABELS):
        return [], ""
    spec = job.get("spec") or {}
    pod_spec = ((spec.get("template") or {}).get("spec")) or {}
    ops: list[dict[str, Any]] = []
    named = pod_spec.get("schedulerName") or ""
    if named not in ("", DEFAULT_SCHEDULER, scheduler_name()):
        return [], (f"spec.template.spec.schedulerName: the Job is labelled for Camp's queue but its "
                    f"pods name the scheduler {named!r}; Camp admits Jobs whose pods it binds "
                    f"(name {scheduler_name()!r}, or none)")
    if spec.get("suspend") is not True:
        ops.append({"op": "add", "path": "/spec/suspend", "value": True})
    if named != scheduler_name():
        ops.append({"op": "add", "path": "/spec/template/spec/schedulerName", "value": scheduler_name()})
    return ops, ""


@csrf_exempt  # the API server posts AdmissionReviews: no session, no form, nothing written
@require_POST
def batch_job_mutate(request: HttpRequest) -> HttpResponse:
    try:
        review = json.loads(request.body)
        req = review["request"]
        uid = str(req["uid"])
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"detail": "request: an admission.k8s.io/v1 AdmissionReview with a "
                                       "request (uid, object) is expected"}, status=400)
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    obj = req.get("object") if isinstance(req, dict) else None
    kind = (req.get("kind") or {}).get("kind") if isinstance(req.get("kind"), dict) else None
    if req.get("operation") == "CREATE" and kind == "Job" and isinstance(obj, dict):
        ops, refusal = job_patch(obj)
        if refusal:
            response = {"uid": uid, "allowed": False, "status": {"code": 400, "message": refusal}}
        elif ops:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    return JsonResponse({"apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
                         "kind": "AdmissionReview", "response": response})
