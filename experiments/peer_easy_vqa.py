"""Upstream LLaDA-V with its Fast-dLLM hook beside seer-trt on easy-vqa's test split (issue 45, item 4), out of tree.

Upstream's language model (``LLaDAModelLM``) gets the fixture's language-model tensors (a strict load) and the prompt
embeddings of seer-trt's PyTorch model (``TaskEncoder.prefix``: vision tower, projector, text embeddings; upstream's
own vision stack is SigLIP from Hugging Face), and decodes with its hook's ``_fast_generate_with_embeds`` at the
setting upstream ships (``train/generate_demo.py``: threshold 1, prefix refresh every 32 steps, stop at
``<|eot_id|>``), timed from those embeddings. seer-trt is timed end to end from question text and picture through
``SeerPipeline.generate``, one request a call (batch 1) and all of them in one call (batched).

1. Exact match of every mode on ``--split`` (the first ``--limit`` questions; all by default), paired against
   upstream + hook (answers that differ, McNemar's exact p).
2. Answers/s on the first ``--speed-n`` of them: ``--rounds`` rounds, every mode once per round, order alternating;
   medians, per-round ranges, and each mode over upstream + hook round by round. Load average at start and end.

Scratch set-up (nothing of it enters the repository; S=/tmp/s47/peer):
    G=/work/.mirror/vukrosic+LLaDA-V/repo    # the fetch tool's copy of github:vukrosic/LLaDA-V
    mkdir -p $S/upstream && git --git-dir $G archive f8b02ce -- . ':(exclude)train/llada_v_prepare/files' \\
        | tar -x -C $S/upstream
    # upstream's two loops suppress LLaDA-V's special ids by number; map them onto the fixture's (checked below)
    sed -i 's/126081, 126080, 126346, 126347/33, 32, 34, 35/' $S/upstream/train/llava/hooks/fast_dllm_hook.py \\
        $S/upstream/train/llava/model/language_model/modeling_llada.py
    pip install --target $S/tf440 --no-deps transformers==4.40.2 tokenizers==0.19.1 huggingface-hub==0.23.5
    seer-export --model tiny-llada-v-vqa --checkpoint export/fixtures/tiny-llada-v-vqa --out $S/e-vqa --force

Run (transformers 4.40 first on PYTHONPATH, then upstream's train/, then seer-trt if not installed):
    OMP_NUM_THREADS=1 PYTHONPATH=$S/tf440:$S/upstream/train python3 experiments/peer_easy_vqa.py \\
        --fixture export/fixtures/tiny-llada-v-vqa --engines $S/e-vqa --split test --gen-length 64 \\
        --rounds 7 --speed-n 300 --json docs/vqa/peer-64.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import io
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from llava.hooks.fast_dllm_hook import FastDLLMGenerationHook
from llava.model.language_model.configuration_llada import LLaDAConfig
from llava.model.language_model.modeling_llada import LLaDAModelLM
from safetensors.torch import load_file
from transformers import AutoTokenizer

from seer_export.models.loading import load_model
from seer_export.reference.fixture import TaskEncoder
from seer_trt import Request, SeerPipeline
from seer_trt.eval import easy_vqa
from seer_trt.eval.accuracy import by_task, truth_ids
from seer_trt.eval.paired import paired
from seer_trt.runtime.detokenize import answer_ids

UPSTREAM_COMMIT = "f8b02ce04b09f4f271fe55a3652059a73bbc7a32 (vukrosic/LLaDA-V)"
HOOK = {"threshold": 1, "prefix_refresh_interval": 32, "stopping_criteria": ["<|eot_id|>"]}  # generate_demo.py's
VISION_PREFIXES = ("model.vision_tower.", "model.mm_projector.", "model.image_newline")
# seer-trt's modes: Request fields beside the question, picture and gen_length. The default request is Seer +
# factor:1 + the pipeline's cache (reuse every 8); decoding is named so that the row stays the product's default
# whatever an export's manifest says (the bare request's row shows what the manifest runs).
SEER_MODES = {
    "default": {"decoding": "factor:1"},
    "peer_algorithm": {"seer": False, "early_stop": True, "decoding": "factor:1", "cache": "reuse",
                       "refresh_interval": 32},
    "bare_request": {},  # Request(question, picture, gen_length): the export's manifest settings as they stand
}  # fmt: skip
LABELS = {
    "upstream_hook": "upstream LLaDA-V + Fast-dLLM hook (threshold 1, refresh 32; PyTorch, batch 1)",
    "upstream_hook_e2e": "the same, timed with its prompt embeddings (seer-trt's PyTorch vision tower, projector, "
    "text embeddings)",
    "default": "seer-trt default: Seer + factor:1 + cache reuse 8",
    "peer_algorithm": "seer-trt running the peer's algorithm: early stop + factor:1 + cache refresh 32, no Seer",
    "bare_request": "seer-trt Request with no overrides (this export's manifest: Seer + its decoding rule + cache reuse 8)",
}


def upstream_model(fixture: Path, cfg, special) -> tuple[LLaDAModelLM, FastDLLMGenerationHook, dict]:
    """Upstream's LM with the fixture's language-model tensors, strictly; its Fast-dLLM hook registered."""
    t = cfg.text
    config = LLaDAConfig(vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                         num_hidden_layers=t.num_hidden_layers, num_attention_heads=t.num_attention_heads,
                         num_key_value_heads=t.num_key_value_heads, rms_norm_eps=t.rms_norm_eps,
                         rope_theta=t.rope_theta, attention_bias=t.qkv_bias, attn_implementation="sdpa")  # fmt: skip
    lm = LLaDAModelLM(config).eval()
    tensors = load_file(str(fixture / "model.safetensors"))
    state = {k: v for k, v in tensors.items() if not k.startswith(VISION_PREFIXES)}
    lm.load_state_dict(state, strict=True)
    source = inspect.getsource(FastDLLMGenerationHook._fast_generate_with_embeds)
    ids = f"[{', '.join(map(str, special.suppressed_ids))}]"
    if ids not in source:
        sys.exit(f"upstream's hook still suppresses LLaDA-V's ids, not the fixture's {ids}: apply the docstring's sed")
    hook = FastDLLMGenerationHook(lm)
    hook.register_hooks()
    report = {"lm_tensors_loaded": len(state), "lm_state_dict_entries": len(lm.state_dict()),
              "vision_tensors_skipped": len(tensors) - len(state), "suppressed_ids_mapped": ids,
              "attention_class": sorted({type(layer.self_attn).__name__ for layer in lm.model.layers})}  # fmt: skip
    return lm, hook, report


@torch.no_grad()
def logits_check(hook: FastDLLMGenerationHook, ref, embeds: torch.Tensor, mask_id: int, gen_length: int) -> dict:
    """Max |logits| difference over the masked window against seer-trt's PyTorch model, on one prompt: upstream's
    own forward (hook off) and the hook's full (refresh) forward."""
    window = torch.full((1, gen_length), mask_id)
    s = embeds.shape[1] + gen_length
    ours = ref(embeds, window, torch.ones(1, s, dtype=torch.int32), torch.arange(s)[None])
    x = torch.cat([embeds, ref.model.embed_tokens(window)], dim=1)
    out = {}
    for name in ("plain", "hook"):
        (hook.register_hooks if name == "hook" else hook.unregister_hooks)()
        kwargs = {"fast_dllm_cache": []} if name == "hook" else {}
        logits = hook.model.lm_head(hook.model.model(inputs_embeds=x, **kwargs)[0])[:, embeds.shape[1] :]
        out[f"{name}_max_abs_diff"] = float((logits - ours).abs().max())
        out[f"{name}_argmax_identical"] = bool((logits.argmax(-1) == ours.argmax(-1)).all())
    return out


