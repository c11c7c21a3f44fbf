"""Models: fused and stepwise RNNs compute the same function, presets build, configs validate."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scalelab.core.errors import SpecError
from scalelab.train.data import TaskDataset
from scalelab.train.models import (
    PRESETS,
    ModelConfig,
    StepwiseLSTM,
    build_model,
    config_with_overrides,
    copy_weights,
    count_parameters,
    linear_flops,
    lstm_matmul_flops,
    reverse_padded,
)

TINY = ["nmt-tiny", "rnnlm-tiny", "sentiment-tiny"]

# Tiny configs that also exercise multi-layer, bidirectional and attention-free variants.
VARIANTS = {
    "nmt-tiny": {},
    "nmt-deep-noattn": {"enc_layers": 2, "dec_layers": 3, "attention": False},
    "nmt-uni": {"bidirectional": False, "enc_layers": 2},
    "rnnlm-tiny": {},
    "rnnlm-deep": {"num_layers": 3},
    "sentiment-tiny": {},
    "sentiment-bi-deep": {"bidirectional": True, "num_layers": 2},
}


def variant(name: str) -> ModelConfig:
    base = next(p for p in TINY if name.startswith(p.split("-")[0]))
    return config_with_overrides(PRESETS[base], VARIANTS[name])


def fixed_batch(cfg: ModelConfig, n: int = 8):
    data = TaskDataset(cfg, seed=3, num_train=64, num_valid=8, fixed_length=True)
    return data.get_batch(0, 0, n, 0, n)


def pair(cfg: ModelConfig) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    fused = build_model(cfg, "fused")
    stepwise = build_model(cfg, "stepwise")
    copy_weights(fused, stepwise)
    return fused, stepwise


@pytest.mark.parametrize("name", list(VARIANTS))
def test_fused_and_stepwise_agree_on_loss_and_gradients(name: str) -> None:
    cfg = variant(name)
    fused, stepwise = pair(cfg)
    batch = fixed_batch(cfg)
    loss_f = fused(**batch.inputs)
    loss_s = stepwise(**batch.inputs)
    assert torch.allclose(loss_f, loss_s, atol=1e-5), (loss_f, loss_s)
    loss_f.backward()
    loss_s.backward()
    grads_s = dict(stepwise.named_parameters())
    for pname, p in fused.named_parameters():
        assert p.grad is not None, pname
        assert torch.allclose(p.grad, grads_s[pname].grad, atol=1e-5, rtol=1e-4), pname


@pytest.mark.parametrize("name", [n for n in PRESETS if n != "nmt-seed"])  # seed: see below
def test_parameter_names_and_counts_are_interchangeable(name: str) -> None:
    cfg = PRESETS[name]
    torch.manual_seed(0)
    fused = build_model(cfg, "fused")
    torch.manual_seed(0)
    stepwise = build_model(cfg, "stepwise")
    state_f, state_s = fused.state_dict(), stepwise.state_dict()
    assert list(state_f) == list(state_s)
    assert any(k.endswith("weight_hh_l0") for k in state_f)
    # same seed, same initial weights: a run's model does not depend on the RNN implementation
    assert all(torch.equal(state_f[k], state_s[k]) for k in state_f)
    assert count_parameters(fused) == count_parameters(stepwise) > 0


def test_stepwise_matches_nn_lstm_with_initial_state() -> None:
    torch.manual_seed(1)
    ref = nn.LSTM(5, 7, num_layers=2, bidirectional=True, batch_first=True)
    mine = StepwiseLSTM(5, 7, num_layers=2, bidirectional=True)
    mine.load_state_dict(ref.state_dict())
    x = torch.randn(3, 6, 5)
    hx = (torch.randn(4, 3, 7), torch.randn(4, 3, 7))
    out_r, (h_r, c_r) = ref(x, hx)
    out_m, (h_m, c_m) = mine(x, hx)
    assert out_m.shape == (3, 6, 14)
    for a, b in ((out_r, out_m), (h_r, h_m), (c_r, c_m)):
        assert torch.allclose(a, b, atol=1e-6)


def test_stepwise_respects_lengths() -> None:
    """Each padded sequence gives what it gives alone; padding outputs zero."""
    torch.manual_seed(2)
    lstm = StepwiseLSTM(4, 6, num_layers=2, bidirectional=True)
    lengths = torch.tensor([5, 2, 3])
    x = torch.randn(3, 5, 4)
    out, (h, c) = lstm(x, lengths=lengths)
    for i, n in enumerate(lengths.tolist()):
        alone, (h1, _) = lstm(x[i : i + 1, :n])
        assert torch.allclose(out[i, :n], alone[0], atol=1e-6)
        assert torch.allclose(h[:, i], h1[:, 0], atol=1e-6)
        assert out[i, n:].abs().sum() == 0


def test_reverse_padded_reverses_within_length_and_is_an_involution() -> None:
    x = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]]).unsqueeze(-1)
    rev = reverse_padded(x, torch.tensor([3, 2]))
    assert rev.squeeze(-1).tolist() == [[3, 2, 1, 0], [5, 4, 0, 0]]
    assert torch.equal(reverse_padded(rev, torch.tensor([3, 2])), x)


def test_stepwise_nmt_ignores_what_lies_beyond_the_source_length() -> None:
    cfg = PRESETS["nmt-tiny"]
    torch.manual_seed(0)
    model = build_model(cfg, "stepwise")
    data = TaskDataset(cfg, seed=5, num_train=64, num_valid=8)
    inputs = dict(data.get_batch(0, 0, 8, 0, 8).inputs)
    assert (inputs["src_lengths"] < inputs["src"].size(1)).any(), "need padded sources"
    clean = model(**inputs)
    garbage = inputs["src"].clone()
    pad = torch.arange(garbage.size(1)) >= inputs["src_lengths"].unsqueeze(1)
    garbage[pad] = 7
    inputs["src"] = garbage
    assert torch.allclose(model(**inputs), clean, atol=1e-6)


def test_nmt_seed_builds_with_expected_shapes_and_size() -> None:
    cfg = PRESETS["nmt-seed"]
    model = build_model(cfg, "fused")
    V, E, H = 50000, 512, 512
    lstm = lambda i: 4 * H * (i + H) + 8 * H  # noqa: E731  (weights + two bias vectors)
    expected = (
        2 * V * E  # source and target embeddings
        + 2 * lstm(E) + 2 * lstm(2 * H)  # 2-layer bidirectional encoder
        + 2 * H * H  # encoder projection 2H -> H
        + lstm(E) + 3 * lstm(H)  # 4-layer decoder
        + H * H + 2 * H * H  # attention score and combine
        + H * V + V  # output projection
    )
    assert count_parameters(model) == expected
    assert 90e6 < expected < 100e6
    assert model.src_embed.weight.shape == (V, E)
    assert model.tgt_embed.weight.shape == (V, E)
    assert model.out.weight.shape == (V, H)
    assert model.enc_proj.weight.shape == (H, 2 * H)
    assert model.encoder.bidirectional and model.encoder.num_layers == 2
    assert model.decoder.num_layers == 4 and not model.decoder.bidirectional
    flops = model.flops_per_step(cfg.default_batch)
    # ~6 FLOPs per non-embedding parameter per target token is the usual rule of thumb.
    rule = 6 * (expected - 2 * V * E) * cfg.default_batch * cfg.tgt_len
    assert 0.5 * rule < flops < 2 * rule


def test_flops_formulas() -> None:
    assert linear_flops(3, 4, 5) == 2 * 3 * 4 * 5
    one = lstm_matmul_flops(2, 3, num_layers=1, steps=1, batch=1)
    assert one == 2 * (2 + 3) * 4 * 3
    assert lstm_matmul_flops(2, 3, 1, 1, 1, bidirectional=True) == 2 * one
    # second layer of a bidirectional stack reads 2H inputs
    two = lstm_matmul_flops(2, 3, num_layers=2, steps=5, batch=7, bidirectional=True)
    assert two == 2 * 5 * 7 * 2 * ((2 + 3) + (6 + 3)) * 12
    small, tiny = build_model(PRESETS["rnnlm-small"]), build_model(PRESETS["rnnlm-tiny"])
    assert small.flops_per_step(64) > 100 * tiny.flops_per_step(64)
    assert small.flops_per_step(64) == pytest.approx(2 * small.flops_per_step(32))


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from intra-op threads, and lose a lot when the CPU is shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name,steps,lr", [("nmt-tiny", 150, 0.02), ("rnnlm-tiny", 100, 0.01),
                                          ("sentiment-tiny", 100, 0.01)])
def test_tiny_models_learn_their_task(name: str, steps: int, lr: float) -> None:
    cfg = PRESETS[name]
    torch.manual_seed(0)
    model = build_model(cfg, "fused")
    data = TaskDataset(cfg, seed=0, num_train=2048, num_valid=128)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    @torch.no_grad()
    def val_loss() -> float:
        model.eval()
        losses = [float(model(**b.inputs)) for b in data.valid_batches(64, 0, 1)]
        model.train()
        return sum(losses) / len(losses)

    before = val_loss()
    per_epoch = data.steps_per_epoch(32)
    for step in range(steps):
        batch = data.get_batch(step // per_epoch, step % per_epoch, 32, 0, 32)
        optimizer.zero_grad()
        model(**batch.inputs).backward()
        optimizer.step()
    after = val_loss()
    assert after < 0.5 * before, (before, after)


def test_config_overrides_validate() -> None:
    base = PRESETS["nmt-tiny"]
    assert config_with_overrides(base, {"hidden_size": 48}).hidden_size == 48
    assert config_with_overrides(base, {"hidden_size": "48", "attention": "false"}).attention is False
    assert config_with_overrides(base, {"dropout": 0}).dropout == 0.0
    with pytest.raises(SpecError, match="hiden_size.*valid fields: .*hidden_size"):
        config_with_overrides(base, {"hiden_size": 48})
    with pytest.raises(SpecError, match="hidden_size"):
        config_with_overrides(base, {"hidden_size": 0})
    with pytest.raises(SpecError, match="expected int"):
        config_with_overrides(base, {"hidden_size": 2.5})
    with pytest.raises(SpecError, match="expected int"):
        config_with_overrides(base, {"enc_layers": True})
    with pytest.raises(SpecError, match="expected int"):
        config_with_overrides(base, {"embed_size": "big"})
    with pytest.raises(SpecError, match="dropout"):
        config_with_overrides(base, {"dropout": 1.5})
    with pytest.raises(SpecError, match="bidirectional"):
        config_with_overrides(PRESETS["rnnlm-tiny"], {"bidirectional": True})
    with pytest.raises(SpecError, match="family"):
        config_with_overrides(base, {"family": "gpt"})
    with pytest.raises(SpecError, match="fused, stepwise"):
        build_model(base, "cudnn")


def test_presets_cover_the_families() -> None:
    for name in ("nmt-seed", "nmt-small", "nmt-tiny", "rnnlm-tiny", "rnnlm-small",
                 "sentiment-tiny", "sentiment-small"):
        assert PRESETS[name].family == name.split("-")[0]
    seed = PRESETS["nmt-seed"]
    assert (seed.src_len, seed.tgt_len, seed.default_batch) == (100, 100, 360)
    assert seed.bidirectional and seed.enc_layers == 2 and seed.dec_layers == 4


def test_dropout_is_the_only_randomness() -> None:
    cfg = config_with_overrides(PRESETS["rnnlm-tiny"], {"dropout": 0.3, "num_layers": 2})
    for rnn in ("fused", "stepwise"):
        model = build_model(cfg, rnn)
        batch = fixed_batch(cfg)
        model.eval()
        assert torch.equal(model(**batch.inputs), model(**batch.inputs))
        model.train()
        assert not torch.equal(model(**batch.inputs), model(**batch.inputs))


def _share_one_buffer(lstm: nn.LSTM, gap: int = 3) -> None:
    """Make `lstm`'s weights views of one float32 buffer with `gap` unused elements after each, as
    cuDNN's flatten does on CUDA (with its alignment), so the one-buffer cast runs on a CPU."""
    params = [getattr(lstm, n) for n in lstm._flat_weights_names]
    total = sum(p.numel() + gap for p in params)
    buffer = torch.zeros(total)
    at = 0
    with torch.no_grad():
        for p in params:
            view = buffer[at:at + p.numel()].view(p.shape)
            view.copy_(p)
            p.set_(buffer.untyped_storage(), at, p.shape)
            at += p.numel() + gap


