"""The admission webhook for Jobs labelled for a queue (issue 34, scheduling/webhooks.py): what
the API server gets back for an AdmissionReview, through Django's request path with no session
(as the API server calls it). The real API server calling it over HTTPS, with the chart's
configuration, is tests/integration/realnode/test_external_pods.py."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from django.test import Client

URL = "/scheduling/webhooks/batch-jobs"  # no slash: the API server drops a trailing one


def _review(job: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "operation": operation,
                        "kind": {"group": "batch", "version": "v1", "kind": "Job"},
                        "namespace": "team-a", "object": job}}


def _job(labels: dict[str, str], *, scheduler: str = "", suspend: bool | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"template": {"spec": {"containers": [{"name": "main", "image": "x"}],
                                                  "restartPolicy": "Never"}}}
    if scheduler:
        spec["template"]["spec"]["schedulerName"] = scheduler
    if suspend is not None:
        spec["suspend"] = suspend
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "labels": labels},
            "spec": spec}


def _answer(body: dict[str, Any]) -> dict[str, Any]:
    r = Client(enforce_csrf_checks=True).post(URL, json.dumps(body), content_type="application/json")
    assert r.status_code == 200, r.content
    data = r.json()
    assert data["kind"] == "AdmissionReview" and data["apiVersion"] == "admission.k8s.io/v1"
    assert data["response"]["uid"] == body["request"]["uid"]
    return dict(data["response"])


def _patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["patchType"] == "JSONPatch"
    return list(json.loads(base64.b64decode(response["patch"])))


@pytest.mark.parametrize("label", ["kueue.x-k8s.io/queue-name", "camp.io/queue-name"])
def test_a_labelled_job_is_created_suspended_naming_camps_scheduler(label: str) -> None:
    response = _answer(_review(_job({label: "team-queue"}, suspend=False)))
    assert response["allowed"] is True
    assert _patch(response) == [
        {"op": "add", "path": "/spec/suspend", "value": True},
        {"op": "add", "path": "/spec/template/spec/schedulerName", "value": "camp-scheduler"}]
    # already suspended and naming Camp: nothing to change
    response = _answer(_review(_job({label: "q"}, scheduler="camp-scheduler", suspend=True)))
    assert response == {"uid": response["uid"], "allowed": True}


def test_a_job_without_the_label_or_an_update_is_left_alone() -> None:
    for body in (_review(_job({"app": "x"})), _review(_job({"kueue.x-k8s.io/queue-name": "q"}), "UPDATE")):
        response = _answer(body)
        assert response["allowed"] is True and "patch" not in response


def test_a_labelled_job_whose_pods_name_another_scheduler_is_refused_in_words() -> None:
    response = _answer(_review(_job({"kueue.x-k8s.io/queue-name": "q"}, scheduler="volcano")))
    assert response["allowed"] is False
    assert "spec.template.spec.schedulerName" in response["status"]["message"]
    assert "'volcano'" in response["status"]["message"]


def test_what_is_no_admission_review_gets_a_400_naming_it() -> None:
    client = Client()
    r = client.post(URL, "not json", content_type="application/json")
    assert r.status_code == 400 and "AdmissionReview" in r.json()["detail"]
    r = client.post(URL, json.dumps({"request": {"object": {}}}), content_type="application/json")
    assert r.status_code == 400
    assert client.get(URL).status_code == 405
