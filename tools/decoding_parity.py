"""The runtime (ONNX Runtime) against the reference sampler (PyTorch, float64 softmax ranking), per decoding rule,
with and without LLaDA-V's early stop, on held-out fixture prompts: windows and forward passes per prompt
(docs/DESIGN.md "Decoding strategies").

    python tools/decoding_parity.py ENGINES N [GEN_LENGTH [RULES]]
    python tools/decoding_parity.py engines/tiny-llada-v-fp32 40 128 fixed,threshold:0.9,factor:1
"""

import dataclasses
import sys

import numpy as np
import torch

from seer_export.models.loading import load_model
from seer_export.models.registry import FIXTURE_DIR
from seer_export.reference.fixture import TaskEncoder
from seer_export.reference.sampler import generate
from seer_trt.eval.tasks import HELD_OUT_SEED, make_samples
from seer_trt.runtime.pipeline import SeerPipeline
from seer_trt.runtime.request import Request

torch.set_num_threads(1)
engines, n = sys.argv[1], int(sys.argv[2])
gl = int(sys.argv[3]) if len(sys.argv) > 3 else 64
rules = sys.argv[4].split(",") if len(sys.argv) > 4 else ["fixed", "threshold:0.9", "factor:1"]
samples = make_samples(HELD_OUT_SEED, n)
pipe = SeerPipeline.from_manifest(engines, threads=1)
model = load_model(FIXTURE_DIR)
enc = TaskEncoder(FIXTURE_DIR, model.config)
with torch.no_grad():
    prefix, valid = enc.prefix(model, samples)
for rule in rules:
    for es in (False, True):
        gen = dataclasses.replace(pipe.manifest.generation, gen_length=gl, steps=gl, block_length=gl, decoding=rule)
        ref = generate(model, prefix, valid, gen, enc.special, early_stop=es)
        res = pipe.generate(
            [
                Request(s.question, s.image, seer=False, early_stop=es, cache="none", gen_length=gl, decoding=rule)
                for s in samples
            ]
        )
        toks = sum(list(r.window) == ref.tokens[i].tolist() for i, r in enumerate(res))
        steps = sum(r.steps == ref.steps[i] for i, r in enumerate(res))
        print(
            f"{rule:14s} early_stop={es!s:5s} tokens {toks}/{n} forward passes {steps}/{n}  "
            f"mean passes ref {ref.steps.mean():.2f} runtime {np.mean([r.steps for r in res]):.2f}",
            flush=True,
        )
