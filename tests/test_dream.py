"""The Dream family (docs/DESIGN.md "Model families"): Dream-v0-Instruct-7B (text only) and LaViDa-Dream. A random
checkpoint under Hugging Face's names (grouped-query attention, q/k/v biases) loads strictly, and only as its own
``--model``. The logits are shifted: position i is predicted from the hidden state of the position before it in its
row, in left-padded and packed layouts, with or without the prompt cache. Dream's schedule and its scores match
Dream's generation code as written (torch's float32 linspace included). The export passes parity, and the runtime's
tokens equal the PyTorch reference under Dream's own loop, early stop and Seer."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from adapter_checks import export_of, runtime_equals_reference, samples_with_images
from tiny_models import tiny_dream_config

from seer_export.models import registry
from seer_export.models.families import FAMILIES, special_tokens
from seer_export.models.llada import predecessors
from seer_export.models.loading import INDEX_FILE, load_model
from seer_export.models.mllm import DiffusionMLLM, left_pad_prompts, window_layout
from seer_export.models.random_checkpoint import write_random_checkpoint
from seer_export.reference.fixture import build_tokenizer
from seer_trt.contracts.config import GenerationConfig
from seer_trt.contracts.errors import CheckpointError, ConfigError

VOCAB = build_tokenizer("dream").get_vocab_size()
SIZES = [(12, 40), (50, 30), (20, 20), (33, 90), (90, 33), (64, 64), (7, 70), (100, 45), (28, 28), (40, 120)]


def _write(folder: Path, family: str) -> Path:
    return write_random_checkpoint(folder, tiny_dream_config(VOCAB, family=family), dtype=torch.float32, seed=9,
                                   gain=4.0, shard_bytes=40_000)  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return _write(tmp_path_factory.mktemp("dream") / "ckpt", "dream")


@pytest.fixture(scope="module")
def lavida_checkpoint(tmp_path_factory) -> Path:
    return _write(tmp_path_factory.mktemp("lavida-dream") / "ckpt", "lavida-dream")


# --- loading ---------------------------------------------------------------------------------------------------------


def test_checkpoint_is_stored_under_dreams_names_and_loads_only_as_dream(checkpoint, tmp_path):
    names = set(json.loads((checkpoint / INDEX_FILE).read_text())["weight_map"])
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
            "model.layers.2.self_attn.q_proj.bias", "model.layers.2.self_attn.k_proj.bias",
            "model.layers.2.self_attn.v_proj.bias", "model.layers.0.mlp.gate_proj.weight"} <= names  # fmt: skip
    assert "model.layers.0.self_attn.o_proj.bias" not in names and not any("vision" in n for n in names)
    data = json.loads((checkpoint / "config.json").read_text())
    assert data["model_type"] == "Dream" and data["num_key_value_heads"] == 2
    special = special_tokens("dream", checkpoint / "tokenizer.json")
    assert data["mask_token_id"] == special.mask_id and data["eos_token_id"] == special.endoftext_id

    model, _ = registry.load("dream", checkpoint)
    assert (model.config.family, model.config.naming, model.config.shift_logits) == ("dream", "llada-v", True)
    k = model.model.layers[0].self_attn.k_proj
    assert k.weight.shape == (2 * 8, 32) and k.bias is not None  # K/V stay grouped: 2 heads of 8
    # Dream's own config.json: Qwen2's keys, model_type "Dream", no product key, no attention_bias key (Qwen2's
    # attention always has q/k/v biases): the family fills in the biases, its loop and its system prompt (none)
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in checkpoint.iterdir():
        (bare / f.name).symlink_to(f)
    (bare / "config.json").unlink()
    real = {k: v for k, v in data.items() if k not in ("family", "qkv_bias", "generation", "system_prompt")}
    (bare / "config.json").write_text(json.dumps(real))
    cfg = load_model(bare).config
    assert (cfg.family, cfg.text.qkv_bias, cfg.generation) == ("dream", True, FAMILIES["dream"].generation)
    assert cfg.text == model.config.text and cfg.system_prompt is None

    with pytest.raises(ConfigError, match="holds a dream checkpoint.*--model dream"):
        registry.load("llada-v", checkpoint)
    with pytest.raises(ConfigError, match="holds a llada-v checkpoint.*--model llada-v"):
        registry.load("dream", registry.FIXTURE_DIR)


def test_options_the_model_does_not_implement_are_refused(checkpoint):
    """Qwen2's config keys that would change the computation are refused, not dropped: RoPE scaling, sliding windows,
    another activation; Dream-v0's own values (null, false, silu) load."""
    from seer_export.models.config import DiffusionMLLMConfig

    data = {k: v for k, v in json.loads((checkpoint / "config.json").read_text()).items() if k != "family"}
    fine = {"rope_scaling": None, "use_sliding_window": False, "sliding_window": 4096, "hidden_act": "silu"}
    assert DiffusionMLLMConfig.from_dict({**data, **fine}).family == "dream"
    for bad in ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, {"use_sliding_window": True},
                {"hidden_act": "gelu"}):  # fmt: skip
        with pytest.raises(ConfigError, match=next(iter(bad))):
            DiffusionMLLMConfig.from_dict({**data, **bad})


