"""Placement quality on the openb trace, following the FGD paper's protocol.

Per seed: shuffle the pod list, inflate it by resampling pods (appended after the originals) until
the requested GPUs reach 130 % of capacity, place pods one by one with no departures, drop pods
that fit nowhere. Report unallocated GPU % (100 − allocated share) when the arrived GPU requests
reach 100 % and 130 % of capacity, for Random, BestFit, FGD (re-implemented) and Camp's default,
beside the published numbers. Ties fall to the lexicographically smallest node name (as in the
paper's simulator).

    .venv/bin/python -m bench.placement_quality                 # 17 lists × 3 seeds × 4 policies
    .venv/bin/python -m bench.placement_quality --lists default --seeds 42 --policies fgd camp
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from multiprocessing import Pool
from pathlib import Path

from bench.openb import POD_LISTS, TracePod, load_nodes, load_pods, load_published
from scheduling.engine import (
    BestFitPolicy,
    ClusterState,
    FGDPolicy,
    FragmentationPolicy,
    Placer,
    Policy,
    RandomPolicy,
    WorkloadProfile,
)

POLICIES = ("random", "bestfit", "fgd", "camp")
PUBLISHED_NAME = {"random": "Random", "bestfit": "BestFit", "fgd": "FGD"}
RESULTS = Path(__file__).resolve().parent / "results"


def make_policy(name: str, profile: WorkloadProfile, seed: int) -> Policy:
    if name == "random":
        return RandomPolicy(seed=seed)
    if name == "bestfit":
        return BestFitPolicy()
    if name == "fgd":
        return FGDPolicy(profile)
    if name == "camp":
        return FragmentationPolicy(profile)
    raise ValueError(name)


def workload(pods: list[TracePod], capacity: float, seed: int, ratio: float = 1.3) -> list[TracePod]:
    """Shuffle, then append resampled pods until requested GPUs reach ``ratio`` × capacity."""
    rng = random.Random(seed)
    out = list(pods)
    rng.shuffle(out)
    total = sum(p.gpus for p in out)
    while total < ratio * capacity:
        p = pods[rng.randrange(len(pods))]
        out.append(p)
        total += p.gpus
    return out


def run_one(args: tuple[str, str, int]) -> dict[str, object]:
    """One (pod list, policy, seed) simulation."""
    pod_list, policy_name, seed = args
    snapshot = load_nodes()
    pods = load_pods(pod_list)
    capacity = float(sum(len(n.gpus) for n in snapshot.nodes))
    profile = WorkloadProfile.from_pods([p.request for p in pods])
    state = ClusterState(snapshot)
    placer = Placer(state, make_policy(policy_name, profile, seed))
    arrived = allocated = 0.0
    alloc100: float | None = None
    failed = 0
    t0 = time.perf_counter()
    c0 = time.process_time()
    stream = workload(pods, capacity, seed)
    for p in stream:
        if alloc100 is None and arrived + p.gpus > capacity:
            alloc100 = allocated
        arrived += p.gpus
        if placer.place_pod(p.request) is not None:
            allocated += p.gpus
        else:
            failed += 1
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0
    if alloc100 is None:
        alloc100 = allocated
    return {
        "pod_list": pod_list,
        "policy": policy_name,
        "seed": seed,
        "pods": len(stream),
        "failed": failed,
        "unalloc100": 100.0 - 100.0 * alloc100 / capacity,
        "unalloc130": 100.0 - 100.0 * allocated / capacity,
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "pods_per_cpu_second": len(stream) / cpu if cpu > 0 else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lists", nargs="+", default=list(POD_LISTS))
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    ap.add_argument("--seeds", nargs="+", type=int, default=[42, 43, 44])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS / "placement_quality.json")
    ap.add_argument("--markdown", type=Path, help="print the Markdown tables of a saved JSON")
    a = ap.parse_args(argv)
    if a.markdown:
        saved = json.loads(a.markdown.read_text())
        pols = [p for p in POLICIES if f"{p}_unalloc100" in saved["rows"][0]]
        print(markdown(saved["rows"], pols))
        return 0

    tasks = [(wl, pol, s) for wl in a.lists for pol in a.policies for s in a.seeds]
    # Longest first (FGD/Camp), so the two workers finish together.
    tasks.sort(key=lambda t: t[1] in ("random", "bestfit"))
    t0 = time.perf_counter()
    if a.workers > 1:
        with Pool(a.workers) as pool:
            runs = list(pool.imap_unordered(run_one, tasks))
    else:
        runs = [run_one(t) for t in tasks]
    wall = time.perf_counter() - t0

    published = load_published()
    rows = []
    for wl in a.lists:
        row: dict[str, object] = {"pod_list": wl}
        for pol in a.policies:
            rs = [r for r in runs if r["pod_list"] == wl and r["policy"] == pol]
            for k in ("unalloc100", "unalloc130"):
                vals = [float(r[k]) for r in rs]  # type: ignore[arg-type]
                row[f"{pol}_{k}"] = statistics.mean(vals)
                row[f"{pol}_{k}_sd"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
            pub = published.get((wl, PUBLISHED_NAME.get(pol, "")))
            if pub:
                row[f"{pol}_pub_unalloc100"] = round(100 - pub[0], 2)
                row[f"{pol}_pub_unalloc130"] = round(100 - pub[1], 2)
        rows.append(row)

    print_table(rows, a.policies)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(
        json.dumps({"seeds": a.seeds, "wall_seconds": wall, "rows": rows, "runs": runs}, indent=1)
    )
    print(f"\n{len(tasks)} runs in {wall:.0f} s; JSON: {a.out}")
    return 0


def print_table(rows: list[dict[str, object]], policies: list[str]) -> None:
    for k, label in (("unalloc100", "100% arrived"), ("unalloc130", "130% arrived")):
        print(f"\nUnallocated GPU % at {label} (ours mean over seeds; published in brackets)")
        head = f"{'pod list':<12}" + "".join(f"{p:>17}" for p in policies)
        if "camp" in policies and "fgd" in policies:
            head += f"{'camp vs fgd':>13}"
        print(head)
        sums: dict[str, float] = {p: 0.0 for p in policies}
        for r in rows:
            line = f"{r['pod_list']:<12}"
            for p in policies:
                v = float(r[f"{p}_{k}"])  # type: ignore[arg-type]
                sums[p] += v
                pub = r.get(f"{p}_pub_{k}")
                line += f"{v:>9.2f}" + (f" [{pub:>5.2f}]" if pub is not None else " " * 8)
            if "camp" in policies and "fgd" in policies:
                c, f = float(r[f"camp_{k}"]), float(r[f"fgd_{k}"])  # type: ignore[arg-type]
                line += f"{100 * (c - f) / f:>+12.1f}%"
            print(line)
        n = len(rows)
        line = f"{'mean':<12}" + "".join(f"{sums[p] / n:>9.2f}        " for p in policies)
        if "camp" in sums and "fgd" in sums:
            line += f"{100 * (sums['camp'] - sums['fgd']) / sums['fgd']:>+12.1f}%"
        print(line)


def markdown(rows: list[dict[str, object]], policies: list[str]) -> str:
    """The two tables as Markdown: ours ± sd (published), and Camp vs FGD."""
    out = []
    for k, label in (("unalloc100", "100 %"), ("unalloc130", "130 %")):
        out.append(f"\n**Unallocated GPU % when arrived GPU requests reach {label} of capacity**\n")
        out.append(
            "| pod list | "
            + " | ".join(f"{p} (published)" if p in PUBLISHED_NAME else p for p in policies)
            + " | Camp vs FGD |"
        )
        out.append("|---" * (len(policies) + 2) + "|")
        sums = dict.fromkeys(policies, 0.0)
        pub_sums = dict.fromkeys(policies, 0.0)
        for r in rows:
            cells = []
            for p in policies:
                v = float(r[f"{p}_{k}"])  # type: ignore[arg-type]
                sd = float(r[f"{p}_{k}_sd"])  # type: ignore[arg-type]
                sums[p] += v
                pub = r.get(f"{p}_pub_{k}")
                if pub is not None:
                    pub_sums[p] += float(pub)  # type: ignore[arg-type]
                cell = f"{v:.2f} ± {sd:.2f}" + (f" ({pub:.2f})" if pub is not None else "")
                cells.append(f"**{cell}**" if p == "camp" else cell)
            c, f = float(r[f"camp_{k}"]), float(r[f"fgd_{k}"])  # type: ignore[arg-type]
            cells.append(f"{100 * (c - f) / f:+.1f} %")
            out.append(f"| {r['pod_list']} | " + " | ".join(cells) + " |")
        n = len(rows)
        cells = []
        for p in policies:
            cell = f"{sums[p] / n:.2f}"
            if p in PUBLISHED_NAME:
                cell += f" ({pub_sums[p] / n:.2f})"
            cells.append(f"**{cell}**" if p == "camp" else cell)
        cells.append(f"{100 * (sums['camp'] - sums['fgd']) / sums['fgd']:+.1f} %")
        out.append("| **mean** | " + " | ".join(cells) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
