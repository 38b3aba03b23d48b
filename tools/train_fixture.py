"""Train the bundled ``tiny-llada-v`` fixture on the synthetic task, on the CPU, within a time budget.

    python tools/train_fixture.py --minutes 60 --out export/fixtures/tiny-llada-v
    python tools/train_fixture.py --family hard --init export/fixtures/tiny-llada-v --lr 2e-3 --minutes 27 \
        --threads 1 --gen-length 128 --out export/fixtures/tiny-llada-v-hard  # then seer-calibrate --write
    python tools/train_fixture.py --model dream --family text --pad-eot 0 --show-pad-eot 0 --minutes 50 \
        --threads 1 --out export/fixtures/tiny-dream  # the Dream family: shifted logits, GQA, text only

``--family easy-vqa`` trains ``tiny-llada-v-vqa`` on easy-vqa's train split (``seer_trt.eval.easy_vqa``; the test split
is what ``seer-eval --dataset easy-vqa`` scores), with a tower on 64 px pictures in 16 px patches::

    python tools/train_fixture.py --family easy-vqa --image-size 64 --patch-size 16 --minutes 50 --threads 1 \
        --hold-out 300 --out export/fixtures/tiny-llada-v-vqa  # then seer-calibrate --model tiny-llada-v-vqa --write

Its pictures have no cells, so the throwaway vision head predicts each patch's mean colour and the share of its
pixels off the background instead of a cell's colour. That head alone did not keep easy-vqa's model seeing: a
first fixture (70 minutes) answered every shape and colour question with one word whatever the picture, its
image tokens 80 times a text embedding's norm and at cosine 0.99 between pictures (same patch), which a linear
head on RMS-normalised tokens still reads. So this family, by default, also penalises the energy all pictures of
a batch share against the energy that varies (``--decollapse``), weights the answer's word (``--answer-weight``:
a window holds up to 127 padding positions), draws half its questions among shape and colour ones
(``--image-share``: the split is 74 % yes/no) and makes half its batches 16 positions wide
(``--short-windows``: more steps in the budget). ``--hold-out N`` leaves out the questions on the train split's
last N pictures, to judge a recipe on them (never on the test split).

``--model dream`` trains the Dream family's layout instead (``seer_export.reference.fixture.dream_fixture_config``:
Dream's ChatML tokens, grouped-query attention with q/k/v biases, shifted logits, no vision tower), on text tasks.
Dream's loop suppresses nothing, so its padding needs no ``<|eot_id|>`` share (``--pad-eot 0 --show-pad-eot 0``).

``--family`` picks the task mixture (``seer_trt.eval.tasks.TASK_FAMILIES``); a family other than the default is
written into config.json (``task_family``), which calibration and evaluation read to draw the same prompts.

LLaDA-V's SFT recipe (docs/DESIGN.md "The fixture model"): per sample a mask ratio t ~ U(eps, 1); each window position (answer,
``<|eot_id|>`` and the ``<|endoftext|>`` padding) is masked with probability t; the loss is the cross-entropy
on masked positions divided by t, averaged over the window. Windows have a random length per sample: often
only just longer than the answer (the windows Seer truncates to), otherwise anything up to the batch's
window, drawn per batch, as SFT pads each batch to its longest sample. The learning rate follows the elapsed
fraction of the budget (warm-up, cosine). A checkpoint is written every few minutes (temp file, then rename).
Never run in CI.

Two additions make the tiny model behave under LLaDA-V's sampler, which a billion-parameter model does by scale:
- LLaDA-V's sampler bans ``<|endoftext|>`` at masked positions, so padding positions commit the model's second
  choice, and later steps see runs of ``<|eot_id|>`` where SFT only ever showed ``<|endoftext|>``. A model that
  never saw that reads the first visible ``<|eot_id|>`` as the answer's end and writes content up to it. So the
  padding target carries a share of ``<|eot_id|>`` (``--pad-eot``: the second choice is the end token), and in a
  share of samples the revealed padding is *shown* as ``<|eot_id|>`` (``--show-pad-eot``); targets are unchanged.
- Without help the vision path collapsed in the first run: the projected features grew to a norm of ~7000 along
  one shared direction (cosine 1.0000 between an empty cell and a shape after RMSNorm), so the answers ignored
  the picture. A throwaway linear head (not saved) reads each RMS-normalised image token and predicts its cell's
  colour or "empty" (``--vision-aux``), which keeps the features informative where the language model reads them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from seer_export.models.mllm import DiffusionMLLM, window_layout
from seer_export.models.registry import FIXTURE_DIR
from seer_export.reference.fixture import (
    TaskEncoder,
    build_tokenizer,
    dream_fixture_config,
    fixture_config,
    write_tokenizer,
)
from seer_trt.eval import easy_vqa
from seer_trt.eval.tasks import COLORS, DEFAULT_FAMILY, FAMILY_KEY, TASK_FAMILIES, Sample, make_sample
from seer_trt.runtime.image import pixel_tiles

MAX_WINDOW = 128
SHORT_WINDOW = 16
IMAGE_TASKS = ("count", "enumerate", "colors", "cell_colors")  # the tasks whose prompt holds a picture
TRAIN_SEED = 1_000_000  # held-out sets use seeds below this
VQA_ANSWER_WEIGHT = 8.0  # easy-vqa's defaults; see the module's docstring
VQA_IMAGE_SHARE = 0.5
VQA_SHORT_WINDOWS = 0.5
VQA_DECOLLAPSE = 1.0


def draw_batch(
    rng: np.random.Generator,
    enc: TaskEncoder,
    batch: int,
    draw: Callable[[np.random.Generator], Sample],
    short: float = 0.0,
):
    """Samples, their answer lengths (with ``<|eot_id|>``) and windows, for one batch whose window is drawn per batch.

    Half the batches are 64 wide and half 128, the answer windows served. Inside a batch a sample's window is
    the whole batch window (what the padded loop sees), tight (answer + 0..3: what Seer keeps) or anything
    between. A first recipe drew mostly short windows for speed; its padded loop at 128 fell to 58 % exact,
    because a full 128 window made up about 2 % of its samples. A share ``short`` of the batches is only
    ``SHORT_WINDOW`` wide instead (easy-vqa's one-word answers: more steps an hour).
    """
    if short and rng.random() < short:
        g = SHORT_WINDOW
    else:
        g = 64 if rng.random() < 0.5 else MAX_WINDOW
    full, tight = (0.3, 0.35) if g == 64 else (0.5, 0.2)
    samples, needs, lengths = [], [], []
    while len(samples) < batch:
        s = draw(rng)
        need = len(enc.answer_ids(s))
        if need > g:
            continue
        u = rng.random()
        if u < full:
            w = g
        elif u < full + tight:
            w = min(g, need + int(rng.integers(0, 4)))
        else:
            w = int(rng.integers(need, g + 1))
        samples.append(s)
        needs.append(need)
        lengths.append(w)
    return samples, needs, lengths, g


def cell_colours(image: np.ndarray, side: int) -> np.ndarray:
    """[side * side] class per vision patch, reading order: 0 empty, 1 + index of the colour in ``COLORS``."""
    h = image.shape[0] // side
    cells = image.reshape(side, h, side, h, 3).transpose(0, 2, 1, 3, 4).reshape(side * side, h * h, 3)
    palette = np.array(list(COLORS.values()))  # [C, 3]
    lit = cells.max(-1) > 0  # [cells, pixels]
    out = np.zeros(side * side, dtype=np.int64)
    for k in np.flatnonzero(lit.any(1)):
        pixel = cells[k][lit[k]][0]
        out[k] = 1 + int(np.abs(palette - pixel).sum(1).argmin())
    return out


def patch_summary(image: np.ndarray, side: int) -> np.ndarray:
    """[side * side, 4] float32 per vision patch, reading order: its mean RGB in [0, 1] and the share of its pixels
    that differ from the picture's background (the corner pixel's colour): easy-vqa's pictures have no cells."""
    h = image.shape[0] // side
    patches = image.reshape(side, h, side, h, 3).transpose(0, 2, 1, 3, 4).reshape(side * side, h * h, 3)
    shape = np.abs(patches.astype(np.int16) - image[0, 0].astype(np.int16)).sum(-1) > 30  # [patches, pixels]
    return np.concatenate([patches.mean(1) / 255, shape.mean(1, keepdims=True)], 1).astype(np.float32)