def test_a_missing_bias_is_named_as_the_checkpoint_names_it(checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    broken.mkdir()
    for f in checkpoint.iterdir():
        if not f.name.endswith(".safetensors"):
            (broken / f.name).symlink_to(f)
    index = json.loads((checkpoint / INDEX_FILE).read_text())
    gone = "model.layers.1.self_attn.v_proj.bias"
    for shard in set(index["weight_map"].values()):
        tensors = load_file(str(checkpoint / shard))
        tensors.pop(gone, None)
        save_file(tensors, str(broken / shard))
    with pytest.raises(CheckpointError, match=gone.replace(".", r"\.")):
        registry.load("dream", broken)


def test_lavida_dream_loads_with_lavidas_tiles(lavida_checkpoint):
    model, _ = registry.load("lavida-dream", lavida_checkpoint)
    cfg = model.config
    assert (cfg.family, cfg.feature_side, cfg.has_tower, cfg.shift_logits) == ("lavida-dream", 4, True, True)
    assert cfg.generation.remasking == "topk_margin" and cfg.generation.schedule == "dream"
    data = json.loads((lavida_checkpoint / "config.json").read_text())
    assert data["model_type"] == "llava_dream"
    del data["family"]
    assert type(cfg).from_dict(data).family == "lavida-dream"


# --- shifted logits --------------------------------------------------------------------------------------------------


def test_each_position_is_predicted_from_the_one_before_it_in_its_row():
    seg = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 2, 2, 1, 2, 2]])  # left-padded; packed-like interleaving
    assert predecessors(seg, 4).tolist() == [[3, 4, 5], [1, 3, 5]]
    assert predecessors(seg, 0).tolist()[0][2] == 2  # a row's first position keeps its own (Dream's logits[:, :1])


def _prompts(model: DiffusionMLLM, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return left_pad_prompts([model.model.embed_tokens(torch.randint(0, VOCAB - 6, (n,), generator=g)) for n in lengths])


def test_logits_are_dreams_shift_of_the_full_sequence(checkpoint):
    """Dream's generation code runs the model over prompt + answer and shifts: logits = cat(l[:, :1], l[:, :-1]);
    answer position j then reads the full pass's position P - 1 + j (left padding leaves P - 1 each row's last)."""
    model = load_model(checkpoint)
    prefix, valid = _prompts(model, [5, 3])
    gen_ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(4))
    seg, pos = window_layout(valid, torch.tensor([6, 6]), 6)
    with torch.no_grad():
        embeds = torch.cat([prefix, model.model.embed_tokens(gen_ids)], 1)
        full = model.lm_head(model.hidden_states(embeds, seg, pos))
        shifted = torch.cat([full[:, :1], full[:, :-1]], 1)[:, 5:]
        torch.testing.assert_close(model(prefix, gen_ids, seg, pos), shifted.float())
        unshifted = dataclasses.replace(model.config, family="lavida-llada", naming="llada-v")
        assert not torch.allclose(DiffusionMLLM(unshifted).eval()(prefix, gen_ids, seg, pos), shifted.float())


def test_a_cached_step_computes_the_last_prompt_position_and_equals_the_exact_step(checkpoint):
    """The cache holds the prompt but its last position, whose state predicts the first answer position; a cached
    step against a snapshot of the same answer state equals the exact forward."""
    model = load_model(checkpoint)
    prefix, valid = _prompts(model, [5, 3])
    gen_ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(4))
    seg, pos = window_layout(valid, torch.tensor([6, 4]), 6)
    layers = len(model.model.layers)
    with torch.no_grad():
        empty = [(torch.zeros(1, 2, 2, 0, 8), torch.zeros(1, 2, 2, 0, 8))] * layers
        exact, present = model.forward_cached(prefix, gen_ids, seg, pos, torch.ones(1), empty)
        past = [(k[None, :, :, :4], v[None, :, :, :4]) for k, v in present]
        cached, _ = model.forward_cached(prefix[:, 4:], gen_ids, seg, pos, torch.ones(1), past)
    torch.testing.assert_close(exact, model(prefix, gen_ids, seg, pos), rtol=1e-4, atol=1e-4)  # two attention paths
    valid_answer = seg[:, 5:] != 0  # padding positions compute nothing anyone reads
    torch.testing.assert_close(cached[valid_answer], exact[valid_answer], rtol=1e-4, atol=1e-4)


