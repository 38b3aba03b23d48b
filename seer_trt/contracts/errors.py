"""One error type for everything a user can trigger.

CLIs print ``str(err)`` on one line and exit 2; ``--verbose`` shows the traceback. Messages name the value
found, the value expected, and the fix.
"""

from __future__ import annotations

import re

# "<_io.BytesIO object at 0x7f...>" and the like: meaningless to a client, and they leak addresses
_OBJECT_REPR = re.compile(r"<[^<>]*? (?:object )?at 0x[0-9a-fA-F]+>")


class SeerError(Exception):
    """Base class of every error a user of seer-trt can trigger."""


class ConfigError(SeerError, ValueError):
    """A configuration value (CLI flag, manifest field, config.json key) is invalid."""


class InputError(SeerError, ValueError):
    """A request's input (an image, a prompt) cannot be processed as given."""


class CheckpointError(SeerError):
    """A checkpoint could not be found, or its tensors do not match the model."""


class ManifestError(SeerError):
    """An export folder's ``manifest.json`` is missing, unreadable, or of a schema this version cannot read."""


def describe(err: BaseException) -> str:
    """``str(err)`` without object reprs, on one line: what an error message may quote from a library's error."""
    text = _OBJECT_REPR.sub("<object>", str(err)).replace("\n", " ").strip()
    return text or type(err).__name__


class EngineError(SeerError):
    """TensorRT engines are missing, were built for another TensorRT or GPU, or failed on the device."""
