"""Step budget and block layout (docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch"-4) and the configuration dataclasses they read.

Expected plans are worked out by hand from LLaDA-V's ``generate_with_embeds`` (``steps // num_blocks`` steps
per block, a block's masks spread evenly with the remainder on the earliest steps) and docs/DESIGN.md "Seer, exactly" truncation.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from seer_trt.contracts.config import GenerationConfig, SeerConfig, SpecialTokens, read_json
from seer_trt.contracts.errors import ConfigError, SeerError
from seer_trt.runtime.schedule import Schedule, plan_schedule, truncated_steps


def plan(n: int, steps: int, block: int, kept=None, batch: int = 1) -> Schedule:
    return plan_schedule(GenerationConfig(gen_length=n, steps=steps, block_length=block), kept, batch)


# --- untruncated layouts ------------------------------------------------------------------------------------


def test_one_block_spreads_remainder_on_early_steps():
    s = plan(10, 4, 10)
    assert s.transfer.tolist() == [[3, 3, 2, 2]]
    assert s.block_end.tolist() == [[10, 10, 10, 10]]
    assert s.kept.tolist() == [10] and s.steps.tolist() == [4] and s.num_steps == 4


def test_two_blocks_run_left_to_right():
    s = plan(8, 4, 4)
    assert s.transfer.tolist() == [[2, 2, 2, 2]]
    assert s.block_end.tolist() == [[4, 4, 8, 8]]  # block 1 at steps 0-1, block 2 at steps 2-3


def test_blocks_with_remainder():
    s = plan(10, 4, 5)  # 2 blocks of 5, 2 steps each: 5 = 3 + 2
    assert s.transfer.tolist() == [[3, 2, 3, 2]]
    assert s.block_end.tolist() == [[5, 5, 10, 10]]


def test_one_step_per_block():
    s = plan(12, 3, 4)
    assert s.transfer.tolist() == [[4, 4, 4]]
    assert s.block_end.tolist() == [[4, 8, 12]]


def test_more_steps_than_positions_commits_zero_on_late_steps():
    s = plan(4, 8, 4)
    assert s.transfer.tolist() == [[1, 1, 1, 1, 0, 0, 0, 0]]


def test_one_token_per_step_when_steps_equal_length():
    s = plan(16, 16, 4)
    assert s.transfer.tolist() == [[1] * 16]
    assert s.block_end.tolist() == [[4] * 4 + [8] * 4 + [12] * 4 + [16] * 4]


def test_batch_without_kept_repeats_the_row():
    s = plan(8, 4, 4, batch=3)
    assert s.transfer.shape == (3, 4) and s.block_end.shape == (3, 4)
    assert (s.transfer == [2, 2, 2, 2]).all() and s.kept.tolist() == [8, 8, 8]
    assert s.kept.dtype == s.steps.dtype == s.transfer.dtype == s.block_end.dtype == np.int64


# --- truncation -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "kept", "n", "expected"),
    [
        (6, 12, 12, 6),  # kept == N: the full budget
        (6, 6, 12, 3),
        (6, 7, 12, 4),  # 3.5 -> 4
        (6, 5, 12, 3),  # 2.5 -> 3
        (6, 1, 12, 1),  # 0.5 -> 1
        (128, 1, 128, 1),
        (128, 17, 128, 17),
        (64, 17, 128, 9),  # 8.5 -> 9
        (1, 1, 128, 1),  # never below one step
        (3, 1, 128, 1),
    ],
)
def test_truncated_steps_is_a_ceiling(steps, kept, n, expected):
    assert math.ceil(steps * kept / n) == expected  # the table itself follows the formula
    assert truncated_steps(steps, kept, n).tolist() == expected
    assert truncated_steps(steps, np.asarray([kept, n]), n).tolist() == [expected, steps]


@pytest.mark.parametrize("kept", [0, -1, 13])
def test_truncated_steps_rejects_kept_outside_window(kept):
    with pytest.raises(ConfigError):
        truncated_steps(6, kept, 12)
    with pytest.raises(ConfigError):
        truncated_steps(6, np.asarray([6, kept]), 12)


def test_truncated_one_block():
    assert plan(10, 4, 10, kept=[5]).transfer.tolist() == [[3, 2]]  # 2 steps over 5 positions
    assert plan(10, 4, 10, kept=[3]).transfer.tolist() == [[2, 1]]  # ceil(1.2) = 2 steps
    s = plan(10, 4, 10, kept=[1])
    assert s.transfer.tolist() == [[1]] and s.block_end.tolist() == [[1]]
    assert plan(10, 4, 10, kept=[5]).block_end.tolist() == [[5, 5]]


@pytest.mark.parametrize(
    ("kept", "transfer", "block_end"),
    [
        (12, [2, 2, 2, 2, 2, 2], [4, 4, 8, 8, 12, 12]),
        (8, [2, 2, 2, 2], [4, 4, 8, 8]),  # whole blocks keep their 2 steps
        (7, [2, 2, 2, 1], [4, 4, 7, 7]),  # blocks of 4 and 3: 2 steps each (ceil(3 * 2 / 4)), 3 = 2 + 1
        (6, [2, 2, 2], [4, 4, 6]),  # partial block of 2: ceil(2 * 2 / 4) = 1 step
        (5, [2, 2, 1], [4, 4, 5]),
        (4, [2, 2], [4, 4]),
        (3, [2, 1], [3, 3]),  # only a partial block: ceil(3 * 2 / 4) = 2 steps
        (1, [1], [1]),
    ],
)
def test_truncated_multi_block(kept, transfer, block_end):
    s = plan(12, 6, 4, kept=[kept])
    assert s.transfer.tolist() == [transfer]
    assert s.block_end.tolist() == [block_end]
    assert s.steps.tolist() == [math.ceil(6 * kept / 12)] == [len(transfer)]


def test_rows_of_different_kept_in_one_plan():
    s = plan(12, 6, 4, kept=np.asarray([12, 6, 1, 7]))
    assert s.kept.tolist() == [12, 6, 1, 7]
    assert s.steps.tolist() == [6, 3, 1, 4]
    assert s.num_steps == 6
    assert s.transfer.tolist() == [
        [2, 2, 2, 2, 2, 2],
        [2, 2, 2, 0, 0, 0],  # done after its 3 steps: commits nothing later
        [1, 0, 0, 0, 0, 0],
        [2, 2, 2, 1, 0, 0],
    ]
    assert s.block_end[:, :3].tolist() == [[4, 4, 8], [4, 4, 6], [1, 1, 1], [4, 4, 7]]
    assert (s.block_end <= s.kept[:, None]).all()  # never past the kept window, even after the last step


def test_plan_rejects_invalid_kept():
    for bad in ([0], [13], [4, -2]):
        with pytest.raises(ConfigError):
            plan(12, 6, 4, kept=np.asarray(bad))


@pytest.mark.parametrize(
    ("n", "steps", "block"),
    [(12, 6, 4), (10, 4, 10), (10, 4, 5), (16, 16, 4), (32, 8, 8), (32, 64, 16), (24, 16, 3), (7, 3, 7)],
)
def test_plan_invariants_for_every_kept(n, steps, block):
    """For each L*: every kept position is committed once, blocks finish left to right, budget = ceil."""
    kept = np.arange(1, n + 1)
    s = plan(n, steps, block, kept=kept)
    spb = steps // (n // block)
    assert (s.transfer.sum(axis=1) == kept).all()
    assert (s.transfer >= 0).all()
    assert s.steps.tolist() == [math.ceil(steps * k / n) for k in kept]
    for b, k in enumerate(kept.tolist()):
        t_row, e_row = s.transfer[b, : s.steps[b]], s.block_end[b, : s.steps[b]]
        assert (s.transfer[b, s.steps[b] :] == 0).all()
        assert (np.diff(e_row) >= 0).all() and e_row[-1] == k
        done = np.cumsum(t_row)
        for end in np.unique(e_row):  # when a block's steps are over, everything before its end is committed
            last = np.flatnonzero(e_row == end)[-1]
            assert done[last] == end
            size = end - (end - 1) // block * block
            assert (e_row == end).sum() == (spb if size == block else math.ceil(size * spb / block))
            # within a block the counts differ by at most one, larger counts first
            counts = t_row[e_row == end]
            assert counts.max() - counts.min() <= 1 and (np.diff(counts) <= 0).all()


# --- configuration --------------------------------------------------------------------------------------------


def test_generation_defaults_are_llada_v():
    g = GenerationConfig()
    assert (g.gen_length, g.steps, g.block_length, g.temperature, g.remasking) == (128, 128, 128, 0.0, "low_confidence")
    assert g.num_blocks == 1
    assert GenerationConfig(gen_length=32, steps=8, block_length=8).num_blocks == 4


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(gen_length=10, block_length=4, steps=10),  # not a multiple of the block
        dict(gen_length=8, block_length=4, steps=3),  # 3 steps over 2 blocks
        dict(remasking="top_p"),
        dict(temperature=-0.1),
        dict(gen_length=0),
        dict(steps=0),
        dict(block_length=0),
    ],
)
def test_generation_config_rejects(kwargs):
    with pytest.raises(ConfigError):
        GenerationConfig(**kwargs)


def test_config_error_is_a_value_error_and_a_seer_error():
    with pytest.raises(ValueError):
        GenerationConfig(temperature=-1.0)
    with pytest.raises(SeerError):
        GenerationConfig(temperature=-1.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(signal="logits"),
        dict(statistic="abs_above"),
        dict(direction="left"),
        dict(probe_layer=-1),
        dict(window=0),
        dict(margin=-1),
        dict(tau_jump=0.0),
        dict(gamma=-0.1),
        dict(threshold=0.0),
        dict(threshold=1.0),
        dict(detector="first"),
        dict(signal="probe"),  # a probe without its weights
        dict(signal="probe", probe_weights=("a",)),
    ],
)
def test_seer_config_rejects(kwargs):
    with pytest.raises(ConfigError):
        SeerConfig(**kwargs)


def test_seer_defaults_are_the_paper_rule():
    s = SeerConfig()
    assert (s.signal, s.statistic, s.probe_layer, s.tau_abs) == ("mlp_sparsity", "abs_below", 3, 1e-3)
    assert (s.direction, s.tau_jump, s.gamma, s.window, s.margin) == ("up", 0.03, 0.6, 3, 1)


def test_seer_replace_validates():
    assert SeerConfig().replace(margin=2).margin == 2
    with pytest.raises(ConfigError):
        SeerConfig().replace(window=0)


def test_only_the_end_token_signal_needs_full_depth():
    assert not SeerConfig(probe_layer=3).full_depth and SeerConfig(probe_layer=3).layers_computed(32) == 4
    assert not SeerConfig(probe_layer=31).full_depth  # a last-layer statistic still stops before the head
    probe = SeerConfig(signal="probe", probe_layer=1, probe_weights=(1.0, -1.0))
    assert not probe.full_depth and probe.layers_computed(32) == 2
    assert SeerConfig(probe_layer=0, signal="end_token_prob").full_depth
    assert SeerConfig(signal="end_token_prob").layers_computed(32) == 32


def test_detector_defaults_by_signal_and_names_say_which():
    assert SeerConfig().detector == "jump" and SeerConfig().name == "paper rule at layer 3"
    probe = SeerConfig(signal="probe", probe_layer=2, probe_weights=[0.5, 1])
    assert probe.detector == "threshold" and probe.probe_weights == (0.5, 1.0) and probe.name == "probe at layer 2"
    assert SeerConfig(signal="end_token_prob").describe() == "end-token at full depth (p > 0.5, margin 1)"
    assert SeerConfig(statistic="gate_negative", probe_layer=7).name == "gate-sign rule at layer 7"
    assert SeerConfig.from_dict(probe.to_dict()) == probe  # JSON round trip: the weights as a list


def special() -> SpecialTokens:
    return SpecialTokens(mask_id=7, endoftext_id=3, startoftext_id=2, eot_id=5, start_header_id=11, end_header_id=12)


def test_suppressed_ids_leave_eot_and_mask_alone():
    ids = special().suppressed_ids
    assert sorted(ids) == [2, 3, 11, 12]  # endoftext, startoftext, both headers: LLaDA-V's list
    assert 5 not in ids  # the answer must be able to end with <|eot_id|>


@pytest.mark.parametrize(
    "cfg",
    [GenerationConfig(gen_length=32, steps=8, block_length=8, temperature=0.5, remasking="random"), GenerationConfig()],
)
def test_generation_json_round_trip(cfg):
    back = GenerationConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg


@pytest.mark.parametrize(
    "cfg",
    [SeerConfig(), SeerConfig(signal="end_token_prob", statistic="gate_negative", probe_layer=7, margin=2, label="x")],
)
def test_seer_json_round_trip(cfg):
    assert SeerConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_special_tokens_json_round_trip():
    tokens = special()
    assert SpecialTokens.from_dict(json.loads(json.dumps(tokens.to_dict()))) == tokens
    assert "STRINGS" not in tokens.to_dict()


@pytest.mark.parametrize("cls", [GenerationConfig, SeerConfig, SpecialTokens])
def test_from_dict_names_unknown_keys(cls):
    data = special().to_dict() if cls is SpecialTokens else cls().to_dict()
    data["stepz"] = 3
    with pytest.raises(ConfigError, match="stepz"):
        cls.from_dict(data)


def test_from_dict_validates_values():
    with pytest.raises(ConfigError):
        GenerationConfig.from_dict({"gen_length": 10, "block_length": 4})
    with pytest.raises(ConfigError):
        SeerConfig.from_dict({"direction": "sideways"})


def test_special_tokens_from_tokenizer(tmp_path):
    import tokenizers

    words = ["[UNK]", "a", "b"] + list(SpecialTokens.STRINGS.values())
    vocab = {w: i for i, w in enumerate(words)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.save(str(tmp_path / "tokenizer.json"))
    got = SpecialTokens.from_tokenizer(tmp_path / "tokenizer.json")
    for field, text in SpecialTokens.STRINGS.items():
        assert getattr(got, field) == vocab[text]

    del vocab["<|eot_id|>"]
    vocab = {w: i for i, w in enumerate(vocab)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.save(str(tmp_path / "broken.json"))
    with pytest.raises(ConfigError, match="eot_id"):
        SpecialTokens.from_tokenizer(tmp_path / "broken.json")


def test_read_json_errors(tmp_path):
    with pytest.raises(ConfigError):
        read_json(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError):
        read_json(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ConfigError):
        read_json(tmp_path / "list.json")
    (tmp_path / "ok.json").write_text(json.dumps({"generation": GenerationConfig().to_dict()}))
    assert GenerationConfig.from_dict(read_json(tmp_path / "ok.json")["generation"]) == GenerationConfig()
