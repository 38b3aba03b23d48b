"""What every command shares: one ``run_main``, a parser whose errors are one line, and the argument groups that
several commands take (engines, backend, generation, cache, samples, model, report), declared once.

In:  the command's name, its parser and the function doing its work.
Out: that function's exit status; for an error a user caused, exit status 2 and one line on stderr (``--verbose``
     re-raises); for Ctrl-C / SIGTERM / SIGHUP, 128 + the signal and one line.

Nothing here imports a stage: defaults come from ``seer_trt.contracts``, so ``--help`` stays light.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

from seer_trt.contracts.errors import SeerError
from seer_trt.contracts.policies import CACHE_MODES, DEFAULT_CACHE, DEFAULT_POLICY, ORDERS, POLICIES


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line naming ``--help``, exit status 2, like every other bad input."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}; see {self.prog} --help", file=sys.stderr)
        raise SystemExit(2)


EXPORT_MODULES = ("torch", "transformers", "safetensors", "onnx", "onnxscript")  # what the export extra brings


def require_extra(prog: str, modules: tuple[str, ...] = EXPORT_MODULES, extra: str = "export") -> None:
    """Refuse to start, in one line, when an extra's packages are missing (a runtime-only ``pip install .``).

    Raises:
        ConfigError: naming the missing packages and the install command.
    """
    import importlib.util

    from seer_trt.contracts.errors import ConfigError

    def importable(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    missing = [m for m in modules if not importable(m)]
    if missing:
        raise ConfigError(f"{prog} needs the '{extra}' extra ({', '.join(missing)} not installed); install it with "
                          f"pip install 'seer-trt[{extra}]'")  # fmt: skip


def interrupted(prog: str, err: KeyboardInterrupt, verbose: bool, atomic: bool = True) -> int:
    """One line for Ctrl-C / SIGTERM / SIGHUP, exit status 128 + the signal; ``--verbose`` re-raises.

    Args:
        atomic: the command writes its outputs whole or not at all, so the line may say nothing half-written
            was left behind.
    """
    from seer_trt.contracts.signals import signal_name

    if verbose:
        raise err
    name, signum = signal_name(err)
    clean = "; nothing half-written was left behind" if atomic else ""
    print(f"{prog}: interrupted ({name}){clean}", file=sys.stderr)
    return 128 + signum


def printable(text: str) -> str:
    """``text`` safe to print: a lone surrogate (a path or argument that was not UTF-8) shown escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def fail(prog: str, err: BaseException, verbose: bool) -> int:
    """One line on stderr for an error a user caused, exit status 2; ``--verbose`` re-raises it."""
    if verbose:
        raise err
    print(printable(f"{prog}: error: {err}"), file=sys.stderr)
    return 2


def run_main(prog: str, parser: argparse.ArgumentParser, work: Callable[[argparse.Namespace], int],
             argv: list[str] | None = None, signals: bool = False, atomic: bool = True) -> int:  # fmt: skip
    """The ``main`` of every command: parse ``argv``, return ``work(args)``; a ``SeerError`` or ``OSError`` becomes
    one line and exit status 2, an interrupt one line and 128 + the signal.

    Args:
        signals: SIGTERM and SIGHUP interrupt ``work`` as Ctrl-C does (commands that write output folders, so the
            staging folder is removed on the way out).
        atomic: every file the command writes appears whole or not at all (what the interrupt line may claim).
    """
    try:  # an interrupt may come during this import, too (a slow machine's start-up)
        from seer_trt.contracts.signals import signals_as_interrupts

        args = parser.parse_args(argv)
    except (KeyboardInterrupt, ImportError) as err:
        from seer_trt.cli import by_interrupt

        interrupt = by_interrupt(err)
        if interrupt is None:
            raise
        return interrupted(prog, interrupt, False, atomic)
    verbose = getattr(args, "verbose", False)
    try:
        if signals:
            with signals_as_interrupts():
                return work(args)
        return work(args)
    except KeyboardInterrupt as err:
        return interrupted(prog, err, verbose, atomic)
    except (SeerError, OSError) as err:
        return fail(prog, err, verbose)
    except ImportError as err:  # Ctrl-C inside an extension module's import fails that import instead
        from seer_trt.cli import by_interrupt

        interrupt = by_interrupt(err)
        if interrupt is None:
            raise
        return interrupted(prog, interrupt, verbose, atomic)


