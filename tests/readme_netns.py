"""Run README lines as written where the ports they name are free: inside a network namespace of their own
(``unshare -n``, loopback alone), so ``seer-serve --port 8000`` and ``ray start --head`` never meet this machine's
own services.

In:  a JSON spec (argv[1]): ``cwd``; ``before``, lines run to the end in turn; ``server``, a line left running in its
     own process group; ``ready``, a URL answering 200 once it serves; ``client``, Python code run then;
     ``after``, lines run at the end whatever happened.
Out: JSON on stdout: each line's exit status and output's tail, the client's, and the server's exit status after
     SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

TAIL = 3000
READY_S = 300


def run(line: str, cwd: str, timeout: float = 600) -> dict:
    p = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return {"line": line, "rc": p.returncode, "stdout": p.stdout[-TAIL:], "stderr": p.stderr[-TAIL:]}


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def main() -> int:
    spec = json.loads(open(sys.argv[1]).read())
    cwd = spec["cwd"]
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    report: dict = {"before": [], "after": []}
    server = None
    try:
        for line in spec["before"]:
            report["before"].append(run(line, cwd))
            if report["before"][-1]["rc"]:
                return print(json.dumps(report)) or 0
        log = open(os.path.join(cwd, "server.log"), "w+")  # noqa: SIM115 - read back below
        server = subprocess.Popen(["bash", "-c", spec["server"]], cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline and server.poll() is None and not ready(spec["ready"]):
            time.sleep(1)
        report["ready"] = server.poll() is None and ready(spec["ready"])
        if report["ready"]:
            p = subprocess.run([sys.executable, "-c", spec["client"]], cwd=cwd, capture_output=True, text=True,
                               timeout=600)  # fmt: skip
            report["client"] = {"rc": p.returncode, "stdout": p.stdout[-TAIL:], "stderr": p.stderr[-TAIL:]}
    finally:
        if server is not None:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGTERM)
            try:
                report["server_rc"] = server.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                report["server_rc"] = server.wait(30)
            log.seek(0)
            report["server_log"] = log.read()[-TAIL:]
        for line in spec["after"]:
            report["after"].append(run(line, cwd))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
