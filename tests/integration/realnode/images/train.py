"""A tiny data-parallel training run for the real-node tier: PyTorch CPU, gloo backend.

Each worker reads its rank from Camp's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT:
workspaces/pods.py), trains a linear regression on synthetic data with DistributedDataParallel,
and rank 0 writes a checkpoint to $CAMP_CHECKPOINT_DIR every --every steps (atomically). A
restarted run resumes from the last checkpoint and says so. Prints one line per step.

    python /opt/train.py --steps 40 --every 5 --step-seconds 0.5
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn


def log(msg: str) -> None:
    print(f"[rank {os.environ.get('RANK', '0')}] {msg}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--step-seconds", type=float, default=0.5)
    a = p.parse_args()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    log(f"rendezvous {os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} world {world}")
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=__import__("datetime").timedelta(seconds=300))
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    ckdir = os.environ.get("CAMP_CHECKPOINT_DIR", "/tmp")
    path = os.path.join(ckdir, "ckpt.pt")
    start = 0
    if os.path.exists(path):
        state = torch.load(path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        log(f"resumed from checkpoint at step {start}")
    true_w = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    g = torch.Generator().manual_seed(1000 + rank)
    for step in range(start + 1, a.steps + 1):
        x = torch.randn(64, 4, generator=g)
        y = x @ true_w.T
        loss = ((ddp(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        log(f"step {step} loss {loss.item():.4f}")
        if rank == 0 and step % a.every == 0:
            tmp = path + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, path)
            log(f"checkpoint step {step}")
        time.sleep(a.step_seconds)
    dist.barrier()
    log("training done")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
