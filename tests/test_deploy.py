"""deploy/: the Kubernetes objects validate against Kubernetes' own schemas (kubernetes-validate, strict), the KServe
InferenceService against KServe's (tools/kserve_validate.py) and names what KServe's Triton runtime needs, and every file and command the container recipe and the
manifests name exists (no Docker daemon runs here to build it)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"


def test_the_seer_serve_objects_validate_against_kubernetes_schemas():
    p = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", str(DEPLOY / "seer-serve.yaml")],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all((DEPLOY / "seer-serve.yaml").read_text())}
    assert kinds == {"Deployment", "Service", "HorizontalPodAutoscaler"}


def test_the_deployment_runs_a_seer_serve_command_the_parser_takes_and_probes_its_routes():
    from seer_trt.cli.serve import build_parser
    from seer_trt.serving.openai.http import ROUTES

    deployment = next(
        d for d in yaml.safe_load_all((DEPLOY / "seer-serve.yaml").read_text()) if d["kind"] == "Deployment"
    )
    spec = deployment["spec"]["template"]["spec"]
    container = spec["containers"][0]
    program, *argv = container["command"]
    assert program == "seer-serve"
    args = build_parser().parse_args(argv)  # every flag exists and parses
    assert container["ports"][0]["containerPort"] == args.port and args.host == "0.0.0.0"
    assert {container["readinessProbe"]["httpGet"]["path"], container["livenessProbe"]["httpGet"]["path"]} <= set(
        ROUTES
    )
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] in ROUTES and int(annotations["prometheus.io/port"]) == args.port
    assert spec["terminationGracePeriodSeconds"] > args.grace  # the server's own grace ends first
    hpa = next(d for d in yaml.safe_load_all((DEPLOY / "seer-serve.yaml").read_text())
               if d["kind"] == "HorizontalPodAutoscaler")  # fmt: skip
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    from types import SimpleNamespace

    from seer_trt.serving.openai.metrics import Metrics

    idle = SimpleNamespace(
        depth=0,
        rows=[],
        steps=0,
        rows_per_step=[],
        calls_per_step=[],
        kv={"slots": 0, "bytes": 0, "budget": 0, "buffer_bytes": 0, "waiting": 0},
    )  # what Metrics reads
    exported = Metrics(idle).render().decode()
    assert re.search(rf"^{metric} 0\.0$", exported, re.M), exported  # the server exports it


def test_the_inference_service_serves_the_repository_on_kserves_triton_runtime():
    isvc = yaml.safe_load((DEPLOY / "inference-service.yaml").read_text())
    assert (isvc["apiVersion"], isvc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    predictor = isvc["spec"]["predictor"]
    assert set(predictor["triton"]) >= {"storageUri", "runtimeVersion", "resources"}
    assert predictor["triton"]["resources"]["limits"]["nvidia.com/gpu"] == 1  # one replica per GPU
    assert predictor["minReplicas"] <= predictor["maxReplicas"]


def test_the_inference_service_validates_against_kserves_schema(tmp_path):
    """tools/kserve_validate.py: strict against KServe 0.21's published schema (read from its SDK's generated models)
    with Kubernetes' own types inside checked by kubernetes-validate; a copy with a misspelt field, a string count, an
    unknown scale metric and a wrong resources key is refused naming each."""
    tool = [sys.executable, str(ROOT / "tools" / "kserve_validate.py")]
    p = subprocess.run([*tool, str(DEPLOY / "inference-service.yaml")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "valid against kserve 0.21.0's V1beta1InferenceService schema" in p.stdout, (
        p.stdout + p.stderr
    )
    bad = yaml.safe_load((DEPLOY / "inference-service.yaml").read_text())
    predictor = bad["spec"]["predictor"]
    predictor["minReplicas"], predictor["scaleMetric"] = "1", "queue"
    predictor["triton"]["runtimVersion"] = predictor["triton"].pop("runtimeVersion")
    predictor["triton"]["resources"]["request"] = predictor["triton"]["resources"].pop("requests")
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    p = subprocess.run([*tool, str(tmp_path / "bad.yaml")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "INVALID" in p.stdout, p.stdout + p.stderr
    for error in ("predictor.minReplicas: '1' is not int", "'queue' is not one of concurrency, rps, cpu, memory",
                  "triton.runtimVersion: not a field of V1beta1TritonSpec", "('request' was unexpected)"):  # fmt: skip
        assert error in p.stdout, p.stdout


def test_every_file_and_command_the_container_recipe_names_exists():
    recipe = (DEPLOY / "Dockerfile").read_text()
    for line in recipe.splitlines():
        if line.startswith("COPY "):
            *sources, _ = shlex.split(line)[1:]
            assert all((ROOT / s).exists() for s in sources), line
    extras = re.search(r"install .*'\.\[([\w,]+)\]'", recipe).group(1).split(",")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(extras) <= set(project["optional-dependencies"])
    cmd = re.search(r"^CMD (\[.*\])", recipe, re.M).group(1)
    assert yaml.safe_load(cmd)[0] in project["scripts"]
