"""A user script in the style of seed 000's DDP test, for CPU/gloo: run it with
`fab train --hosts a,b --script docs/examples/seed000_main.py -- --epochs 2`.

Like the seed it calls `dist.init_process_group()` with everything from torchrun's
environment, reads LOCAL_RANK, seeds each rank differently, uses a DistributedSampler with
set_epoch, and trains the seed's ToyModel (here on random 32x32 images, so nothing downloads).
It knows nothing of meshrun. Rank 0 prints its arguments as JSON (meshrun's tests use that).
"""

import argparse
import json
import os
import random

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def init_seeds(seed=0):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("rest", nargs="*")
    args = parser.parse_args()

    dist.init_process_group()  # torchrun's environment says everything
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    init_seeds(1 + rank)
    if rank == 0:
        print("ARGS " + json.dumps({"argv": args.rest, "epochs": args.epochs}), flush=True)

    generator = torch.Generator().manual_seed(0)
    images = torch.randn(256, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (256,), generator=generator)
    dataset = torch.utils.data.TensorDataset(images, labels)
    sampler = torch.utils.data.distributed.DistributedSampler(dataset)
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, sampler=sampler)

    model = DDP(ToyModel())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        print(f"rank {rank} local_rank {local_rank} epoch {epoch} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