# --- Dream's loop, as its generation code writes it -------------------------------------------------------------


def test_dreams_schedule_matches_its_float32_timesteps():
    from seer_trt.runtime.decoding import dream_transfer, linspace32
    from seer_trt.runtime.schedule import plan_schedule

    for n in range(1, 1200, 7):
        np.testing.assert_array_equal(linspace32(1.0, 1e-3, n), torch.linspace(1, 1e-3, n).numpy())
    for masks, steps in [(16, 16), (256, 256), (512, 512), (100, 37), (7, 3), (64, 1), (300, 299)]:
        t, left, want = torch.linspace(1, 1e-3, steps + 1), torch.tensor(masks), []
        for i in range(steps):  # diffusion_generate's count, as it computes it (a float32 tensor times an int64 one)
            k = int(left * (1 - t[i + 1] / t[i])) if i < steps - 1 else int(left)
            want.append(k)
            left = left - k
        assert dream_transfer(masks, steps) == want and sum(want) == masks
    gen = GenerationConfig(gen_length=64, steps=64, block_length=64, schedule="dream")
    s = plan_schedule(gen, np.array([64, 20]))
    assert s.steps.tolist() == [64, 20] and s.transfer[1, :20].tolist() == dream_transfer(20, 20)
    assert (s.block_end[1] == 20).all()
    # the count comes from the masks still open, as diffusion_generate recomputes it every step: a step that committed
    # the mask id itself (a random model's prediction, now and then) leaves that position to a later step
    t = torch.linspace(1, 1e-3, 21)
    for step, open_masks in ((0, 20), (5, 17), (12, 9), (18, 4)):
        want = int(torch.tensor(open_masks) * (1 - t[step + 1] / t[step]))
        assert int(s.count(step, np.array([64, open_masks]))[1]) == want
    assert s.count(19, np.array([64, 3]))[1] == 3 and s.count(25, np.array([5, 3]))[1] == 0  # all left; past its end
    with pytest.raises(ConfigError, match="one block"):
        GenerationConfig(gen_length=64, steps=64, block_length=32, schedule="dream")
    with pytest.raises(ConfigError, match="decoding 'fixed'"):
        GenerationConfig(remasking="entropy", decoding="threshold:0.9")


def test_dreams_scores_match_between_the_runtime_and_the_reference():
    from seer_export.reference.sampler import dream_score as torch_score
    from seer_trt.runtime.decoding import dream_score

    p = torch.softmax(torch.randn(3, 5, 40, generator=torch.Generator().manual_seed(2)) * 3, -1).double()
    for kind in ("topk_margin", "entropy"):
        np.testing.assert_allclose(dream_score(p.numpy(), kind), torch_score(p, kind).numpy(), rtol=1e-12)
    top = torch.sort(p, -1, descending=True).values
    np.testing.assert_allclose(dream_score(p.numpy(), "topk_margin"), (top[..., 0] - top[..., 1]).numpy())
    np.testing.assert_allclose(dream_score(p.numpy(), "entropy"), (p * torch.log(p + 1e-10)).sum(-1).numpy())


def test_the_graphs_scores_order_positions_as_dreams_formulas():
    """``denoise``'s fp32 log(p1 - p2) and sum p log(p + 1e-10) against Dream's formulas in float64, on logits of a
    random model's spread and sharper: close, and the same order of every row's positions."""
    from seer_export.onnx.modules import greedy
    from seer_export.reference.sampler import dream_score
    from seer_trt.contracts.config import SpecialTokens

    special = SpecialTokens(1, 2, 3, 4, 5, 6)
    g = torch.Generator().manual_seed(0)
    for scale in (1.0, 4.0, 12.0):
        logits = torch.randn(4, 64, 300, generator=g) * scale
        _, _, _, log_margin, neg_entropy = greedy(logits, torch.ones(4, 64, dtype=torch.long), special, (), True)
        p = torch.softmax(logits.double(), -1)
        for got, kind in ((log_margin.double().exp(), "topk_margin"), (neg_entropy.double(), "entropy")):
            want = dream_score(p, kind)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-12)
            order = torch.argsort(-got, dim=1, stable=True)
            assert torch.equal(order, torch.argsort(-want, dim=1, stable=True)), (scale, kind)
    tie = torch.zeros(1, 1, 8)
    tie[..., :2] = 5.0  # two equal best logits: margin 0 ranks last, finitely (-inf reads as not eligible)
    assert torch.isfinite(greedy(tie, torch.ones(1, 1, dtype=torch.long), special, (), True)[3]).all()


