"""A tiny data-parallel training loop on CPU (gloo), for tracing its collectives.

    COLLSYNTH_TRACE_DIR=trace/ torchrun --nproc-per-node 2 -m collsynth.trace.run examples/train.py

Each rank trains the same small MLP on its own random batches; DistributedDataParallel
averages the gradients with one allreduce per bucket, and every few steps the ranks all-gather
their losses and broadcast a learning-rate change from rank 0. It runs in a few seconds on a
laptop; the trace it leaves is the input of ``collsynth trace summarize`` and ``collsynth plan``.
Plain ``torchrun --nproc-per-node 2 examples/train.py`` runs it without the tracer.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = 8
WIDTH = 256


def main() -> None:
    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.ReLU(),
                                torch.nn.Linear(4 * WIDTH, WIDTH))
    ddp = DistributedDataParallel(model, bucket_cap_mb=1)  # several buckets: several allreduces
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(1 + rank)  # each rank its own batches
    for step in range(STEPS):
        inputs = torch.randn(32, WIDTH, generator=data)
        loss = torch.nn.functional.mse_loss(ddp(inputs), inputs)
        optimizer.zero_grad()
        loss.backward()  # DDP's gradient allreduce
        optimizer.step()
        if step % 4 == 3:
            losses = [torch.zeros(1) for _ in range(world)]
            dist.all_gather(losses, loss.detach().reshape(1))
            lr = torch.tensor([optimizer.param_groups[0]["lr"] * 0.5])
            dist.broadcast(lr, src=0)
            for group in optimizer.param_groups:
                group["lr"] = float(lr)
            if rank == 0:
                mean = sum(float(x) for x in losses) / world
                print(f"step {step + 1}: mean loss {mean:.4f}, lr {float(lr):.4f}")
    # Every rank done before the group goes: a rank that tears down gloo while its peer still
    # talks to the store can abort at exit ("terminate called without an active exception").
    del ddp
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
