"""Distributed engines: the training loop's only way to Horovod and torch.distributed (DDP is built by ddp.py).

Every engine offers the same small surface to the training loop, so the loop reads the same for one
process, DDP and Horovod, and the distributed lines are easy to spot:

- `wrap(model, optimizer)`  - make gradients exchange (DDP wrapper / Horovod DistributedOptimizer) and
  give every rank rank 0's parameters. Optimizer state is never broadcast: on resume every rank
  loads it from the checkpoint itself, after `wrap` (Horovod's wrapper is a new optimizer);
- `finish_exchange(optimizer)` - wait for the gradient all-reduce to complete, returning the seconds
  spent waiting where the engine can tell (Horovod), so the records can show the exchange share;
- `step(optimizer, apply)` - the optimizer update, `apply(optimizer)` (default: `optimizer.step()`; the
  gradient scaler's step under fp16), Horovod without a second synchronisation;
- `consolidate(optimizer)` / `restored()` - sharded optimizer state made whole before a checkpoint;
  the engine's own copies of the weights (ps `--ps-state cpu`) refreshed after one is loaded;
- `mean(x)` / `any(flag)` - all-reduce of a scalar (validation loss, "stop now" agreement);
- `gather(tensor)` / `allgather(x)` - every rank's tensor (RNG states for a checkpoint) or scalar (speeds);
- `shutdown()`.

No collective is written here by hand: DDP, Horovod (Gloo on CPU, NCCL on GPU) do the work. With
`--grad-compression fp16|bf16` the gradients travel in that format (a DDP comm hook, Horovod's
`Compression.fp16`) and are float32 again before anything reads them.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from scalelab.core.devices import GPU_PINNED_ENV, check_gpus, no_gpu
from scalelab.core.errors import EngineError
from scalelab.core.launch import horovod_env
from scalelab.core.spec import EngineSpec, server_rank
from scalelab.train import collector_paused


@dataclass
class Placement:
    """Where this process sits in the layout."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    node_rank: int = 0


