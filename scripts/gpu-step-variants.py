"""Issue 36, ask 3: where an nmt-seed bf16 step goes on a GPU, and what a few changes buy, side by side.

Times whole training steps (forward, backward, fused Adam; autocast bf16 and the compiled output layer, as
the trainer runs them) of one model in one process, the variants interleaved round by round so that a
drifting clock hits them alike:
- per-weight: the recurrent weights cast one by one and handed to `nn.LSTM.forward` through
  `functional_call` (the trainer before this change: cuDNN re-flattened them every call)
- one-buffer: the trainer now (`scalelab.train.models.cast_flat`: one cast of cuDNN's buffer, `_VF.lstm`)
- each with the trainer's phase clocks (a synchronize between data, forward, backward and optimizer) and
  with one synchronize per step (the loss read)
- the trainer's `--cuda-graph auto` (scalelab/train/graphs.py): forward and backward replayed as one graph
- one-buffer, the whole step captured once as a CUDA graph and replayed, after a ladder of smaller
  captures (the decoder LSTM's forward, its backward, the model's forward and backward) that finds what
  breaks capture
Then a torch.profiler table of one-buffer's kernels, with how busy the GPU was over the steps' wall time. Writes gpu-step.json and gpu-step.md into --out.

    python3 scripts/gpu-step-variants.py --out DIR [--batch 360] [--steps 10] [--rounds 2]
On a CPU it runs the same variants on a tiny preset (`--model nmt-tiny --device cpu`) to check the script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scalelab.core.presets import PRESETS  # noqa: E402
from scalelab.train import models as M  # noqa: E402
from scalelab.train.outloss import resolve as resolve_output_loss  # noqa: E402

ONE_BUFFER = M.FusedLSTM.forward


def per_weight_forward(self, input, hx=None, lengths=None):  # noqa: ANN001, ANN201 - the forward before this change
    low = M.autocast_dtype(input.device.type)
    if low is None:
        return torch.nn.LSTM.forward(self, input, hx)
    with torch.autocast(input.device.type, enabled=False):
        weights = {name: p.to(low) for name, p in self.named_parameters()}
        state = None if hx is None else (hx[0].to(low), hx[1].to(low))
        return torch.func.functional_call(self, weights, (input.to(low), state))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def inputs_for(cfg, batch: int, device: torch.device) -> dict:  # noqa: ANN001
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, cfg.vocab_size, (batch, cfg.src_len), generator=g)
    tgt = torch.randint(4, cfg.vocab_size, (batch, cfg.tgt_len + 1), generator=g)
    return {"src": src.to(device), "src_lengths": torch.full((batch,), cfg.src_len).to(device),
            "tgt_in": tgt[:, :-1].contiguous().to(device), "tgt_out": tgt[:, 1:].contiguous().to(device)}


class Eager:
    """One step as the trainer takes it, with or without its phase clocks."""

    def __init__(self, model, inputs, device, dtype, phase_syncs: bool) -> None:  # noqa: ANN001
        self.model, self.inputs, self.device, self.dtype, self.phase_syncs = model, inputs, device, dtype, phase_syncs
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-4, **({"fused": True} if device.type == "cuda" else {}))

    def __call__(self) -> float:
        clock = (lambda: sync(self.device)) if self.phase_syncs else (lambda: None)
        clock()
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=self.dtype):
            loss = self.model(**self.inputs)
        clock()
        loss.backward()
        clock()
        self.opt.step()
        clock()
        return float(loss.detach())


class TrainerGraph:
    """The trainer's `--cuda-graph auto` (scalelab/train/graphs.py): forward and backward replayed as one
    graph after two eager steps, fused Adam eager after it; on a model of its own (a graph owns the
    gradients it writes)."""

    def __init__(self, cfg, output_loss, inputs, device, dtype) -> None:  # noqa: ANN001
        from scalelab.train.graphs import StepGraph

        torch.manual_seed(0)
        self.model = M.build_model(cfg, "fused", output_loss).to(device)
        self.inputs, self.dtype, self.device = inputs, dtype, device
        self.graph = StepGraph(self.model, lambda: torch.autocast("cuda", dtype=dtype, cache_enabled=False))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4, fused=True)
        self.step_no = 0

    def __call__(self) -> float:
        self.step_no += 1
        loss = self.graph.forward_backward(self.inputs, self.step_no)
        if loss is None:
            self.model.zero_grad(set_to_none=not self.graph.owns_grads)
            with torch.autocast("cuda", dtype=self.dtype):
                loss = self.model(**self.inputs)
            loss.backward()
        self.opt.step()
        return float(loss.detach())


class Graphed:
    """The whole step (forward, backward, capturable fused Adam) captured once, replayed per step."""

    def __init__(self, model, inputs, device, dtype) -> None:  # noqa: ANN001
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True, capturable=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=dtype, cache_enabled=False):
                    loss = model(**inputs)
                loss.backward()
                self.opt.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        self.opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            with torch.autocast("cuda", dtype=dtype, cache_enabled=False):
                self.loss = model(**inputs)
            self.loss.backward()
            self.opt.step()

    def __call__(self) -> float:
        self.graph.replay()
        return float(self.loss.detach())


def profile_table(step, device: torch.device, top: int = 14) -> list[dict]:  # noqa: ANN001
    """[how busy the GPU was] + the top kernels. Busy is the union of the kernels' intervals over the
    steps' wall time: near 100 % the step is bound by the GPU's work, well under it by launching."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    step()
    sync(device)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(2):
            step()
        sync(device)
        wall = time.perf_counter() - t0
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == DeviceType.CUDA)
    busy, reach = 0.0, float("-inf")
    for a, b in spans:
        if b > reach:
            busy += b - max(a, reach)
            reach = b
    events = prof.key_averages()
    attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    kernels = [e for e in events if e.device_type == DeviceType.CUDA] or list(events)
    total = sum(getattr(e, attr, 0) for e in kernels) or 1
    rows = sorted(kernels, key=lambda e: getattr(e, attr, 0), reverse=True)[:top]
    return [{"busy_ms_per_step": busy / 2e3, "wall_ms_per_step": wall / 2 * 1e3}] + [
        {"kernel": e.key[:90], "calls_per_step": e.count // 2, "ms_per_step": getattr(e, attr, 0) / 2e3,
         "share": getattr(e, attr, 0) / total} for e in rows]


