"""``seer-calibrate``: measure step-zero signals on held-out data and choose a model's Seer calibration.

In:  a registered model, held-out task samples (two disjoint seeds: one to choose settings, one to report
     them), the answer window N.
Out: per-layer step-zero profiles around the true answer end (table and PNG), detection quality of the
     paper-exact rule, of the best setting per signal, and the chosen calibration, optionally written into
     the model's ``config.json`` (``--write``).

Detection quality per setting: exact (the cut lands at the true ``<|eot_id|>``), premature cuts (L* shorter
than the answer plus its ``<|eot_id|>``: tokens lost), and the mean kept window over the true length. The
choice minimises the kept window among settings whose premature-cut rate is at most ``--max-premature`` on the
choosing split (docs/DESIGN.md §4: "Calibration and signals"). The real LLaDA-V keeps the paper's values.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from pathlib import Path

import numpy as np

from seer_trt.boundary import detect
from seer_trt.cli import fail, require_extra, save_figure
from seer_trt.config import SeerConfig
from seer_trt.errors import SeerError

CHOOSE_SEED, REPORT_SEED = 11, 13  # held-out seeds; the trainer uses >= 1_000_000
OFFSETS = np.arange(-6, 7)  # positions around the true end shown in the profile


@dataclasses.dataclass(frozen=True)
class Profiles:
    """Full-depth step-zero statistics of n samples over an N-position window."""

    abs_below: np.ndarray  # [n, layers, N] mean(|h| < tau_abs)
    gate_negative: np.ndarray  # [n, layers, N] mean(gate(x) < 0)
    p_end: np.ndarray  # [n, N] p(eot) + p(endoftext)
    end: np.ndarray  # [n] index of the true <|eot_id|> (answer length)

    def signal(self, seer: SeerConfig) -> np.ndarray:
        if seer.signal == "end_token_prob":
            return self.p_end
        stats = self.abs_below if seer.statistic == "abs_below" else self.gate_negative
        return stats[:, seer.probe_layer]


def collect(model, enc, samples, gen_length: int, tau_abs: float, batch: int = 50) -> Profiles:
    from seer_export.seer import step_zero

    parts = []
    for start in range(0, len(samples), batch):
        chunk = samples[start : start + batch]
        prefix, valid = enc.prefix(model, chunk)
        z = step_zero(model, prefix, valid, gen_length, enc.special, tau_abs=tau_abs)
        parts.append((z.abs_below, z.gate_negative, z.p_end))
    end = np.array([len(enc.answer_ids(s)) - 1 for s in samples])
    return Profiles(*(np.concatenate(p) for p in zip(*parts, strict=True)), end=end)


def evaluate(profiles: Profiles, seer: SeerConfig, n_window: int) -> dict[str, float]:
    kept = detect(profiles.signal(seer), seer)
    true_len = profiles.end + 1
    return {
        "exact": float(np.mean(kept == np.minimum(true_len + seer.margin, n_window))),
        "premature_cut_rate": float(np.mean(kept < true_len)),
        "mean_kept_over_true": float(np.mean(kept / true_len)),
        "no_cut_rate": float(np.mean(kept == n_window)),
    }


def candidates(n_layers: int, tau_abs: float) -> list[SeerConfig]:
    out = []
    grid = itertools.product(
        ("abs_below", "gate_negative"), range(n_layers), ("up", "down"),
        (0.01, 0.02, 0.03, 0.05, 0.08, 0.12, 0.2, 0.3), (0.3, 0.6, 1.0, 2.0), (2, 3), (1, 2),
    )  # fmt: skip
    for stat, layer, direction, tau_jump, gamma, window, margin in grid:
        out.append(SeerConfig(
            signal="mlp_sparsity", statistic=stat, probe_layer=layer, tau_abs=tau_abs, direction=direction,
            tau_jump=tau_jump, gamma=gamma, window=window, margin=margin, label="calibrated",
        ))  # fmt: skip
    for threshold, margin in itertools.product((0.3, 0.5, 0.7, 0.9), (1, 2)):
        out.append(SeerConfig(signal="end_token_prob", end_prob_threshold=threshold, margin=margin,
                              label="calibrated"))  # fmt: skip
    return out


def evaluate_all(sets: dict[int, Profiles], seer: SeerConfig) -> dict[str, float]:
    """Detection quality averaged over the windows in ``sets`` (N -> profiles at that N)."""
    per = [evaluate(p, seer, n) for n, p in sets.items()]
    return {k: float(np.mean([q[k] for q in per])) for k in per[0]}


def choose(sets: dict[int, Profiles], cands: list[SeerConfig], max_premature: float):
    """Best setting per family (signal/statistic) and overall: smallest kept window within the premature bound,
    averaged over every window length in ``sets``."""

    def key(q):  # within the bound: smallest window; outside it: fewest premature cuts
        ok = q["premature_cut_rate"] <= max_premature
        return (0, q["mean_kept_over_true"], -q["exact"]) if ok else (1, q["premature_cut_rate"], 0)

    best: dict[str, tuple[SeerConfig, dict]] = {}
    for seer in cands:
        q = evaluate_all(sets, seer)
        family = seer.signal if seer.signal == "end_token_prob" else seer.statistic
        if family not in best or key(q) < key(best[family][1]):
            best[family] = (seer, q)
    overall = min(best.values(), key=lambda sq: key(sq[1]))
    return best, overall[0]


def layer_profile_table(profiles: Profiles) -> str:
    """Mean statistic per layer at offsets around the true end (0 = the <|eot_id|> position)."""
    n, layers, window = profiles.abs_below.shape
    idx = profiles.end[:, None] + OFFSETS[None]  # [n, offsets]
    ok = (idx >= 0) & (idx < window)
    idx_c = np.clip(idx, 0, window - 1)
    lines = ["| statistic | layer | " + " | ".join(f"{o:+d}" for o in OFFSETS) + " |",
             "|---|---|" + "---|" * len(OFFSETS)]  # fmt: skip
    for name, stats in (("abs_below", profiles.abs_below), ("gate_negative", profiles.gate_negative)):
        for layer in range(layers):
            vals = np.take_along_axis(stats[:, layer], idx_c, axis=1)
            mean = np.where(ok, vals, np.nan)
            cells = " | ".join(f"{v:.3f}" for v in np.nanmean(mean, axis=0))
            lines.append(f"| {name} | {layer} | {cells} |")
    vals = np.where(ok, np.take_along_axis(profiles.p_end, idx_c, axis=1), np.nan)
    lines.append("| p_end | head | " + " | ".join(f"{v:.3f}" for v in np.nanmean(vals, axis=0)) + " |")
    return "\n".join(lines)


def plot(profiles: Profiles, chosen: SeerConfig, path: Path) -> None:
    """Per-layer mean profiles aligned at the true end, and one sample's chosen signal with its cut."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n, layers, window = profiles.abs_below.shape
    idx = profiles.end[:, None] + OFFSETS[None]
    ok = (idx >= 0) & (idx < window)
    idx_c = np.clip(idx, 0, window - 1)
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    for ax, (name, stats) in zip(
        axes[:2], (("|h| < tau_abs", profiles.abs_below), ("gate < 0", profiles.gate_negative)), strict=True
    ):
        for layer in range(layers):
            vals = np.where(ok, np.take_along_axis(stats[:, layer], idx_c, axis=1), np.nan)
            ax.plot(OFFSETS, np.nanmean(vals, axis=0), marker=".", label=f"layer {layer}")
        ax.axvline(0, color="k", ls=":", lw=1)
        ax.set(title=f"step-zero {name}, mean over {n} samples", xlabel="position - true <|eot_id|>")
        ax.legend(fontsize=7)
    vals = np.where(ok, np.take_along_axis(profiles.p_end, idx_c, axis=1), np.nan)
    axes[2].plot(OFFSETS, np.nanmean(vals, axis=0), marker=".", color="C3")
    axes[2].axvline(0, color="k", ls=":", lw=1)
    axes[2].set(title="step-zero p(<|eot_id|>) + p(<|endoftext|>)", xlabel="position - true <|eot_id|>")
    k = int(np.argsort(profiles.end)[len(profiles.end) // 2])  # a median-length sample
    sig = profiles.signal(chosen)[k]
    cut = int(detect(sig[None], chosen)[0])
    axes[3].plot(np.arange(window), sig, marker=".")
    axes[3].axvline(profiles.end[k], color="g", ls=":", label="true <|eot_id|>")
    axes[3].axvline(cut - 0.5, color="r", label=f"cut: L* = {cut}")
    axes[3].set(title=f"one sample: {chosen.signal} / {chosen.statistic} @ {chosen.probe_layer}", xlabel="position")
    axes[3].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=90)


def quality_table(rows: list[tuple[str, SeerConfig, dict]]) -> str:
    from seer_export.reference import describe

    lines = ["| setting | exact | premature cuts | kept / true | no cut |", "|---|---|---|---|---|"]
    for name, seer, q in rows:
        lines.append(
            f"| {name}: {describe(seer)} | {100 * q['exact']:.1f} % | {100 * q['premature_cut_rate']:.1f} % "
            f"| {q['mean_kept_over_true']:.2f}x | {100 * q['no_cut_rate']:.1f} % |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="seer-calibrate",
        description="Measure step-zero signals (MLP sparsity per layer, end-token probability) on held-out "
        "prompts, compare boundary detectors, and choose the model's Seer calibration.",
    )
    ap.add_argument("--model", default="tiny-llada-v", help="registered model name (default: tiny-llada-v)")
    ap.add_argument("--checkpoint", type=Path, help="local checkpoint folder (llada-v)")
    ap.add_argument("--n", type=int, default=400, help="samples per split (choose, report); default 400")
    ap.add_argument(
        "--gen-length",
        type=int,
        nargs="+",
        default=[64, 128],
        help="answer windows N at step zero; the choice must hold over all of them (default 64 128)",
    )
    ap.add_argument("--max-premature", type=float, default=0.01, help="premature-cut bound when choosing")
    ap.add_argument("--out", type=Path, default=Path("runs/calibrate"), help="folder for the report and PNG")
    ap.add_argument("--write", action="store_true", help="write the chosen calibration into the model's config.json")
    ap.add_argument("--verbose", action="store_true", help="show tracebacks")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        require_extra("seer-calibrate")
        import torch

        from seer_export.fixture import TaskEncoder
        from seer_export.models.registry import load
        from seer_trt.tasks import make_samples

        model, folder = load(args.model, args.checkpoint)
        model.eval()
        enc = TaskEncoder(folder, model.config)
        vision = model.config.vision
        grid = vision.image_size // vision.patch_size
        split: dict[str, dict[int, Profiles]] = {"choose": {}, "report": {}}
        with torch.no_grad():
            for name, seed in (("choose", CHOOSE_SEED), ("report", REPORT_SEED)):
                for n in args.gen_length:
                    samples = [s for s in make_samples(seed, args.n, grid, vision.patch_size)
                               if len(enc.answer_ids(s)) < n]  # fmt: skip
                    print(f"step zero on {len(samples)} {name} samples, N = {n}", file=sys.stderr)
                    split[name][n] = collect(model, enc, samples, n, SeerConfig().tau_abs)
        n_layers = model.config.text.num_hidden_layers
        best, chosen = choose(split["choose"], candidates(n_layers, SeerConfig().tau_abs), args.max_premature)
        named = [("paper", SeerConfig()), *((f"best {fam}", s) for fam, (s, _) in best.items()), ("chosen", chosen)]
        summary = {"model": args.model, "chosen": chosen.to_dict(), "max_premature": args.max_premature, "windows": {}}
        first = split["report"][args.gen_length[0]]
        print("\nStep-zero profile around the true end (report split, N = "
              f"{args.gen_length[0]}; columns: position - true <|eot_id|>)")  # fmt: skip
        print(layer_profile_table(first))
        for n, report in split["report"].items():
            rows = [(name, seer, evaluate(report, seer, n)) for name, seer in named]
            print(f"\nDetection on the report split ({len(report.end)} samples, N = {n}); settings chosen on a "
                  f"disjoint split with premature cuts <= {100 * args.max_premature:.1f} %")  # fmt: skip
            print(quality_table(rows))
            summary["windows"][str(n)] = {
                "n": int(len(report.end)), "rows": [{"name": k, "seer": s.to_dict(), **q} for k, s, q in rows],
            }  # fmt: skip
        args.out.mkdir(parents=True, exist_ok=True)
        plot(first, chosen, args.out / "step_zero_profile.png")
        (args.out / "calibration.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"\nwrote {args.out / 'calibration.json'} and {args.out / 'step_zero_profile.png'}")
        if args.write:
            config_path = folder / "config.json"
            data = json.loads(config_path.read_text())
            data["seer"] = chosen.to_dict()
            tmp = config_path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(data, indent=2) + "\n")
            tmp.replace(config_path)
            print(f"wrote the chosen calibration into {config_path}")
        return 0
    except SeerError as err:
        return fail("seer-calibrate", err, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
