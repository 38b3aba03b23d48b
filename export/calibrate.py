"""``seer-calibrate``: measure step-zero signals on held-out data and choose a model's Seer calibration.

In:  a registered model, held-out task samples of the family its config.json names (``task_family``; three
     disjoint seeds: one to fit the probes on, one to choose every detector's settings on, one to report them;
     for easy-vqa's fixture three disjoint parts of the train split, never the test split),
     the answer windows N.
Out: per-layer step-zero profiles around the true answer end (table and PNG); for every layer x signal (the
     paper's |h| < tau_abs statistic, the gate sign, a linear probe on the residual stream, and the full-depth
     end-token probability) the detection quality of its best setting; the chosen calibration, optionally
     written into the model's ``config.json`` (``--write``).

Probes (docs/DESIGN.md "Seer, exactly", "Step-zero probes"): for every layer k, scikit-learn's logistic regression on the
RMS-normalised residual stream after layer k at every answer position of the fitting split (label: at or past
the true ``<|eot_id|>``; the detector's threshold is then chosen on another split, so the probe's fit does not
flatter it); the scaler is folded into one weight vector and a bias, which the early-exit graph
applies as a dot product. A probe's probability goes through the same detectors as the other signals.

Detection quality per setting: exact (the cut lands at the true ``<|eot_id|>`` plus the margin), premature cuts
(L* shorter than the answer plus its ``<|eot_id|>``: tokens lost), kept / true (true = answer + ``<|eot_id|>``,
the oracle window) and kept / (true + 1) (1.00x: an exact cut with one token of margin), no-cut rate. The best
setting of a (signal, layer) keeps the smallest window among those within ``--max-premature`` on the choosing
split, on every window N. The choice is the **shallowest** layer whose best setting meets premature <=
``--max-premature`` and kept / (true + 1) <= ``--max-kept`` on every N; without one, the setting with the
smallest window within the premature bound (the end-token signal at full depth, typically), said so.

Accuracy (docs/DESIGN.md "Seer, exactly", "The end tail"): a cut that lands right can still change answers, so the
chosen detector is then judged by exact match against the uncut loop on the choosing split, paired on the same
prompts (``seer_trt.eval.paired``), under ``--accuracy-rule`` (the default request's rule, with LLaDA-V's early
stop; ``fixed`` runs the exact loop): for each end tail of ``--tails`` (the share of the cut-away positions kept as
committed end tokens), the answers lost and gained and McNemar's p. The smallest tail that loses at most
``--max-loss`` points with p > 0.1 on every N is chosen; the report split shows the same figures; without one, the
largest tail, said so.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

import numpy as np

from seer_export.calibrate_tail import draw_splits, judge_accuracy, judge_tail_only, write_seer
from seer_trt.cli.common import Parser, add_model, add_verbose, require_extra, run_main
from seer_trt.contracts.config import SeerConfig
from seer_trt.eval.report import save_figure, write_json
from seer_trt.runtime.boundary import detect

FIT_SEED, CHOOSE_SEED, REPORT_SEED = 17, 11, 13  # held-out seeds; the trainer uses >= 1_000_000
SPLITS = {"fit": FIT_SEED, "choose": CHOOSE_SEED, "report": REPORT_SEED}
OFFSETS = np.arange(-6, 7)  # positions around the true end shown in the profile
FAMILIES = ("abs_below", "gate_negative", "probe")  # per-layer signals; "end_token_prob" is one more at full depth
PROBE_C = 1.0  # inverse L2 strength of the logistic regression (standardised features)
PROBE_MAX_ITER = 2000


@dataclasses.dataclass(frozen=True)
class Profiles:
    """Full-depth step-zero statistics of n samples over an N-position window."""

    abs_below: np.ndarray  # [n, layers, N] mean(|h| < tau_abs)
    gate_negative: np.ndarray  # [n, layers, N] mean(gate(x) < 0)
    residual: np.ndarray  # [n, layers, N, D] float32 RMS-normalised residual stream after each layer
    p_end: np.ndarray  # [n, N] p(eot) + p(endoftext)
    end: np.ndarray  # [n] index of the true <|eot_id|> (answer length)

    def signal(self, seer: SeerConfig) -> np.ndarray:
        """[n, N]: the profile ``seer`` reads (the probe's probability, computed as the graph computes it)."""
        if seer.signal == "end_token_prob":
            return self.p_end
        if seer.signal == "probe":
            return probe_probability(self.residual[:, seer.probe_layer], seer)
        stats = self.abs_below if seer.statistic == "abs_below" else self.gate_negative
        return stats[:, seer.probe_layer]


def probe_probability(features: np.ndarray, seer: SeerConfig) -> np.ndarray:
    """sigmoid(w . x + b) in float32 through ``seer_export.reference.seer.probe_score`` (the reference and the graph's)."""
    import torch

    from seer_export.reference.seer import probe_score

    return probe_score(torch.from_numpy(features), seer).numpy()


def collect(model, enc, samples, gen_length: int, tau_abs: float, batch: int = 50,
            layers: tuple[int, ...] | None = None) -> Profiles:  # fmt: skip
    """Full-depth step zero over ``samples``, recording ``layers`` (all by default)."""
    from seer_export.reference.seer import step_zero

    parts = []
    for start in range(0, len(samples), batch):
        chunk = samples[start : start + batch]
        prefix, valid = enc.prefix(model, chunk)
        z = step_zero(model, prefix, valid, gen_length, enc.special, layers, tau_abs=tau_abs, residual=True)
        parts.append((z.abs_below, z.gate_negative, z.residual, z.p_end))
    end = np.array([len(enc.answer_ids(s)) - 1 for s in samples])
    return Profiles(*(np.concatenate(p) for p in zip(*parts, strict=True)), end=end)


def fit_probe(sets: dict[int, Profiles], layer: int) -> tuple[tuple[float, ...], float]:
    """Logistic regression at ``layer`` over every answer position of every window in ``sets``.

    Returns the weights and bias on the normalised residual stream, with sklearn's standardisation folded in:
    w = coef / scale, b = intercept - sum(coef * mean / scale).
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    xs, ys = [], []
    for p in sets.values():
        n, _, window, dim = p.residual.shape
        xs.append(p.residual[:, layer].reshape(-1, dim))
        ys.append((np.arange(window)[None] >= p.end[:, None]).reshape(-1))  # at or past the true <|eot_id|>
    fit = make_pipeline(StandardScaler(), LogisticRegression(C=PROBE_C, max_iter=PROBE_MAX_ITER))
    fit.fit(np.concatenate(xs), np.concatenate(ys))
    scaler, lr = fit[0], fit[1]
    weights = lr.coef_[0] / scaler.scale_
    bias = float(lr.intercept_[0] - np.sum(lr.coef_[0] * scaler.mean_ / scaler.scale_))
    return tuple(float(w) for w in weights.astype(np.float32)), bias


def evaluate(profiles: Profiles, seer: SeerConfig, n_window: int) -> dict[str, float]:
    kept = detect(profiles.signal(seer), seer)
    true_len = profiles.end + 1  # answer + <|eot_id|>: the oracle window
    return {
        "exact": float(np.mean(kept == np.minimum(true_len + seer.margin, n_window))),
        "premature_cut_rate": float(np.mean(kept < true_len)),
        "mean_kept_over_true": float(np.mean(kept / true_len)),
        "mean_kept_over_true_plus_1": float(np.mean(kept / (true_len + 1))),
        "no_cut_rate": float(np.mean(kept == n_window)),
    }


def jump_grid(base: SeerConfig, directions, tau_jumps, gammas, windows=(2, 3), margins=(1, 2)) -> list[SeerConfig]:
    return [base.replace(detector="jump", direction=d, tau_jump=t, gamma=g, window=w, margin=m)
            for d, t, g, w, m in itertools.product(directions, tau_jumps, gammas, windows, margins)]  # fmt: skip


def threshold_grid(base: SeerConfig, thresholds=(0.1, 0.2, 0.3, 0.5, 0.7, 0.9), margins=(1, 2)) -> list[SeerConfig]:
    return [
        base.replace(detector="threshold", threshold=t, margin=m) for t, m in itertools.product(thresholds, margins)
    ]


def candidates(family: str, layer: int, tau_abs: float, probe: tuple[tuple[float, ...], float] | None = None):
    """Every setting tried for one (signal, layer)."""
    if family == "end_token_prob":
        return threshold_grid(SeerConfig(signal="end_token_prob", label="calibrated"))
    if family == "probe":
        weights, bias = probe
        base = SeerConfig(signal="probe", probe_layer=layer, probe_weights=weights, probe_bias=bias, label="calibrated")
        return threshold_grid(base) + jump_grid(base, ("up",), (0.1, 0.2, 0.3, 0.5), (0.3, 0.6, 1.0))
    base = SeerConfig(signal="mlp_sparsity", statistic=family, probe_layer=layer, tau_abs=tau_abs, label="calibrated")
    return jump_grid(base, ("up", "down"), (0.01, 0.02, 0.03, 0.05, 0.08, 0.12, 0.2, 0.3), (0.3, 0.6, 1.0, 2.0))


def evaluate_all(sets: dict[int, Profiles], seer: SeerConfig) -> dict[int, dict[str, float]]:
    """Detection quality per window N."""
    return {n: evaluate(p, seer, n) for n, p in sets.items()}


def worst(q: dict[int, dict[str, float]]) -> dict[str, float]:
    """The worst value over the windows of every figure (the most of each; the least exact)."""
    keys = next(iter(q.values()))
    return {k: (min if k == "exact" else max)(v[k] for v in q.values()) for k in keys}


def best_setting(sets: dict[int, Profiles], cands: list[SeerConfig], max_premature: float):
    """The setting with the smallest kept window whose premature rate is within the bound on every window;
    if none is, the one with the fewest premature cuts. Returns (setting, per-window quality)."""

    def key(q):
        w = worst(q)
        ok = w["premature_cut_rate"] <= max_premature
        return (0, w["mean_kept_over_true"], -w["exact"]) if ok else (1, w["premature_cut_rate"], 0)

    return min(((s, evaluate_all(sets, s)) for s in cands), key=lambda sq: key(sq[1]))


def meets(q: dict[int, dict[str, float]], max_premature: float, max_kept: float) -> bool:
    w = worst(q)
    return w["premature_cut_rate"] <= max_premature and w["mean_kept_over_true_plus_1"] <= max_kept


@dataclasses.dataclass(frozen=True)
class Row:
    """The best setting of one (signal, layer) on the choosing split, and whether it meets the bar there."""

    family: str  # abs_below | gate_negative | probe | end_token_prob
    layer: int | None  # None: full depth
    seer: SeerConfig
    choose: dict[int, dict[str, float]]  # per window N, on the choosing split
    meets: bool  # premature and kept bounds hold on every window of the choosing split


def calibrate(fit_sets: dict[int, Profiles], choose_sets: dict[int, Profiles], n_layers: int, tau_abs: float,
              max_premature: float, max_kept: float, log=lambda s: None,
              layers: range | None = None) -> tuple[list[Row], Row, bool]:  # fmt: skip
    """Every layer x signal's best setting, and the choice: (rows, chosen row, whether it meets the bar).

    Probes are fitted on ``fit_sets``; every detector's settings are chosen on ``choose_sets``. ``layers``: which
    layers to consider (default: every layer the profiles hold); ``n_layers`` is the model's depth.
    """
    rows = []
    layers = range(next(iter(fit_sets.values())).abs_below.shape[1]) if layers is None else layers
    for layer in layers:
        probe = fit_probe(fit_sets, layer)
        log(f"layer {layer}: probe fitted, choosing detector settings")
        for family in FAMILIES:
            seer, q = best_setting(choose_sets, candidates(family, layer, tau_abs, probe), max_premature)
            rows.append(Row(family, layer, seer, q, meets(q, max_premature, max_kept)))
    seer, q = best_setting(choose_sets, candidates("end_token_prob", n_layers - 1, tau_abs), max_premature)
    rows.append(Row("end_token_prob", None, seer, q, meets(q, max_premature, max_kept)))
    passing = [r for r in rows if r.meets]
    if passing:  # the shallowest layer that meets the bar (full depth last); within it, the smallest window
        depth = lambda r: n_layers if r.layer is None else r.layer  # noqa: E731
        shallowest = min(depth(r) for r in passing)
        chosen = min((r for r in passing if depth(r) == shallowest),
                     key=lambda r: worst(r.choose)["mean_kept_over_true"])  # fmt: skip
        return rows, chosen, True
    within = [r for r in rows if worst(r.choose)["premature_cut_rate"] <= max_premature] or rows
    return rows, min(within, key=lambda r: worst(r.choose)["mean_kept_over_true"]), False


def layer_profile_table(profiles: Profiles) -> str:
    """Mean statistic per probed layer at offsets around the true end (0 = the <|eot_id|> position)."""
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


def detection_table(rows: list[tuple[Row, dict[str, float]]], n_layers: int, chosen: Row) -> str:
    """Every layer x signal on one split and window: its best setting's figures."""
    lines = ["| layer | signal | setting | layers computed | premature cuts | kept / true | kept / (true + 1) "
             "| no cut | exact | meets the bar (choosing split) |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row, q in rows:
        layer = "full" if row.layer is None else str(row.layer)
        mark = " **chosen**" if row is chosen else ""
        lines.append(
            f"| {layer} | {row.family} | {row.seer.describe()} | {row.seer.layers_computed(n_layers)}"
            f"{' + head' if row.layer is None else ''} | {100 * q['premature_cut_rate']:.1f} % "
            f"| {q['mean_kept_over_true']:.2f}x | {q['mean_kept_over_true_plus_1']:.2f}x | {100 * q['no_cut_rate']:.1f} % "
            f"| {100 * q['exact']:.1f} % | {'yes' if row.meets else 'no'}{mark} |"
        )
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
    axes[2].plot(OFFSETS, np.nanmean(vals, axis=0), marker=".", color="C3", label="p_end (full depth)")
    if chosen.signal == "probe":
        probe = profiles.signal(chosen)
        vals = np.where(ok, np.take_along_axis(probe, idx_c, axis=1), np.nan)
        axes[2].plot(OFFSETS, np.nanmean(vals, axis=0), marker=".", color="C0", label=chosen.name)
    axes[2].axvline(0, color="k", ls=":", lw=1)
    axes[2].set(title="step-zero probabilities of the end", xlabel="position - true <|eot_id|>")
    axes[2].legend(fontsize=7)
    k = int(np.argsort(profiles.end)[len(profiles.end) // 2])  # a median-length sample
    sig = profiles.signal(chosen)[k]
    cut = int(detect(sig[None], chosen)[0])
    axes[3].plot(np.arange(window), sig, marker=".")
    axes[3].axvline(profiles.end[k], color="g", ls=":", label="true <|eot_id|>")
    axes[3].axvline(cut - 0.5, color="r", label=f"cut: L* = {cut}")
    axes[3].set(title=f"one sample: {chosen.name}", xlabel="position")
    axes[3].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=90)


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(
        prog="seer-calibrate",
        description="Measure step-zero signals (MLP statistics and a linear probe per layer, end-token probability) "
        "on held-out prompts, compare boundary detectors per layer, and choose the model's Seer calibration: the "
        "shallowest layer meeting the premature and kept bounds.",
    )
    add_model(ap)
    ap.add_argument("--n", type=int, default=400, help="samples per split (fit, choose, report); default 400")
    ap.add_argument(
        "--gen-length",
        type=int,
        nargs="+",
        default=[64, 128],
        help="answer windows N at step zero; the choice must hold over all of them (default 64 128)",
    )
    ap.add_argument("--max-premature", type=float, default=0.01, help="premature-cut bound (default 0.01)")
    ap.add_argument("--max-kept", type=float, default=1.25, help="bound on kept / (true + 1) (default 1.25)")
    ap.add_argument("--batch", type=int, default=50, help="prompts per step-zero forward")
    ap.add_argument("--max-layer", type=int, help="probe layers 0..K only (default: every layer); an 8B model's "
                    "residual stream at every layer, position and prompt does not fit in memory")  # fmt: skip
    ap.add_argument("--accuracy-rule", nargs="+", default=["factor:1"],
                    help="decoding rules the cut's accuracy is judged under, each with LLaDA-V's early stop unless "
                    "fixed (the exact loop); the tail must hold under all (default factor:1, the default request's)")  # fmt: skip
    ap.add_argument("--tails", type=float, nargs="+", default=[0.0, 0.5, 1.0],
                    help="end tails to judge: shares of the cut-away positions kept as committed end tokens "
                    "(default 0 0.5 1)")  # fmt: skip
    ap.add_argument("--max-loss", type=float, default=1.0,
                    help="exact-match points the cut may lose against the uncut loop (default 1), with McNemar's "
                    "p > 0.1")  # fmt: skip
    ap.add_argument("--tail-only", action="store_true",
                    help="keep the model's detector (its config.json calibration) and judge and choose only its end "
                    "tail; the report is tail.json")  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("runs/calibrate"), help="folder for the report and PNG")
    ap.add_argument("--write", action="store_true", help="write the chosen calibration into the model's config.json")
    add_verbose(ap)
    return ap


PROG = "seer-calibrate"


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, build_parser(), work, argv, atomic=False)  # a report of two files, each whole


def check_report_folder(out: Path) -> None:
    """Refuse, before the forward passes, a report folder that cannot be made: a file at ``out`` or on its way.

    Raises:
        InputError: naming the file in the way.
    """
    from seer_trt.contracts.errors import InputError

    blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise InputError(f"--out {out}: {blocker} is a file, not a folder; name a folder for the report")


def work(args: argparse.Namespace) -> int:
    require_extra("seer-calibrate")
    check_report_folder(args.out)
    import torch

    from seer_export.models.registry import load
    from seer_export.reference.fixture import TaskEncoder

    model, folder = load(args.model, args.checkpoint)
    model.eval()
    enc = TaskEncoder(folder, model.config)
    vision = model.config.vision
    grid = vision.image_size // vision.patch_size
    if args.tail_only:
        return judge_tail_only(model, enc, folder, grid, vision.patch_size, args, SPLITS)
    tau_abs = SeerConfig().tau_abs
    depth = model.config.text.num_hidden_layers
    considered = range(depth if args.max_layer is None else min(depth, args.max_layer + 1))
    paper_layer = SeerConfig().probe_layer if SeerConfig().probe_layer < depth else 0
    probed = tuple(range(max(len(considered), paper_layer + 1)))  # the paper's rule is always reported
    paper_seer = SeerConfig().replace(probe_layer=paper_layer)
    split: dict[str, dict[int, Profiles]] = {name: {} for name in SPLITS}
    drawn: dict[str, dict[int, list]] = {name: {} for name in SPLITS}
    parts = draw_splits(enc, SPLITS, args.n, grid, vision.patch_size)
    with torch.no_grad():
        for name in SPLITS:
            for n in args.gen_length:
                samples = [s for s in parts[name] if len(enc.answer_ids(s)) < n]
                drawn[name][n] = samples
                print(f"step zero on {len(samples)} {name} samples, N = {n}", file=sys.stderr)
                split[name][n] = collect(model, enc, samples, n, tau_abs, args.batch, probed)
    n_layers = model.config.text.num_hidden_layers
    rows, chosen, ok = calibrate(split["fit"], split["choose"], n_layers, tau_abs, args.max_premature,
                                 args.max_kept, lambda s: print(s, file=sys.stderr), considered)  # fmt: skip
    bar = f"premature <= {100 * args.max_premature:g} %, kept <= {args.max_kept:g}x (true + 1) on every N"
    summary = {"model": args.model, "task_family": enc.family, "chosen": chosen.seer.to_dict(),
               "chosen_name": chosen.seer.describe(), "meets_bar": ok, "bar": bar,
               "max_premature": args.max_premature, "max_kept": args.max_kept, "paper": {}, "windows": {}}  # fmt: skip
    first = split["report"][args.gen_length[0]]
    print("\nStep-zero profile around the true end (report split, N = "
          f"{args.gen_length[0]}; columns: position - true <|eot_id|>)")  # fmt: skip
    print(layer_profile_table(first))
    for n, report in split["report"].items():
        measured = [(r, evaluate(report, r.seer, n)) for r in rows]
        paper = evaluate(report, paper_seer, n)
        print(f"\nDetection per layer x signal on the report split ({len(report.end)} samples, N = {n}); probes "
              f"fitted on one disjoint split, each row's setting chosen on another; bar: {bar}")  # fmt: skip
        print(detection_table(measured, n_layers, chosen))
        print(f"paper-exact rule ({paper_seer.describe()}): premature {100 * paper['premature_cut_rate']:.1f} %, "
              f"kept / true {paper['mean_kept_over_true']:.2f}x, no cut {100 * paper['no_cut_rate']:.1f} %")  # fmt: skip
        summary["paper"][str(n)] = paper
        summary["windows"][str(n)] = {"n": int(len(report.end)), "rows": [
            {"layer": r.layer, "signal": r.family, "setting": r.seer.describe(), "meets_bar": r.meets,
             "layers_computed": r.seer.layers_computed(n_layers), "choose": r.choose[n], **q}
            for r, q in measured]}  # fmt: skip
    verdict = "meets the bar" if ok else f"NO layer meets the bar ({bar}); best honest choice"
    print(f"\ndetector: {chosen.seer.describe()} ({verdict})")
    seer, accurate = judge_accuracy(model, enc, drawn, chosen.seer, args, summary)
    chosen = dataclasses.replace(chosen, seer=seer)
    summary["chosen"], summary["chosen_name"] = seer.to_dict(), seer.describe()
    print(f"\nchosen: {seer.describe()} ({verdict}; "
          + ("its cut keeps the uncut loop's accuracy)" if accurate else "NO end tail keeps the uncut loop's accuracy: "
             "the most context of those tried)"))  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    plot(first, chosen.seer, args.out / "step_zero_profile.png")
    write_json(args.out / "calibration.json", summary)
    print(f"wrote {args.out / 'calibration.json'} and {args.out / 'step_zero_profile.png'}")
    if args.write:
        write_seer(folder, chosen.seer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