def _timed(fn, n: int = 10) -> float:  # noqa: ANN001
    """Median ms of `fn` over n calls, synchronized around each."""
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def capture_ladder(model, inputs, dtype) -> dict:  # noqa: ANN001
    """Capture ever larger parts of the step as CUDA graphs, to find what breaks capture of the whole:
    the decoder LSTM's forward, its forward and backward, the model's forward and backward. Stops at the
    first failure (a failed capture can leave the context unusable). Each success: replay ms against
    the same work run eagerly."""
    x = model.tgt_embed(inputs["tgt_in"]).detach().requires_grad_(True)

    def dec_fwd():  # noqa: ANN202
        with torch.autocast("cuda", dtype=dtype, cache_enabled=False):
            return model.decoder(x)[0]

    def dec_fwd_bwd():  # noqa: ANN202
        out = dec_fwd()
        out.float().sum().backward()
        return out

    def model_fwd_bwd():  # noqa: ANN202
        with torch.autocast("cuda", dtype=dtype, cache_enabled=False):
            loss = model(**inputs)
        loss.backward()
        return loss

    rungs = {"decoder LSTM forward": (dec_fwd, True), "decoder LSTM forward+backward": (dec_fwd_bwd, False),
             "model forward+backward": (model_fwd_bwd, False)}
    found: dict[str, str] = {}
    for name, (fn, no_grad) in rungs.items():
        try:
            ctx = torch.no_grad if no_grad else torch.enable_grad
            with ctx():
                eager = _timed(fn)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        fn()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                model.zero_grad(set_to_none=True)
                x.grad = None
                with torch.cuda.graph(graph):
                    fn()
            replay = _timed(graph.replay)
            found[name] = f"captured: replay {replay:.2f} ms, eager {eager:.2f} ms"
        except Exception as exc:  # noqa: BLE001 - the first failure is the finding
            found[name] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            break
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="nmt-seed")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=360)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per variant and round")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip", default="", help="semicolon-separated variant names to leave out (graph, profile too)")
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = PRESETS[args.model]
    output_loss, note = resolve_output_loss("auto", device)
    torch.manual_seed(0)
    model = M.build_model(cfg, "fused", output_loss).to(device)
    inputs = inputs_for(cfg, args.batch, device)
    words = args.batch * cfg.tgt_len
    result: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "torch": torch.__version__, "model": args.model, "batch": args.batch, "output_loss": output_loss,
                    "output_loss_note": note, "variants": {}, "errors": {}, "warnings": {}}
    variants = {  # name: (the LSTM forward, phase clocks)
        "per-weight, phase clocks": (per_weight_forward, True),
        "one-buffer, phase clocks": (ONE_BUFFER, True),
        "per-weight, one sync": (per_weight_forward, False),
        "one-buffer, one sync": (ONE_BUFFER, False),
    }
    skip = set(filter(None, args.skip.split(";")))
    steppers: dict = {}
    for name, (forward, phases) in variants.items():
        if name not in skip:
            steppers[name] = (forward, Eager(model, inputs, device, dtype, phases))
    if device.type == "cuda" and "trainer graph" not in skip:
        steppers["trainer graph"] = (ONE_BUFFER, TrainerGraph(cfg, output_loss, inputs, device, dtype))
    times: dict[str, list[float]] = {name: [] for name in steppers}
    peaks: dict[str, float] = {}
    losses: dict[str, float] = {}
    for rnd in range(args.rounds):
        for name, (forward, step) in steppers.items():
            if name in result["errors"]:
                continue
            M.FusedLSTM.forward = forward
            if isinstance(step, TrainerGraph) and step.graph.note:
                result["errors"][name] = step.graph.note
            try:
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    for _ in range(args.warmup):
                        step()
                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats(device)
                    for _ in range(args.steps):
                        sync(device)
                        t0 = time.perf_counter()
                        losses[name] = step()
                        sync(device)
                        times[name].append(time.perf_counter() - t0)
                    if device.type == "cuda":
                        peaks[name] = max(peaks.get(name, 0.0), torch.cuda.max_memory_allocated(device) / 2**30)
                result["warnings"][name] = sorted({str(w.message)[:200] for w in seen})
            except Exception as exc:  # noqa: BLE001 - a variant that fails is a finding, not the end
                result["errors"][name] = f"{type(exc).__name__}: {exc}"[:500]
            print(f"[round {rnd + 1}] {name}: {statistics.median(times[name]) * 1e3:.1f} ms" if times[name]
                  else f"[round {rnd + 1}] {name}: {result['errors'].get(name)}", flush=True)
    M.FusedLSTM.forward = ONE_BUFFER
    if "profile" not in skip:
        try:  # (profile_table takes one eager step first)
            result["profile"] = profile_table(Eager(model, inputs, device, dtype, False), device)
        except Exception as exc:  # noqa: BLE001
            result["errors"]["profile"] = f"{type(exc).__name__}: {exc}"[:500]
    if device.type == "cuda" and "capture" not in skip:
        result["capture"] = capture_ladder(model, inputs, dtype)
        print("capture ladder:", json.dumps(result["capture"]), flush=True)
    if device.type == "cuda" and "graph" not in skip:
        name = "one-buffer, CUDA graph"
        try:
            graphed = Graphed(model, inputs, device, dtype)
            times[name] = []
            for _ in range(args.warmup):
                graphed()
            for _ in range(args.steps * args.rounds):
                sync(device)
                t0 = time.perf_counter()
                losses[name] = graphed()
                sync(device)
                times[name].append(time.perf_counter() - t0)
            print(f"{name}: {statistics.median(times[name]) * 1e3:.1f} ms", flush=True)
        except Exception as exc:  # noqa: BLE001
            result["errors"][name] = f"{type(exc).__name__}: {exc}"[:500]
            traceback.print_exc()
            print(f"{name}: failed: {result['errors'][name]}", flush=True)
    for name, ts in times.items():
        if ts:
            med = statistics.median(ts)
            result["variants"][name] = {"median_ms": med * 1e3, "min_ms": min(ts) * 1e3, "steps": len(ts),
                                        "words_per_s": words / med, "peak_gib": peaks.get(name),
                                        "last_loss": losses.get(name)}
    (args.out / "gpu-step.json").write_text(json.dumps(result, indent=1))
    lines = [f"# nmt step variants on {result['device']} (torch {result['torch']}), {args.model}, batch {args.batch}, "
             f"bf16, output loss {output_loss}", "", "| variant | median ms | min ms | words/s | peak GiB | loss |",
             "|---|---|---|---|---|---|"]
    for name, v in result["variants"].items():
        peak = f"{v['peak_gib']:.2f}" if v["peak_gib"] is not None else "-"
        lines.append(f"| {name} | {v['median_ms']:.1f} | {v['min_ms']:.1f} | {v['words_per_s']:,.0f} | {peak} | "
                     f"{v['last_loss']:.4f} |")
    for name, err in result["errors"].items():
        lines.append(f"\n{name} failed: {err}")
    for name, ws in result["warnings"].items():
        for w in ws:
            lines.append(f"\nwarning in {name}: {w}")
    for key in ("capture",):
        for rung, what in result.get(key, {}).items():
            lines.append(f"\ncapture {rung}: {what}")
    for key in ("profile",):
        if result.get(key):
            busy = result[key][0]
            lines += ["", f"{key}: GPU busy {busy['busy_ms_per_step']:.1f} ms of {busy['wall_ms_per_step']:.1f} ms "
                      "per step (kernels' union over the step's wall time)", "",
                      "| kernel | calls/step | ms/step | share |", "|---|---|---|---|"]
            lines += [f"| {r['kernel']} | {r['calls_per_step']} | {r['ms_per_step']:.2f} | {r['share']:.1%} |"
                      for r in result[key][1:]]
    (args.out / "gpu-step.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
