"""``camp`` — submit and follow training jobs and dev environments from a terminal.

Authentication: an API token (``camp_…``, made on the portal's API tokens page), given
by ``--token`` / ``CAMP_TOKEN`` or saved by ``camp login``; the server by ``--url`` /
``CAMP_URL``. Every command is one or two calls to ``/api/v1/``; errors from the server
are printed field by field and exit with status 1.

    camp login --url https://camp.example.com --token camp_…
    camp submit -f job.yaml          # kind: TrainingJob (default), DevEnvironment or Job;
                                     # many documents: the Jobs go in one bulk request
    camp ls
    camp logs JOB [--tail 100] [-f]
    camp why JOB
    camp stop JOB
    camp rm JOB
    camp serve create NAME --project T/P --cluster C --image vllm --model hf://org/model
    camp serve list | status NAME | scale NAME N | update NAME --max 4 | rollout NAME | delete NAME
    camp serve create ... --companion name=draft,image-ref=REF,model=hf://org/m,memory=20480,compute=20
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import click
import requests
import yaml

CONFIG = Path(os.environ.get("CAMP_CONFIG", Path.home() / ".config" / "camp" / "config.json"))
TIMEOUT = 30


class Api:
    def __init__(self, url: str, token: str) -> None:
        if not url or not token:
            raise click.UsageError("Set the server and token: camp login --url URL --token TOKEN "
                                   "(or CAMP_URL and CAMP_TOKEN).")
        self.base = url.rstrip("/") + "/api/v1/"
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {token}", "Accept": "application/json",
                                     "User-Agent": "camp-cli"})

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            r = self.session.request(method, self.base + path.lstrip("/"), timeout=TIMEOUT, **kwargs)
        except requests.RequestException as exc:
            raise click.ClickException(f"Cannot reach {self.base}: {type(exc).__name__}") from exc
        if r.status_code >= 400:
            raise click.ClickException(_describe(r))
        return r.json() if r.content else None

    def items(self, path: str, **params: Any) -> list[dict[str, Any]]:
        data = self.call("GET", path, params=params)
        return list(data["results"] if isinstance(data, dict) and "results" in data else data)


def _describe(r: requests.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return f"HTTP {r.status_code}"
    if isinstance(body, dict):
        if set(body) == {"detail"}:
            return f"{r.status_code}: {body['detail']}"
        lines = []
        for field, errors in body.items():
            msgs = errors if isinstance(errors, list) else [errors]
            lines.append(f"{field}: {' '.join(str(m) for m in msgs)}")
        return f"{r.status_code}:\n  " + "\n  ".join(lines)
    return f"{r.status_code}: {body}"


def _load_config() -> dict[str, str]:
    try:
        return dict(json.loads(CONFIG.read_text()))
    except (OSError, ValueError):
        return {}


@click.group()
@click.option("--url", envvar="CAMP_URL", help="Camp server, e.g. https://camp.example.com")
@click.option("--token", envvar="CAMP_TOKEN", help="API token (camp_…)")
@click.pass_context
def cli(ctx: click.Context, url: str | None, token: str | None) -> None:
    """Camp: GPU training jobs and dev environments."""
    saved = _load_config()
    ctx.obj = {"url": url or saved.get("url", ""), "token": token or saved.get("token", "")}


def _api(ctx: click.Context) -> Api:
    return Api(ctx.obj["url"], ctx.obj["token"])


@cli.command()
@click.option("--url", "server", required=True)
@click.option("--token", "token", prompt=True, hide_input=True)
def login(server: str, token: str) -> None:
    """Save the server and token (file readable by you only)."""
    Api(server, token).call("GET", "training-jobs/", params={"page_size": 1})
    CONFIG.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(CONFIG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.S_IRUSR | stat.S_IWUSR)
    os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR)  # an existing file keeps its mode otherwise (0644)
    with os.fdopen(fd, "w") as fh:
        json.dump({"url": server, "token": token}, fh)
    click.echo(f"Saved to {CONFIG}.")


def _project_id(api: Api, ref: Any) -> int:
    """``tenant/project`` (or a project id) → the project id."""
    if isinstance(ref, int) or (isinstance(ref, str) and ref.isdigit()):
        return int(ref)
    if not isinstance(ref, str) or "/" not in ref:
        raise click.ClickException("project: write it as tenant/project.")
    tenant, name = ref.split("/", 1)
    for p in api.items("projects/", name=name):
        if p.get("tenant_name") == tenant:
            return int(p["id"])
    raise click.ClickException(f"project: {ref} does not exist or is not yours.")


def _image_id(api: Api, name: str) -> int:
    found = api.items("images/", name=name)
    if not found:
        raise click.ClickException(f"image: no catalog image named {name}.")
    return int(found[0]["id"])


BULK_JOBS = 1000
"""Jobs per ``POST jobs/bulk/`` (the server's limit)."""


def cluster_option(value: str | None) -> dict[str, Any] | None:
    """``--cluster``: ``any``, ``a,b`` (one name pins the job), or labels ``region=eu,arch=arm64``
    → the job fields ``cluster`` / ``cluster_choice``; None leaves the file's own."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        raise click.BadParameter("any, a cluster name, names a,b, or labels key=value,...",
                                 param_hint="--cluster")
    if value.casefold() == "any":  # any case: no cluster may be named "any"
        return {"cluster": None, "cluster_choice": {}}
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if all("=" in p for p in parts):
        labels = dict(p.split("=", 1) for p in parts)
        if not all(k and v for k, v in labels.items()):
            raise click.BadParameter("labels as key=value", param_hint="--cluster")
        return {"cluster": None, "cluster_choice": {"labels": labels}}
    if any("=" in p for p in parts):
        raise click.BadParameter("either cluster names or key=value labels, not both",
                                 param_hint="--cluster")
    if len(parts) == 1:
        return {"cluster": parts[0], "cluster_choice": {}}
    return {"cluster": None, "cluster_choice": {"clusters": parts}}


@cli.command()
@click.option("-f", "--file", "path", required=True, type=click.File("r"), help="A job.yaml ('-': stdin)")
@click.option("--cluster", "cluster", default=None,
              help="Where Job and TrainingJob documents may run: any | a,b | region=eu,arch=arm64 "
                   "(one name pins)")
@click.pass_context
def submit(ctx: click.Context, path: Any, cluster: str | None) -> None:
    """Submit training jobs, dev environments or plain jobs from a YAML file.

    The file may hold many documents (separated by ``---``). Documents of ``kind: Job``
    (a scheduling job: name, project, cluster, groups, priority_class, mixed_gpu_models,
    ...) are submitted together through the bulk endpoint, all or nothing; the others one
    by one. ``--cluster`` sets where the Job and TrainingJob documents may run (overriding
    their own ``cluster`` and ``cluster_choice``): ``any`` cluster the project may use, a set
    ``a,b``, or cluster labels ``region=eu``; Camp then places each run where it starts
    soonest. Dev environments always name their cluster (their home volume lives there)."""
    where = cluster_option(cluster)
    try:
        specs = [d for d in yaml.safe_load_all(path) if d is not None]
    except yaml.YAMLError as exc:
        raise click.ClickException(f"{path.name} is not valid YAML: {exc}") from exc
    if not specs or not all(isinstance(d, dict) for d in specs):
        raise click.ClickException(f"{path.name}: a mapping of fields is expected in each document.")
    api = _api(ctx)
    projects: dict[Any, int] = {}

    def project_of(ref: Any) -> int:
        if ref not in projects:
            projects[ref] = _project_id(api, ref)
        return projects[ref]

    jobs = []
    for spec in specs:
        kind = str(spec.pop("kind", "TrainingJob"))
        body = dict(spec)
        if "project" in body:
            body["project"] = project_of(body["project"])
        if where is not None and kind in ("Job", "TrainingJob"):
            body.update(where)
        if kind == "Job":
            jobs.append(body)
        else:
            _submit_one(api, kind, body)
    for i in range(0, len(jobs), BULK_JOBS):
        done = api.call("POST", "jobs/bulk/", json={"jobs": jobs[i:i + BULK_JOBS]})
        for j in done["jobs"]:
            click.echo(f"job {j['name']} (#{j['id']}) {j['state']}")


def _submit_one(api: Api, kind: str, body: dict[str, Any]) -> None:
    if isinstance(body.get("image"), str):
        body["image"] = _image_id(api, body["image"])
    if kind == "DevEnvironment":
        env = api.call("POST", "environments/", json=body)
        click.echo(f"environment {env['name']} (#{env['id']}) {env['state']}")
        if env.get("access_url"):
            click.echo(f"open: {env['access_url']}")
        for k, v in (env.get("how_to_open") or {}).items():
            if k == "ssh":
                click.echo(f"ssh: {v}")
        return
    if kind != "TrainingJob":
        raise click.ClickException("kind: TrainingJob, DevEnvironment or Job.")
    t = api.call("POST", "training-jobs/", json=body)
    where = f" on {t['cluster']}" if t.get("cluster") else " (placed by Camp)" if t.get("floating") else ""
    click.echo(f"training job {t['name']} (#{t['id']}) {t['state']}{where}")


WORKLOAD_JOB_KINDS = frozenset({"pytorch", "deepspeed", "mpi", "tensorflow", "jupyter", "vscode", "ssh",
                                "service"})
"""``Job.kind`` of the runs of training jobs, environments and model services: ``camp ls``
lists those workloads, not their runs; the other jobs (``kind: Job`` documents) are listed
as jobs."""


def _row(kind: str, x: dict[str, Any]) -> list[str]:
    run = x.get("run") or {}
    why = run.get("reason") or x.get("blocked_reason") or x.get("stop_reason") or ""
    if kind == "job":
        why = x.get("why_across_clusters") or x.get("reason") or ""
    if x.get("cull_warning"):
        why = x["cull_warning"]
    return [kind, str(x["id"]), x["name"], f"{x['tenant']}/{_project_name(x)}", x["state"], why[:70]]


def _project_name(x: dict[str, Any]) -> str:
    return str(x.get("project_name") or x["project"])


@cli.command(name="ls")
@click.pass_context
def ls(ctx: click.Context) -> None:
    """List your projects' training jobs, dev environments and jobs (``kind: Job`` documents;
    a floating one's WHY names each cluster)."""
    api = _api(ctx)
    rows = [_row("training", t) for t in api.items("training-jobs/")]
    rows += [_row("env", e) for e in api.items("environments/")]
    rows += [_row("job", j) for j in api.items("jobs/") if j.get("kind") not in WORKLOAD_JOB_KINDS]
    header = ["KIND", "ID", "NAME", "PROJECT", "STATE", "WHY"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _find(api: Api, ref: str) -> tuple[str, dict[str, Any]]:
    """A training job, environment or job by id (``12``, ``env/12``, ``job/33``) or by name
    (looked for in that order)."""
    kinds = [("training-jobs", "training"), ("environments", "env"), ("jobs", "job")]
    if "/" in ref:
        prefix, ref = ref.split("/", 1)
        kinds = [k for k in kinds if k[1] == prefix or k[0] == prefix] or kinds
    for path, label in kinds:
        if ref.isdigit():
            try:
                return path, api.call("GET", f"{path}/{ref}/")
            except click.ClickException:
                continue
        if path == "jobs":  # the jobs API searches names (?search=); keep the exact ones, and
            # only plain jobs, as ``ls`` lists them: the job behind a training job or environment
            # (kept when that is deleted) is reached through it, or as ``job/<id>``
            found = [j for j in api.items(f"{path}/", search=ref)
                     if j.get("name") == ref and j.get("kind") not in WORKLOAD_JOB_KINDS]
        else:
            found = api.items(f"{path}/", name=ref)
        if len(found) > 1:
            raise click.ClickException(f"{ref} names several {label}s; use its id (camp ls).")
        if found:
            return path, found[0]
    raise click.ClickException(f"No training job, environment or job {ref} (see camp ls).")


def _events(lines: Any) -> Any:
    """Server-Sent Events (``event:`` / ``data:`` lines, a blank line ends one) → (event, data)."""
    event, data = "message", list[str]()
    for raw in lines:
        line = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)


def _follow(api: Api, path: str, obj: dict[str, Any], tail: int, pod: str, seconds: int) -> None:
    url = f"{api.base}{path}/{obj['id']}/logs/"
    params: dict[str, str | int] = {"follow": "true", "tail": tail, "pod": pod, "timeout": seconds}
    try:
        with api.session.get(url, params=params, stream=True, timeout=(TIMEOUT, seconds + TIMEOUT),
                             headers={"Accept": "text/event-stream"}) as r:
            if r.status_code >= 400:
                raise click.ClickException(_describe(r))
            pods: set[str] = set()
            # chunk_size=None: hand on whatever has arrived, not 512-byte blocks
            for event, data in _events(r.iter_lines(chunk_size=None)):  # type: ignore[call-overload]
                body = json.loads(data)
                if event == "log":
                    pods.add(body["pod"])
                    prefix = f"{body['pod']} | " if pod == "" else ""
                    click.echo(f"{prefix}{body['line']}")
                elif event == "end":
                    if not pods:
                        click.echo(f"{obj['name']}: no log lines ({body['reason']}).", err=True)
                    else:
                        click.echo(f"-- {body['reason']}", err=True)
                    return
    except requests.RequestException as exc:
        raise click.ClickException(f"The log stream broke off: {type(exc).__name__}") from exc


@cli.command()
@click.argument("job")
@click.option("--tail", default=None, type=int, help="Lines per pod [default: 200; 50 with -f]")
@click.option("--pod", default="", help="Only this pod")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines as they are written")
@click.option("--timeout", "seconds", default=300, show_default=True, type=click.IntRange(1, 3600),
              help="With -f: stop after this many seconds")
@click.pass_context
def logs(ctx: click.Context, job: str, tail: int | None, pod: str, follow: bool, seconds: int) -> None:
    """Print the logs of a job's (or environment's) pods; -f follows them."""
    api = _api(ctx)
    path, obj = _find(api, job)
    if path == "jobs":
        raise click.ClickException(f"{obj['name']} is a job: its logs are read in its cluster "
                                   "(camp logs reads training jobs' and environments').")
    if follow:
        _follow(api, path, obj, 50 if tail is None else tail, pod, seconds)
        return
    tail = 200 if tail is None else tail
    entries = api.call("GET", f"{path}/{obj['id']}/logs/", params={"tail": tail, "pod": pod})
    if not entries:
        click.echo(f"{obj['name']} has no running pods ({obj['state']}).", err=True)
    for e in entries:
        click.echo(f"==> {e['pod']} ({e['role']}) <==")
        click.echo(e["text"])


@cli.command()
@click.argument("job")
@click.pass_context
def why(ctx: click.Context, job: str) -> None:
    """Why a job waits, its place in the queue and what would let it start."""
    api = _api(ctx)
    path, obj = _find(api, job)
    # A job's own record says why (a training job or environment has a why/ of its own).
    w = obj if path == "jobs" else api.call("GET", f"{path}/{obj['id']}/why/")
    click.echo(f"{obj['name']}: {w['state']}")
    if w.get("reason"):
        click.echo(f"why: {w['reason']}")
    across = w.get("why_across_clusters") or ""
    if across and across != w.get("reason"):
        click.echo(f"clusters: {across}")
    if w.get("queue_position"):
        click.echo(f"queue position: {w['queue_position']} of {w['queue_length']}")
    if w.get("hint"):
        click.echo(f"would start: {w['hint']}")
    # a job Camp did not create (issue 34): the Kubernetes objects it stands for
    kj = w.get("kubernetes_job")
    if kj:
        queue = f", queue {kj['queue_name']}" if kj.get("queue_name") else ""
        click.echo(f"kubernetes: Job {kj['namespace']}/{kj['name']}{queue}")
    elif w.get("kubernetes_pods"):
        pods = ", ".join(f"{p['namespace']}/{p['name']}" for p in w["kubernetes_pods"])
        click.echo(f"kubernetes: pod {pods}")


@cli.command()
@click.argument("job")
@click.pass_context
def stop(ctx: click.Context, job: str) -> None:
    """Stop a training job or dev environment (an environment keeps its volume), or cancel a job."""
    api = _api(ctx)
    path, obj = _find(api, job)
    if path == "jobs":
        done = api.call("POST", f"jobs/{obj['id']}/cancel/")
        click.echo(f"{done['name']}: {done['state']}")
        return
    done = api.call("POST", f"{path}/{obj['id']}/stop/")
    click.echo(f"{done['name']}: {done['state']} ({done.get('stop_reason') or 'stopping'})")


@cli.command()
@click.argument("tenant")
@click.option("--since", default=None, help="First day, YYYY-MM-DD (default: 30 days ago)")
@click.option("--until", default=None, help="Last day, YYYY-MM-DD (default: today)")
@click.option("--by", type=click.Choice(["project", "user"]), default="project")
@click.pass_context
def usage(ctx: click.Context, tenant: str, since: str | None, until: str | None, by: str) -> None:
    """A tenant's usage and its cost (showback), per project or user, cluster and GPU model."""
    params = {k: v for k, v in (("tenant", tenant), ("since", since), ("until", until), ("by", by)) if v}
    report = _api(ctx).call("GET", "usage/", params=params)
    cur = report["currency"]
    click.echo(f"{report['tenant']}: {report['since']} to {report['until']}")
    for r in report["rows"]:
        who = f"{r['project']}" + (f"/{r['user']}" if r["user"] else "")
        cost = "no price" if r["cost"] is None else f"{r['cost']} {cur}"
        click.echo(f"  {who} · {r['cluster']} · {r['gpu_model'] or 'no GPU'}: {r['gpu_hours']:g} GPU-h, "
                   f"{r['cpu_core_hours']:g} core-h, {r['ram_gib_hours']:g} GiB-h RAM · {cost}")
    total = "" if report["cost"] is None else f" · {report['cost']} {cur}"
    click.echo(f"total: {report['gpu_hours']:g} GPU-h{total}")
    if report["unpriced"]:
        click.echo(f"no price set for: {', '.join(report['unpriced'])}")


@cli.command(name="rm")
@click.argument("job")
@click.option("-y", "--yes", is_flag=True, help="Do not ask (an environment's home volume is deleted)")
@click.pass_context
def rm(ctx: click.Context, job: str, yes: bool) -> None:
    """Delete a training job (stopped first if running; its audit trail stays) or a dev
    environment (with its home volume)."""
    api = _api(ctx)
    path, obj = _find(api, job)
    if path == "jobs":
        raise click.ClickException(f"{obj['name']} is a job: jobs are kept (camp stop cancels it).")
    if path == "environments" and not yes:
        click.confirm(f"Delete environment {obj['name']} and its home volume?", abort=True)
    api.call("DELETE", f"{path}/{obj['id']}/")
    kind = "environment" if path == "environments" else "training job"
    click.echo(f"{kind} {obj['name']} (#{obj['id']}) deleted")


# --- model services ------------------------------------------------------------------------------


@cli.group(name="ns")
def ns() -> None:
    """Kubernetes namespaces bound to a project (pods there naming Camp's scheduler queue as its jobs)."""


@ns.command(name="bind")
@click.argument("cluster")
@click.argument("namespace")
@click.option("--project", required=True, help="tenant/project (you are its admin)")
@click.pass_context
def ns_bind(ctx: click.Context, cluster: str, namespace: str, project: str) -> None:
    """Bind NAMESPACE of CLUSTER to a project. The namespace must carry Camp's labels first:
    if it does not, the answer says which (``kubectl label namespace ...``)."""
    api = _api(ctx)
    done = api.call("POST", "namespace-bindings/", json={
        "cluster": cluster, "namespace": namespace, "project": _project_id(api, project)})
    click.echo(f"{done['cluster']}/{done['namespace']}: bound (binding {done['id']})")


@ns.command(name="ls")
@click.pass_context
def ns_ls(ctx: click.Context) -> None:
    """The namespace bindings you can see."""
    for b in _api(ctx).items("namespace-bindings/"):
        who = b["created_by"] or ""
        click.echo(f"{b['id']}\t{b['cluster']}/{b['namespace']}\tproject {b['project']}\t{who}")


@ns.command(name="unbind")
@click.argument("binding", type=int)
@click.pass_context
def ns_unbind(ctx: click.Context, binding: int) -> None:
    """Unbind (its waiting pods are not admitted; running ones are left alone)."""
    _api(ctx).call("DELETE", f"namespace-bindings/{binding}/")
    click.echo(f"binding {binding}: removed")


@cli.group(name="priority-map")
def priority_map() -> None:
    """Kubernetes PriorityClass → Camp priority class, per cluster, for pods Camp did not create."""


@priority_map.command(name="set")
@click.argument("cluster")
@click.argument("kube_priority_class")
@click.argument("priority_class")  # the API checks it against Camp's classes (one list, the server's)
@click.pass_context
def priority_map_set(ctx: click.Context, cluster: str, kube_priority_class: str, priority_class: str) -> None:
    """Pods of CLUSTER whose priorityClassName is KUBE_PRIORITY_CLASS queue with PRIORITY_CLASS
    (platform admins; setting it again changes the class)."""
    done = _api(ctx).call("POST", "priority-class-mappings/", json={
        "cluster": cluster, "kube_priority_class": kube_priority_class, "priority_class": priority_class})
    click.echo(f"{done['cluster']}/{done['kube_priority_class']} → {done['priority_class']} "
               f"(mapping {done['id']})")


@priority_map.command(name="ls")
@click.option("--cluster", default=None, help="only this cluster's")
@click.pass_context
def priority_map_ls(ctx: click.Context, cluster: str | None) -> None:
    """The mappings (a PriorityClass not listed: a Camp class of the same name, else normal)."""
    params = {"cluster": cluster} if cluster else {}
    for m in _api(ctx).items("priority-class-mappings/", **params):
        click.echo(f"{m['id']}\t{m['cluster']}/{m['kube_priority_class']}\t{m['priority_class']}")


@priority_map.command(name="rm")
@click.argument("mapping", type=int)
@click.pass_context
def priority_map_rm(ctx: click.Context, mapping: int) -> None:
    """Remove a mapping (its pods follow the default rule again)."""
    _api(ctx).call("DELETE", f"priority-class-mappings/{mapping}/")
    click.echo(f"mapping {mapping}: removed")


@cli.group()
def serve() -> None:
    """Model services: online inference replicas, autoscaled, beside training."""


def _service(api: Api, ref: str) -> dict[str, Any]:
    if ref.isdigit():
        return dict(api.call("GET", f"services/{ref}/"))
    found = [s for s in api.items("services/", name=ref)]
    if not found:
        raise click.ClickException(f"No model service named {ref}.")
    if len(found) > 1:
        where = ", ".join(f"#{s['id']} in {s['tenant']}/{s['project_name']}" for s in found)
        raise click.ClickException(f"{ref} names several services ({where}): give its id.")
    return found[0]


def _env_pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair}: write NAME=VALUE", param_hint="--env")
        out[key] = value
    return out