def check_output(path: Path | None, flag: str = "--output", source: Path | None = None,
                 source_flag: str = "--input", example: str = "out.jsonl") -> None:  # fmt: skip
    """Refuse, before any work, an output file that cannot be written: a folder, in a folder that does not exist
    (no folder is created that the user did not ask for) or under a file, or the very file ``source`` names
    (through any link), which the output would replace.

    Raises:
        InputError: naming ``flag`` and what to do (``example``: a file name to suggest).
    """
    from seer_trt.contracts.errors import InputError

    if path is None:
        return
    if path.is_dir():
        raise InputError(f"{flag} {path} is a folder; name a file (for example {path / example})")
    parent = path.parent
    blocker = next((p for p in (parent, *parent.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise InputError(f"{flag} {path}: {blocker} is a file, not a folder; name a file in a folder")
    if not parent.is_dir():
        raise InputError(f"{flag} {path}: the folder {parent} does not exist; create it first (mkdir -p {parent})")
    if source is not None and str(source) != "-" and output_path(path) == output_path(source):
        raise InputError(f"{flag} {path} is the {source_flag} file ({source}): the results would replace what they "
                         f"answer; name another file")  # fmt: skip


def output_path(path: Path) -> Path:
    """Where writing ``path`` lands: symbolic links followed (so a link stays a link and its target is replaced),
    resolved the same way whatever the working folder, as every path compared with it is."""
    return path.expanduser().resolve()


def write_output(path: Path | None, text: str, flag: str = "--output") -> None:
    """``text`` to the file at ``path``, or to stdout when ``path`` is None (``write_output_stream`` of one piece)."""
    write_output_stream(path, (text,), flag)


def write_output_stream(path: Path | None, pieces: Iterable[str], flag: str = "--output") -> None:
    """Each of ``pieces`` written as it comes (so the caller need not hold them all): to stdout, flushed after each,
    when ``path`` is None.

    Never half-written: the pieces go to a staging file of this process's own next to ``path`` (its target, when
    ``path`` is a symbolic link; so processes writing the same output never share one), renamed onto it once the
    last is written; on any failure, an exception from ``pieces`` included, the staging file is removed and the
    previous file stays. An output that exists and is no regular file (``/dev/null``, a FIFO, a terminal) is
    written directly, as stdout is: there is nothing to replace.

    Raises:
        InputError: see ``check_output``.
    """
    import stat

    from seer_trt.contracts.outfolder import write_file

    if path is None:
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
        return
    check_output(path, flag)
    target = output_path(path)

    def write(f: BinaryIO) -> None:
        for piece in pieces:
            f.write(piece.encode("utf-8"))

    try:
        special = not stat.S_ISREG(target.stat().st_mode)
    except FileNotFoundError:
        special = False
    if special:
        with open(target, "wb") as f:
            write(f)
        return
    write_file(target, write)


JSONL_LINE_SLACK = 2**16  # bytes of a request line besides its text: field names, settings, an image path


def jsonl_line_limit(max_chars: int) -> int:
    """The most bytes one JSONL request line may take: its text at ``max_chars`` characters, each written as JSON
    escapes at worst (12 bytes: a surrogate pair of ``\\uXXXX``), plus ``JSONL_LINE_SLACK``."""
    return 12 * max_chars + JSONL_LINE_SLACK


def open_jsonl(path: Path, flag: str = "--input") -> BinaryIO:
    """The JSONL file at ``path`` opened for reading (``-``: stdin's bytes), before any work.

    Raises:
        InputError: it does not exist, cannot be read, or is not a regular file or a pipe.
    """
    import stat

    from seer_trt.contracts.errors import InputError

    try:
        if str(path) == "-":
            stream = getattr(sys.stdin, "buffer", None)
            if stream is None:  # a text stream without a buffer (tests): as given
                import io

                stream = io.BytesIO(sys.stdin.read().encode("utf-8", "surrogateescape"))
            return stream
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise InputError(f"{flag} {path} is a folder; pass a JSONL file")
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            raise InputError(f"{flag} {path} is not a regular file; pass a JSONL file")
        return open(path, "rb")  # noqa: SIM115 - the caller closes it
    except FileNotFoundError:
        raise InputError(f"{flag} {path} does not exist; pass a JSONL file") from None
    except OSError as err:
        raise InputError(f"cannot read {flag} {path} ({err.strerror or err}); pass a JSONL file") from None


def iter_jsonl(stream: BinaryIO, path: Path, max_line_bytes: int, flag: str = "--input") -> Iterator[tuple[int, Any]]:
    """The request lines of an open JSONL stream, one at a time as they are read, each as (line number, decoded
    JSON value or the line's error as ``line N: ...``); blank lines are skipped. Never holds more than
    ``max_line_bytes`` of one line: a longer line is skipped to its end and becomes its error. Closes ``stream``
    (not stdin) when done.

    Raises:
        InputError: the stream cannot be read, or it held no request (raised once it is exhausted).
    """
    import codecs
    import json

    from seer_trt.contracts.errors import InputError

    count = 0
    try:
        number = 0
        while True:
            raw = stream.readline(max_line_bytes + 1)
            if not raw:
                break
            number += 1
            if number == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                size = len(raw)
                while raw and not raw.endswith(b"\n"):  # the rest of the line, a bounded chunk at a time
                    raw = stream.readline(2**20)
                    size += len(raw)
                size -= raw.endswith(b"\n")
                count += 1
                yield number, (f"line {number}: {size} bytes, more than the {max_line_bytes} a request line may "
                               f"hold (its text past what the largest prompt bucket holds); shorten it")  # fmt: skip
                continue
            raw = raw.rstrip(b"\r\n")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                count += 1
                yield number, (f"line {number}: not UTF-8 (byte 0x{raw[err.start]:02x} at column "
                               f"{err.start + 1}); write the file as UTF-8")  # fmt: skip
                continue
            if not line.strip():
                continue
            try:
                value: Any = json.loads(line)
            except json.JSONDecodeError as err:
                value = f"line {number}: not JSON ({err.msg})"
            except RecursionError:
                value = f"line {number}: nested too deeply to be a request"
            count += 1
            yield number, value
    except OSError as err:
        raise InputError(f"cannot read {flag} {path} ({err.strerror or err}); pass a JSONL file") from None
    finally:
        if stream is not getattr(sys.stdin, "buffer", None):
            stream.close()
    if not count:
        raise InputError(f"{flag} {path} holds no requests; write one JSON object per line")


def read_jsonl(path: Path, max_line_bytes: int, flag: str = "--input") -> list[tuple[int, Any]]:
    """Every request line of a JSONL file at once (``iter_jsonl`` of ``open_jsonl``): for files small enough to
    hold; the commands stream them.

    Raises:
        InputError: see ``open_jsonl`` and ``iter_jsonl``.
    """
    return list(iter_jsonl(open_jsonl(path, flag), path, max_line_bytes, flag))


def command_line(prog: str, argv: list[str] | None) -> str:
    """The command as typed, for reports."""
    return " ".join([prog, *(sys.argv[1:] if argv is None else argv)])


# --- argument groups ------------------------------------------------------------------------------------------


def add_engines(ap: argparse.ArgumentParser, help: str = "export folder written by seer-export",
                required: bool = True) -> None:  # fmt: skip
    """``--engines``; ``required`` False where another flag stands in for it (the command then asks for it)."""
    ap.add_argument("--engines", type=Path, required=required, help=help)


def add_verbose(ap: argparse.ArgumentParser, help: str = "tracebacks on errors") -> None:
    ap.add_argument("--verbose", action="store_true", help=help)


def add_threads(ap: argparse._ActionsContainer, default: int = 0, help: str = "") -> None:
    """``--threads``: ONNX Runtime's intra-op threads; 0 is ONNX Runtime's own choice."""
    what = help or "ONNX Runtime intra-op threads"
    ap.add_argument(
        "--threads", type=int, default=default, help=f"{what} (default: {default or 'ONNX Runtime chooses'})"
    )


def add_backend(ap: argparse.ArgumentParser) -> None:
    """How an export's graphs run: ``SeerPipeline.from_manifest``'s backend, provider, threads, checks."""
    g = ap.add_argument_group("backend")
    g.add_argument("--backend", default="onnxruntime", choices=("onnxruntime", "tensorrt", "tensorrt-rtx"),
                   help="onnxruntime (default), or the TensorRT plans seer-build recorded")  # fmt: skip
    g.add_argument("--provider", default="cpu", help="ONNX Runtime provider: cpu (default), cuda, tensorrt")
    add_threads(g)
    g.add_argument("--verify", action="store_true",
                   help="check every graph file against the sha256 the export recorded before running")  # fmt: skip
    g.add_argument("--cuda-graphs", action="store_true",
                   help="TensorRT backends: replay CUDA graphs for calls at a static bucket shape")  # fmt: skip
    g.add_argument("--policy", default=DEFAULT_POLICY, choices=POLICIES,
                   help=f"how each denoising step's rows are split into graph calls (default: {DEFAULT_POLICY}, "
                   f"timed on the backend before the first step that needs it)")  # fmt: skip
    g.add_argument("--kv-budget-mib", type=int, metavar="MIB",
                   help="bytes the prompt K/V cache may hold in the backend's memory, in MiB: a request joins the "
                   "denoising loop once its K/V fits, and waits until then (default: a quarter of the machine's "
                   "memory on the CPU, half the GPU's free memory under CUDA and TensorRT)")  # fmt: skip


def backend_options(args: argparse.Namespace) -> dict:
    """``SeerPipeline.from_manifest``'s keyword arguments from ``add_backend``'s flags (``--kv-budget-mib`` checked).

    Raises:
        InputError: a K/V budget below 1 MiB.
    """
    from seer_trt.contracts.errors import InputError

    budget = args.kv_budget_mib
    if budget is not None and budget < 1:
        raise InputError(f"--kv-budget-mib {budget} must be at least 1 (MiB); omit it for the default")
    return {"backend": args.backend, "provider": args.provider, "threads": args.threads, "policy": args.policy,
            "verify": args.verify, "cuda_graphs": args.cuda_graphs,
            "kv_budget": None if budget is None else budget * 2**20}  # fmt: skip


def add_generation(ap: argparse.ArgumentParser) -> None:
    """Overrides of the export's generation defaults, as ``Request`` fields."""
    g = ap.add_argument_group("generation")
    g.add_argument("--gen-length", type=int, help="answer window (default: the export's)")
    g.add_argument("--steps", type=int, help="denoising steps over the window (default: the export's)")
    g.add_argument("--temperature", type=float,
                   help="sampling temperature (default: the export's, 0: greedy); > 0 samples over the whole "
                   "vocabulary through denoise_logits where the export has it (seer-export --sampling), else from "
                   "the denoise graph's most probable ids per position")  # fmt: skip
    g.add_argument("--decoding", metavar="RULE",
                   help="how many tokens a step commits: fixed (gen_length / steps per step, the paper's loop), "
                   "threshold:TAU (every position with probability >= TAU, at least one; Fast-dLLM) or factor:F "
                   "(the n most confident while the n-th has probability >= 1 - F / (n + 1); LLaDA-V's Fast-dLLM "
                   "hook) (default: the export's)")  # fmt: skip
    g.add_argument("--no-seer", action="store_true", help="the padded baseline: denoise all gen_length positions")
    g.add_argument("--early-stop", action="store_true",
                   help="LLaDA-V's official stopping criterion: stop once the answer before the first <|eot_id|> "
                   "is complete (with or without Seer)")  # fmt: skip


def add_cache(ap: argparse.ArgumentParser, default: str = DEFAULT_CACHE.mode, orders: bool = True,
              why: str = "") -> None:  # fmt: skip
    """The prompt K/V cache policy (``CacheConfig``): mode, refresh interval, forecast order."""
    g = ap.add_argument_group("prompt K/V cache")
    g.add_argument("--cache", choices=CACHE_MODES, default=default,
                   help=f"none (every step computes the prompt: the exact loop), reuse (refresh every "
                   f"--refresh-interval steps and at block starts, reuse in between) or forecast (ResilPhase "
                   f"extrapolation between refreshes) (default: {default}{why})")  # fmt: skip
    g.add_argument("--refresh-interval", type=int, default=DEFAULT_CACHE.refresh,
                   help=f"steps between exact prompt computations under --cache reuse/forecast (default: "
                   f"{DEFAULT_CACHE.refresh})")  # fmt: skip
    if orders:
        g.add_argument("--forecast-order", type=int, default=DEFAULT_CACHE.order, choices=ORDERS,
                       help=f"Lagrange order of --cache forecast (default: {DEFAULT_CACHE.order})")  # fmt: skip


def add_samples(ap: argparse.ArgumentParser, n: int, seed: int, what: str = "held-out prompts") -> None:
    """How many held-out prompts of the fixture task, and their seed."""
    g = ap.add_argument_group("prompts")
    g.add_argument("--n", type=int, default=n, help=f"{what} (default {n})")
    g.add_argument("--seed", type=int, default=seed, help=f"their seed (default {seed})")


def add_model(ap: argparse.ArgumentParser, default: str = "tiny-llada-v") -> None:
    """Which PyTorch checkpoint: a registry name and, optionally, the folder it is in."""
    g = ap.add_argument_group("model")
    g.add_argument("--model", default=default,
                   help=f"registered model: tiny-llada-v (the bundled fixture), tiny-llada-v-hard (the bundled fixture "
                   f"with real-model-like confidences), tiny-llada-v-vqa (the bundled fixture trained on easy-vqa), tiny-dream (the bundled Dream-family fixture: shifted logits), "
                   f"llada-v, lavida-llada, mmada, dream, lavida-dream (default: {default})")  # fmt: skip
    g.add_argument("--checkpoint", type=Path,
                   help="checkpoint folder (config.json, safetensors, tokenizer); default: the registry's, or the "
                   "local Hugging Face cache")  # fmt: skip


def add_report(ap: argparse.ArgumentParser, json: str = "write the figures here", plot: str | None = None) -> None:
    """Where a measuring command writes its report (``--json``) and its figure (``--plot``)."""
    g = ap.add_argument_group("report")
    g.add_argument("--json", type=Path, help=json)
    if plot is not None:
        g.add_argument("--plot", type=Path, help=plot)
