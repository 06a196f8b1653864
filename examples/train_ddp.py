"""Train the MLP of ``train_mlp.py`` with DistributedDataParallel, as a gang job across nodes.

corral runs a job that needs more GPUs than one node has as a gang: one process per node, each with the gang's
variables (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``NNODES``, ``NODE_RANK``, ``LOCAL_WORLD_SIZE``; see
``corral.core.contract``). This script runs either way corral allows:

- one process per node, as the agent starts it: ``python examples/train_ddp.py``; the script joins the process
  group as rank ``NODE_RANK`` of ``NNODES`` (``job.gang.rank`` and ``job.gang.size``);
- one process per GPU under torchrun: ``torchrun --nnodes $NNODES --node_rank $NODE_RANK --nproc_per_node
  $LOCAL_WORLD_SIZE --master_addr $MASTER_ADDR --master_port $MASTER_PORT examples/train_ddp.py``; torchrun's
  ``RANK`` and ``WORLD_SIZE`` then apply (``env://``).

Without either it trains alone (no process group). Every rank goes through ``corral.job``: a directive (pause,
checkpoint-and-exit, limits) reaches the ranks at different times, and they apply it at the same step; rank 0
writes the checkpoint and every rank resumes from it, so that a preempted and resumed run ends with the very
weights of an uninterrupted one (``--save-weights``, written by rank 0). CPU (gloo) or GPUs (NCCL).

See examples/README.md and docs/live.md ("Gang jobs across nodes").
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from train_mlp import make_data, make_model

import corral.job


def join_process_group(gang: corral.job.GangEnvironment | None, backend: str, timeout_s: float) -> bool:
    """Join the gang's process group; False when there is none (a run by hand: one process alone)."""
    timeout = timedelta(seconds=timeout_s)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun's worker (or a launcher that sets them)
        dist.init_process_group(backend, timeout=timeout)
        return True
    if gang is None:
        return False
    dist.init_process_group(
        backend,
        init_method=f"tcp://{gang.master_addr}:{gang.master_port}",
        rank=gang.rank,
        world_size=gang.size,
        timeout=timeout,
    )
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=50, help="steps of each rank in an epoch")
    parser.add_argument("--batch-size", type=int, default=16, help="batch size of each rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-sleep", type=float, default=0.0, metavar="S", help="sleep S seconds in each step")
    parser.add_argument("--save-weights", metavar="PATH", help="rank 0 saves the final state_dict to PATH")
    parser.add_argument("--dist-timeout-s", type=float, default=1800.0, help="torch.distributed's timeout")
    args = parser.parse_args()

    gang = corral.job.GangEnvironment.from_env(os.environ)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES", "0") != ""
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    distributed = join_process_group(gang, "nccl" if use_cuda else "gloo", args.dist_timeout_s)
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    torch.manual_seed(args.seed + 1 + rank)  # each rank's own randomness (dropout): saved per rank
    dataset = make_data(world * args.steps_per_epoch * args.batch_size, args.seed)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loss_fn = nn.CrossEntropyLoss()

    # The Job restores the checkpoint (rank 0's, the same on every rank) into the model before DDP wraps it.
    job = corral.job.Job(model=model, optimizer=optimizer, batch_size=args.batch_size)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if use_cuda else None) if distributed else model
    with job:
        where = "standalone" if job.standalone else f"job {job.job_id} run {job.run}"
        resumed = f", resumed at step {job.start_step} (epoch {job.epoch})" if job.resumed else ""
        print(f"rank {rank} of {world} training on {device} ({where}){resumed}", flush=True)
        for epoch in job.epochs(args.epochs):
            sampler.set_epoch(epoch)
            loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
            for x, y in job.loop(loader):
                optimizer.zero_grad(set_to_none=True)
                loss_fn(ddp(x.to(device)), y.to(device)).backward()  # gradients all-reduced across the ranks
                optimizer.step()
                if args.step_sleep:
                    time.sleep(args.step_sleep)

    if args.save_weights and rank == 0:
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, args.save_weights)
    if distributed:
        dist.destroy_process_group()
    print(f"rank {rank} done: {job.global_step} steps", flush=True)


if __name__ == "__main__":
    main()
