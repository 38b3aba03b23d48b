"""An answer that holds the mask id is no answer (issue 42): a model never predicts the mask token it was trained to
replace, so such an "answer" comes from a broken export (a NaN weight exported with ``--no-validate`` turns every
prediction into ``<|mdm_mask|>``), and the detokenize stage refuses it with an error that says so
(``seer_trt.runtime.detokenize``; the C++ runtime's request fails alike: tests/test_cpp.py). seer-export refuses such
a weight itself now (tests/test_export.py); the broken export here is made by editing a good one's weights file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from seer_trt.runtime.detokenize import MaskAnswerError, answer, detokenize, mask_in_answer

MASK, EOT = 82, 81  # the fixture's ids (tests below read them from the manifest where an export is at hand)


class Words:
    """A tokenizer's decode, for the stage alone: ids as words."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(f"w{i}" for i in ids)


def nan_export(src: Path, dst: Path, tensor: str = "model.layers.3.mlp.down_proj.weight.T") -> Path:
    """The export ``src`` with one value of ``tensor`` set to NaN in a copy of its weights file (the other files
    hard-linked): what seer-export ``--no-validate`` wrote from a checkpoint holding a NaN before issue 42."""
    dst.mkdir()
    for path in src.iterdir():
        if path.is_dir():
            shutil.copytree(path, dst / path.name)
        elif path.name == "weights.data":
            shutil.copyfile(path, dst / path.name)
        else:
            os.link(path, dst / path.name)
    offset, length, dtype, _ = json.loads((dst / "weights.json").read_text())[tensor]
    values = np.memmap(dst / "weights.data", dtype=dtype, mode="r+", offset=offset, shape=(length // 4,))
    values[5] = np.nan
    values.flush()
    del values
    return dst


def test_an_answer_holding_the_mask_id_is_refused_and_the_rest_of_the_window_is_not_looked_at():
    assert answer(np.array([5, 6, EOT, MASK, MASK]), 5, Words(), EOT, MASK) == ([5, 6], "w5 w6")  # after <|eot_id|>
    assert answer(np.array([5, 6, 7, MASK, MASK]), 3, Words(), EOT, MASK) == ([5, 6, 7], "w5 w6 w7")  # past L*
    with pytest.raises(MaskAnswerError) as err:
        answer(np.array([5, MASK, 7, MASK, EOT]), 5, Words(), EOT, MASK)
    assert str(err.value) == mask_in_answer([5, MASK, 7, MASK], MASK)
    assert str(err.value).startswith("the model produced the mask token (id 82) as an answer, at 2 of its 4 positions "
                                     "from position 1; the export is broken")  # fmt: skip
    assert "re-export it with validation (seer-export without --no-validate)" in str(err.value)
    assert mask_in_answer([5, 6], MASK) is None


def test_detokenize_checks_only_when_given_the_mask_id():
    tokens, kept = np.array([[5, MASK, EOT], [6, 7, EOT]]), np.array([3, 3])
    assert detokenize(tokens, kept, Words(), EOT) == [([5, MASK], f"w5 w{MASK}"), ([6, 7], "w6 w7")]
    with pytest.raises(MaskAnswerError, match="at 1 of its 2 positions from position 1"):
        detokenize(tokens, kept, Words(), EOT, MASK)
    assert detokenize(tokens[1:], kept[1:], Words(), EOT, MASK) == [([6, 7], "w6 w7")]


@pytest.fixture(scope="module")
def broken(fixture_export, tmp_path_factory) -> Path:
    return nan_export(fixture_export[0], tmp_path_factory.mktemp("broken") / "engines")


def test_a_broken_exports_answers_are_refused_and_a_healthy_ones_pass_unchanged(fixture_export, broken):
    """The fixture's answers to the held-out prompts pass the stage's check unchanged (ids and text); the same export
    with one NaN weight answers mask ids (what seer-run reported as "[UNK]" with rc 0 before issue 42), which the
    stage refuses for every row."""
    from seer_trt.eval.tasks import make_samples
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.runtime.request import Request

    requests = [Request(s.question, s.image) for s in make_samples(23, 12)]
    for folder, healthy in ((fixture_export[0], True), (broken, False)):
        pipe = SeerPipeline.from_manifest(folder)
        special, tokenizer = pipe.manifest.special_tokens, pipe.prompts.tokenizer
        results = pipe.generate(requests)
        pipe.close()
        refused = rf"the model produced the mask token \(id {special.mask_id}\) as an answer"
        for r in results:
            if healthy:
                assert r.ok and answer(np.array(r.window), r.kept, tokenizer, special.eot_id, special.mask_id) == (
                    list(r.token_ids), r.text)  # fmt: skip
            else:  # the pipeline failed the request with the stage's error
                assert not r.ok and re.match(refused, r.error) and r.error_kind == "internal", r.error
