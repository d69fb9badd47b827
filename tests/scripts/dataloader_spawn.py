"""Test workload for tests/test_runscript.py: classes of the `__main__` script pickled by reference.

A Dataset class read by 2 DataLoader workers started with spawn (they re-run this file as
`__mp_main__` and unpickle `__main__.Squares`), and an atexit handler that pickles a `__main__`
class after the script has returned. Prints the sum of squares, the worker ids, the pickled class.
"""

import atexit
import pickle

import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return torch.tensor([index * index, torch.utils.data.get_worker_info().id])


class Point:
    def __init__(self, x):
        self.x = x


def at_exit():
    point = pickle.loads(pickle.dumps(Point(7)))
    print("atexit pickled", type(point).__module__, type(point).__name__, point.x)


if __name__ == "__main__":
    atexit.register(at_exit)
    loader = DataLoader(Squares(), batch_size=2, num_workers=2, multiprocessing_context="spawn")
    batches = torch.cat(list(loader))
    print("sum", int(batches[:, 0].sum()), "workers", sorted(set(batches[:, 1].tolist())))
