"""Train a small MLP classifier on synthetic data, as a job corral can pause, preempt and resume.

The data (a fixed-seed Gaussian mixture, 4 classes) and the model are built from ``--seed``, so two runs with
the same options end with the same weights, whether or not one of them was preempted and resumed in between
(``--save-weights`` writes them for comparison). Runs in a few seconds on a CPU; uses the GPU when there is one.

Each step goes through ``job.train_step``, so a GPU memory cap from the scheduler makes the job degrade (micro-
batches, then activations and optimizer state in host memory) instead of failing, and a compute share makes it
idle between steps. On a machine without a GPU, ``--simulated-gpu-mib N`` models an N MiB GPU's memory
(``corral.job.SimulatedDevice``), so that a cap has a visible effect on stand-in GPUs too.

    python examples/train_mlp.py --epochs 3                                   # standalone
    CORRAL_CHECKPOINT_DIR=/tmp/ckpt python examples/train_mlp.py --step-sleep 0.05
        # ... kill -TERM <pid> (exit 75, checkpoint saved) and run it again: it resumes
    corral submit --tenant alice --gpus 1 -- python examples/train_mlp.py --epochs 5

See examples/README.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import corral.job

FEATURES = 32
CLASSES = 4


def make_data(samples: int, seed: int) -> TensorDataset:
    """A Gaussian mixture: each class a cluster around its own centre, so the task is learnable."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(CLASSES, FEATURES, generator=g) * 0.3
    labels = torch.randint(0, CLASSES, (samples,), generator=g)
    features = centres[labels] + torch.randn(samples, FEATURES, generator=g)
    return TensorDataset(features, labels)


def make_model(hidden: int = 64) -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, hidden),
        nn.ReLU(),
        nn.Dropout(0.1),  # draws from the torch generator each step: resume must restore it exactly
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, CLASSES),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=50, help="dataset size = steps x batch size")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-sleep", type=float, default=0.0, metavar="S", help="sleep S seconds in each step")
    parser.add_argument("--save-weights", metavar="PATH", help="save the final state_dict to PATH")
    parser.add_argument(
        "--sigterm-at-step",
        type=int,
        metavar="K",
        help="send SIGTERM to this process during global step K, as an agent preempting it would (for demos and "
        "tests: a deterministic preemption point)",
    )
    parser.add_argument("--print-steps", action="store_true", help="print a line per step")
    parser.add_argument(
        "--simulated-gpu-mib",
        type=int,
        metavar="N",
        help="on a CPU, model an N MiB GPU's memory so that memory caps apply (corral.job.SimulatedDevice)",
    )
    parser.add_argument("--hidden", type=int, default=64, help="width of the hidden layers")
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES", "0") != ""
    device = torch.device("cuda" if use_cuda else "cpu")

    torch.manual_seed(args.seed)
    dataset = make_data(args.steps_per_epoch * args.batch_size, args.seed)
    model = make_model(args.hidden).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    loss_fn = nn.CrossEntropyLoss()

    # A new batch size from the scheduler is applied at the next epoch (a DataLoader's cannot change mid-epoch,
    # and the checkpoint's position counts batches): the hook notes it and says the size in use is unchanged.
    requested: list[int] = []

    def on_batch_size(n: int) -> int | None:
        print(f"scheduler asks for batch size {n}: from the next epoch", flush=True)
        requested.append(n)
        return job.batch_size

    simulated = None
    if args.simulated_gpu_mib is not None and not use_cuda:
        simulated = corral.job.SimulatedDevice(capacity_mib=args.simulated_gpu_mib)
    job = corral.job.Job(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        batch_size=args.batch_size,
        on_batch_size=on_batch_size,
        device=simulated,
    )
    with job:
        where = "standalone" if job.standalone else f"job {job.job_id} run {job.run}"
        resumed = f", resumed at step {job.start_step} (epoch {job.epoch})" if job.resumed else ""
        print(f"training on {device} ({where}){resumed}", flush=True)
        for epoch in job.epochs(args.epochs):
            if requested:
                job.batch_size = requested.pop()
                requested.clear()
            loader = DataLoader(dataset, batch_size=job.batch_size, shuffle=True)
            total, batches = 0.0, 0
            mode = job.mem_mode
            for x, y in job.loop(loader):
                if args.sigterm_at_step is not None and job.global_step == args.sigterm_at_step:
                    os.kill(os.getpid(), signal.SIGTERM)  # the checkpoint is taken at the end of this step
                x, y = x.to(device), y.to(device)
                # zero_grad, forward and backward (in micro-batches when a memory cap needs it), optimizer step
                loss = job.train_step((x, y), lambda b: loss_fn(model(b[0]), b[1]))
                total += loss.item()
                batches += 1
                if job.mem_mode != mode:
                    print(f"step {job.global_step}: memory cap {job.mem_cap_mib} MiB, now {job.mem_mode}", flush=True)
                    mode = job.mem_mode
                if args.print_steps:
                    print(f"step {job.global_step} loss {loss.item():.4f}", flush=True)
                if args.step_sleep:
                    time.sleep(args.step_sleep)
            scheduler.step()
            mean = total / batches if batches else float("nan")
            print(f"epoch {epoch} loss {mean:.4f} ({batches} steps, lr {scheduler.get_last_lr()[0]:.4g})", flush=True)

    if args.save_weights:
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, args.save_weights)
    print(f"done: {job.global_step} steps", flush=True)


if __name__ == "__main__":
    main()
