"""Seer's end tail (docs/DESIGN.md "Seer, exactly", "The end tail") and the paired statistics that judge a cut."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from seer_trt.contracts.config import SeerConfig, SpecialTokens
from seer_trt.contracts.errors import ConfigError
from seer_trt.eval.paired import mcnemar_exact, paired
from seer_trt.runtime.layout import packed_layout, padded_layout


def test_mcnemar_exact_p_is_the_two_sided_binomial_tail():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(13, 2) == pytest.approx(2 * (1 + 15 + 105) / 2**15)  # the 13 against 2: 0.0074
    assert mcnemar_exact(2, 13) == mcnemar_exact(13, 2)
    assert mcnemar_exact(5, 5) == 1.0  # capped at 1
    assert mcnemar_exact(6, 0) == pytest.approx(2 / 64)


def test_paired_counts_lost_and_gained_answers():
    a = [True, True, False, False, True]
    b = [True, False, True, False, False]
    p = paired(a, b)
    assert (p.only_a, p.only_b, p.n) == (2, 1, 5)
    assert p.points == pytest.approx(-20.0)
    with pytest.raises(ValueError, match="same prompts"):
        paired(a, b[:3])


def test_tail_settings_are_checked_and_round_trip():
    seer = SeerConfig(tail=0.5, tail_token="endoftext")
    assert SeerConfig.from_dict(seer.to_dict()) == seer
    assert seer.tails(np.array([10, 63, 64]), 64).tolist() == [27, 1, 0]  # ceil(0.5 * (N - L*)), none uncut
    assert SeerConfig().tails(np.array([3]), 64).tolist() == [0]  # the paper's cut has no tail
    assert "end tail 0.5" in seer.describe()
    special = SpecialTokens(mask_id=1, endoftext_id=2, startoftext_id=3, eot_id=4, start_header_id=5, end_header_id=6)
    assert seer.tail_id(special) == 2 and SeerConfig(tail=1).tail_id(special) == 4
    for bad in (-0.1, 1.5, True, "1"):
        with pytest.raises(ConfigError, match="seer.tail must be"):
            SeerConfig(tail=bad)
    with pytest.raises(ConfigError, match="tail_token"):
        SeerConfig(tail_token="pad")


def test_layouts_put_the_tail_after_the_window_and_leave_tailless_rows_alone():
    d = 3
    prompts = [np.full((4, d), 1.0, np.float32), np.full((2, d), 2.0, np.float32)]
    kept, tails, tail = np.array([3, 2]), np.array([2, 0]), np.full(d, 9.0, np.float32)
    padded = padded_layout(prompts, kept, 8, 4, tails, tail)
    # row 0: pad pad | tail tail | prompt x4 | answer x3, pad; the tail's positions follow the answer's
    assert padded.prefix_embeds[0, :, 0].tolist() == [0, 0, 9, 9, 1, 1, 1, 1]
    assert padded.segment_ids[0].tolist() == [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]
    assert padded.position_ids[0, 2:11].tolist() == [7, 8, 0, 1, 2, 3, 4, 5, 6]
    plain = padded_layout(prompts, kept, 8, 4)  # a row without a tail is laid out as before
    assert np.array_equal(padded.prefix_embeds[1], plain.prefix_embeds[1])
    assert np.array_equal(padded.segment_ids[1], plain.segment_ids[1])
    valid = plain.segment_ids[1] > 0
    assert np.array_equal(padded.position_ids[1][valid], plain.position_ids[1][valid])
    packed = packed_layout(prompts, kept, tails, tail)
    assert packed.prefix_embeds[0, :, 0].tolist() == [9, 9, 1, 1, 1, 1, 2, 2]
    assert packed.segment_ids[0].tolist() == [1] * 6 + [2] * 2 + [1] * 3 + [2] * 2
    assert packed.position_ids[0].tolist() == [7, 8, 0, 1, 2, 3, 0, 1, 4, 5, 6, 2, 3]
    assert packed.gen_shape == (1, 5) and padded.gen_shape == (2, 4)


@pytest.mark.slow
def test_the_tail_is_the_full_window_with_its_padding_committed(fixture_export):
    """A cut window with an end tail of 1 computes what the uncut window computes once everything past the cut is
    ``<|eot_id|>``: the runtime (tail in the prompt part, ahead of the prompt) equals the PyTorch reference (tail
    in the answer window after the cut) token for token and step for step, on every dispatch path."""
    import torch

    from seer_export.models.registry import FIXTURE_DIR
    from seer_export.models.registry import load as load_model
    from seer_export.reference.fixture import TaskEncoder
    from seer_export.reference.sampler import generate
    from seer_trt.eval.tasks import make_samples
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.runtime.request import Request

    folder, manifest, _ = fixture_export
    samples = make_samples(35, 8)
    model, _ = load_model("tiny-llada-v", None)
    enc = TaskEncoder(FIXTURE_DIR, model.config)
    windows = np.array([len(enc.answer_ids(s)) for s in samples])  # the oracle's cut: answer and <|eot_id|>
    pipe = SeerPipeline.from_manifest(folder, seer=dataclasses.replace(manifest.seer, tail=1.0))
    for decoding, early in (("fixed", False), ("factor:1", True)):
        gen = dataclasses.replace(manifest.generation, decoding=decoding)
        with torch.no_grad():
            prefix, valid = enc.prefix(model, samples)
            ref = generate(model, prefix, valid, gen, enc.special, kept=windows, early_stop=early,
                           tail=gen.gen_length - windows, tail_token="eot")  # fmt: skip
        reqs = [Request(s.question, s.image, window=int(w), decoding=decoding, early_stop=early, cache="none")
                for s, w in zip(samples, windows, strict=True)]  # fmt: skip
        for policy in ("static", "packed", "per_request"):
            results = pipe.generate(reqs, policy=policy)
            want = [row[:k].tolist() for row, k in zip(ref.tokens, windows, strict=True)]
            assert [list(r.window) for r in results] == want
            assert [r.steps for r in results] == ref.steps.tolist()
        cached = pipe.generate([dataclasses.replace(r, cache="reuse") for r in reqs])  # the cache holds the tail
        assert all(c.ok for c in cached) and sum(c.refreshes for c in cached) < sum(c.steps for c in cached)


def test_calibration_chooses_the_smallest_tail_that_keeps_accuracy_everywhere():
    from seer_export.calibrate_tail import choose_tail

    def row(points: float, p: float) -> dict:
        return {"points": points, "p": p}

    results = {  # (rule, N) -> tail -> paired figures against the uncut loop
        ("factor:1", 64): {"tail 0": row(-3.0, 0.5), "tail 0.5": row(-0.5, 1.0), "tail 1": row(0.0, 1.0)},
        ("fixed", 128): {"tail 0": row(0.0, 1.0), "tail 0.5": row(0.0, 1.0), "tail 1": row(0.0, 1.0)},
    }
    assert choose_tail(results, [0.0, 0.5, 1.0], max_loss=1.0) == (0.5, True)
    results[("fixed", 128)]["tail 0.5"] = row(-0.8, 0.05)  # within the points, but the pairs say it loses
    assert choose_tail(results, [0.0, 0.5, 1.0], max_loss=1.0) == (1.0, True)
    results[("fixed", 128)]["tail 1"] = row(-2.0, 0.3)
    assert choose_tail(results, [0.0, 0.5, 1.0], max_loss=1.0) == (1.0, False)  # none: the most context, said so