_COMPANION_KEYS = {"name": "name", "image": "image", "image-ref": "image_reference", "model": "model_source",
                   "port": "port", "health": "health_path", "gpus": "gpu_count", "memory": "gpu_memory_mib",
                   "compute": "gpu_cores_percent", "cpu": "cpu_millicores", "ram": "ram_mib"}
_COMPANION_INTS = {"port", "gpu_count", "gpu_memory_mib", "gpu_cores_percent", "cpu_millicores", "ram_mib"}


def _companion(spec: str) -> dict[str, Any]:
    """``name=draft,image-ref=REF,model=hf://org/m,memory=20480,compute=20[,port=8001,gpus=1,
    cpu=1000,ram=8192,health=/health,image=vllm]``: one companion model server (same node)."""
    out: dict[str, Any] = {}
    for part in filter(None, spec.split(",")):
        key, sep, value = part.partition("=")
        field = _COMPANION_KEYS.get(key.strip())
        if not sep or field is None:
            raise click.BadParameter(f"{part}: write KEY=VALUE with KEY one of {', '.join(_COMPANION_KEYS)}",
                                     param_hint="--companion")
        if field in _COMPANION_INTS:
            try:
                out[field] = int(value)
            except ValueError as exc:
                raise click.BadParameter(f"{key}: a whole number", param_hint="--companion") from exc
        else:
            out[field] = value
    if "name" not in out:
        raise click.BadParameter(f"{spec}: give name=...", param_hint="--companion")
    return out


