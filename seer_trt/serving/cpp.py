"""The C++ runtime (``cpp/``, docs/DESIGN.md "C++ runtime") from Python, through its C ABI (``seer/seer_c.h``) and ctypes.

In:  a built ``libseer.so``, an export folder, options (``ort_library``, ``provider``, ``threads``, ``policy``, ...);
     requests as C++ request objects (``seer_trt.cli.prompt_ids``: ``prompt_ids``, optional pixel tiles).
Out: one result dict per request, with ``seer-run``'s fields (``text``, ``token_ids``, ``window``, ``kept``, ``steps``,
     ``gen_length``, ``seconds``, ``error``); ``seconds`` adds ``graphs``, the time inside ONNX Runtime.

What the tests hold against the Python runtime and what ``seer-bench --cpp`` times. ctypes releases the GIL during
a foreign call, so several Python threads drive one pipeline as a C++ service's threads would.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seer_trt.contracts.errors import ConfigError, InputError, ManifestError

STAGES = ("preprocess", "step_zero", "boundary", "dispatch", "packing", "denoise", "detokenize", "graphs")
ABI_VERSION = 5
_I64 = ctypes.POINTER(ctypes.c_int64)


class _Image(ctypes.Structure):
    _fields_ = [
        ("pixel_values", ctypes.POINTER(ctypes.c_float)),
        ("tiles", ctypes.c_int64),
        ("grid_cols", ctypes.c_int64),
        ("grid_rows", ctypes.c_int64),
        ("width", ctypes.c_int64),
        ("height", ctypes.c_int64),
    ]


class _Request(ctypes.Structure):
    """``seer_request`` of ABI 5: ``struct_size`` first, the stride of a request array (seer_c.h)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("prompt_ids", _I64),
        ("prompt_len", ctypes.c_size_t),
        ("image", _Image),
        ("gen_length", ctypes.c_int64),
        ("steps", ctypes.c_int64),
        ("block_length", ctypes.c_int64),
        ("window", ctypes.c_int64),
        ("seer", ctypes.c_int32),
        ("early_stop", ctypes.c_int32),
        ("cache", ctypes.c_char_p),
        ("refresh_interval", ctypes.c_int64),
        ("decoding", ctypes.c_char_p),
        ("remasking", ctypes.c_char_p),
        ("temperature", ctypes.c_double),
        ("seed", ctypes.c_uint64),
        ("top_p", ctypes.c_double),
        ("stop", ctypes.POINTER(ctypes.c_char_p)),
        ("num_stop", ctypes.c_size_t),
    ]


SEER_OFF = -1  # seer_request.seer: the padded baseline


class _Result(ctypes.Structure):
    _fields_ = [
        ("token_ids", _I64),
        ("num_tokens", ctypes.c_size_t),
        ("window", _I64),
        ("window_len", ctypes.c_size_t),
        ("kept", ctypes.c_int64),
        ("steps", ctypes.c_int64),
        ("gen_length", ctypes.c_int64),
        ("seconds", ctypes.c_double * len(STAGES)),
        ("text", ctypes.c_char_p),
        ("error", ctypes.c_char_p),
        ("refreshes", ctypes.c_int64),
    ]


class _Results(ctypes.Structure):
    _fields_ = [("count", ctypes.c_size_t), ("items", ctypes.POINTER(_Result))]


def wheel_library() -> str:
    """The installed onnxruntime wheel's ``libonnxruntime.so``: the library the Python runtime runs on, so a
    ``CppPipeline`` given it (``ort_library=``) computes the same bits from every graph call."""
    import onnxruntime

    found = sorted((Path(onnxruntime.__file__).parent / "capi").glob("libonnxruntime.so*"))
    if not found:
        raise ConfigError(f"the onnxruntime wheel at {Path(onnxruntime.__file__).parent} holds no libonnxruntime.so")
    return str(found[0])


def load_library(path: str | Path) -> ctypes.CDLL:
    """``libseer.so`` with its C ABI declared.

    Raises:
        ConfigError: the file does not load or is another ABI version.
    """
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as err:
        raise ConfigError(f"cannot load the C++ runtime {path} ({err}); build it: cmake -S cpp -B cpp/build && "
                          f"cmake --build cpp/build") from None  # fmt: skip
    lib.seer_abi_version.restype = ctypes.c_int
    lib.seer_open.restype = ctypes.c_void_p
    lib.seer_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p),
                              ctypes.c_size_t]  # fmt: skip
    lib.seer_generate.restype = ctypes.POINTER(_Results)
    lib.seer_generate.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Request), ctypes.c_size_t, ctypes.c_char_p]
    lib.seer_results_free.argtypes = [ctypes.POINTER(_Results)]
    lib.seer_close.argtypes = [ctypes.c_void_p]
    lib.seer_last_error.restype = ctypes.c_char_p
    if lib.seer_abi_version() != ABI_VERSION:
        raise ConfigError(f"{path} has C ABI version {lib.seer_abi_version()}, expected {ABI_VERSION}; rebuild it")
    return lib


