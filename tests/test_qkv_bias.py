"""Grouped-query attention with q/k/v biases (Qwen2's and Dream's attention, issue 26) as configuration of the one
language model: the biases load strictly under Hugging Face's names, the attention equals a hand computation, and an
export of such a model passes parity with its K/V cache kept grouped (2 K/V heads for 4 query heads)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from tiny_models import gqa_bias_config

from seer_export.models.config import DiffusionMLLMConfig
from seer_export.models.llada import attention_mask, rope
from seer_export.models.loading import INDEX_FILE, load_model
from seer_export.models.random_checkpoint import write_random_checkpoint
from seer_trt.contracts.errors import CheckpointError


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("gqa") / "ckpt"
    return write_random_checkpoint(folder, gqa_bias_config(), dtype=torch.float32, seed=2, gain=3.0)


def test_biases_load_strictly_and_round_trip(checkpoint):
    names = set(json.loads((checkpoint / INDEX_FILE).read_text())["weight_map"])
    assert {"model.layers.1.self_attn.q_proj.bias", "model.layers.1.self_attn.v_proj.bias"} <= names
    assert "model.layers.1.self_attn.o_proj.bias" not in names  # o_proj has none, as in Qwen2
    model = load_model(checkpoint)
    assert model.config.text.qkv_bias and model.model.layers[0].self_attn.k_proj.bias.shape == (16,)  # 2 heads x 8
    assert DiffusionMLLMConfig.from_dict(json.loads(json.dumps(model.config.to_dict()))) == model.config
    broken = dataclasses.replace(model.config, text=dataclasses.replace(model.config.text, qkv_bias=False))
    with torch.device("meta"):
        from seer_export.models.loading import check_state, load_state
        from seer_export.models.mllm import DiffusionMLLM

        with pytest.raises(CheckpointError, match=r"unexpected \[model\.layers\.0\.self_attn\.k_proj\.bias"):
            check_state(DiffusionMLLM(broken), load_state(checkpoint))  # a config without the biases names them


def test_attention_equals_a_hand_computation(checkpoint):
    model = load_model(checkpoint)
    attn = model.model.layers[0].self_attn
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(1))
    segment_ids = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    position_ids = (segment_ids.cumsum(1) - 1).clamp(min=0)
    cos, sin = rope(position_ids, 8, model.config.text.rope_theta, x.dtype)
    mask = attention_mask(segment_ids)
    with torch.no_grad():
        got = attn(x, mask, cos, sin)

        def heads(w, b, n):  # [B, n, S, 8]
            return (x @ w.T + b).view(2, 7, n, 8).transpose(1, 2)

        def rotate(t):
            return t * cos + torch.cat([-t[..., 4:], t[..., :4]], dim=-1) * sin

        q = rotate(heads(attn.q_proj.weight, attn.q_proj.bias, 4))
        k = rotate(heads(attn.k_proj.weight, attn.k_proj.bias, 2)).repeat_interleave(2, dim=1)  # heads 0,1 -> kv 0
        v = heads(attn.v_proj.weight, attn.v_proj.bias, 2).repeat_interleave(2, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(8)
        scores = scores.masked_fill(~mask, float("-inf"))
        out = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(2, 7, 32) @ attn.o_proj.weight.T
    torch.testing.assert_close(got, out, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_an_export_of_it_passes_parity_with_grouped_kv(checkpoint, tmp_path):
    from seer_export.onnx.options import ExportOptions
    from seer_export.onnx.run import run_export

    manifest = run_export(ExportOptions(checkpoint=checkpoint, out=tmp_path / "engines", samples=4),
                          log=lambda line: None)  # fmt: skip
    assert manifest.parity.status == "passed", manifest.parity.note
    past = next(t for t in manifest.graph("denoise").spec.inputs if t.name == "past_key_values.0.key")
    assert past.shape[2] == 2  # the cache holds the 2 K/V heads, not the 4 query heads
