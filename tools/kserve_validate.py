"""Check KServe objects against KServe's published schema, offline, as strictly as kubernetes-validate checks core ones.

    python3 tools/kserve_validate.py deploy/inference-service.yaml [--kserve 0.21.0] [--wheel FILE]

KServe publishes its CRDs' OpenAPI schema in its repository (``config/crd/``) and generates its Python SDK from the
same schema: every ``kserve/models/v1beta1_*.py`` class holds ``openapi_types`` (field: type) and ``attribute_map``
(field: JSON key), and the fields the schema requires raise ``must not be None``. This reads those classes from the
SDK's wheel (``pip download kserve==VERSION --no-deps``, cached under ``$XDG_CACHE_HOME/seer-trt``; nothing of it is
imported or installed) and walks each document of the file against them: an unknown key, a value of the wrong type,
a missing required field or a ``scaleMetric`` outside the values its schema names is an error. Kubernetes' own types
inside (``V1ResourceRequirements``, ``V1ObjectMeta``, ``V1Container`` ...) are checked against kubernetes-validate's
strict schema of the newest Kubernetes it carries. Prints one line per document and each error under it; exit 1 on
any error, 2 when the schema cannot be had.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

KSERVE = "0.21.0"  # the KServe release whose schema deploy/ is written against
GROUP = "serving.kserve.io"


@dataclass
class Model:
    """One SDK class: its fields' types and JSON keys, and the fields the schema requires."""

    types: dict[str, str]
    keys: dict[str, str]
    required: set[str] = field(default_factory=set)
    doc: dict[str, str] = field(default_factory=dict)  # field: its setter's description


def wheel(version: str) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "seer-trt" / f"kserve-{version}"
    found = sorted(cache.glob(f"kserve-{version}-*.whl"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    try:
        p = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d",
                            str(cache), f"kserve=={version}"], capture_output=True, text=True, timeout=300)  # fmt: skip
    except subprocess.TimeoutExpired:
        print(f"kserve_validate: pip download kserve=={version} took more than 300 s", file=sys.stderr)
        raise SystemExit(2) from None
    found = sorted(cache.glob(f"kserve-{version}-*.whl"))
    if p.returncode != 0 or not found:
        print(f"kserve_validate: cannot download kserve=={version}'s wheel: {p.stderr.strip()[-300:]}", file=sys.stderr)
        raise SystemExit(2)
    return found[0]


def models(path: Path) -> dict[str, Model]:
    """The SDK's model classes by name, read from the wheel's source without importing it."""
    out = {}
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            if not re.fullmatch(r"kserve/models/v\w+\.py", name):
                continue
            source = z.read(name).decode()
            for node in ast.parse(source).body:
                if not isinstance(node, ast.ClassDef):
                    continue
                found = {t.targets[0].id: ast.literal_eval(t.value) for t in node.body if isinstance(t, ast.Assign)
                         and isinstance(t.targets[0], ast.Name) and t.targets[0].id in ("openapi_types",
                                                                                         "attribute_map")}  # fmt: skip
                if len(found) == 2:
                    doc = {}
                    for f in node.body:
                        if isinstance(f, ast.FunctionDef) and len(f.args.args) == 2 and ast.get_docstring(f):
                            doc[f.name] = ast.get_docstring(f)
                    required = set(re.findall(r"Invalid value for `(\w+)`, must not be `None`", source))
                    out[node.name] = Model(found["openapi_types"], found["attribute_map"], required, doc)
    return out


def kubernetes_schema():
    """(definitions resource id, registry, {Python class name: definition key}) of kubernetes-validate's strict schema
    of the newest Kubernetes it carries."""
    import kubernetes_validate
    from referencing import Registry, Resource

    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    newest = max((d for d in root.glob("v*-local-strict")), key=lambda d: tuple(map(int, d.name[1:].split("-")[0]
                                                                                   .split("."))))  # fmt: skip
    defs = json.loads((newest / "_definitions.json").read_text())
    names: dict[str, str] = {}
    for key in sorted(defs["$defs"], key=lambda k: (not k.startswith("io.k8s.api.core."), k)):
        parts = key.split(".")
        if len(parts) >= 2 and re.fullmatch(r"v\d+(?:(alpha|beta)\d+)?", parts[-2]):
            names.setdefault(parts[-2].capitalize() + parts[-1], key)
    registry = Registry().with_resource(defs["$id"], Resource.from_contents(defs))
    return defs["$id"], registry, names, newest.name