@serve.command(name="create")
@click.argument("name")
@click.option("--project", required=True, help="tenant/project")
@click.option("--cluster", required=True)
@click.option("--image", "image", help="A catalog image (vllm, triton, tgi, ...)")
@click.option("--image-ref", "image_reference", default="", help="Or an image reference")
@click.option("--model", "model_source", default="", help="hf://org/model, a path in the image, or pvc:path")
@click.option("--model-kind", "model_source_kind", type=click.Choice(["uri", "image", "volume"]),
              default="uri")
@click.option("--port", type=int, default=8000)
@click.option("--health", "health_path", default="/health")
@click.option("--gpus", "gpu_count", type=int, default=1)
@click.option("--gpu-memory", "gpu_memory_mib", type=int, default=20480, help="MiB per GPU (0: whole cards)")
@click.option("--gpu-cores", "gpu_cores_percent", type=int, default=30, help="% of each GPU's compute")
@click.option("--cpu", "cpu_millicores", type=int, default=2000, help="millicores")
@click.option("--ram", "ram_mib", type=int, default=16384, help="MiB")
@click.option("--min", "min_replicas", type=int, default=1)
@click.option("--max", "max_replicas", type=int, default=1)
@click.option("--metric", "autoscale_metric", type=click.Choice(["concurrency", "rps", "gpu_util"]),
              default="concurrency")
