"""The command-line tools: argparse only, one module per command, each a thin layer over a library function.

The console scripts enter through ``launch``: the command's module is imported inside it, and SIGINT, SIGTERM
and SIGHUP end any command with one line and exit status 128 + the signal, during its imports as at any later
point. (Only
Python's own start-up, the first few tens of milliseconds before any of this code runs, is out of its reach.)
"""

from __future__ import annotations

import importlib
import signal
import sys

_START_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


class SignalInterrupt(KeyboardInterrupt):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def by_interrupt(err: BaseException) -> KeyboardInterrupt | None:
    """The interrupt behind ``err``: itself, or one that a failing import chained (``ImportError: initialization
    failed`` when Ctrl-C lands inside an extension module's import)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def _raise(signum, frame):
    raise SignalInterrupt(signum)


_raise.seer_default = True  # stands for the default: signals_as_interrupts installs its own handler over it


def launch(prog: str, module: str, argv: list[str] | None = None) -> int:
    """Import ``module`` and return its ``main(argv)``. SIGTERM and SIGHUP (where not ignored) raise a
    KeyboardInterrupt for the whole command, as Ctrl-C does, so every command ends on them with one line and
    128 + the signal (``seer_trt.cli.common.run_main``); an interrupt during the import says so."""
    try:  # a Ctrl-C may come while the handlers are being installed, too, or while main builds its parser (before
        for s in _START_SIGNALS:  # run_main's own guard: argparse imports gettext and locale lazily)
            if signal.getsignal(s) is signal.SIG_DFL:
                signal.signal(s, _raise)
        return importlib.import_module(module).main(argv)
    except BaseException as err:
        interrupt = by_interrupt(err)
        if interrupt is None:
            raise
        signum = getattr(interrupt, "signum", signal.SIGINT)
        print(f"{prog}: interrupted ({signal.Signals(signum).name}) while starting; nothing was done", file=sys.stderr)
        return 128 + int(signum)


def _entry(prog: str, module: str):
    def main(argv: list[str] | None = None) -> None:
        sys.exit(launch(prog, module, argv))

    main.__doc__ = f"The ``{prog}`` console script (``{module}.main``)."
    main.command_module = module  # where its parser is (tools/cli_docs.py)
    return main


seer_run = _entry("seer-run", "seer_trt.cli.run")
seer_triton = _entry("seer-triton", "seer_trt.cli.triton")
seer_serve = _entry("seer-serve", "seer_trt.cli.serve")
seer_build = _entry("seer-build", "seer_trt.cli.build")
seer_eval = _entry("seer-eval", "seer_trt.cli.eval")
seer_prompt_ids = _entry("seer-prompt-ids", "seer_trt.cli.prompt_ids")
# the export-side commands live in seer_export (which may import seer_trt, never the reverse): imported by name
seer_export = _entry("seer-export", "seer_export.cli")
seer_reference = _entry("seer-reference", "seer_export.reference.run")
seer_calibrate = _entry("seer-calibrate", "seer_export.calibrate")
seer_quantize = _entry("seer-quantize", "seer_export.quantize")
seer_bench = _entry("seer-bench", "seer_export.bench.cli")
