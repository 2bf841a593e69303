"""A tiny data-parallel training run for the real-node tier: PyTorch CPU, gloo backend.

Camp's contract for a checkpointing training job (workspaces/pods.py, services/training.py):

* each worker reads its rank and the rendezvous from Camp's environment (RANK, WORLD_SIZE,
  MASTER_ADDR, MASTER_PORT);
* rank 0 writes a checkpoint to $CAMP_CHECKPOINT_DIR (the job's checkpoint volume) every
  --every steps, atomically, and then prints ``CAMP_CHECKPOINT step=<n> path=<file>``, the
  line Camp's log scan records as the job's latest checkpoint;
* a run that Camp starts again (after a preemption) gets that file as $CAMP_RESUME_FROM and
  every worker resumes from it, saying so.

Prints one line per step.

    python /opt/train.py --steps 40 --every 5 --step-seconds 0.5
"""
import argparse
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn


def log(msg: str) -> None:
    print(f"[rank {os.environ.get('RANK', '0')}] {msg}", flush=True)


def _stopped(signum: int, frame: object) -> None:
    # PID 1 of its container: without a handler the kernel ignores SIGTERM, so a preempted pod
    # sat out its whole grace period (30 s) before the kubelet's SIGKILL. Work since the last
    # checkpoint is lost either way; exit at once (as torchrun does for its workers).
    log("SIGTERM: stopping; a resumed run starts from the last checkpoint")
    os._exit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGTERM, _stopped)
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--step-seconds", type=float, default=0.5)
    a = p.parse_args()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    log(f"rendezvous {os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} world {world}")
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    log(f"joined the process group ({dist.get_world_size()} workers)")
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    ckdir = os.environ.get("CAMP_CHECKPOINT_DIR", "/tmp")
    start = 0
    resume = os.environ.get("CAMP_RESUME_FROM", "")
    if resume:
        state = torch.load(resume)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        log(f"resumed from {resume} at step {start}")
    true_w = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    g = torch.Generator().manual_seed(1000 + rank + 7919 * start)
    for step in range(start + 1, a.steps + 1):
        x = torch.randn(64, 4, generator=g)
        y = x @ true_w.T
        loss = ((ddp(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        log(f"step {step} loss {loss.item():.4f}")
        if rank == 0 and step % a.every == 0:
            path = os.path.join(ckdir, f"step-{step}.pt")
            tmp = path + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, path)
            print(f"CAMP_CHECKPOINT step={step} path={path}", flush=True)
        time.sleep(a.step_seconds)
    dist.barrier()
    log("training done")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