class Systems:
    """Both systems over one list of questions; each ``run_*`` returns per-question answer ids and passes."""

    def __init__(self, args: argparse.Namespace) -> None:
        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
        self.gen = args.gen_length
        self.ref = load_model(args.fixture)
        self.enc = TaskEncoder(args.fixture, self.ref.config)
        self.special = self.enc.special
        self.lm, self.hook, self.load = upstream_model(args.fixture, self.ref.config, self.special)
        self.tokenizer = AutoTokenizer.from_pretrained(str(args.fixture))  # upstream encodes its stop words with it
        self.pipe = SeerPipeline.from_manifest(args.engines, threads=1, calibrate=True)  # cost model now

    @torch.no_grad()
    def embeds(self, samples) -> list[torch.Tensor]:
        """Upstream's input: each prompt's embeddings [1, P, D] from seer-trt's PyTorch model (untimed)."""
        return [self.enc.prefix(self.ref, [s])[0] for s in samples]

    def run_upstream(self, embeds: list[torch.Tensor]) -> list[tuple[list[int], int]]:
        out = []
        for e in embeds:
            with contextlib.redirect_stdout(io.StringIO()) as printed:  # the hook prints its step count per call
                ids = self.hook._fast_generate_with_embeds(
                    inputs_embeds=e, steps=self.gen, gen_length=self.gen, block_length=self.gen, temperature=0.0,
                    remasking="low_confidence", mask_id=self.special.mask_id, tokenizer=self.tokenizer, **HOOK)  # fmt: skip
            steps = int(re.findall(r"Number of steps: (\d+)", printed.getvalue())[-1])
            out.append((answer_ids(ids[0].numpy(), self.special.eot_id), steps))
        return out

    def run_seer(self, samples, mode: str, batched: bool) -> list[tuple[list[int], int]]:
        requests = [Request(s.question, s.image, gen_length=self.gen, **SEER_MODES[mode]) for s in samples]
        results = self.pipe.generate(requests) if batched else [self.pipe.generate(r)[0] for r in requests]
        failed = [r.error for r in results if not r.ok]
        if failed:
            raise RuntimeError(f"{mode}: {len(failed)} failed, first: {failed[0]}")
        return [(list(r.token_ids), r.steps) for r in results]


