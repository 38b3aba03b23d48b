"""``config.pbtxt``: one Triton model's configuration, planned as a dataclass, rendered strictly, parsed back.

In:  a ``ModelSpec`` (name, backend, inputs/outputs, instance groups, parameters), or a ``config.pbtxt`` file.
Out: the file's text (``render``), or tritonclient's ``model_config_pb2.ModelConfig`` (``parse``).

Rendering goes through one Jinja template with ``StrictUndefined``: a value the template asks for and the spec
lacks is an error, never an empty string. Every rendered file is parsed back with ``google.protobuf.text_format``
into the server's own schema before it is written, so a typo in the template cannot reach a server.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from seer_trt.contracts.errors import ConfigError

TEMPLATE = Path(__file__).with_name("templates") / "config.pbtxt.j2"
DATA_TYPES = {  # manifest dtype -> Triton data type
    "float32": "TYPE_FP32",
    "float16": "TYPE_FP16",
    "int64": "TYPE_INT64",
    "int32": "TYPE_INT32",
    "bool": "TYPE_BOOL",
    "bytes": "TYPE_STRING",
}
KINDS = ("KIND_CPU", "KIND_GPU")


@dataclasses.dataclass(frozen=True)
class TensorConfig:
    """One model input or output as Triton sees it."""

    name: str
    data_type: str  # a Triton type name, DATA_TYPES values
    dims: tuple[int, ...]  # -1 for a dynamic axis; without the batch axis when max_batch_size > 0
    optional: bool = False  # inputs only: the request may leave it out

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", tuple(int(d) for d in self.dims))
        if self.data_type not in DATA_TYPES.values():
            raise ConfigError(
                f"tensor {self.name!r}: data type {self.data_type!r} is not one of {list(DATA_TYPES.values())}"
            )
        if any(d < -1 or d == 0 for d in self.dims):
            raise ConfigError(f"tensor {self.name!r}: dims {list(self.dims)} must be positive sizes or -1 (dynamic)")


@dataclasses.dataclass(frozen=True)
class InstanceGroup:
    count: int  # instances of the model (per GPU for KIND_GPU)
    kind: str  # "KIND_CPU" | "KIND_GPU"
    profiles: tuple[str, ...] = ()  # TensorRT optimization profile indices this group may use; () = all
    gpus: tuple[int, ...] = ()  # KIND_GPU: the devices it runs on, ``count`` instances on each; () = every GPU

    def __post_init__(self) -> None:
        if self.gpus and (
            self.kind != "KIND_GPU" or any(d < 0 for d in self.gpus) or len(set(self.gpus)) < len(self.gpus)
        ):
            raise ConfigError(f"instance group gpus {list(self.gpus)}: distinct device indices >= 0, KIND_GPU only")
        if self.kind not in KINDS or self.count < 1:
            raise ConfigError(
                f"instance group {self.count} x {self.kind!r}: expected a count >= 1 and a kind in {KINDS}"
            )


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """An ONNX Runtime GPU execution accelerator (the TensorRT execution provider) with its settings."""

    name: str  # "tensorrt"
    parameters: tuple[tuple[str, str], ...]  # e.g. ("precision_mode", "FP16")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Everything one model folder of a repository holds: its configuration and the files of version 1."""

    name: str  # the model's name, also its folder's
    backend: str  # "python" | "tensorrt" | "onnxruntime"
    platform: str | None  # "tensorrt_plan" | "onnxruntime_onnx" for those backends, None for python
    max_batch_size: int  # 0: no implicit batch axis (the dims carry the batch axis themselves)
    inputs: tuple[TensorConfig, ...]
    outputs: tuple[TensorConfig, ...]
    instance_groups: tuple[InstanceGroup, ...]
    parameters: tuple[tuple[str, str], ...] = ()  # string parameters, in order
    default_model_filename: str | None = None  # the model file in the version folder, when not Triton's default
    batch_delay_us: int | None = None  # dynamic batching's max queue delay; None: no dynamic batching
    accelerator: Accelerator | None = None
    files: tuple[tuple[str, Path], ...] = ()  # (path inside the version folder, source file or folder)
    decoupled: bool = False  # responses sent through the request's response sender, any number per request

    def parameter(self, key: str) -> str:
        return dict(self.parameters)[key]


def quote(value: Any) -> str:
    """A protobuf text-format string literal."""
    if not isinstance(value, str):
        raise ConfigError(f"config.pbtxt template: expected a string to quote, got {type(value).__name__} {value!r}")
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def given(value: Any) -> bool:
    """Template test ``x is given``: False for None; a value the spec lacks raises (``is not none`` would not)."""
    import jinja2

    if isinstance(value, jinja2.Undefined):
        str(value)  # StrictUndefined raises UndefinedError naming what is missing
    return value is not None


def render(model: ModelSpec, source: str) -> str:
    """The ``config.pbtxt`` text of ``model``, checked by parsing it back.

    Args:
        model: the model to configure.
        source: what it was generated from (written in the header comment).

    Raises:
        ConfigError: the template asks for a value the spec does not have, or the result does not parse.
    """
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True, autoescape=False)  # fmt: skip
    env.filters["quote"] = quote
    env.tests["given"] = given
    try:
        text = env.from_string(TEMPLATE.read_text()).render(model=model, source=source)
    except jinja2.UndefinedError as err:
        raise ConfigError(f"model {model.name!r}: the config template needs a value the plan lacks ({err})") from None
    parse(text, f"{model.name}/config.pbtxt")
    return text


def parse(text: str, where: str):
    """``text`` parsed into tritonclient's ``ModelConfig`` message.

    Raises:
        ConfigError: tritonclient is not installed, or the text is not a valid model configuration.
    """
    model_config_pb2 = schema()
    from google.protobuf import text_format

    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as err:
        raise ConfigError(f"{where} is not a valid Triton model configuration: {err}") from None
    return config


def schema():
    """tritonclient's ``model_config_pb2`` module (the server's configuration schema)."""
    try:
        from tritonclient.grpc import model_config_pb2
    except ImportError as err:
        raise ConfigError(
            f"tritonclient is needed to check Triton configurations ({err}); pip install 'seer-trt[triton]'"
        ) from None
    return model_config_pb2


def tensors(config, which: str) -> list[TensorConfig]:
    """The inputs or outputs of a parsed ``ModelConfig`` as ``TensorConfig``s."""
    names = schema().DataType
    return [
        TensorConfig(t.name, names.Name(t.data_type), tuple(t.dims), getattr(t, "optional", False))
        for t in getattr(config, which)
    ]


def parameters(config) -> dict[str, str]:
    """A parsed ``ModelConfig``'s string parameters."""
    return {k: v.string_value for k, v in config.parameters.items()}
