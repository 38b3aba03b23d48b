"""Checks every model adapter passes (tests/test_lavida.py, tests/test_mmada.py; not a test module)."""

from __future__ import annotations

import json
from pathlib import Path


def calibrates(model: str, checkpoint: Path, out: Path) -> None:
    """seer-calibrate --model MODEL: the step-zero signals per layer on held-out prompts (with images) and a chosen
    calibration, written to ``out`` (random weights: whether a layer meets the bar is not the point)."""
    from seer_export.calibrate import main as calibrate_main

    argv = ["--model", model, "--checkpoint", str(checkpoint), "--n", "12", "--gen-length", "16", "--out", str(out)]
    assert calibrate_main(argv) == 0
    report = json.loads((out / "calibration.json").read_text())
    assert report["model"] == model and report["chosen"]["probe_layer"] < 3
    accuracy = report["accuracy"]  # the cut judged by exact match against the uncut loop, with each end tail
    assert report["chosen"]["tail"] == accuracy["tail"] in (0.0, 0.5, 1.0)
    assert set(accuracy["report"]["factor:1"]["16"]) == {"uncut", "tail 0", "tail 0.5", "tail 1"}
    assert (out / "step_zero_profile.png").is_file()


def serves_in_triton_repositories(engines: Path, manifest, graph: str, out: Path) -> None:
    """seer-triton's CPU and GPU repositories for ``engines``, checked against the manifest (config.pbtxt inputs and
    outputs, files): the default (one decoupled model running the whole export), and the bls layout's component
    model for the front end's ``graph`` beside the orchestrator."""
    from seer_trt.serving.triton.repository import check_repository, plan_repository, served_graphs, write_repository

    assert graph in served_graphs(manifest)
    for flavour in ("cpu", "gpu"):
        repo = write_repository(plan_repository(engines, flavour=flavour), out / flavour)
        assert check_repository(repo) == ["seer"]
        repo = write_repository(plan_repository(engines, flavour=flavour, orchestration="bls"), out / f"{flavour}-bls")
        models = check_repository(repo)
        assert any(graph in m for m in models), models


def export_of(model: str, checkpoint: Path, out: Path):
    """seer-export --model MODEL --checkpoint CHECKPOINT into ``out``, with parity validation: (folder, manifest)."""
    from seer_export.onnx.options import ExportOptions
    from seer_export.onnx.run import run_export

    options = ExportOptions(model=model, checkpoint=checkpoint, out=out, samples=4)
    return out, run_export(options, log=lambda line: None)


def samples_with_images(sizes: list[tuple[int, int]], grid: int, cell: int, n: int = 40) -> list:
    """``n`` held-out questions; those with a picture get a random one of the next of ``sizes`` (h, w)."""
    import numpy as np

    from seer_trt.eval.tasks import make_samples

    rng = np.random.default_rng(7)
    out = []
    for i, s in enumerate(make_samples(13, n, grid, cell)):
        if s.image is not None:
            h, w = sizes[i % len(sizes)]
            s = type(s)(s.task, s.question, s.answer, rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        out.append(s)
    assert sum(s.image is not None for s in out) >= 10
    return out


def runtime_equals_reference(pipe, manifest, model, enc, samples: list, gen, mode: str):
    """The runtime's kept windows, steps and tokens on ``samples`` equal the PyTorch reference sampler's under
    ``gen`` in ``mode`` ("seer", "early_stop", or the family's own loop); returns the reference."""
    import torch

    from seer_export.reference.sampler import generate
    from seer_export.reference.seer import seer_generate
    from seer_trt.runtime.request import Request

    with torch.no_grad():
        prefix, valid = enc.prefix(model, samples)
        if mode == "seer":
            ref = seer_generate(model, prefix, valid, gen, enc.special, pipe.seer)[0]  # the pipeline's detector
        else:
            ref = generate(model, prefix, valid, gen, enc.special, early_stop=mode == "early_stop")
    fields = {"gen_length": gen.gen_length, "steps": gen.steps, "block_length": gen.block_length,
              "decoding": gen.decoding, "remasking": gen.remasking}  # fmt: skip
    results = pipe.generate([Request(s.question, s.image, seer=mode == "seer", early_stop=mode == "early_stop",
                                     cache="none", **fields) for s in samples])  # fmt: skip
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert [r.kept for r in results] == ref.kept.tolist()
    assert [r.steps for r in results] == ref.steps.tolist()
    assert [list(r.window) for r in results] == [row[:k].tolist() for row, k in zip(ref.tokens, ref.kept, strict=True)]
    return ref
