"""Role vllm_server's ExecStop helper (files/vllm-server-stop), run for real on this host:
a server that serves gets SIGTERM and the time to finish; one that is still starting, and
so ignores SIGTERM as vLLM does then, is ended at once with its children."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time

from conftest import ROOT

STOP = ROOT / "roles" / "vllm_server" / "files" / "vllm-server-stop"

# A server that is still starting: it ignores SIGTERM and has a child (its engine).
IGNORE = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
STARTING = f"""
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", {IGNORE!r}])
print(child.pid, flush=True)
{IGNORE}
"""


def alive(pid: int) -> bool:
    return subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode == 0


def test_a_server_still_starting_is_ended_at_once_with_its_children() -> None:
    server = subprocess.Popen([sys.executable, "-c", STARTING], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    child = int(server.stdout.readline())
    started = time.monotonic()
    # Nothing answers on this port: the server does not serve yet.
    run = subprocess.run(
        [sys.executable, str(STOP), str(server.pid), "http://127.0.0.1:9/health", "60"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0, run.stderr
    server.wait(timeout=10)
    assert time.monotonic() - started < 10
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child)
    assert "not serving yet" in run.stdout and "2 processes" in run.stdout


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


def test_a_server_that_serves_gets_sigterm_and_the_time_to_finish() -> None:
    health = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=health.serve_forever, daemon=True).start()
    # It finishes what it has for 2 s after SIGTERM, then exits.
    draining = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(2), sys.exit(0)))\n"
        "time.sleep(600)\n"
    )
    server = subprocess.Popen([sys.executable, "-c", draining])
    # Reaped as systemd reaps its main process (a zombie would look alive to the helper).
    reaped = threading.Thread(target=server.wait, daemon=True)
    reaped.start()
    time.sleep(0.5)
    started = time.monotonic()
    url = f"http://127.0.0.1:{health.server_address[1]}/health"
    run = subprocess.run(
        [sys.executable, str(STOP), str(server.pid), url, "60"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    health.shutdown()
    took = time.monotonic() - started
    assert run.returncode == 0 and "serving: SIGTERM" in run.stdout, run
    reaped.join(timeout=5)
    assert server.returncode == 0 and 2 <= took < 10, took
