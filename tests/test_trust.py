"""Every report warns about results that cannot be trusted (analysis.scaling.trust_warnings)."""

import dataclasses
import json

from scalelab.analysis.results import emulation_warnings, write_report
from scalelab.analysis.scaling import LayoutSummary, scale_layouts, trust_warnings
from scalelab.core.spec import Spec, save_spec


def summary(workers: int, wps: float, **changes) -> LayoutSummary:
    base = LayoutSummary(
        label="s", workers=workers, nodes=1, gpus_per_node=workers, engine="horovod", rnn="fused", model="m",
        mode="strong", global_batch=64, steps_measured=100, steps_warmup=5, steps_incomplete=0, words_per_s=wps,
        samples_per_s=wps / 10, step_s_mean=0.2, step_s_median=0.2, step_s_p90=0.21, step_s_std=0.01,
        share_data=None, share_forward=None, share_backward=None, share_exchange=None, share_optimizer=None,
        final_loss=1.0, final_val_loss=None, loss_threshold=None, reached_threshold=None,
        time_to_threshold_s=None, steps_to_threshold=None)
    return dataclasses.replace(base, **changes)


def test_a_sound_sweep_has_no_warning():
    assert trust_warnings(scale_layouts([summary(1, 1000.0), summary(2, 1900.0)])) == []


def test_each_untrustworthy_result_is_named():
    table = scale_layouts([
        summary(1, 1000.0, steps_measured=2),
        summary(2, 1900.0, step_s_std=0.08),
        summary(4, 300.0),  # slower with more workers: serial fraction above 1
        summary(8, 7000.0, loss_threshold=2.0, reached_threshold=True, steps_to_threshold=10, first_val_step=10,
                time_to_threshold_s=0.0),
    ])
    text = "\n".join(trust_warnings(table))
    assert "only 2 measured step(s)" in text
    assert "spread 40%" in text
    assert "outside [0, 1]" in text and "at 4 worker(s)" in text
    assert "first validation (step 10)" in text


def test_emulated_devices_are_named_and_reports_carry_warnings(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    save_spec(Spec(nodes=2, gpus_per_node=1, emulate_slowdown=[1.0, 2.0]).validate(), run)
    said = emulation_warnings([run])
    assert any("sleeping" in w for w in said) and any("processes on one machine" in w for w in said)
    report = write_report([summary(2, 1000.0, steps_measured=3)], [run], tmp_path / "out")
    assert any("measured step" in w for w in report.warnings)
    assert "WARNING: " in report.markdown_path.read_text()
    assert json.loads((tmp_path / "out" / "warnings.json").read_text()) == report.warnings