def test_dreams_own_loop_is_n_steps_in_one_block():
    for name, score in (("dream", "entropy"), ("lavida-dream", "topk_margin")):
        g = FAMILIES[name].own_loop(48)
        assert (g.gen_length, g.steps, g.block_length, g.schedule, g.remasking) == (48, 48, 48, "dream", score)


# --- the export and the runtime -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def export(checkpoint, tmp_path_factory):
    return export_of("dream", checkpoint, tmp_path_factory.mktemp("dream-export") / "engines")


@pytest.mark.slow
def test_export_passes_parity_and_records_the_shift(export):
    out, manifest = export
    assert manifest.parity.status == "passed", manifest.parity.note
    assert (manifest.model.family, manifest.model.logit_shift, manifest.vision.encoder) == ("dream", 1, "none")
    assert "vision" not in manifest.graphs and "denoise_logits" not in manifest.graphs
    outputs = [t.name for t in manifest.graph("denoise").spec.outputs]
    assert outputs[:5] == ["x0", "log_confidence", "p_end", "log_margin", "neg_entropy"]  # Dream's scores, in the graph
    past = [t for t in manifest.graph("denoise").spec.inputs if t.name.startswith("past_key_values.")]
    assert past and all(t.shape[2] == 2 for t in past)  # the small K/V: 2 grouped heads, not 4


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["dream_loop", "early_stop", "seer", "seer_end_tail"])
def test_runtime_tokens_equal_the_pytorch_reference(export, checkpoint, mode):
    from seer_export.reference.fixture import TaskEncoder
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.runtime.request import Request

    out, manifest = export
    model = load_model(checkpoint)
    tail = manifest.seer.replace(tail=1.0, tail_token="endoftext")  # Dream's loop pads with <|endoftext|>
    pipe = SeerPipeline.from_manifest(out, seer=tail if mode == "seer_end_tail" else None)
    mode = "seer" if mode == "seer_end_tail" else mode
    gen = pipe.settings(gen_length=16)
    assert gen == FAMILIES["dream"].own_loop(16)
    refused = pipe.generate([Request("count to 3 .", np.zeros((8, 8, 3), dtype=np.uint8))])[0]
    assert not refused.ok and "text-only model" in refused.error
    samples = [s for s in samples_with_images(SIZES, 7, 4) if s.image is None]
    ref = runtime_equals_reference(pipe, manifest, model, TaskEncoder(checkpoint, model.config), samples, gen, mode)
    pipe.close()
    if mode == "dream_loop":
        assert set(ref.steps.tolist()) == {16}
    if mode == "seer":
        assert min(ref.kept) < gen.gen_length


