"""A model mirror for the tests: Debian's nginx (bin/bootstrap installs it) serving a folder
on loopback, as a fleet's HTTP mirror serves its models, with Range requests as nginx
answers them. ``/slow/`` serves the same files at a bounded rate, so that a test can kill a
transfer halfway."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Bytes a second on /slow/: a 4 MiB file takes about 8 s.
SLOW_RATE = 512 * 1024

CONFIG = """\
daemon off;
worker_processes 1;
{user}
pid {prefix}/nginx.pid;
error_log {prefix}/error.log;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location /slow/ {{
            alias {root}/;
            limit_rate {rate};
        }}
    }}
}}
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def nginx_serving(root: Path, prefix: Path) -> Iterator[str]:
    """nginx serving ``root`` on loopback until the block ends; yields its base URL."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    assert Path(nginx).exists(), "nginx is missing: bin/bootstrap installs it"
    prefix.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    # As root, nginx's workers would run as nobody, who cannot read pytest's 0700 folders.
    user = "user root;" if os.geteuid() == 0 else ""
    config = prefix / "nginx.conf"
    config.write_text(
        CONFIG.format(user=user, prefix=prefix, port=port, root=root.resolve(), rate=SLOW_RATE)
    )
    server = subprocess.Popen(
        [nginx, "-p", str(prefix), "-c", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(base, timeout=2).close()
                break
            except urllib.error.HTTPError:
                break  # it answers (403 for a folder without an index)
            except OSError:
                assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
                assert time.monotonic() < deadline, "nginx did not answer within 20 s"
                time.sleep(0.1)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=20)
