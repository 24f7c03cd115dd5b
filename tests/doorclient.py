"""A client of the lab's front door for the tests: one request sent exactly as written, what
the balancer made of it, and a bounded load that counts every answer."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

REFUSED = "x-specfleet-refused"
#: What HAProxy's HTTP parser answers to a request it cannot parse (a fragment in the
#: target), before any rule runs: its built-in page, which no rule can add a header to.
PARSER_REFUSAL = b"<html><body><h1>400 Bad request</h1>"


@dataclass(frozen=True)
class Door:
    host: str
    port: int
    client_key: str
    server_key: str
    model: str

    @classmethod
    def of(cls, lab: Any) -> Door:
        """The front door of a lab (a labs.LabUnderTest), with its client and server keys."""
        return cls(
            host=lab.address(lab.balancer),
            port=8080,
            client_key=str(lab.variables["lab_client_api_key"]),
            server_key=str(lab.variables["specfleet_server_api_key"]),
            model=str(lab.variables["vllm_server_served_model_name"]),
        )

    def connection(self) -> http.client.HTTPSConnection:
        # The lab's certificate is self-signed: this test checks routing, not TLS trust.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return http.client.HTTPSConnection(self.host, self.port, timeout=60, context=context)


@dataclass(frozen=True)
class Answer:
    status: int
    #: Why the balancer refused it (its X-Specfleet-Refused header), or None.
    refused: str | None
    #: What the balancer answered itself (X-Specfleet-Door: its own /health), or None.
    door: str | None
    body: bytes

    @property
    def forwarded(self) -> bool:
        """Whether it reached vLLM: neither refused nor answered by the balancer itself."""
        return self.refused is None and self.door is None


def send(
    connection: http.client.HTTPSConnection,
    method: str,
    target: str,
    headers: dict[str, str],
    body: bytes | None = None,
) -> Answer:
    """One request with ``target`` sent exactly as written (http.client does not normalise)."""
    try:
        connection.putrequest(method, target, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Type", "application/json")
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        data = response.read()
    except (http.client.HTTPException, OSError):
        connection.close()
        raise
    if response.getheader("Connection", "").lower() == "close":
        connection.close()
    refused = response.getheader(REFUSED)
    if refused is None and response.status == 400 and data.startswith(PARSER_REFUSAL):
        refused = "unparsable"
    return Answer(response.status, refused, response.getheader("x-specfleet-door"), data)


class Load:
    """Completions through the door from a few threads until stopped (at most ``minutes``),
    each at most ``per_second`` a second (within the key's rate limit), with a key that can
    be switched while it runs; every answer is counted.

    As OpenAI's client does, a request whose connection failed (refused, reset, closed
    before an answer: the balancer itself restarting) is sent again, once, after half a
    second; such requests are counted in ``retried``. Any other answer but 200 fails."""

    def __init__(
        self,
        door: Door,
        key: str,
        threads: int = 2,
        per_second: float = 2.5,
        minutes: float = 45,
    ) -> None:
        self.interval = 1 / per_second
        self.seconds = minutes * 60
        self.door, self.key = door, key
        self.results: Counter[str] = Counter()
        self.failures: list[str] = []
        self.retried = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _once(
        self, connection: http.client.HTTPSConnection, body: bytes
    ) -> tuple[http.client.HTTPSConnection, Answer | None, str]:
        headers = {"Authorization": f"Bearer {self.key}"}
        try:
            answer = send(connection, "POST", "/v1/completions", headers, body)
            return connection, answer, str(answer.status)
        except (http.client.HTTPException, OSError) as error:
            return self.door.connection(), None, type(error).__name__

    def _run(self) -> None:
        body = json.dumps({"model": self.door.model, "prompt": "hi", "max_tokens": 2}).encode()
        connection = self.door.connection()
        deadline = time.monotonic() + self.seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            started = time.monotonic()
            connection, answer, outcome = self._once(connection, body)
            if answer is None:
                time.sleep(0.5)
                with self._lock:
                    self.retried += 1
                connection, answer, outcome = self._once(connection, body)
            with self._lock:
                self.results[outcome] += 1
                if outcome != "200":
                    detail = answer.body[:120] if answer else b""
                    self.failures.append(f"{outcome} {detail!r}")
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)
