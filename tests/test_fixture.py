"""The bundled fixture end to end: it ships, answers its task, and Seer cuts where its answers end."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from seer_export.models.registry import FIXTURE_DIR, load
from seer_export.reference.fixture import TaskEncoder
from seer_export.reference.run import PAPER, answer_of, metrics, run_modes
from seer_export.reference.seer import step_zero
from seer_trt.contracts.config import GenerationConfig, SeerConfig
from seer_trt.eval.tasks import make_samples

N_SAMPLES = 40
HELD_OUT = 7


@pytest.fixture(scope="module")
def fixture():
    model, folder = load("tiny-llada-v")
    model.eval()
    enc = TaskEncoder(folder, model.config)
    samples = make_samples(HELD_OUT, N_SAMPLES)
    return model, enc, samples


def test_fixture_ships_inside_the_package():
    sizes = {p.name: p.stat().st_size for p in FIXTURE_DIR.iterdir()}
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert name in sizes, f"{name} missing from {FIXTURE_DIR}"
    assert sizes["model.safetensors"] <= 10 * 2**20


def test_fixture_uses_llada_v_chat_layout_and_special_tokens(fixture):
    model, enc, samples = fixture
    text = enc.chat.render("<image>\nhow many shapes ?")
    assert text.startswith("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\n<image>\nhow many shapes ?")
    assert text.endswith("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    ids = enc.prompt_ids(samples[0])
    assert ids[:2] == [enc.special.startoftext_id, enc.special.start_header_id]
    assert len(set(enc.special.to_dict().values())) == 6
    # the fixture's ids differ from LLaDA-V's: nothing may hard-code them
    assert enc.special.mask_id != 126336


def test_fixture_config_carries_a_valid_calibration(fixture):
    model, _, _ = fixture
    data = json.loads((FIXTURE_DIR / "config.json").read_text())
    seer = SeerConfig.from_dict(data["seer"])
    assert seer.label == "calibrated" or seer.signal == "end_token_prob"
    assert model.config.seer == seer
    assert seer.probe_layer < model.config.text.num_hidden_layers


@pytest.fixture(scope="module")
def results(fixture):
    model, enc, samples = fixture
    gen = GenerationConfig(gen_length=64, steps=64, block_length=64)
    modes = run_modes(model, enc, samples, gen, {"calibrated": model.config.seer, "paper": PAPER})
    truth = [enc.answer_ids(s)[:-1] for s in samples]
    return modes, metrics(modes, truth), truth


@pytest.mark.slow
def test_seer_keeps_accuracy_and_cuts_near_the_end(results):
    modes, m, truth = results
    seer = m["calibrated"]
    # The padded baseline answers nearly every prompt (over 90 % of 500 held-out ones, README): a broken sampler,
    # model or fixture falls far below this.
    assert m["baseline"]["exact_match"] >= 0.9, m["baseline"]
    assert seer["exact_match"] >= m["baseline"]["exact_match"] - 0.05, (seer, m["baseline"])
    assert seer["premature_cut_rate"] <= 0.05, seer
    assert seer["mean_kept_over_true"] <= 1.5, seer
    assert seer["mean_steps"] < 0.6 * m["baseline"]["mean_steps"], seer
    kept = modes["calibrated"].kept
    assert (kept <= 64).all() and (kept >= 1).all()


def test_calibrated_signal_marks_the_true_end(fixture):
    """At step zero the calibrated signal sits past its threshold from the true <|eot_id|> on, not before."""
    model, enc, samples = fixture
    seer = model.config.seer
    with torch.no_grad():
        prefix, valid = enc.prefix(model, samples)
        zero = step_zero(model, prefix, valid, 64, enc.special, tau_abs=seer.tau_abs, residual=True)
    profile = zero.profile(seer)  # [n, 64]
    ends = [len(enc.answer_ids(s)) - 1 for s in samples]
    at_end = np.array([row[e] for row, e in zip(profile, ends, strict=True)])
    before = np.array([row[e - 1] for row, e in zip(profile, ends, strict=True) if e >= 1])
    if seer.detector == "threshold":
        assert np.median(at_end) > seer.threshold > np.median(before)
    else:
        sign = 1.0 if seer.direction == "up" else -1.0
        assert np.median(sign * (at_end[: len(before)] - before)) > seer.tau_jump


def test_answer_of_stops_at_the_first_eot():
    assert answer_of(np.array([5, 6, 9, 7, 9]), 9, (8,)) == [5, 6]
    assert answer_of(np.array([5, 8, 6, 8]), 9, (8,)) == [5, 6]


def run_cli(module, *args):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=600)


def test_reference_cli_rejects_unknown_model():
    out = run_cli("seer_export.reference.run", "--model", "no-such-model")
    assert out.returncode == 2
    assert "no-such-model" in out.stderr and "tiny-llada-v" in out.stderr
    assert "Traceback" not in out.stderr


def test_calibrate_cli_without_checkpoint_says_how_to_provide_one(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = run_cli("seer_export.calibrate", "--model", "llada-v")
    assert out.returncode == 2
    assert "--checkpoint" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_calibrate_cli_writes_report_png_and_config(tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(FIXTURE_DIR, ckpt)
    before = json.loads((ckpt / "config.json").read_text())
    before.pop("seer")
    (ckpt / "config.json").write_text(json.dumps(before))
    out = run_cli("seer_export.calibrate", "--checkpoint", str(ckpt), "--n", "24", "--gen-length", "48",
                  "--out", str(tmp_path / "report"), "--write", "--max-layer", "2")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "**chosen**" in out.stdout and "| probe |" in out.stdout and "| end_token_prob |" in out.stdout
    report = json.loads((tmp_path / "report" / "calibration.json").read_text())
    written = json.loads((ckpt / "config.json").read_text())["seer"]
    assert written == report["chosen"]
    assert {r["layer"] for r in report["windows"]["48"]["rows"]} == {0, 1, 2, None}  # --max-layer 2, and full depth
    SeerConfig.from_dict(written)  # valid
    png = (tmp_path / "report" / "step_zero_profile.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