@click.option("--target", "autoscale_target", type=float, default=8.0, help="per replica")
@click.option("--scale-to-zero", "scale_to_zero_seconds", type=int, default=None, help="idle seconds")
@click.option("--priority", "priority_class", default="inference")
@click.option("--arg", "args", multiple=True, help="A server argument (repeat)")
@click.option("--env", "env", multiple=True, help="NAME=VALUE (repeat)")
@click.option("--companion", "companions", multiple=True,
              help="A model server on the same node in every replica (repeat): name=draft,image-ref=REF,"
                   "model=hf://org/m,memory=MiB,compute=%[,port=8001,gpus=1,cpu=1000,ram=8192,health=/path]")
@click.option("--ingress-host", "ingress_host", default="", help="Kubernetes: route this host to the service")
@click.pass_context
def serve_create(ctx: click.Context, name: str, project: str, image: str | None, args: tuple[str, ...],
                 env: tuple[str, ...], companions: tuple[str, ...], **opts: Any) -> None:
    """Create a model service; its first replicas are queued at once."""
    api = _api(ctx)
    body: dict[str, Any] = {**opts, "name": name, "project": _project_id(api, project),
                            "args": list(args), "env": _env_pairs(env),
                            "companions": [_companion(c) for c in companions]}
    if image:
        body["image"] = _image_id(api, image)
    svc = api.call("POST", "services/", json=body)
    click.echo(f"service {svc['name']} (#{svc['id']}) created: {svc['desired_replicas']} replica(s) queued")
    click.echo(f"endpoint: {svc['endpoint']}")