def test_cast_flat_keeps_one_buffer_and_the_gradients() -> None:
    """The bf16 weights handed to cuDNN are views of one buffer at the float32 offsets (so cuDNN does not
    copy them into a new one every step), with the same values and gradients as casting each alone."""
    from scalelab.train.models import FusedLSTM, cast_flat

    torch.manual_seed(0)
    lstm = FusedLSTM(8, 16, num_layers=2, bidirectional=True)
    _share_one_buffer(lstm)
    params = [getattr(lstm, n) for n in lstm._flat_weights_names]
    flat = cast_flat(params, torch.bfloat16)
    storage = flat[0].untyped_storage().data_ptr()
    assert all(w.untyped_storage().data_ptr() == storage for w in flat)
    assert [w.storage_offset() for w in flat] == [p.storage_offset() for p in params]
    assert all(w.dtype == torch.bfloat16 and w.shape == p.shape for w, p in zip(flat, params))
    alone = [p.to(torch.bfloat16) for p in params]
    assert all(torch.equal(a, b) for a, b in zip(flat, alone))
    weights = torch.randn(len(params))
    sum(wt * w.float().sum() for wt, w in zip(weights, flat)).backward()
    got = [p.grad.clone() for p in params]
    lstm.zero_grad(set_to_none=True)
    sum(wt * w.float().sum() for wt, w in zip(weights, alone)).backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(got, params))


