"""The PyTorch reference sampler (LLaDA-V ``generate_with_embeds`` semantics, batched) and Seer's step zero.

A tiny random LLaDA-V is built in the test; what is checked follows docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch"-4, not the code's own output:
commit counts per step, block order, suppression, batch == batch 1 under left padding, seeding, reuse of
step 0's logits, and the MLP statistics recomputed by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tiny_models import tiny_config
from torch import nn

from seer_export.models.llada import attention_mask, rope
from seer_export.models.mllm import DiffusionMLLM, left_pad_prompts, window_layout
from seer_export.reference.sampler import commit_top_k, generate, suppress_special
from seer_export.reference.seer import capture_mlp, seer_generate, step_zero
from seer_trt.contracts.config import GenerationConfig, SeerConfig, SpecialTokens
from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.geometry import IMAGE_PLACEHOLDER
from seer_trt.runtime.boundary import find_boundaries, find_end_by_probability

VOCAB = 40
SPECIAL = SpecialTokens(mask_id=39, endoftext_id=30, startoftext_id=31, eot_id=32, start_header_id=33, end_header_id=34)
N = 8


def tiny_model(seed: int = 0, weight_std: float = 4.0) -> DiffusionMLLM:
    """A 3-layer LLaDA-V with weights large enough that different positions and prompts predict differently."""
    cfg = tiny_config(vocab=VOCAB, layers=3)
    torch.manual_seed(seed)
    model = DiffusionMLLM(cfg).eval()
    with torch.no_grad():  # default init gives near-identical logits at every mask position: widen it
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.normal_(0.0, weight_std / p.shape[1] ** 0.5)
    return model


class Recorder(nn.Module):
    """Wraps the model: records every call's inputs and keeps the mask id out of the predictions.

    A random model can predict the mask id itself, which the LLaDA-V sampler would commit (see
    ``test_committed_mask_id_is_not_left_inside_the_window``); the other tests are about the schedule, so
    they take that choice away from the model.
    """

    def __init__(self, model: nn.Module, mask_id: int = SPECIAL.mask_id) -> None:
        super().__init__()
        self.inner = model
        self.mask_id = mask_id
        self.calls: list[dict[str, torch.Tensor]] = []

    def forward(self, prefix_embeds, gen_ids, segment_ids, position_ids):
        self.calls.append(dict(gen_ids=gen_ids.clone(), segment_ids=segment_ids.clone()))
        logits = self.inner(prefix_embeds, gen_ids, segment_ids, position_ids).clone()
        logits[..., self.mask_id] = float("-inf")
        return logits


@pytest.fixture(scope="module")
def model() -> DiffusionMLLM:
    return tiny_model()


@pytest.fixture(scope="module")
def prompts(model):
    """Left-padded batch of three prompts of lengths 4, 7 + image (5 features) and 2."""
    g = torch.Generator().manual_seed(1)
    pixels = torch.rand(1, 3, 16, 16, generator=g) * 2 - 1
    with torch.no_grad():
        rows = [
            model.embed_prompt([31, 1, 2, 3]),
            model.embed_prompt([31, 4, IMAGE_PLACEHOLDER, 5, 6, 7, 8], pixels),
            model.embed_prompt([31, 9]),
        ]
    assert [r.shape[0] for r in rows] == [4, 11, 2]
    return left_pad_prompts(rows)


def single(prompts, b: int):
    """Row b alone, without its left padding."""
    embeds, valid = prompts
    return embeds[b : b + 1, valid[b]], valid[b : b + 1, valid[b]]


def gen_config(**kw) -> GenerationConfig:
    return GenerationConfig(**{"gen_length": N, "steps": N, "block_length": N, **kw})


# --- small helpers ---------------------------------------------------------------------------------------------


def test_left_pad_prompts():
    a, b = torch.ones(2, 3), 2 * torch.ones(4, 3)
    embeds, valid = left_pad_prompts([a, b])
    assert embeds.shape == (2, 4, 3) and valid.dtype == torch.bool
    assert valid.tolist() == [[False, False, True, True], [True] * 4]
    assert (embeds[0, :2] == 0).all() and (embeds[0, 2:] == 1).all() and (embeds[1] == 2).all()


def test_window_layout_left_padding_and_kept():
    valid = torch.tensor([[False, False, True, True], [True, True, True, True], [False, False, False, True]])
    segment_ids, position_ids = window_layout(valid, torch.tensor([2, 3, 1]), 3)
    assert segment_ids.dtype == torch.int32  # graph contract (docs/DESIGN.md "Graphs and their contract")
    assert segment_ids.tolist() == [
        [0, 0, 1, 1, 1, 1, 0],  # padding, prompt, kept answer positions, dropped answer position
        [1, 1, 1, 1, 1, 1, 1],
        [0, 0, 0, 1, 1, 0, 0],
    ]
    real = segment_ids.bool()
    for b in range(3):  # positions count 0, 1, 2, ... over the real tokens of each row
        assert position_ids[b][real[b]].tolist() == list(range(int(real[b].sum())))


def test_commit_top_k_picks_k_per_row_ties_by_position():
    conf = torch.tensor([[0.5, 0.9, 0.5, 0.5, 0.1], [0.2] * 5, [-math.inf, 0.1, -math.inf, 0.3, 0.1]])
    got = commit_top_k(conf, torch.tensor([2, 3, 3]))
    assert got.tolist() == [
        [True, True, False, False, False],  # 0.9, then the first of the three 0.5
        [True, True, True, False, False],
        [False, True, False, True, True],  # the two 0.1 before any -inf
    ]
    assert commit_top_k(conf, torch.tensor([0, 0, 0])).sum() == 0
    assert commit_top_k(conf, torch.tensor([5, 5, 5])).all()


def test_commit_top_k_matches_sorting_reference():
    g = torch.Generator().manual_seed(0)
    conf = torch.randint(0, 4, (50, 9), generator=g).double()  # many ties
    k = torch.randint(0, 10, (50,), generator=g)
    got = commit_top_k(conf, k)
    assert (got.sum(1) == k).all()
    for b in range(50):
        order = sorted(range(9), key=lambda j: (-conf[b, j].item(), j))
        assert sorted(torch.nonzero(got[b]).flatten().tolist()) == sorted(order[: k[b]])


def test_suppress_special_only_touches_masked_positions():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, VOCAB, generator=g)
    logits[0, 1, SPECIAL.endoftext_id] = -math.inf  # already -inf at an unmasked position: must stay, not NaN
    logits[1, 2, 5] = -math.inf
    masked = torch.tensor([[True, False, True, False, False, True], [False, True, True, True, False, False]])
    before = logits.clone()
    out = suppress_special(logits, masked, SPECIAL)
    assert torch.equal(logits, before)  # input untouched
    assert not out.isnan().any()
    assert torch.equal(out[~masked], logits[~masked])
    ids = list(SPECIAL.suppressed_ids)
    others = [i for i in range(VOCAB) if i not in ids]
    assert (out[masked][:, ids] == -math.inf).all()
    assert torch.equal(out[masked][:, others], logits[masked][:, others])
    assert torch.isfinite(out[masked][:, SPECIAL.eot_id]).all()  # <|eot_id|> stays available


# --- generate ---------------------------------------------------------------------------------------------------


def test_no_mask_left_inside_kept_window_and_masks_past_it(model, prompts):
    embeds, valid = prompts
    rec = Recorder(model)
    kept = np.asarray([8, 5, 2])
    out = generate(rec, embeds, valid, gen_config(steps=8, block_length=4), SPECIAL, kept=kept)
    assert out.tokens.shape == (3, N)
    assert out.kept.tolist() == [8, 5, 2]
    assert out.steps.tolist() == [8, 5, 2]  # ceil(8 * L* / 8)
    assert len(rec.calls) == 8  # the batch runs its longest row's steps
    prompt_len = embeds.shape[1]
    for b, k in enumerate(kept):
        assert (out.tokens[b, :k] != SPECIAL.mask_id).all()
        assert (out.tokens[b, k:] == SPECIAL.mask_id).all()
        for call in rec.calls:  # the dropped positions are padding in every forward
            assert (call["segment_ids"][b, prompt_len + k :] == 0).all()
            assert (call["segment_ids"][b, prompt_len : prompt_len + k] == 1).all()


def test_one_token_per_step_with_one_block(model, prompts):
    embeds, valid = prompts
    rec = Recorder(model)
    out = generate(rec, embeds, valid, gen_config(), SPECIAL)
    assert len(rec.calls) == N
    states = [c["gen_ids"] for c in rec.calls] + [torch.as_tensor(out.tokens)]
    for t, x in enumerate(states):
        assert ((x == SPECIAL.mask_id).sum(1) == N - t).all()  # every row, one commit per step
    for before, after in zip(states[:-1], states[1:], strict=True):  # a committed token is never changed or re-masked
        done = before != SPECIAL.mask_id
        assert torch.equal(after[done], before[done])


@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
def test_left_block_is_finished_before_the_next_starts(model, prompts, remasking):
    embeds, valid = prompts
    rec = Recorder(model)
    out = generate(rec, embeds, valid, gen_config(steps=4, block_length=4, remasking=remasking), SPECIAL, seed=5)
    states = [c["gen_ids"] == SPECIAL.mask_id for c in rec.calls] + [torch.as_tensor(out.tokens) == SPECIAL.mask_id]
    assert len(states) == 5
    # steps 0-1 belong to block [0, 4), steps 2-3 to block [4, 8); 2 commits per step
    for t, block in enumerate([(0, 4), (0, 4), (4, 8), (4, 8)]):
        new = states[t] & ~states[t + 1]  # committed at step t
        assert (new.sum(1) == 2).all()
        assert not new[:, : block[0]].any() and not new[:, block[1] :].any()
    assert states[2][:, 4:].all() and not states[2][:, :4].any()  # block 2 untouched until block 1 is done
    assert not states[4].any()


def test_suppressed_ids_are_never_chosen(prompts):
    """The head strongly prefers endoftext, then startoftext, the headers, and only then <|eot_id|>."""
    model = tiny_model(seed=3)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 50.0  # a large, always positive unit in the residual stream
        model.lm_head.weight[:, 0] = 0.0
        preference = {
            SPECIAL.endoftext_id: 100,
            SPECIAL.startoftext_id: 90,
            SPECIAL.start_header_id: 80,
            SPECIAL.end_header_id: 70,
            SPECIAL.eot_id: 60,
            SPECIAL.mask_id: -100,
        }
        for idx, weight in preference.items():
            model.lm_head.weight[idx, 0] = float(weight)
        ids = torch.tensor([[31, 1, 2, 3], [31, 4, 5, 6]])
        embeds, valid = left_pad_prompts([model.embed_prompt(r.tolist()) for r in ids])
        # the test means something only if, unsuppressed, the model would pick endoftext everywhere
        seg, pos = window_layout(valid, torch.full((2,), N), N)
        raw = model(embeds, torch.full((2, N), SPECIAL.mask_id), seg, pos)
    assert (raw.argmax(-1) == SPECIAL.endoftext_id).all()
    for temperature, remasking in [(0.0, "low_confidence"), (1.0, "low_confidence"), (0.5, "random")]:
        gen = gen_config(steps=4, block_length=4, temperature=temperature, remasking=remasking)
        out = generate(model, embeds, valid, gen, SPECIAL, seed=1)
        assert not np.isin(out.tokens, SPECIAL.suppressed_ids).any()
        assert (out.tokens == SPECIAL.eot_id).all()  # the best id that is not suppressed


@pytest.mark.parametrize(
    ("temperature", "remasking"), [(0.0, "low_confidence"), (1.0, "low_confidence"), (0.0, "random"), (0.7, "random")]
)
def test_left_padded_batch_matches_batch_of_one(model, prompts, temperature, remasking):
    embeds, valid = prompts
    gen = gen_config(steps=4, block_length=4, temperature=temperature, remasking=remasking)
    kept = np.asarray([8, 5, 3])
    batch = generate(Recorder(model), embeds, valid, gen, SPECIAL, kept=kept, seed=7)
    per_row_seed = generate(Recorder(model), embeds, valid, gen, SPECIAL, kept=kept, seed=[7, 8, 9])
    for b in range(3):
        e, v = single(prompts, b)
        alone = generate(Recorder(model), e, v, gen, SPECIAL, kept=kept[b : b + 1], seed=7)
        np.testing.assert_array_equal(batch.tokens[b], alone.tokens[0])
        assert batch.steps[b] == alone.steps[0]
        alone = generate(Recorder(model), e, v, gen, SPECIAL, kept=kept[b : b + 1], seed=7 + b)
        np.testing.assert_array_equal(per_row_seed.tokens[b], alone.tokens[0])


def test_seed_determinism_and_variation(model, prompts):
    embeds, valid = prompts
    gen = gen_config(steps=4, block_length=4, temperature=1.0)
    a = generate(Recorder(model), embeds, valid, gen, SPECIAL, seed=0)
    b = generate(Recorder(model), embeds, valid, gen, SPECIAL, seed=0)
    c = generate(Recorder(model), embeds, valid, gen, SPECIAL, seed=1)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert (a.tokens != c.tokens).any()
    greedy = gen_config(steps=4, block_length=4)
    d = generate(Recorder(model), embeds, valid, greedy, SPECIAL, seed=0)
    e = generate(Recorder(model), embeds, valid, greedy, SPECIAL, seed=1)
    np.testing.assert_array_equal(d.tokens, e.tokens)  # greedy + low_confidence draws no noise


@pytest.mark.parametrize("kept", [None, np.asarray([8, 4, 6])])
def test_step0_logits_replace_the_first_forward(model, prompts, kept):
    embeds, valid = prompts
    gen = gen_config(steps=4, block_length=4)
    rec = Recorder(model)
    seg, pos = window_layout(valid, torch.full((3,), N), N)
    step0 = rec(embeds, torch.full((3, N), SPECIAL.mask_id), seg, pos)  # the full-window step-zero logits
    rec.calls.clear()
    reused = generate(rec, embeds, valid, gen, SPECIAL, kept=kept, step0_logits=step0)
    steps = int(reused.steps.max())
    assert len(rec.calls) == steps - 1
    rec.calls.clear()
    fresh = generate(rec, embeds, valid, gen, SPECIAL, kept=kept)
    assert len(rec.calls) == steps
    if kept is None:  # same window, same logits at step 0: same answer
        np.testing.assert_array_equal(reused.tokens, fresh.tokens)


def count_calls(model: DiffusionMLLM) -> tuple[dict[str, int], list]:
    counts: dict[str, int] = {}
    modules = {f"layer{i}": layer for i, layer in enumerate(model.model.layers)}
    modules.update(norm=model.model.norm, lm_head=model.lm_head)
    handles = []
    for name, module in modules.items():
        counts[name] = 0
        handles.append(
            module.register_forward_hook(lambda m, i, o, name=name: counts.__setitem__(name, counts[name] + 1))
        )
    return counts, handles


def test_step_zero_early_exit_runs_only_up_to_the_probe_layer(model, prompts):
    embeds, valid = prompts
    counts, handles = count_calls(model)
    try:
        early = step_zero(model, embeds, valid, N, SPECIAL, layers=(1,), full_depth=False)
        assert counts == {"layer0": 1, "layer1": 1, "layer2": 0, "norm": 0, "lm_head": 0}
        full = step_zero(model, embeds, valid, N, SPECIAL, layers=(1,), full_depth=True)
        assert counts == {"layer0": 2, "layer1": 2, "layer2": 1, "norm": 1, "lm_head": 1}
    finally:
        for h in handles:
            h.remove()
    assert early.layers == full.layers == (1,)
    assert early.abs_below.shape == early.gate_negative.shape == (3, 1, N)
    np.testing.assert_array_equal(early.abs_below, full.abs_below)
    np.testing.assert_array_equal(early.gate_negative, full.gate_negative)
    assert early.p_end is None and early.logits is None
    assert full.p_end.shape == (3, N) and full.logits.shape == (3, N, VOCAB)
    p = torch.softmax(full.logits.float(), -1)
    np.testing.assert_allclose(full.p_end, (p[..., SPECIAL.eot_id] + p[..., SPECIAL.endoftext_id]).numpy(), rtol=1e-6)
    assert ((full.p_end >= 0) & (full.p_end <= 1 + 1e-6)).all()


@torch.no_grad()
def manual_mlp(model: DiffusionMLLM, embeds: torch.Tensor, valid: torch.Tensor, layer: int):
    """The step-zero SwiGLU intermediate h and gate pre-activation of ``layer``, answer positions only."""
    batch, prompt_len = embeds.shape[:2]
    seg, pos = window_layout(valid, torch.full((batch,), N), N)
    masks = torch.full((batch, N), SPECIAL.mask_id)
    x = torch.cat([embeds, model.model.embed_tokens(masks)], dim=1)
    mask = attention_mask(seg)
    cos, sin = rope(pos, model.config.text.head_dim, model.config.text.rope_theta, x.dtype)
    for block in model.model.layers[:layer]:
        x = block(x, mask, cos, sin)
    block = model.model.layers[layer]
    x = x + block.self_attn(block.input_layernorm(x), mask, cos, sin)
    y = block.post_attention_layernorm(x)
    gate = block.mlp.gate_proj(y)
    h = F.silu(gate) * block.mlp.up_proj(y)
    return h[:, prompt_len:], gate[:, prompt_len:]


@pytest.mark.parametrize("layer", [0, 2])
def test_statistics_match_a_manual_computation(model, prompts, layer):
    embeds, valid = prompts
    h, gate = manual_mlp(model, embeds, valid, layer)
    # a threshold in the middle of |h|, at a wide gap between two values, so rounding cannot move a unit across
    values = h.abs().flatten().sort().values
    lo, hi = int(0.4 * len(values)), int(0.6 * len(values))
    k = lo + int(torch.argmax(values[lo + 1 : hi] - values[lo : hi - 1]))
    tau = float((values[k] + values[k + 1]) / 2)
    zero = step_zero(model, embeds, valid, N, SPECIAL, layers=(layer,), tau_abs=tau, full_depth=False)
    want_abs = (h.abs() < tau).float().mean(-1).numpy()  # [B, N]
    want_neg = (gate < 0).float().mean(-1).numpy()
    assert 0.2 < want_abs.mean() < 0.8  # the check is not trivially all-0 or all-1
    np.testing.assert_allclose(zero.abs_below[:, 0], want_abs, atol=1e-7)
    np.testing.assert_allclose(zero.gate_negative[:, 0], want_neg, atol=1e-7)
    seer = SeerConfig(probe_layer=layer, statistic="abs_below")
    np.testing.assert_array_equal(zero.profile(seer), zero.abs_below[:, 0])
    np.testing.assert_array_equal(zero.profile(seer.replace(statistic="gate_negative")), zero.gate_negative[:, 0])


def test_step_zero_rows_do_not_depend_on_the_batch(model, prompts):
    embeds, valid = prompts
    batch = step_zero(model, embeds, valid, N, SPECIAL, layers=(0, 2))
    for b in range(3):
        alone = step_zero(model, *single(prompts, b), N, SPECIAL, layers=(0, 2))
        np.testing.assert_allclose(batch.gate_negative[b], alone.gate_negative[0], atol=1.5 / 64)
        np.testing.assert_allclose(batch.p_end[b], alone.p_end[0], atol=1e-5)


def test_capture_mlp_removes_its_hooks(model, prompts):
    embeds, valid = prompts
    with capture_mlp(model, (0, 1)) as seen:
        seg, pos = window_layout(valid, torch.full((3,), N), N)
        model(embeds, torch.full((3, N), SPECIAL.mask_id), seg, pos)
    assert seen[0]["h"].shape == (3, embeds.shape[1] + N, 64) and seen[1]["gate"].shape == seen[1]["h"].shape
    for layer in model.model.layers:
        assert not layer.mlp.gate_proj._forward_hooks and not layer.mlp.down_proj._forward_pre_hooks


def test_seer_generate_end_token_signal_reuses_step_zero(model, prompts):
    embeds, valid = prompts
    gen = gen_config(steps=4, block_length=4)
    # every p(end) exceeds a tiny threshold: the end is at 0, L* = 0 + 1 + margin
    seer = SeerConfig(signal="end_token_prob", threshold=1e-9, margin=2)
    counts, handles = count_calls(model)
    try:
        out, profile = seer_generate(model, embeds, valid, gen, SPECIAL, seer)
    finally:
        for h in handles:
            h.remove()
    assert out.kept.tolist() == [3, 3, 3] == find_end_by_probability(profile, 1e-9, 2).tolist()
    assert out.steps.tolist() == [math.ceil(4 * 3 / N)] * 3
    assert counts["lm_head"] == 2  # the full-depth step zero doubles as step 0; one more step on the window
    assert (out.tokens[:, 3:] == SPECIAL.mask_id).all()
    zero = step_zero(model, embeds, valid, N, SPECIAL)
    np.testing.assert_array_equal(profile, zero.p_end)
    want = generate(model, embeds, valid, gen, SPECIAL, kept=out.kept, step0_logits=zero.logits)
    np.testing.assert_array_equal(out.tokens, want.tokens)


def test_seer_generate_sparsity_signal_exits_early(model, prompts):
    embeds, valid = prompts
    gen = gen_config(steps=4, block_length=4)
    seer = SeerConfig(probe_layer=0, statistic="gate_negative", tau_jump=0.01, gamma=10.0)
    counts, handles = count_calls(model)
    try:
        out, profile = seer_generate(model, embeds, valid, gen, SPECIAL, seer)
    finally:
        for h in handles:
            h.remove()
    zero = step_zero(model, embeds, valid, N, SPECIAL, layers=(0,), full_depth=False)
    np.testing.assert_array_equal(profile, zero.gate_negative[:, 0])
    kept = find_boundaries(profile, 0.01, 10.0, 3, "up", 1)
    assert out.kept.tolist() == kept.tolist()
    assert (kept < N).any()  # the truncated path is exercised
    steps = int(out.steps.max())
    assert counts["layer0"] == steps + 1  # the early-exit step zero ran layer 0 only
    assert counts["layer1"] == counts["layer2"] == counts["lm_head"] == steps


def test_seer_generate_probe_signal_exits_early_on_the_residual_stream(model, prompts):
    """A probe at layer 1: step zero runs layers 0-1 only; its profile is sigmoid(w . x / rms(x) + b) of the
    residual stream after layer 1, computed here by hand from a hook."""
    embeds, valid = prompts
    gen = gen_config(steps=4, block_length=4)
    rng = np.random.default_rng(0)
    seer = SeerConfig(signal="probe", probe_layer=1, probe_weights=tuple(rng.normal(size=32)), probe_bias=0.5,
                      threshold=0.4, margin=1)  # fmt: skip
    seen = {}
    hook = model.model.layers[1].register_forward_hook(lambda m, i, o: seen.setdefault("x", o))
    counts, handles = count_calls(model)
    try:
        out, profile = seer_generate(model, embeds, valid, gen, SPECIAL, seer)
    finally:
        hook.remove()
        for h in handles:
            h.remove()
    x = seen["x"][:, embeds.shape[1] :].double()  # the step-zero pass came first: its layer-1 output
    x = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    want = torch.sigmoid(x @ torch.tensor(seer.probe_weights, dtype=torch.float64) + 0.5).numpy()
    np.testing.assert_allclose(profile, want, atol=1e-5)
    assert out.kept.tolist() == find_end_by_probability(profile, 0.4, 1).tolist()
    steps = int(out.steps.max())
    assert counts["layer2"] == counts["lm_head"] == steps and counts["layer1"] == steps + 1  # no head at step zero
    zero = step_zero(model, embeds, valid, N, SPECIAL, layers=(1,), full_depth=False, residual=True)
    np.testing.assert_array_equal(zero.profile(seer), profile)
    with pytest.raises(ConfigError, match="residual"):
        step_zero(model, embeds, valid, N, SPECIAL, layers=(1,), full_depth=False).profile(seer)


# --- early stopping (LLaDA-V's stopping_criteria=['<|eot_id|>']) -------------------------------------------------


class EotAt(Recorder):
    """Predicts ``<|eot_id|>`` nowhere, except with near-certainty at ``plan[call][row]``: a position, None, or a
    negative -p for the first still-masked position at or after p."""

    def __init__(self, model: nn.Module, plan: dict[int, list[int | None]]) -> None:
        super().__init__(model)
        self.plan = plan

    def forward(self, prefix_embeds, gen_ids, segment_ids, position_ids):
        logits = super().forward(prefix_embeds, gen_ids, segment_ids, position_ids)
        logits[..., SPECIAL.eot_id] = float("-inf")
        for row, pos in enumerate(self.plan.get(len(self.calls) - 1, [])):
            if pos is not None and pos < 0:
                pos = int(next(j for j in range(-pos, N) if gen_ids[row, j] == SPECIAL.mask_id))
                self.chosen = pos
            if pos is not None:
                logits[row, pos, SPECIAL.eot_id] = 1e4
        return logits


def test_early_stop_commits_only_before_the_first_eot_and_stops(model, prompts):
    embeds, valid = prompts
    # step 0: row 0 commits <|eot_id|> at 5, row 1 at 2; row 2 never predicts it
    rec = EotAt(model, {0: [5, 2, None]})
    out = generate(rec, embeds, valid, gen_config(), SPECIAL, early_stop=True)
    assert out.steps.tolist() == [1 + 5, 1 + 2, N]  # the eot's step, then one commit per step before it
    assert len(rec.calls) == N  # the batch runs while any row is live
    tokens = out.tokens
    assert tokens[0, 5] == SPECIAL.eot_id and (tokens[0, :5] != SPECIAL.mask_id).all()
    assert (tokens[0, 6:] == SPECIAL.mask_id).all()  # nothing after the stop commits
    assert tokens[1, 2] == SPECIAL.eot_id and (tokens[1, 3:] == SPECIAL.mask_id).all()
    assert (tokens[2] != SPECIAL.mask_id).all() and SPECIAL.eot_id not in tokens[2]
    for b in range(3):  # each row as if alone (upstream is batch 1)
        plan = {0: [[5, 2, None][b]]}
        alone = generate(EotAt(model, plan), *single(prompts, b), gen_config(), SPECIAL, early_stop=True)
        np.testing.assert_array_equal(alone.tokens[0], tokens[b])
        assert alone.steps[0] == out.steps[b]
    padded = generate(EotAt(model, {0: [5, 2, None]}), embeds, valid, gen_config(), SPECIAL)
    assert padded.steps.tolist() == [N] * 3 and (padded.tokens != SPECIAL.mask_id).all()


def test_early_stop_moves_to_an_earlier_eot_and_commits_fewer_than_k(model, prompts):
    embeds, valid = prompts
    e, v = single(prompts, 0)
    # two tokens per step; step 0 commits <|eot_id|> at 6 (and one more), step 1 one at a masked p in [2, 6)
    rec = EotAt(model, {0: [6], 1: [-2]})
    out = generate(rec, e, v, gen_config(steps=N // 2), SPECIAL, early_stop=True)
    row, p = out.tokens[0], rec.chosen
    assert 2 <= p < 6 and row[6] == SPECIAL.eot_id and row[p] == SPECIAL.eot_id
    assert (row[:p] != SPECIAL.mask_id).all()  # the answer before the first eot is complete
    assert row[7] == SPECIAL.mask_id  # past the first stop: never eligible
    after_step_1 = rec.calls[2]["gen_ids"][0].numpy()
    assert (row[p + 1 :] == after_step_1[p + 1 :]).all()  # past the moved stop: nothing more commits
    committed = [int((c["gen_ids"] != SPECIAL.mask_id).sum()) for c in rec.calls] + [
        int((row != SPECIAL.mask_id).sum())
    ]
    assert committed[:3] == [0, 2, 4]  # two per step while enough positions are eligible
    left = p - int((rec.calls[2]["gen_ids"][0, :p] != SPECIAL.mask_id).sum())  # masked before p after step 1
    assert out.steps.tolist() == [2 + -(-left // 2)] and len(rec.calls) == out.steps[0]
    assert committed[-1] == 4 + left  # the last step commits fewer than 2 when one position is left