def accuracy(sys_: Systems, samples, modes: list[str], chunk: int = 50) -> tuple[dict, dict]:
    """Exact match of every mode over ``samples`` (seer-trt in batched calls of ``chunk``), paired with upstream."""
    truth = [truth_ids(sys_.pipe, s) for s in samples]
    answers: dict[str, list] = {m: [] for m in modes}
    seconds = dict.fromkeys(modes, 0.0)
    for first in range(0, len(samples), chunk):
        part = samples[first : first + chunk]
        for m in modes:
            embeds = sys_.embeds(part) if m == "upstream_hook" else None
            t0 = time.perf_counter()
            answers[m] += sys_.run_upstream(embeds) if embeds is not None else sys_.run_seer(part, m, batched=True)
            seconds[m] += time.perf_counter() - t0
        print(f"  {first + len(part)}/{len(samples)} questions", file=sys.stderr, flush=True)
    out = {}
    hits = {m: [a == t for (a, _), t in zip(answers[m], truth, strict=True)] for m in modes}
    for m in modes:
        same = [a == b for (a, _), (b, _) in zip(answers[m], answers["upstream_hook"], strict=True)]
        out[m] = {"label": LABELS[m], "exact": sum(hits[m]), "n": len(samples),
                  "exact_match": sum(hits[m]) / len(samples),
                  "exact_by_answer_type": by_task([s.task for s in samples], hits[m]),
                  "forward_passes_per_answer": float(np.mean([s for _, s in answers[m]])),
                  "step_zero_pass": m in ("default", "bare_request"),
                  "answers_differ_from_upstream_hook": len(same) - sum(same),
                  "against_upstream_hook": paired(hits["upstream_hook"], hits[m]).to_dict(),
                  "answers_per_s_accuracy_pass": len(samples) / seconds[m]}  # fmt: skip
    differ = [{"index": i, "truth": s.answer[0], **{m: sys_.pipe.prompts.tokenizer.decode(answers[m][i][0])
                                                   for m in modes}}
              for i, s in enumerate(samples) if answers["default"][i][0] != answers["upstream_hook"][i][0]][:40]  # fmt: skip
    return out, {"first_40_questions_where_default_differs_from_upstream_hook": differ}