@serve.command(name="list")
@click.pass_context
def serve_list(ctx: click.Context) -> None:
    """Your model services: status, replicas ready/desired, revision, load."""
    rows = [["ID", "NAME", "PROJECT", "STATUS", "READY", "REV", "LOAD"]]
    for s in _api(ctx).items("services/", page_size=500):
        rows.append([str(s["id"]), s["name"], f"{s['tenant']}/{s['project_name']}", s["status"],
                     f"{s['ready_replicas']}/{s['desired_replicas']}", str(s["revision"]), f"{s['load']:g}"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


@serve.command(name="status")
@click.argument("service")
@click.pass_context
def serve_status(ctx: click.Context, service: str) -> None:
    """One service: replicas (and why a replica waits), load, revision, endpoint."""
    s = _service(_api(ctx), service)
    click.echo(f"{s['name']} (#{s['id']}) in {s['tenant']}/{s['project_name']}: {s['status']}")
    if s.get("status_reason"):
        click.echo(f"why: {s['status_reason']}")
    click.echo(f"replicas: {s['ready_replicas']} ready of {s['desired_replicas']} desired "
               f"(min {s['min_replicas']}, max {s['max_replicas']}); revision {s['revision']}")
    click.echo(f"load: {s['load']:g} ({s['autoscale_metric']}, target {s['autoscale_target']:g} per replica)")
    if s.get("load_error"):
        click.echo(f"replicas held: {s['load_error']}")
    p50, p95 = s.get("latency_p50_seconds"), s.get("latency_p95_seconds")

    def ms(v: float | None) -> str:
        return "—" if v is None else f"{v * 1000:.0f} ms"

    click.echo("latency: " + ("—" if p50 is None and p95 is None else f"p50 {ms(p50)} · p95 {ms(p95)}"))
    click.echo(f"endpoint: {s['endpoint']}")
    if s.get("ingress_host"):
        click.echo(f"ingress: http://{s['ingress_host']}/")
    for c in s.get("companions") or []:
        click.echo(f"companion {c['name']} (same node): {c.get('image_reference', '')} "
                   f"{c.get('gpu_memory_mib')} MiB × {c.get('gpu_cores_percent')} %, port {c.get('port')}")
    for r in s["replicas"]:
        job = r["job"]
        line = f"  #{r['number']} r{r['revision']} {job['name']}: {job['state']}"
        if job["state"] != "running" and job.get("reason"):
            line += f" — {job['reason']}"
        click.echo(line)


@serve.command(name="scale")
@click.argument("service")
@click.argument("replicas", type=int, required=False)
@click.option("--min", "min_replicas", type=int, default=None)
@click.option("--max", "max_replicas", type=int, default=None)
@click.pass_context
def serve_scale(ctx: click.Context, service: str, replicas: int | None, min_replicas: int | None,
                max_replicas: int | None) -> None:
    """A fixed replica count (0 stops it), or the autoscaler's --min/--max."""
    api = _api(ctx)
    s = _service(api, service)
    body = {k: v for k, v in (("replicas", replicas), ("min_replicas", min_replicas),
                              ("max_replicas", max_replicas)) if v is not None}
    done = api.call("POST", f"services/{s['id']}/scale/", json=body)
    click.echo(f"{done['name']}: {done['desired_replicas']} desired (min {done['min_replicas']}, "
               f"max {done['max_replicas']})")


@serve.command(name="update")
@click.argument("service")
@click.option("--min", "min_replicas", type=int, default=None)
@click.option("--max", "max_replicas", type=int, default=None)
@click.option("--metric", "autoscale_metric", type=click.Choice(["concurrency", "rps", "gpu_util"]),
              default=None)
@click.option("--target", "autoscale_target", type=float, default=None, help="per replica")
@click.option("--scale-down-delay", "scale_down_delay_seconds", type=int, default=None, help="seconds")
@click.option("--scale-to-zero", "scale_to_zero_seconds", type=int, default=None, help="idle seconds")
@click.pass_context
def serve_update(ctx: click.Context, service: str, **opts: Any) -> None:
    """Change the autoscaling settings (a new image or arguments: ``camp serve rollout``)."""
    api = _api(ctx)
    s = _service(api, service)
    body = {k: v for k, v in opts.items() if v is not None}
    if not body:
        raise click.UsageError("Give at least one setting to change.")
    done = api.call("PATCH", f"services/{s['id']}/", json=body)
    click.echo(f"{done['name']}: min {done['min_replicas']}, max {done['max_replicas']}, "
               f"{done['autoscale_metric']} target {done['autoscale_target']:g} per replica")


@serve.command(name="rollout")
@click.argument("service")
@click.option("--image-ref", "image_reference", default=None)
@click.option("--model", "model_source", default=None)
@click.option("--arg", "args", multiple=True, help="The new arguments (repeat; replaces them all)")
@click.option("--env", "env", multiple=True, help="NAME=VALUE (repeat; replaces them all)")
@click.pass_context
def serve_rollout(ctx: click.Context, service: str, image_reference: str | None, model_source: str | None,
                  args: tuple[str, ...], env: tuple[str, ...]) -> None:
    """A new revision (the changes given, else a restart), one replica at a time."""
    api = _api(ctx)
    s = _service(api, service)
    body: dict[str, Any] = {}
    if image_reference:
        body["image_reference"] = image_reference
    if model_source:
        body["model_source"] = model_source
    if args:
        body["args"] = list(args)
    if env:
        body["env"] = _env_pairs(env)
    done = api.call("POST", f"services/{s['id']}/rollout/", json=body)
    click.echo(f"{done['name']}: rolling out revision {done['revision']}")


@serve.command(name="api-key")
@click.argument("service")
@click.pass_context
def serve_api_key(ctx: click.Context, service: str) -> None:
    """A new API key for calls through the service's Ingress (the old one stops working).
    Printed once, alone on stdout, so ``export CAMP_SERVICE_KEY=$(camp serve api-key NAME)``
    works; keep it like a password."""
    api = _api(ctx)
    s = _service(api, service)
    done = api.call("POST", f"services/{s['id']}/api-key/")
    click.echo(f"{s['name']}: new API key for {done['external_endpoint']} (the previous one no "
               "longer works)", err=True)
    click.echo(done["api_key"])


@serve.command(name="delete")
@click.argument("service")
@click.option("-y", "--yes", is_flag=True, help="Do not ask")
@click.pass_context
def serve_delete(ctx: click.Context, service: str, yes: bool) -> None:
    """Delete a service: its replicas stop and its Service object goes."""
    api = _api(ctx)
    s = _service(api, service)
    if not yes:
        click.confirm(f"Delete model service {s['name']} and stop its replicas?", abort=True)
    api.call("DELETE", f"services/{s['id']}/")
    click.echo(f"service {s['name']} (#{s['id']}) deleted")


@cli.group(name="scim-token")
def scim_token() -> None:
    """SCIM provisioning tokens, one identity provider each (platform admins)."""


@scim_token.command(name="ls")
@click.pass_context
def scim_token_ls(ctx: click.Context) -> None:
    """Tokens and their providers (never the secrets)."""
    for t in _api(ctx).items("scim-tokens/"):
        state = "live" if t["active"] else "revoked"
        click.echo(f"{t['id']:>4}  {t['prefix']}  {t['provider']}  {t['sso_source']} "
                   f"{t['sso_issuer']}  {state}  last used {t['last_used_at'] or 'never'}")


@scim_token.command(name="create")
@click.argument("provider")
@click.option("--sso-source", type=click.Choice(["oidc", "saml"]), default=None,
              help="How the provisioned people sign in (a new provider only)")
@click.option("--sso-issuer", default=None,
              help="The OIDC issuer or SAML IdP entity id they sign in with (a new provider)")
@click.pass_context
def scim_token_create(ctx: click.Context, provider: str, sso_source: str | None,
                      sso_issuer: str | None) -> None:
    """A new token; printed once, alone on stdout (copy it into the provider)."""
    body = {k: v for k, v in (("provider", provider), ("sso_source", sso_source),
                              ("sso_issuer", sso_issuer)) if v}
    done = _api(ctx).call("POST", "scim-tokens/", json=body)
    click.echo(f"SCIM token #{done['id']} for {done['provider']} ({done['prefix']}…)", err=True)
    click.echo(done["token"])


@scim_token.command(name="revoke")
@click.argument("token_id", type=int)
@click.pass_context
def scim_token_revoke(ctx: click.Context, token_id: int) -> None:
    """Revoke a token by its id (``camp scim-token ls``): the provider's next call gets 401."""
    _api(ctx).call("DELETE", f"scim-tokens/{token_id}/")
    click.echo(f"SCIM token #{token_id} revoked")


def main() -> None:
    try:
        cli(standalone_mode=True)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
