"""Submit-time refusals of work that can never run where it is sent (review finding 8 of issue 16).

A job pinned to one cluster whose image is built for no architecture of that cluster's nodes,
or whose pod group allows only GPU models no node of it has, would be accepted and then rejected
by the cluster's cycle ("No node can ever fit"); a floating job allowed only on clusters without
its GPU models would be rejected by the placement step. These checks refuse both at submit, with
a ValidationError naming the field (``groups[i].image``, ``groups[i].gpu_models``); the workload
kinds map those to their own fields.

The rules are the placement step's (``multicluster.excluded``, fed by ``cluster_views``): a node's
architecture is its ``kubernetes.io/arch`` label (amd64 when absent), GPU models compare by
``model_family``, an image's architectures are what the project's catalog records (none recorded:
unrestricted). A cluster with no node synced yet refuses nothing (as ``refuse_if_no_node_holds_all``):
its nodes may simply not be known yet.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ValidationError

from scheduling.engine.placement import model_family

from ..models import Cluster
from .placement import ChoiceContext


def _platforms(arches: Iterable[str]) -> str:
    return ", ".join(sorted("linux/" + a for a in arches))


def refuse_never_runs_on(
    cluster: Cluster, groups: list[dict[str, Any]], project: Any, context: ChoiceContext | None = None
) -> None:
    """Refuse pod ``groups`` of a job pinned to ``cluster`` (as ``project`` sees the image catalog)
    whose image has no variant for any of its nodes' architectures, or whose allowed GPU models
    none of its nodes has. The cluster's nodes are read only when a group asks something of them
    (an image whose platforms the catalog records, or GPU models): most submits read none."""
    ctx = context or ChoiceContext()
    arches = ctx.arches(project, {str(g.get("image") or "busybox") for g in groups})
    asks = [(arches.get(str(g.get("image") or "busybox")), _models(g)) for g in groups]
    if not any(need or wanted for need, wanted in asks):
        return  # no image with recorded platforms, no GPU model asked: nothing to compare
    view = ctx.view_of(cluster)
    if view is None:
        return
    for i, (need, wanted) in enumerate(asks):
        if need and not need & view.arches:
            raise ValidationError(
                {
                    f"groups[{i}].image": [
                        f"The image is built for {_platforms(need)}; cluster {cluster} has "
                        f"{_platforms(view.arches)} nodes only. Choose an image with a variant for it, "
                        f"or another cluster."
                    ]
                }
            )
        if wanted and not wanted & view.gpu_models:
            have = ", ".join(sorted(view.gpu_models)) or "no GPUs"
            raise ValidationError(
                {
                    f"groups[{i}].gpu_models": [
                        f"No node of cluster {cluster} has a GPU of model {', '.join(sorted(wanted))} "
                        f"(it has {have})."
                    ]
                }
            )


def refuse_gpu_models_nowhere(
    groups: list[dict[str, Any]], cluster_ids: list[int], context: ChoiceContext
) -> None:
    """Refuse pod ``groups`` of a floating job whose allowed GPU models no node of any cluster it may
    use (``cluster_ids``, enabled) has. Nothing is refused while one of them has no node synced."""
    if not cluster_ids or any(cid not in context.synced() for cid in cluster_ids):
        return
    views = context.views()
    have = {m for cid in cluster_ids for m in views[cid].gpu_models}
    for i, g in enumerate(groups):
        wanted = _models(g)
        if wanted and not wanted & have:
            raise ValidationError(
                {
                    f"groups[{i}].gpu_models": [
                        "None of the clusters this job may use has a GPU of model "
                        f"{', '.join(sorted(wanted))} "
                        f"(they have {', '.join(sorted(have)) or 'no GPUs'})."
                    ]
                }
            )


def _models(group: dict[str, Any]) -> frozenset[str]:
    """The GPU model families a GPU pod group allows (empty: any, or no GPU asked)."""
    models = group.get("gpu_models") or []
    if not group.get("gpu_count") or not isinstance(models, list):
        return frozenset()
    return frozenset(model_family(str(m)) for m in models)