def test_cast_flat_falls_back_to_one_cast_each_without_a_shared_buffer() -> None:
    from scalelab.train.models import FusedLSTM, cast_flat

    lstm = FusedLSTM(8, 16)
    flat = cast_flat(lstm._flat_weights, torch.bfloat16)
    assert len({w.untyped_storage().data_ptr() for w in flat}) == len(flat)
    assert all(torch.equal(w, p.to(torch.bfloat16)) for w, p in zip(flat, lstm._flat_weights))


def test_fused_lstm_under_autocast_runs_in_bf16_from_one_buffer() -> None:
    """The autocast forward through the one-buffer cast gives the per-weight cast's output, in bf16."""
    from scalelab.train.models import FusedLSTM

    torch.manual_seed(0)
    lstm = FusedLSTM(8, 16, num_layers=2, bidirectional=True)
    x = torch.randn(3, 5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before, _ = lstm(x)
    _share_one_buffer(lstm)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        after, _ = lstm(x)
    after.float().sum().backward()
    assert after.dtype == torch.bfloat16 and torch.equal(before, after)
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in lstm.parameters())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu-check.sh runs it there)")
def test_bf16_lstm_on_cuda_takes_cudnn_s_buffer_as_it_is() -> None:
    """On a GPU the bf16 forward neither re-flattens the float32 weights (their addresses stay) nor makes
    cuDNN copy the cast ones ("not part of single contiguous chunk of memory"), and it stays within bf16's
    rounding of the float32 forward."""
    import warnings

    from scalelab.train.models import FusedLSTM

    torch.manual_seed(0)
    lstm = FusedLSTM(64, 128, num_layers=2, bidirectional=True).cuda()
    where = [p.data_ptr() for p in lstm.parameters()]
    x = torch.randn(4, 7, 64, device="cuda")
    with torch.no_grad():
        reference, _ = lstm(x)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out, _ = lstm(x)
            out.float().sum().backward()
    assert out.dtype == torch.bfloat16
    assert [p.data_ptr() for p in lstm.parameters()] == where
    assert not [w for w in seen if "contiguous chunk" in str(w.message)], [str(w.message) for w in seen]
    assert torch.allclose(out.float(), reference, atol=3e-2, rtol=3e-2)
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in lstm.parameters())