class Checker:
    def __init__(self, sdk: dict[str, Model]) -> None:
        self.sdk = sdk
        self.k8s_id, self.registry, self.k8s, self.k8s_version = kubernetes_schema()

    def check(self, value, kind: str, at: str) -> list[str]:
        if value is None:
            return []
        if m := re.fullmatch(r"list\[(.+)\]", kind):
            if not isinstance(value, list):
                return [f"{at}: {type(value).__name__}, expected a list ({kind})"]
            return [e for i, v in enumerate(value) for e in self.check(v, m.group(1), f"{at}[{i}]")]
        if m := re.fullmatch(r"dict\((\w+), (.+)\)", kind):
            if not isinstance(value, dict):
                return [f"{at}: {type(value).__name__}, expected a mapping ({kind})"]
            return [e for k, v in value.items() for e in self.check(v, m.group(2), f"{at}.{k}")]
        simple = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "object": (object,),
                  "datetime": (str,), "date": (str,)}  # fmt: skip
        if kind in simple:
            ok = isinstance(value, simple[kind]) and not (kind in ("int", "float") and isinstance(value, bool))
            return [] if ok else [f"{at}: {value!r} is not {kind}"]
        if kind in self.sdk:
            return self.object(value, kind, at)
        if kind in self.k8s:
            return self.kubernetes(value, kind, at)
        return [f"{at}: no schema for type {kind}"]

    def object(self, value, kind: str, at: str) -> list[str]:
        model = self.sdk[kind]
        if not isinstance(value, dict):
            return [f"{at}: {type(value).__name__}, expected an object ({kind})"]
        by_key = {v: k for k, v in model.keys.items()}
        errors = [f"{at}.{k}: not a field of {kind}" for k in value if k not in by_key]
        errors += [f"{at}.{model.keys[f]}: required by {kind}" for f in sorted(model.required)
                   if model.keys[f] not in value]  # fmt: skip
        for key, v in value.items():
            if key in by_key:
                name = by_key[key]
                errors += self.check(v, model.types[name], f"{at}.{key}")
                allowed = re.search(r"possible values are ([\w, ]+)\.", model.doc.get(name, ""))
                if allowed and isinstance(v, str) and v not in re.split(r",\s*", allowed.group(1)):
                    errors.append(f"{at}.{key}: {v!r} is not one of {allowed.group(1)}")
        return errors

    def kubernetes(self, value, kind: str, at: str) -> list[str]:
        import jsonschema

        schema = {"$ref": f"{self.k8s_id}#/$defs/{self.k8s[kind]}"}
        validator = jsonschema.Draft202012Validator(schema, registry=self.registry)
        return [f"{at}{''.join(f'.{p}' for p in e.absolute_path)}: {e.message}" for e in validator.iter_errors(value)]


def main(argv: list[str] | None = None) -> int:
    import yaml

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--kserve", default=KSERVE, help=f"the KServe release whose schema to check against ({KSERVE})")
    ap.add_argument("--wheel", type=Path, help="the kserve wheel to read (default: downloaded once and cached)")
    args = ap.parse_args(argv)
    sdk = models(args.wheel or wheel(args.kserve))
    if "V1beta1InferenceService" not in sdk:
        print(f"kserve_validate: no InferenceService model in kserve {args.kserve}'s wheel", file=sys.stderr)
        return 2
    checker = Checker(sdk)
    failed = False
    for path in args.files:
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if not isinstance(doc, dict):  # an empty document (a trailing ---, comments only)
                continue
            api, kind = doc.get("apiVersion", ""), doc.get("kind", "")
            group, _, version = api.rpartition("/")
            cls = f"{version.capitalize()}{kind}"
            where = f"{path} document {i} ({kind} {api})"
            if group != GROUP or cls not in sdk:
                print(f"{where}: not a KServe object of kserve {args.kserve}")
                failed = True
                continue
            errors = checker.check(doc, cls, kind)
            failed |= bool(errors)
            print(f"{where}: {'INVALID' if errors else 'valid'} against kserve {args.kserve}'s {cls} schema "
                  f"({len(sdk)} SDK models; core types: kubernetes-validate {checker.k8s_version})")  # fmt: skip
            for e in errors:
                print(f"  {e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