@pytest.mark.slow
def test_the_cache_keeps_each_rows_last_prompt_position_live(export):
    """Through the exported graph, refreshed padded and packed: a cached step against the snapshots taken at the same
    answer state gives the refresh's predictions; a snapshot holds its row's prefix without its last position, which
    the cached step computes live."""
    from seer_trt.runtime.kv_cache import ONE, CallBuffers, KVPool, no_cache
    from seer_trt.runtime.layout import rows_cached, rows_packed, rows_padded
    from seer_trt.runtime.pipeline import SeerPipeline

    out, manifest = export
    pipe = SeerPipeline.from_manifest(out)
    prompts = [pipe.encode(q).embeds for q in ("a b c d", "a b", "c")]
    positions = [np.arange(len(p)) for p in prompts]
    lengths = [len(p) for p in prompts]
    kept = np.array([6, 4, 5])
    spec = pipe.backend.spec("denoise")
    mask = manifest.special_tokens.mask_id
    x = np.random.default_rng(0).integers(0, VOCAB - 6, (3, 6))
    pool = KVPool(pipe.backend.memory, spec, 2**28)
    buffers = CallBuffers(pool, 4)
    for layout in (rows_padded(prompts, positions, lengths, kept, max(lengths), 6),
                   rows_packed(prompts, positions, lengths, kept)):  # fmt: skip
        feeds = {"prefix_embeds": layout.prefix_embeds, "gen_ids": layout.gen_ids(x, mask),
                 "segment_ids": layout.segment_ids, "position_ids": layout.position_ids, **no_cache(spec, layout.gen_shape[0])}  # fmt: skip
        present = buffers.present_into(layout.gen_shape[0], layout.prefix_embeds.shape[1])
        fresh = pipe.backend.run("denoise", feeds, ["x0"], into=present)["x0"].copy()
        slots = [pool.reserve(n - 1, 1) for n in lengths]  # the last prefix position stays out of the snapshot
        for i, slot in enumerate(slots):
            pool.store(slot, 0, present, int(layout.prefix_at[0][i]), int(layout.prefix_at[1][i]))
        past_len = max(lengths) - 1
        cached = rows_cached(prompts, positions, lengths, kept, past_len, 6, shifted=True)
        assert cached.prefix_embeds.shape[1] == 1  # each row's last prompt position, computed live
        buffers.begin_step()
        handle, order = buffers.past_call([0, 1, 2], 1, past_len)
        assert order == [0, 1, 2]  # a new buffer: the rows in their order
        past = buffers.past_feeds(handle, [(i, slot, (0,)) for i, slot in enumerate(slots)])
        got = pipe.backend.run("denoise", {"prefix_embeds": cached.prefix_embeds, "gen_ids": cached.gen_ids(x, mask),
                                           "segment_ids": cached.segment_ids, "position_ids": cached.position_ids,
                                           "past_weights": ONE, **past}, ["x0"])["x0"]  # fmt: skip
        np.testing.assert_array_equal(cached.gather(got, (3, 6), -1), layout.gather(fresh, (3, 6), -1))
        for slot in slots:
            pool.release(slot)
    buffers.close()
    pipe.close()


@pytest.fixture(scope="module")
def lavida_export(lavida_checkpoint, tmp_path_factory):
    return export_of("lavida-dream", lavida_checkpoint, tmp_path_factory.mktemp("lavida-dream-export") / "engines")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["dream_loop", "seer"])
def test_lavida_dream_tokens_equal_the_pytorch_reference_with_images(lavida_export, lavida_checkpoint, mode):
    """40 held-out prompts, 13 with an image of LaViDa's grids; LaViDa-Dream's loop ranks by top-1 minus top-2."""
    from seer_export.reference.fixture import TaskEncoder
    from seer_trt.runtime.pipeline import SeerPipeline

    out, manifest = lavida_export
    assert manifest.parity.status == "passed", manifest.parity.note
    assert (manifest.model.logit_shift, manifest.vision.encoder, manifest.vision.tokens_per_tile) == (1, "siglip", 16)
    model = load_model(lavida_checkpoint)
    pipe = SeerPipeline.from_manifest(out)
    gen = pipe.settings(gen_length=16)
    assert gen == FAMILIES["lavida-dream"].own_loop(16) and gen.remasking == "topk_margin"
    samples = samples_with_images(SIZES, 7, 4)
    enc = TaskEncoder(lavida_checkpoint, model.config)
    ref = runtime_equals_reference(pipe, manifest, model, enc, samples, gen, mode)
    pipe.close()
    if mode == "seer":
        assert min(ref.kept) < gen.gen_length


@pytest.mark.slow
def test_triton_repositories_serve_both_adapters(export, lavida_export, tmp_path):
    from adapter_checks import serves_in_triton_repositories

    serves_in_triton_repositories(*export, "denoise", tmp_path / "dream")
    serves_in_triton_repositories(*lavida_export, "vision", tmp_path / "lavida-dream")


@pytest.mark.slow
def test_seer_calibrate_runs_on_the_text_only_adapter(checkpoint, tmp_path):
    """On the text tasks (a text-only model's config names its task family), step zero read one position back."""
    from adapter_checks import calibrates

    text = tmp_path / "ckpt"
    text.mkdir()
    for f in checkpoint.iterdir():
        (text / f.name).symlink_to(f)
    data = json.loads((checkpoint / "config.json").read_text())
    (text / "config.json").unlink()
    (text / "config.json").write_text(json.dumps({**data, "task_family": "text"}))
    calibrates("dream", text, tmp_path / "cal")


