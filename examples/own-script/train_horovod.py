"""A plain Horovod training script, measured by scalelab with three `track` calls (marked `# track`).

    horovodrun -np 2 python train_horovod.py                        # Horovod's own way: track does nothing
    launch --script examples/own-script/train_horovod.py --engine horovod --gpus-per-node 2 -- --steps 50

The same synthetic task as train_ddp.py (next token of counting sequences). Under `launch --engine
horovod` the script runs under horovodrun; `hvd.init()` finds its ranks as it always does.
"""

import argparse
import os

import horovod.torch as hvd
import torch
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
    g = torch.Generator().manual_seed(step * 1000 + rank)
    start = torch.randint(0, vocab, (size, 1), generator=g)
    seq = (start + torch.arange(length + 1)) % vocab
    return seq[:, :-1], seq[:, 1:]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--vocab", type=int, default=32)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--length", type=int, default=16)
    p.add_argument("--val-every", type=int, default=10)
    a = p.parse_args()

    hvd.init()
    torch.manual_seed(0)
    model = CountingLM(a.vocab, a.hidden)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = 0
    ckpt = os.path.join(track.checkpoint_dir, "model.pt") if track.checkpoint_dir else None
    if ckpt and os.path.exists(ckpt):  # `launch resume`: every rank reads the same file
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        first = state["step"]
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    loss_fn = nn.CrossEntropyLoss()
    per_rank = a.global_batch // hvd.size()

    track.unit("tokens")  # track: what `items` counts, so the reports say tokens/s (optional: samples/s)
    for step in range(first, a.steps):
        x, y = batch(step, hvd.rank(), per_rank, a.vocab, a.length)
        opt.zero_grad()
        loss = loss_fn(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        track.step(items=x.numel(), loss=loss.item())  # track: tokens this rank processed, its loss
        if (step + 1) % a.val_every == 0:
            with torch.no_grad():
                vx, vy = batch(10**6, 0, 64, a.vocab, a.length)
                val = hvd.allreduce(loss_fn(model(vx).flatten(0, 1), vy.flatten()), name="val").item()
            if hvd.rank() == 0:
                print(f"step {step + 1} validation loss {val:.3f}", flush=True)
            if track.validation(loss=val):  # track: True once --loss-threshold is reached
                break
        stop = hvd.allreduce(torch.tensor(float(track.should_stop())), op=hvd.Max, name="stop").item()
        if stop:  # track.should_stop() above: `launch cancel`, SIGTERM, pre-emption on any rank: save, leave
            if hvd.rank() == 0 and ckpt:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, ckpt)
            break


if __name__ == "__main__":
    main()