class CppPipeline:
    """A ``seer::Pipeline`` opened through the C ABI."""

    def __init__(self, library: str | Path | ctypes.CDLL, folder: str | Path, **options: Any) -> None:
        """
        Args:
            library: ``libseer.so`` (or the loaded library).
            folder: the export folder.
            options: ``ort_library``, ``provider``, ``device_id``, ``threads``, ``policy``, ``tau_pad``, ``short``,
                ``share_weights``, ``cache``, ``refresh_interval``, ``forecast_order`` (``seer/seer_c.h``).

        Raises:
            ManifestError: the C++ runtime refused to open the folder; its message says why.
        """
        self.lib = library if isinstance(library, ctypes.CDLL) else load_library(library)
        keys = [k.encode() for k in options]
        values = [str(int(v) if isinstance(v, bool) else v).encode() for v in options.values()]
        handle = self.lib.seer_open(str(folder).encode(), (ctypes.c_char_p * len(keys))(*keys),
                                    (ctypes.c_char_p * len(values))(*values), len(keys))  # fmt: skip
        if not handle:
            raise ManifestError(self.lib.seer_last_error().decode())
        self.handle = handle

    def generate(self, requests: Sequence[Mapping[str, Any]], policy: str | None = None) -> list[dict[str, Any]]:
        """One result dict per request. A request: ``prompt_ids``, optional ``pixel_values`` (an array [tiles, 3,
        S, S] float32) or ``image_tiles`` (its .npy path), ``image_grid``, ``image_size``, ``gen_length``, ``steps``,
        ``block_length``, ``decoding``, ``window``, ``seer``, ``early_stop``, ``cache``, ``refresh_interval``,
        ``temperature``, ``remasking``, ``seed``, ``top_p``, ``stop`` (the text ends before the first).

        A request whose ``decoding`` is not text fails alone with Python's message (the C ABI takes text)."""
        failed = {i: _decoding_error(r["decoding"]) for i, r in enumerate(requests)
                  if r.get("decoding") is not None and not isinstance(r["decoding"], str)}  # fmt: skip
        sent = [r for i, r in enumerate(requests) if i not in failed]
        answered = iter(self._generate(sent, policy) if sent else [])
        return [_failed(failed[i]) if i in failed else next(answered) for i in range(len(requests))]

    def _generate(self, requests: Sequence[Mapping[str, Any]], policy: str | None) -> list[dict[str, Any]]:
        keep: list[Any] = []  # arrays the C structs point into, alive through the call
        structs = (_Request * len(requests))()
        for c, r in zip(structs, requests, strict=True):
            c.struct_size = ctypes.sizeof(_Request)
            ids = np.ascontiguousarray(r["prompt_ids"], dtype=np.int64)
            keep.append(ids)
            c.prompt_ids, c.prompt_len = ids.ctypes.data_as(_I64), len(ids)
            pixels = r.get("pixel_values")
            if pixels is None and r.get("image_tiles") is not None:
                pixels = np.load(r["image_tiles"])
            if pixels is not None:
                pixels = np.ascontiguousarray(pixels, dtype=np.float32)
                pixels = pixels[None] if pixels.ndim == 3 else pixels
                keep.append(pixels)
                c.image.pixel_values = pixels.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
                c.image.tiles = len(pixels)
            c.image.grid_cols, c.image.grid_rows = r.get("image_grid") or (0, 0)
            c.image.width, c.image.height = r.get("image_size") or (0, 0)
            for name in ("gen_length", "steps", "block_length", "window", "refresh_interval", "seed"):
                setattr(c, name, r.get(name) or 0)
            c.cache = None if r.get("cache") is None else str(r["cache"]).encode()
            c.decoding = None if r.get("decoding") is None else r["decoding"].encode()
            c.remasking = None if r.get("remasking") is None else str(r["remasking"]).encode()
            c.seer, c.early_stop = 0 if r.get("seer", True) else SEER_OFF, bool(r.get("early_stop", False))
            c.temperature = -1.0 if r.get("temperature") is None else float(r["temperature"])
            c.top_p = float(r.get("top_p", 1.0))
            stop = r.get("stop") or []
            stop = [stop] if isinstance(stop, str) else list(stop)
            if stop:
                array = (ctypes.c_char_p * len(stop))(*(str(q).encode() for q in stop))
                keep.append(array)
                c.stop, c.num_stop = array, len(stop)
        out = self.lib.seer_generate(self.handle, structs, len(requests), policy.encode() if policy else None)
        if not out:
            raise ConfigError(self.lib.seer_last_error().decode())
        try:
            return [_result(out.contents.items[i]) for i in range(out.contents.count)]
        finally:
            self.lib.seer_results_free(out)

    def close(self) -> None:
        if self.handle:
            self.lib.seer_close(self.handle)
            self.handle = None

    def __enter__(self) -> CppPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _decoding_error(value: Any) -> str:
    """Python's message for a decoding rule that is not text (``seer_trt.runtime.request.check_settings``)."""
    from seer_trt.runtime.request import check_settings

    try:
        check_settings(decoding=value)
    except InputError as err:
        return str(err)
    raise AssertionError(f"decoding {value!r} is not text, yet check_settings accepted it")


