"""A plain PyTorch DDP training script, measured by scalelab with three `track` calls (marked `# track`).

    python train_ddp.py --steps 50                                  # alone: one process, track does nothing
    launch --script examples/own-script/train_ddp.py --engine ddp --gpus-per-node 2 -- --steps 50
    launch sweep --script examples/own-script/train_ddp.py --workers 1,2 --loss-threshold 2.0 -- --steps 80

Synthetic data: a small LSTM learns to predict the next token of sequences that count upwards modulo
the vocabulary, so the loss falls quickly to a threshold. The global batch (--global-batch) is split
over the ranks. Under `launch`, torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) is set and
`init_process_group()` reads it; alone, the script trains on one process without it.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn

from scalelab import track


class CountingLM(nn.Module):
    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.lstm(self.embed(x))[0])


def batch(step: int, rank: int, size: int, vocab: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of global batch `step`: sequences start + 0, 1, 2, ... (mod vocab)."""
    g = torch.Generator().manual_seed(step * 1000 + rank)
    start = torch.randint(0, vocab, (size, 1), generator=g)
    seq = (start + torch.arange(length + 1)) % vocab
    return seq[:, :-1], seq[:, 1:]


def agree(flag: bool, distributed: bool) -> bool:
    """True on every rank when any rank's flag is: all ranks leave the loop at the same step."""
    if not distributed:
        return flag
    t = torch.tensor(float(flag))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--vocab", type=int, default=32)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--length", type=int, default=16)
    p.add_argument("--val-every", type=int, default=10)
    a = p.parse_args()

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.manual_seed(0)
    model = CountingLM(a.vocab, a.hidden)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    per_rank = a.global_batch // world

    first = 0
    ckpt = os.path.join(track.checkpoint_dir, "model.pt") if track.checkpoint_dir else None
    if ckpt and os.path.exists(ckpt):  # `launch resume`: continue where the last save left off
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        first = state["step"]

    track.unit("tokens")  # track: what `items` counts, so the reports say tokens/s (optional: samples/s)
    for step in range(first, a.steps):
        x, y = batch(step, rank, per_rank, a.vocab, a.length)
        opt.zero_grad()
        loss = loss_fn(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        track.step(items=x.numel(), loss=loss.item())  # track: tokens this rank processed, its loss
        if (step + 1) % a.val_every == 0:
            with torch.no_grad():
                vx, vy = batch(10**6, 0, 64, a.vocab, a.length)
                val = torch.tensor(loss_fn(model(vx).flatten(0, 1), vy.flatten()).item())
            if distributed:
                dist.all_reduce(val)
                val /= world
            if rank == 0:
                print(f"step {step + 1} validation loss {val.item():.3f}", flush=True)
            if track.validation(loss=val.item()):  # track: True once --loss-threshold is reached
                break
        if agree(track.should_stop(), distributed):  # track: `launch cancel`, SIGTERM, pre-emption: save, leave
            if rank == 0 and ckpt:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, ckpt)
            break
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