class Engine:
    """One process, no exchange: the baseline every layout is compared with."""

    name = "single"
    exchanging = True  # False for independent replicas: plain model and optimizer on every rank

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.placement = Placement()

    @property
    def rank(self) -> int:
        return self.placement.rank

    @property
    def world(self) -> int:
        return self.placement.world

    def device(self, want: str) -> torch.device:
        """`cuda:<local_rank>` when a GPU is wanted and present, else the CPU.

        Every rank of a node checks that the node has a GPU for each of its ranks (the backends that
        cannot see the node before it starts rely on this): two ranks on one GPU is refused, never run.
        """
        if want == "cuda" and not torch.cuda.is_available():
            raise EngineError(no_gpu())
        if want in ("auto", "cuda") and torch.cuda.is_available():
            if os.environ.get(GPU_PINNED_ENV) == "1":  # its launcher gave it one GPU of its own (Slurm)
                torch.cuda.set_device(0)
                return torch.device("cuda", 0)
            check_gpus(self.placement.local_world, want, f"node {self.placement.node_rank}")
            torch.cuda.set_device(self.placement.local_rank)
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        return model, optimizer

    def graphable(self) -> bool:
        """Whether the backward can be captured as a CUDA graph (scalelab/train/graphs.py): not when the
        engine's exchange runs inside it (DDP's and Horovod's gradient hooks, the parameter server's push)."""
        return True

    def replicas(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        """Independent replicas: every rank trains its own copy, no gradient exchange (the seeds'
        `--independent_replica`, the ideal curve that isolates communication cost)."""
        self.exchanging = False
        return model, optimizer

    def finish_exchange(self, optimizer: torch.optim.Optimizer) -> float | None:
        return None

    def step(self, optimizer: torch.optim.Optimizer, apply: Callable[[Any], Any] | None = None) -> float | None:
        """The update: `apply(optimizer)` (fp16's scaler step), or the optimizer's own step when none is
        given; returns seconds of exchange done after it (the parameter server's pull), else None."""
        if apply is None:
            optimizer.step()
        else:
            apply(optimizer)
        return None

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    def grad_sq(self) -> float | None:
        """|G|² of the exchanged gradient where no rank holds all of it (ps), else None: read it locally."""
        return None

    def consolidate(self, optimizer: torch.optim.Optimizer) -> None:
        """Make rank 0's optimizer state complete before it writes a checkpoint (sharded state only)."""

    def restored(self) -> None:
        """After a checkpoint's weights were loaded into the model: copies the engine keeps re-read them."""

    def mean(self, value: float) -> float:
        return float(value)

    def any(self, flag: bool) -> bool:
        return bool(flag)

    def gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's `tensor` (same shape and dtype on every rank), in rank order, on the CPU."""
        return [tensor.cpu()]

    def allgather(self, value: float) -> list[float]:
        return [float(t) for t in self.gather(torch.tensor([float(value)], dtype=torch.float64))]

    def allreduce_(self, tensor: torch.Tensor) -> None:
        """Sum `tensor` over every rank in place (one rank: nothing to do); the links' timing uses it."""

    def shutdown(self) -> None:
        pass


#: The process groups of this rank, never freed: the rank ends with os._exit (scalelab/train/__main__.py).
#: A Gloo group's destructor joins its worker threads, and runs wherever its last reference goes, with
#: the GIL held: at the end of a run, DDP's reducer (freed by the return of `train`, or by a collection).
#: A worker still finishing the last collective frees that collective's tensors, which takes the GIL:
#: both wait forever. Two DDP ranks of one CI run hung so after their `end` record (2026-11-28, gdb).
_KEPT_UNTIL_EXIT: list[Any] = []


def keep_until_exit(obj: Any) -> Any:
    """`obj` (a process group, a DDP model whose reducer holds one), referenced until the rank's os._exit."""
    _KEPT_UNTIL_EXIT.append(obj)
    return obj


def start_process_group(backend: str, **options: Any) -> None:
    """torch.distributed's env:// rendezvous (torchrun's variables), its world group kept until exit."""
    import torch.distributed as dist

    dist.init_process_group(backend, **options)  # distributed
    keep_until_exit(dist.group.WORLD)


class DDPEngine(Engine):
    """torch.distributed: Gloo on CPU, NCCL on GPU; started by torchrun (env:// rendezvous)."""

    name = "ddp"

    def __init__(self, spec: EngineSpec) -> None:
        import torch.distributed as dist

        super().__init__(spec)
        if "RANK" not in os.environ:
            raise EngineError("the ddp engine must be started by torchrun (RANK is not set); use `launch --engine ddp`")
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        start_process_group(backend, timeout=datetime.timedelta(minutes=10))
        self.placement = Placement(
            rank=dist.get_rank(),
            world=dist.get_world_size(),
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
            local_world=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
            node_rank=int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", 0))),
        )
        self._dist = dist

    def graphable(self) -> bool:
        return not self.exchanging  # independent replicas have no hooks in the backward

    def wrap(self, model, optimizer):
        from scalelab.train import ddp

        device_ids = [model_device(model).index] if model_device(model).type == "cuda" else None
        # DDP broadcasts rank 0's parameters at construction; all-reduce overlaps backward by bucket. Built
        # without importing the compiler (scalelab/train/ddp.py); should the stand-in have to import it (a
        # PyTorch that asks the compiler more), the collector is paused while its many long-lived objects load.
        with collector_paused():
            model = ddp.build(model, device_ids=device_ids, bucket_cap_mb=self.spec.bucket_cap_mb)
        hook = ddp_compression_hook(self.spec.grad_compression)
        if hook is not None:
            model.register_comm_hook(None, hook)  # each bucket: cast, divide, all-reduce, back to fp32
        return model, optimizer

    def _tensor(self, value: float) -> torch.Tensor:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        return torch.tensor([float(value)], dtype=torch.float64, device=device)

    def mean(self, value: float) -> float:
        t = self._tensor(value)
        self._dist.all_reduce(t)  # distributed: sum
        return float(t.item()) / self.world

    def any(self, flag: bool) -> bool:
        t = self._tensor(1.0 if flag else 0.0)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX)  # distributed
        return bool(t.item() > 0)

    def allreduce_(self, tensor: torch.Tensor) -> None:
        self._dist.all_reduce(tensor)  # distributed: sum

    def gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        t = tensor.to(self._tensor(0.0).device)  # NCCL gathers GPU tensors only
        out = [torch.empty_like(t) for _ in range(self.world)]
        self._dist.all_gather(out, t)  # distributed
        return [o.cpu() for o in out]

    def shutdown(self) -> None:
        if self._dist.is_initialized():
            self._dist.barrier()  # distributed: no rank tears down Gloo while a peer still talks to it
            self._dist.destroy_process_group()