def _failed(error: str) -> dict[str, Any]:
    return {"text": "", "token_ids": [], "window": [], "kept": 0, "steps": 0, "gen_length": 0, "seconds": {},
            "error": error, "refreshes": 0, "error_kind": "input"}  # fmt: skip


def _result(r: _Result) -> dict[str, Any]:
    if r.error:
        return _failed(r.error.decode("utf-8", "replace"))
    return {
        "text": None if r.text is None else r.text.decode("utf-8", "replace"),
        "token_ids": r.token_ids[: r.num_tokens],
        "window": r.window[: r.window_len],
        "kept": r.kept,
        "steps": r.steps,
        "gen_length": r.gen_length,
        "seconds": dict(zip(STAGES, r.seconds, strict=True)),
        "error": None,
        "refreshes": r.refreshes,
        "error_kind": None,
    }


class CppRequests:
    """seer-run requests -> C++ requests, with one export's tokenizer, chat template and vision settings."""

    def __init__(self, folder: str | Path) -> None:
        from seer_trt.contracts.manifest import Manifest
        from seer_trt.runtime.image import ImageLimits
        from seer_trt.runtime.prompt import PromptFormat

        self.manifest = Manifest.read(folder)
        self.prompts = PromptFormat(folder, self.manifest)  # the tokenizer and the template only: no graph runs
        v = self.manifest.vision
        self.limits = ImageLimits.of(v)

    def tiles(self, image: Any) -> tuple[np.ndarray, dict[str, Any]]:
        """The image's normalised pixel tiles [tiles, 3, S, S] float32, and the fields anyres merging needs."""
        from seer_trt.runtime.image import prepare_image

        prepared = prepare_image(image, self.manifest.vision, self.limits)
        if prepared.grid is None:
            return prepared.tiles.astype(np.float32), {}
        extra = {"image_grid": list(prepared.grid), "image_size": list(prepared.original_size)}
        return prepared.tiles.astype(np.float32), extra

    def convert(self, data: dict[str, Any], tiles_path: Path | None) -> dict[str, Any]:
        """One seer-run request object as a C++ request object (its image's tiles saved at ``tiles_path``).

        Raises:
            InputError: a malformed request, an unreadable image, or an image without a place for its tiles.
        """
        from seer_trt.runtime.request import Request

        request = Request.from_dict(data)
        out: dict[str, Any] = {k: v for k, v in data.items() if k not in ("prompt", "image", "system", "history")}
        out["prompt_ids"] = self.prompts.ids(request.prompt, request.image is not None, request.system, request.history)
        if request.image is not None:
            if tiles_path is None:
                raise InputError("an image needs a file for its tiles; pass --tiles FILE.npy (or --tiles-dir DIR)")
            tiles, extra = self.tiles(request.image)
            save_npy(tiles_path, tiles)
            out.update(image_tiles=str(tiles_path), **extra)
        return out


def save_npy(path: Path, array: np.ndarray) -> None:
    """``array`` as a .npy file at exactly ``path`` (``np.save`` given a name would add ``.npy``), written whole or
    not at all: through a staging file of this process's own, renamed onto ``path``. No folder is created.

    Raises:
        InputError: the folder of ``path`` does not exist, or ``path`` is a folder.
    """
    from seer_trt.contracts.outfolder import write_file

    if path.is_dir():
        raise InputError(f"tiles file {path} is a folder; name a .npy file")
    if not path.parent.is_dir():
        raise InputError(f"tiles file {path}: the folder {path.parent} does not exist; create it first")
    write_file(path, lambda f: np.save(f, array))