def vqa_train_questions(hold_out: int) -> tuple[list[Sample], list[Sample]]:
    """easy-vqa's train split (the test split is what seer-eval scores) as (trained, held out): the questions on
    the split's last ``hold_out`` pictures (by image id) are held out, to judge a recipe without the test split."""
    import easy_vqa as ev

    samples, image_ids = easy_vqa.load("train"), ev.get_train_questions()[2]
    first = len(easy_vqa._images("train")) - hold_out
    trained, held = [], []
    for s, image_id in zip(samples, image_ids, strict=True):
        (trained if int(image_id) < first else held).append(s)
    return trained, held


def sampler(family: str, image_share: float = 0.0, hold_out: int = 0) -> Callable[[np.random.Generator], Sample]:
    """Draws one training sample: a synthetic task of ``family``, or a question of easy-vqa's train split.

    easy-vqa: with probability ``image_share`` a shape or colour question, else any question (the split is 74 %
    yes/no, which its text alone half answers), so the answers that need the picture pay often enough.
    """
    if family != easy_vqa.DATASET:
        return lambda rng: make_sample(rng, family=family)
    train, _ = vqa_train_questions(hold_out)
    seeing = [s for s in train if s.task != "yes/no"]

    def draw(rng: np.random.Generator) -> Sample:
        pool = seeing if rng.random() < image_share else train
        return pool[int(rng.integers(len(pool)))]

    return draw


