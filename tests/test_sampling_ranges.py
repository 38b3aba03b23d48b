"""temperature and top_p take OpenAI's ranges (temperature [0, 2], top_p (0, 1]) and are refused outside them on every
surface: ``Request`` and the settings check (InputError), seer-run's JSONL field and ``--temperature`` flag, the
manifest's generation default (GenerationConfig). HTTP's 400s: tests/test_serve.py's ERRORS."""

from __future__ import annotations

import json
import math

import pytest
from cli_capture import cli
from test_manifest import make_manifest

from seer_trt.cli.run import main as run_main
from seer_trt.contracts.config import GenerationConfig
from seer_trt.contracts.errors import ConfigError, InputError, ManifestError
from seer_trt.contracts.manifest import MANIFEST_FILE, Manifest
from seer_trt.runtime.request import Request, check_settings

TOP = GenerationConfig.MAX_TEMPERATURE
BAD_TEMPERATURES = [-0.5, TOP + 0.01, 1e6, math.inf, math.nan]
BAD_TOP_P = [0, -0.1, 1.5, math.inf, math.nan]


def test_the_range_is_openais():
    assert TOP == 2.0


@pytest.mark.parametrize("t", [0, 0.0, 0.7, 1, TOP])
def test_temperatures_in_the_range_are_taken_everywhere(t):
    check_settings(temperature=t)
    assert Request("count", temperature=t).temperature == t
    assert GenerationConfig(temperature=t).temperature == t


@pytest.mark.parametrize("t", BAD_TEMPERATURES)
def test_a_temperature_outside_the_range_is_one_input_error(t):
    for refuse in (lambda: check_settings(temperature=t), lambda: Request("count", temperature=t)):
        with pytest.raises(InputError) as err:
            refuse()
        assert f"temperature is {t!r}; expected a number in [0, 2]" in str(err.value)


@pytest.mark.parametrize("p", BAD_TOP_P)
def test_a_top_p_outside_the_range_is_one_input_error(p):
    with pytest.raises(InputError, match=r"top_p is .*; expected a number in \(0, 1\]"):
        Request("count", top_p=p)


@pytest.mark.parametrize("t", BAD_TEMPERATURES)
def test_a_generation_default_outside_the_range_is_a_config_error(t):
    with pytest.raises(ConfigError, match=r"temperature must be a number in \[0, 2\]"):
        GenerationConfig(temperature=t)


def test_a_manifest_whose_default_temperature_is_outside_the_range_is_refused_when_read(tmp_path):
    data = make_manifest().to_dict()
    data["generation"]["temperature"] = 1e6
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=r"temperature must be a number in \[0, 2\]") as err:
        Manifest.read(tmp_path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("t", ["1e6", "2.5", "-1"])
def test_seer_runs_temperature_flag_outside_the_range_is_one_line(fixture_export, t):
    rc, out, err = cli(run_main, ["--engines", str(fixture_export[0]), "--prompt", "count to 3 .", "--temperature", t])
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"temperature is {float(t)!r}; expected a number in [0, 2]" in err and "(command-line flags)" in err


def test_seer_runs_jsonl_lines_outside_the_ranges_fail_alone(fixture_export, tmp_path):
    lines = [{"prompt": "count to 3 ."}, {"prompt": "count to 3 .", "temperature": 1e6},
             {"prompt": "count to 3 .", "top_p": 1.5}, {"prompt": "count to 3 .", "temperature": 2, "seed": 1}]  # fmt: skip
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    rc, _, err = cli(run_main, ["--engines", str(fixture_export[0]), "--input", str(tmp_path / "in.jsonl"), "--output",
                                str(out)])  # fmt: skip
    assert rc == 1 and "2 answered, 2 failed" in err, err
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["error"] is None for r in results] == [True, False, False, True]
    assert "temperature is 1000000.0; expected a number in [0, 2]" in results[1]["error"]
    assert "top_p is 1.5; expected a number in (0, 1]" in results[2]["error"]
