"""seer-serve's replicas on a real local Ray cluster (seer_trt/serving/ray_serve.py, tools/ray_cluster.py): a head and a
second node as separate ``ray start`` processes inside a network namespace with loopback alone (Ray binds and dials
the machine's own address otherwise), 2 replicas deployed by ``seer-serve --ray``, 16 clients, 200 requests (text and image, a quarter streamed), then
the same load with one replica's process killed halfway, then scaled down to one replica halfway (a graceful drain). Bounded in count and time; needs root for ``unshare -n``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.serving


def test_two_replicas_on_two_nodes_answer_every_request_and_survive_a_killed_replica(fixture_export, tmp_path):
    out = tmp_path / "ray.json"
    p = subprocess.run(["unshare", "-n", sys.executable, str(ROOT / "tools" / "ray_cluster.py"), "--engines",
                        str(fixture_export[0]), "--replicas", "2", "--clients", "16", "--requests", "200", "--fault", "--drain",
                        "--json", str(out)], capture_output=True, text=True, timeout=900)  # fmt: skip
    assert p.returncode == 0, p.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["node_count"] == 2 and report["nodes"] == ["127.0.0.1"]  # two nodes, loopback only
    steady, fault = report["runs"]["steady"], report["runs"]["fault"]
    assert steady["answered_first_time"] == steady["sent"] == 200 and steady["lost"] == steady["hung"] == 0
    assert len(steady["per_replica"]) == 2 and min(steady["per_replica"].values()) > 0  # both replicas answered
    assert steady["per_replica_metrics"] == steady["per_replica"]  # and their own counters say so, request for request
    assert (
        steady["equal_to_generate"] >= 199
    )  # equal up to float rounding at a border (docs/DESIGN.md "Serving and embedding")
    # the fault: every request answered, first time or on the client's retry of a 5xx / closed connection
    assert fault["lost"] == fault["hung"] == fault["refused"] == 0
    assert fault["answered_first_time"] + fault["answered_on_retry"] == fault["sent"] == 200
    assert fault["equal_to_generate"] >= 199
    assert report["replicas_running_after"] == 2 and report["replica_back_s"] < 120  # Ray brought it back
    # scaled down to one replica halfway through a third run: the stopped replica drains, nothing lost or refused
    drain = report["runs"]["drain"]
    assert drain["lost"] == drain["hung"] == drain["refused"] == 0 and report["replicas_after_drain"] == 1
    assert drain["answered_first_time"] + drain["answered_on_retry"] == 200 and drain["equal_to_generate"] >= 199
    # seer-serve --ray deployed it, and SIGTERM removed it: the application is gone and the command exits as one
    assert report["serve_exit"] == 128 + 15 and report["applications_after_stop"] == []
