"""A data-parallel training step with the cxlrt backend:

    torchrun --nproc-per-node 2 examples/torch_ddp.py

Each rank trains a small model on its own shard of the data with
DistributedDataParallel; DDP all-reduces the gradients through the pool
(the "cxlrt" backend), so every rank ends with the same weights."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import cxlrt.torch_backend  # noqa: F401  (registers "cxlrt")

dist.init_process_group("cxlrt")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)  # the same initial weights on every rank
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
gen = torch.Generator().manual_seed(1234 + rank)  # this rank's shard
x = torch.randn(512, 64, generator=gen)
y = x[:, :8].sum(1, keepdim=True)
losses = []
for step in range(20):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()  # gradients averaged across ranks through the pool
    opt.step()
    losses.append(loss.item())

# Every rank holds the same weights.
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
everyone = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(everyone, flat)
assert all(torch.equal(everyone[0], w) for w in everyone), "ranks diverged"
assert losses[-1] < losses[0] * 0.8, losses
if rank == 0:
    print(f"rank 0/{world}: loss {losses[0]:.3f} -> {losses[-1]:.3f}; "
          f"{flat.numel()} weights identical on every rank")
dist.destroy_process_group()