class PSEngine(DDPEngine):
    """Parameter server on torch.distributed collectives, shards colocated with the workers or in
    server ranks of their own (`--ps-placement separate`).

    Parameters are dealt to shards by size, largest first, round-robin (as TensorFlow placed variables
    over its PS tasks); shard s lives in worker `s * world // shards`, so the default (one shard per
    node) puts one on every node. Push: each gradient is reduced to its owner (sum / world: the same
    average DDP makes). The owner alone applies the optimizer step to its parameters (the others' grads
    are dropped, so their optimizer state stays empty), then pull: each parameter is broadcast from its
    owner. Optimizer state is sharded; `consolidate` copies it to every rank before a checkpoint.
    Separate placement: the last `servers_per_node` local ranks of every node own all the shards and
    train on no data (the loop gives them an empty slice); their gradients, and any a worker lacks, are
    zeros, so every rank takes part in every reduce, and the sum over the workers is what colocated sums.
    The spec refuses fp16 (its scaler would check only the gradients this rank owns) and 16-bit
    exchange, so the gradients read here (|G|², clipping) are the true fp32 ones.
    """

    name = "ps"

    def __init__(self, spec: EngineSpec) -> None:
        super().__init__(spec)
        self.owner: dict[torch.nn.Parameter, int] = {}  # parameter -> the rank holding its shard
        self.shadow: dict[torch.nn.Parameter, torch.Tensor] = {}  # --ps-state cpu: owned parameter -> its CPU copy

    @property
    def separate(self) -> bool:
        return self.spec.ps_placement == "separate"

    def _shard_rank(self, shard: int, shards: int) -> int:
        """The rank that holds `shard`: a worker spread over the world (colocated), or its server rank."""
        if not self.separate:
            return shard * self.world // shards
        per_node = self.placement.local_world
        return server_rank(shard, per_node, self.spec.servers_per_node(self.world // per_node))

    def wrap(self, model, optimizer):
        params = list(model.parameters())
        shards = self.spec.ps_shards or max(1, self.world // self.placement.local_world)
        by_size = sorted(range(len(params)), key=lambda i: (-params[i].numel(), i))
        self.owner = {params[i]: self._shard_rank(n % shards, shards) for n, i in enumerate(by_size)}
        for p in params:
            self._dist.broadcast(p.data, src=0)  # distributed: rank 0's parameters everywhere
        if self.spec.ps_state == "cpu":
            self.shadow = self._cpu_shards(optimizer)
        return model, optimizer

    def _cpu_shards(self, optimizer) -> dict[torch.nn.Parameter, torch.Tensor]:
        """`--ps-state cpu`: a CPU copy of each parameter this rank's shards own takes its place in the
        optimizer (same position: checkpoints read alike), so the update and its state live on the CPU,
        as on TensorFlow's PS tasks. The push lands there, the pull starts from there."""
        shadow = {p: p.detach().to("cpu", copy=True) for p, owner in self.owner.items() if owner == self.rank}
        for group in optimizer.param_groups:
            group["params"] = [shadow.get(p, p) for p in group["params"]]
        return shadow

    def restored(self) -> None:
        """The CPU shards take the weights a checkpoint just loaded into the model."""
        for p, cpu in self.shadow.items():
            cpu.copy_(p.detach())

    def _held(self) -> list[torch.Tensor]:
        """The averaged gradients this rank's shards hold after the push (on the CPU with --ps-state cpu)."""
        return [g for p in self.owner if (g := self.shadow.get(p, p).grad) is not None]

    def finish_exchange(self, optimizer) -> float | None:
        """Push: every gradient to its owner, averaged; returns the seconds (push half of exchange_s)."""
        if not self.exchanging:
            return None
        t0 = time.perf_counter()
        for p, owner in self.owner.items():
            held = self.shadow.get(p, p)  # what the optimizer updates: p, or its CPU copy
            if p.grad is None and self.separate:  # a server computes none: it adds zeros to the sum
                p.grad = torch.zeros_like(p)
            if p.grad is None:
                held.grad = None
                continue
            if self.world > 1:  # one rank owns every shard: there is nobody to exchange with
                self._dist.reduce(p.grad, dst=owner)  # distributed: sum on the owner only
            grad = p.grad.div_(self.world).to(held.device) if owner == self.rank else None
            p.grad, held.grad = None, grad
        self._grad_sq = self._sum_of_squares()
        return time.perf_counter() - t0 if self.world > 1 else 0.0

    def _sum_of_squares(self) -> float:
        """|G|² of the whole averaged gradient (clipping, noise scale): this rank's shards, summed over ranks."""
        held = self._held()
        local = torch.stack([g.double().square().sum().cpu() for g in held]).sum() if held else torch.zeros((), dtype=torch.float64)
        sq = self._tensor(float(local))
        if self.world > 1:
            self._dist.all_reduce(sq)  # distributed
        return float(sq.item())

    def grad_sq(self) -> float | None:
        return self._grad_sq if self.exchanging else None

    def clip_grad_norm(self, model, max_norm: float) -> None:
        """torch's clip over the whole gradient, whose shards live on their owners: sum the squares."""
        if not self.exchanging:
            return super().clip_grad_norm(model, max_norm)
        coef = min(1.0, max_norm / (self._grad_sq**0.5 + 1e-6))  # |G|² summed over the shards at the push
        for g in self._held():
            g.mul_(coef)

    def step(self, optimizer, apply: Callable[[Any], Any] | None = None) -> float | None:
        """The owners' update, then pull; returns the pull's seconds (the other half of exchange_s)."""
        super().step(optimizer, apply)  # only owned parameters hold a gradient
        return self.pull() if self.exchanging else None

    def pull(self) -> float:
        """Every parameter from its owner (from its CPU copy with --ps-state cpu); returns the seconds."""
        t0 = time.perf_counter()
        for p, cpu in self.shadow.items():
            p.data.copy_(cpu)  # the shard's new value onto the device it is broadcast from
        if self.world == 1:
            return 0.0  # nothing to pull from anyone else
        for p, owner in self.owner.items():
            self._dist.broadcast(p.data, src=owner)  # distributed: the new value from its owner
        return time.perf_counter() - t0

    def consolidate(self, optimizer) -> None:
        """Every rank gets every shard's optimizer state, so rank 0's checkpoint holds all of it."""
        if self.world == 1:
            return  # this rank holds every shard's state already
        for p, owner in self.owner.items():
            box = [optimizer.state.get(self.shadow.get(p, p))]
            self._dist.broadcast_object_list(box, src=owner)  # distributed
            if owner != self.rank and box[0] is not None:
                optimizer.state[p] = {k: v.to(p.device) if torch.is_tensor(v) and v.dim() else v for k, v in box[0].items()}


class HorovodEngine(Engine):
    """Horovod: hvd.init, DistributedOptimizer (tensor fusion, optional fp16 compression), broadcasts."""

    name = "horovod"

    def __init__(self, spec: EngineSpec) -> None:
        super().__init__(spec)
        hvd = import_horovod()
        # Tensor fusion settings must be in the environment before hvd.init() starts the background thread;
        # the launcher put them there (core.launch.engine_env), this covers a rank started by hand.
        for name, value in horovod_env(spec.fusion_threshold_mb, spec.cycle_time_ms).items():
            os.environ.setdefault(name, value)
        hvd.init()  # distributed
        self.placement = Placement(
            rank=hvd.rank(),
            world=hvd.size(),
            local_rank=hvd.local_rank(),
            local_world=hvd.local_size(),
            node_rank=hvd.cross_rank(),
        )
        self.hvd = hvd

    def graphable(self) -> bool:
        return not self.exchanging  # independent replicas have no hooks in the backward

    def wrap(self, model, optimizer):
        hvd = self.hvd
        compression = horovod_compression(hvd, self.spec.grad_compression)
        optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), compression=compression, op=hvd.Average
        )
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # distributed
        # No broadcast_optimizer_state: every rank built the same fresh optimizer, and on resume every
        # rank loads the checkpoint's state into *this* optimizer (DistributedOptimizer is a new one
        # built from the param groups: state loaded before wrapping is dropped). Horovod would also
        # initialise an empty state with a dummy step, leaving Adam at step 1 with zero moments.
        return model, optimizer

    def finish_exchange(self, optimizer) -> float | None:
        if not self.exchanging:
            return None
        t0 = time.perf_counter()
        optimizer.synchronize()  # distributed: wait for the all-reduces started during backward
        return time.perf_counter() - t0

    def step(self, optimizer, apply: Callable[[Any], Any] | None = None) -> float | None:
        if not self.exchanging:
            return super().step(optimizer, apply)
        with optimizer.skip_synchronize():
            return super().step(optimizer, apply)

    def mean(self, value: float) -> float:
        t = torch.tensor([float(value)], dtype=torch.float64)
        return float(self.hvd.allreduce(t, op=self.hvd.Average, name="scalelab.mean").item())  # distributed

    def any(self, flag: bool) -> bool:
        t = torch.tensor([1.0 if flag else 0.0], dtype=torch.float64)
        return bool(self.hvd.allreduce(t, op=self.hvd.Sum, name="scalelab.any").item() > 0)  # distributed

    def allreduce_(self, tensor: torch.Tensor) -> None:
        self.hvd.allreduce_(tensor, op=self.hvd.Sum, name="scalelab.link")  # distributed

    def gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        rows = self.hvd.allgather(tensor.cpu().unsqueeze(0), name="scalelab.gather")  # distributed
        return [row.clone() for row in rows]  # one storage each, not views into the gathered rows

    def shutdown(self) -> None:
        self.hvd.shutdown()


COMPRESSED_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def ddp_compression_hook(compression: str) -> Callable | None:
    """A DDP comm hook for `--grad-compression` (None: DDP's own all-reduce in fp32).

    Each gradient bucket is cast to fp16 / bf16, divided by the world size, all-reduced and copied back
    into the fp32 bucket: what torch's `fp16_compress_hook` and `bf16_compress_hook` do, written here
    because torch's bf16 hook refuses every backend but NCCL, and Gloo reduces bf16 as well.
    """
    if compression == "none":
        return None
    import torch.distributed as dist

    dtype = COMPRESSED_DTYPES[compression]

    def hook(process_group, bucket):
        buffer = bucket.buffer()
        low = buffer.to(dtype).div_(dist.get_world_size(process_group))
        future = dist.all_reduce(low, group=process_group, async_op=True).get_future()  # distributed
        return future.then(lambda done: buffer.copy_(done.value()[0]))

    return hook


def horovod_compression(hvd: Any, compression: str) -> Any:
    """Horovod's compressor for `--grad-compression`; bf16 is refused by the spec (Horovod 0.28 has none)."""
    if compression == "bf16":
        raise EngineError("Horovod 0.28 cannot all-reduce bf16 tensors; use --grad-compression fp16 or --engine ddp")
    return hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none


def import_horovod():
    """Import horovod.torch or say exactly how to get a working build."""
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        raise EngineError(
            f"Horovod with PyTorch support is not installed ({exc}); run scripts/build-horovod.sh "
            "(builds horovod 0.28.1 with PyTorch + Gloo), or use --engine ddp"
        ) from None
    if not hvd.gloo_built() and not hvd.mpi_built():
        raise EngineError("Horovod was built without Gloo or MPI; rebuild it with scripts/build-horovod.sh")
    return hvd


def horovod_status() -> str | None:
    """None when Horovod can run PyTorch jobs here, else the reason (checked before launching)."""
    try:
        import_horovod()
    except EngineError as exc:
        return str(exc)
    return None


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


#: Each engine's class, by the names of core.engines.ENGINES (which also says how its ranks start).
ENGINE_CLASSES: dict[str, type[Engine]] = {"single": Engine, "ddp": DDPEngine, "horovod": HorovodEngine, "ps": PSEngine}


def make_engine(spec: EngineSpec) -> Engine:
    """This rank's engine, initialised (joins the rendezvous its launcher set up)."""
    return ENGINE_CLASSES[spec.name](spec)