def save(model: DiffusionMLLM, out: Path, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "model.safetensors.tmp"
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / "model.safetensors")
    (out / "training.json").write_text(json.dumps(meta, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0, help="wall-clock training budget")
    ap.add_argument("--out", type=Path, default=FIXTURE_DIR, help="fixture folder to write")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--resume", action="store_true", help="start from the weights already in --out (fine-tune)")
    ap.add_argument("--init", type=Path, help="start from another fixture folder's weights (fine-tune; same config)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--pad-eot",
        type=float,
        default=0.3,
        help="share of <|eot_id|> in the padding positions' target (the rest <|endoftext|>); see above",
    )
    ap.add_argument(
        "--show-pad-eot",
        type=float,
        default=0.5,
        help="share of samples whose revealed padding is shown as <|eot_id|> (a random part of it); see above",
    )
    ap.add_argument("--vision-aux", type=float, default=0.3, help="weight of the per-cell colour loss; see above")
    ap.add_argument("--answer-weight", type=float, help="loss weight of the answer's own positions (default 1; "
                    f"{VQA_ANSWER_WEIGHT:g} for {easy_vqa.DATASET}); see above")  # fmt: skip
    ap.add_argument("--image-share", type=float, help=f"{easy_vqa.DATASET}: share of draws that are shape or "
                    f"colour questions (default {VQA_IMAGE_SHARE:g}); see above")  # fmt: skip
    ap.add_argument("--short-windows", type=float, help=f"share of batches {SHORT_WINDOW} wide (default 0; "
                    f"{VQA_SHORT_WINDOWS:g} for {easy_vqa.DATASET}); see draw_batch")  # fmt: skip
    ap.add_argument("--decollapse", type=float, help="weight of the image tokens' shared / varied energy (default 0; "
                    f"{VQA_DECOLLAPSE:g} for {easy_vqa.DATASET}); see above")  # fmt: skip
    ap.add_argument("--hold-out", type=int, default=0, help=f"{easy_vqa.DATASET}: leave out the questions on the "
                    "train split's last N pictures, to judge the weights on (never the test split)")  # fmt: skip
    ap.add_argument(
        "--sampler-order",
        type=float,
        default=0.4,
        help="share of samples masked in the order the sampler commits: padding revealed (as <|eot_id|>) first",
    )
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast for matmuls (fp32 weights and loss)")
    ap.add_argument("--family", choices=[*sorted(TASK_FAMILIES), easy_vqa.DATASET], default=DEFAULT_FAMILY,
                    help=f"task mixture to train on (default {DEFAULT_FAMILY}, the bundled tiny-llada-v's), or "
                         f"{easy_vqa.DATASET}'s train split")  # fmt: skip
    ap.add_argument("--image-size", type=int, default=32, help="the vision tower's tile (64 for easy-vqa's pictures)")
    ap.add_argument(
        "--patch-size", type=int, default=8, help="the vision tower's patch (16: 4 x 4 tokens of a 64 tile)"
    )
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's, one per core)")
    ap.add_argument("--gen-length", type=int, default=64, help="the config's default answer window (default 64)")
    ap.add_argument(
        "--model",
        choices=["llada-v", "dream"],
        default="llada-v",
        help="the model family's layout: llada-v (tiny-llada-v's) or dream (shifted logits, GQA, text)",
    )
    args = ap.parse_args()
    dataset = args.family == easy_vqa.DATASET  # its aux target is each patch's summary, not a cell's colour
    defaults = {"answer_weight": (VQA_ANSWER_WEIGHT, 1.0), "decollapse": (VQA_DECOLLAPSE, 0.0),
                "short_windows": (VQA_SHORT_WINDOWS, 0.0), "image_share": (VQA_IMAGE_SHARE, 0.0)}  # fmt: skip
    for name, (vqa_default, other) in defaults.items():  # easy-vqa's recipe, or the other families' unchanged one
        if getattr(args, name) is None:
            setattr(args, name, vqa_default if dataset else other)

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    write_tokenizer(args.out, args.model, args.family)
    vocab = build_tokenizer(args.model, args.family).get_vocab_size()
    if args.model == "dream":
        cfg = dream_fixture_config(vocab, args.gen_length)
    else:
        cfg = fixture_config(vocab, args.gen_length, args.image_size, args.patch_size)
    if args.model == "dream" and args.family in TASK_FAMILIES and any(TASK_FAMILIES[args.family].weights[i] for i, t in
                                     enumerate(TASK_FAMILIES[args.family].tasks) if t in IMAGE_TASKS):  # fmt: skip
        ap.error(f"--model dream has no vision tower; --family {args.family} holds image tasks (use --family text)")
    data = cfg.to_dict()
    if args.family != DEFAULT_FAMILY:  # the default family's config stays as it was before families existed
        data[FAMILY_KEY] = args.family
    (args.out / "config.json").write_text(json.dumps(data, indent=2) + "\n")
    enc = TaskEncoder(args.out, cfg)
    model = DiffusionMLLM(cfg)
    for p in model.parameters():  # small init: tiny models train faster from it
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02)
    previous = None
    if args.resume or args.init:
        start_from = args.out if args.resume else args.init
        model.load_state_dict(load_file(str(start_from / "model.safetensors")))
        previous = json.loads((start_from / "training.json").read_text())
        if args.init:
            previous = {"init": str(args.init), **previous}
    side = cfg.vision.image_size // cfg.vision.patch_size
    aux_head = torch.nn.Linear(cfg.text.hidden_size, 4 if dataset else 1 + len(COLORS))  # throwaway: never saved
    draw = sampler(args.family, args.image_share, args.hold_out)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params / 1e6:.2f}M  vocab {cfg.text.vocab_size}", flush=True)
    opt = torch.optim.AdamW(
        [*model.parameters(), *aux_head.parameters()], lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01
    )
    rng = np.random.default_rng(TRAIN_SEED + args.seed)
    budget = args.minutes * 60
    start = last_save = time.time()
    step, ema = 0, None
    while (elapsed := time.time() - start) < budget:
        frac = elapsed / budget
        lr = args.lr * min(1.0, frac / 0.03) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
        for group in opt.param_groups:
            group["lr"] = lr
        samples, needs, lengths, g = draw_batch(rng, enc, args.batch, draw, args.short_windows)
        target = torch.tensor([enc.window(s, g) for s in samples])  # [B, G], padded to g with endoftext
        kept = torch.tensor(lengths)
        in_window = torch.arange(g)[None] < kept[:, None]  # [B, G]
        t = torch.rand(args.batch, 1) * (1 - 1e-3) + 1e-3  # mask ratio per sample
        masked = (torch.rand(args.batch, g) < t) & in_window
        gen_ids = torch.where(masked, torch.full_like(target, enc.special.mask_id), target)
        shown = target == enc.special.endoftext_id  # revealed padding: shown as <|eot_id|> in some samples
        share = torch.rand(args.batch, 1) * (torch.rand(args.batch, 1) < args.show_pad_eot)
        # The sampler commits the far padding early and the answer's end last: show that state too. The padding
        # up to a few positions past the answer's end stays masked like the answer; the rest is mostly revealed.
        order = torch.rand(args.batch, 1) < args.sampler_order
        far = shown & (torch.arange(g)[None] >= (torch.tensor(needs) + torch.randint(0, 9, (args.batch,)))[:, None])
        masked = torch.where(order & far, (torch.rand(args.batch, g) < 0.1 * t) & in_window, masked)
        gen_ids = torch.where(masked, torch.full_like(target, enc.special.mask_id), target)
        share = torch.where(order, torch.ones_like(share), share)
        shown &= ~masked & (torch.rand(args.batch, g) < share)
        gen_ids = torch.where(shown, torch.full_like(target, enc.special.eot_id), gen_ids)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            prefix, valid = enc.prefix(model, samples)
        segment_ids, position_ids = window_layout(valid, kept, g)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(prefix, gen_ids, segment_ids, position_ids).float()  # [B, G, V]
        logp = F.log_softmax(logits, dim=-1)  # [B, G, V]
        ce = -logp.gather(-1, target[..., None])[..., 0]  # [B, G]
        # Padding targets <|endoftext|> with a share of <|eot_id|>: LLaDA-V's sampler bans <|endoftext|> at
        # masked positions, so what a padding position commits is the model's second choice. Real LLaDA-V fills
        # it with <|eot_id|>; a hard one-hot target leaves the fixture's second choice to chance (more content).
        pad = target == enc.special.endoftext_id
        ce = torch.where(pad, (1 - args.pad_eot) * ce - args.pad_eot * logp[..., enc.special.eot_id], ce)
        answer = torch.arange(g)[None] < (torch.tensor(needs) - 1)[:, None]  # [B, G] the answer's words
        weight = torch.where(answer, args.answer_weight, 1.0)
        loss = ((ce * weight * masked / t).sum(1) / kept).mean()
        with_image = [s for s in samples if s.image is not None and cfg.has_tower]
        if args.vision_aux > 0 and with_image:
            pixels = torch.cat([torch.from_numpy(pixel_tiles(s.image, cfg.vision.image_size)) for s in with_image])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                feats = model.tile_features(pixels).float()  # [I, T, D]
            guess = aux_head(F.rms_norm(feats, feats.shape[-1:]))  # [I, T, classes or 4]
            if dataset:
                summary = torch.from_numpy(np.stack([patch_summary(s.image, side) for s in with_image]))  # [I, T, 4]
                aux = F.mse_loss(guess, summary) * 10  # ~ the scale of a cross-entropy
            else:
                colours = torch.from_numpy(np.stack([cell_colours(s.image, side) for s in with_image]))  # [I, T]
                aux = F.cross_entropy(guess.flatten(0, 1), colours.flatten())
            loss = loss + args.vision_aux * aux
            if args.decollapse and len(with_image) > 1:  # the part every picture shares, against what varies
                shared = feats.mean(0)  # [T, D]
                loss = loss + args.decollapse * shared.pow(2).sum() / (feats - shared).pow(2).sum(-1).mean(0).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 50 == 0:
            print(f"step {step:5d}  {elapsed / 60:5.1f} min  lr {lr:.2e}  loss {ema:.4f}", flush=True)
        if time.time() - last_save > 300:
            save(model, args.out, {"previous": previous, "steps": step, "minutes": elapsed / 60, "loss_ema": ema})
            last_save = time.time()
    vqa = {
        "answer_weight": args.answer_weight,
        "image_share": args.image_share,
        "short_windows": args.short_windows,
        "decollapse": args.decollapse,
        "hold_out": args.hold_out,
    }
    vqa = vqa if dataset else {}  # the other families' training.json stays as it was
    save(model, args.out, {"previous": previous, "steps": step, "pad_eot": args.pad_eot,
                           "show_pad_eot": args.show_pad_eot, "vision_aux": args.vision_aux, "sampler_order": args.sampler_order, **vqa, "minutes": (time.time() - start) / 60, "loss_ema": ema,
                           "batch": args.batch, "lr": args.lr, "parameters": n_params, "family": args.family,
                           "threads": torch.get_num_threads(), "model": args.model})  # fmt: skip
    print(f"done: {step} steps, loss {ema:.4f}", flush=True)


if __name__ == "__main__":
    main()