def speed(sys_: Systems, samples, modes: list[str], rounds: int) -> dict:
    """Interleaved rounds; every timed call is one mode over all ``samples`` (upstream from its embeddings)."""
    embeds = sys_.embeds(samples)
    runs = {"upstream_hook": lambda: sys_.run_upstream(embeds),
            "upstream_hook_e2e": lambda: sys_.run_upstream(sys_.embeds(samples))}  # fmt: skip
    for m in (m for m in modes if m != "upstream_hook"):
        runs[f"{m}_b1"] = lambda m=m: sys_.run_seer(samples, m, batched=False)
        runs[f"{m}_batched"] = lambda m=m: sys_.run_seer(samples, m, batched=True)
    for run in runs.values():  # warm-up, untimed (the batched path calibrates its cost model on first use)
        run()
    wall = {k: [] for k in runs}
    cpu = {k: [] for k in runs}
    answers, orders, loads = {}, [], []
    for r in range(rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        orders.append(order)
        for k in order:
            w, c = time.perf_counter(), time.process_time()
            answers[k] = [a for a, _ in runs[k]()]
            wall[k].append(time.perf_counter() - w)
            cpu[k].append(time.process_time() - c)
        loads.append(os.getloadavg())
    n = len(samples)
    out = {}

    def over(times: dict, k: str, base: str) -> dict:  # k's answers/s over base's, round by round
        r = [u / s for s, u in zip(times[k], times[base], strict=True)]
        return {"median": statistics.median(r), "min": min(r), "max": max(r)}

    for k in runs:
        equal = sum(a == b for a, b in zip(answers[k], answers["upstream_hook"], strict=True))
        out[k] = {"answers_per_s_median": statistics.median(n / s for s in wall[k]),
                  "answers_per_s_by_round": [n / s for s in wall[k]],
                  "over_upstream_hook": over(wall, k, "upstream_hook"),
                  "over_upstream_hook_e2e": over(wall, k, "upstream_hook_e2e"),
                  "answers_per_cpu_s_median": statistics.median(n / s for s in cpu[k]),
                  "over_upstream_hook_per_cpu_s": over(cpu, k, "upstream_hook"),
                  "wall_over_cpu": sum(wall[k]) / sum(cpu[k]), "answers_equal_to_upstream_hook": equal}  # fmt: skip
    b1_vs_batched = {m: answers[f"{m}_b1"] == answers[f"{m}_batched"] for m in modes if m != "upstream_hook"}
    return {"n": n, "rounds": rounds, "round_orders": orders, "load_average_after_each_round": loads,
            "modes": out, "b1_answers_identical_to_batched": b1_vs_batched}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fixture", type=Path, default=Path("export/fixtures/tiny-llada-v-vqa"))
    p.add_argument("--engines", type=Path, required=True, help="seer-export output folder of the fixture")
    p.add_argument("--split", default="test", choices=easy_vqa.SPLITS)
    p.add_argument("--limit", type=int, default=None, help="first N questions of the split (default: all)")
    p.add_argument("--gen-length", type=int, default=64)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--speed-n", type=int, default=300, help="questions of the speed rounds (the split's first N)")
    p.add_argument("--modes", default="default,peer_algorithm,bare_request", help="seer-trt modes (SEER_MODES)")
    p.add_argument("--skip-accuracy", action="store_true", help="only the speed rounds")
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args()
    modes = ["upstream_hook", *args.modes.split(",")]
    load_start = os.getloadavg()
    sys_ = Systems(args)
    samples = easy_vqa.load(args.split, args.limit)
    e0 = sys_.embeds(samples[:1])[0]
    check = logits_check(sys_.hook, sys_.ref, e0, sys_.special.mask_id, args.gen_length)
    print(f"load {sys_.load}; logits {check}", file=sys.stderr, flush=True)
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "pythonpath": os.environ.get("PYTHONPATH", ""),
        "upstream_commit": UPSTREAM_COMMIT, "hook_setting": HOOK, "load": sys_.load, "logits": check,
        "fixture": str(args.fixture), "engines": str(args.engines), "split": args.split, "n": len(samples),
        "gen_length": args.gen_length, "modes": {m: LABELS[m] for m in modes},
        "seer_trt_requests": {m: SEER_MODES[m] for m in modes[1:]},
        "manifest_generation": dataclasses.asdict(sys_.pipe.manifest.generation),
        "special_tokens": {k: getattr(sys_.special, k) for k in ("mask_id", "eot_id", "endoftext_id")},
        "timing": "upstream: _fast_generate_with_embeds alone, from prompt embeddings seer-trt's PyTorch model "
                  "computed beforehand; seer-trt: SeerPipeline.generate end to end from question text and picture. "
                  "upstream_hook_e2e (speed only): the embeddings computed inside the timing. answers_per_s_accuracy_pass: one pass, modes interleaved per 50 questions, seer-trt in calls of "
                  "50, upstream one at a time (indicative); the speed section's rounds are the measurement",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__, "transformers": sys.modules["transformers"].__version__,
                    "torch_threads": torch.get_num_threads(), "ort_threads": 1},
        "load_average_start": load_start,
    }  # fmt: skip
    if not args.skip_accuracy:
        report["accuracy"], report["examples"] = accuracy(sys_, samples, modes)
        print(json.dumps({m: (v["exact"], v["answers_differ_from_upstream_hook"])
                          for m, v in report["accuracy"].items()}), file=sys.stderr, flush=True)  # fmt: skip
    report["speed"] = speed(sys_, samples[: args.speed_n], modes, args.rounds)
    report["load_average_end"] = os.getloadavg()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    for k, v in report["speed"]["modes"].items():
        o, c = v["over_upstream_hook"], v["over_upstream_hook_per_cpu_s"]
        print(
            f"{k:24s} {v['answers_per_s_median']:8.1f}/s  {o['median']:.2f}x [{o['min']:.2f}-{o['max']:.2f}]  "
            f"per CPU s {c['median']:.2f}x [{c['min']:.2f}-{c['max']:.2f}]"
        )


if __name__ == "__main__":
    main()