@pytest.mark.slow
def test_the_step_scheduler_batches_dream_requests_ranked_by_its_scores(export):
    """Dream's default requests (ranked by its scores, which the denoise graph returns) share steps in the step
    engine, and each gets its answer alone."""
    from seer_trt.eval.tasks import make_samples
    from seer_trt.runtime.engine import Engine
    from seer_trt.runtime.pipeline import SeerPipeline
    from seer_trt.runtime.request import Request

    pipe = SeerPipeline.from_manifest(export[0], threads=1)
    samples = make_samples(3, 12, family="text")
    requests = [Request(s.question, gen_length=16, remasking=[None, "topk_margin", "low_confidence"][i % 3],
                        seer=i % 2 == 0, cache="none") for i, s in enumerate(samples)]  # fmt: skip
    alone = [pipe.generate([r])[0] for r in requests]
    engine = Engine(pipe, policy="static")  # stepped by hand: the same call shapes on every run
    tickets = []
    while len(tickets) < len(requests) or engine.rows or engine.depth:
        tickets += [engine.submit(r) for r in requests[len(tickets) : len(tickets) + 3]]
        engine.step()
        assert engine.steps < 500
    got = [t.result(0) for t in tickets]
    engine.close()
    pipe.close()
    assert [g.window for g in got] == [a.window for a in alone] and all(g.ok for g in got)
    assert max(engine.rows_per_step) > 3  # rows ranked by different scores shared steps


def test_a_qwen_style_template_renders_as_transformers_would(tmp_path):
    """A ChatML template in Qwen's style (it tests ``tools`` and an assistant message's ``tool_calls``, trims its
    blocks with ``{%-``, and writes its own system turn): history renders, and the template's raise_exception is a
    one-line refusal of the conversation, not a crash."""
    from seer_trt.contracts.errors import InputError
    from seer_trt.runtime.prompt import ChatFormat

    template = (
        "{%- if tools %}{{- raise_exception('no tools here') }}{%- endif %}\n"
        "{%- if messages[0].role != 'system' %}{{- '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{%- endif %}\n"
        "{%- for message in messages %}\n"
        "  {%- if message.role == 'assistant' and message.tool_calls %}{{- raise_exception('tool call') }}\n"
        "  {%- elif message.role == 'tool' %}{{- raise_exception('no tool turns') }}\n"
        "  {%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\n"
        "  {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n"
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "bos_token": None}))
    chat = ChatFormat.from_folder(tmp_path)
    text = chat.render("count to 3 .", history=[("user", "hi"), ("assistant", "hello")])
    assert text == ("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\ncount to 3 .<|im_end|>\n"
                    "<|im_start|>assistant\n")  # fmt: skip
    refusing = ChatFormat.from_folder(tmp_path)
    object.__setattr__(refusing, "template", "{{ raise_exception('roles must alternate') }}")
    with pytest.raises(InputError, match="refused this conversation: roles must alternate"):
        refusing.render("count to 3 .")


# --- the bundled Dream-family fixture --------------------------------------------------------------------------------


def test_the_dream_fixture_ships_names_its_families_and_loads_with_its_calibration():
    from seer_export.models.registry import DREAM_FIXTURE_DIR, get_entry, load
    from seer_export.reference.fixture import fixture_family
    from seer_trt.eval.tasks import held_out

    entry = get_entry("tiny-dream")
    assert entry.bundled == DREAM_FIXTURE_DIR and entry.family == "dream"
    sizes = {p.name: p.stat().st_size for p in DREAM_FIXTURE_DIR.iterdir()}
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "training.json"):
        assert name in sizes, f"{name} missing from {DREAM_FIXTURE_DIR}"
    assert sizes["model.safetensors"] <= 10 * 2**20
    assert json.loads((DREAM_FIXTURE_DIR / "training.json").read_text())["model"] == "dream"
    assert fixture_family(DREAM_FIXTURE_DIR) == "text"
    written = json.loads(build_tokenizer("dream").to_str())  # the tokenizer the trainer writes
    assert json.loads((DREAM_FIXTURE_DIR / "tokenizer.json").read_text()) == written
    model, folder = load("tiny-dream")  # strict: every tensor present, none unexpected
    cfg = model.config
    assert (cfg.family, cfg.shift_logits, cfg.text.num_key_value_heads, cfg.text.qkv_bias) == ("dream", True, 2, True)
    assert cfg.seer.label == "calibrated" and cfg.generation.schedule == "dream"
    vocab = build_tokenizer("dream").get_vocab()
    for s in held_out(200, family="text"):
        assert s.image is None and all(w in vocab for w in s.question.split() + list(s.answer)), s
