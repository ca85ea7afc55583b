"""A small HTTP client of `aotc serve` (the standard library's http.client, one kept-alive
connection per client): used by `aotc serve --check`, the tests and scripts/serve_load.py.
Not thread-safe: give each thread its own Client."""

from __future__ import annotations

import http.client
import io
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aotc_runtime.serve.protocol import JSON_TYPE, NPZ_TYPE


@dataclass
class Reply:
    status: int
    body: bytes
    content_type: str
    seconds: float
    server_timing: str = ""

    def timings(self) -> dict:
        """Server-Timing's durations in ms, by name (read, decode, replica, queued, call, encode)."""
        found = {}
        for entry in self.server_timing.split(","):
            name, _, rest = entry.strip().partition(";")
            if rest.startswith("dur="):
                found[name] = float(rest[4:])
        return found

    def json(self) -> dict:
        return json.loads(self.body)

    def outputs(self) -> dict:
        """name -> numpy array of a 200 answer, JSON or .npz."""
        import numpy

        if self.content_type.startswith(NPZ_TYPE):
            with numpy.load(io.BytesIO(self.body), allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}
        return {name: numpy.asarray(value) for name, value in self.json()["outputs"].items()}


class Client:
    def __init__(self, url: str, timeout: float = 60.0):
        parts = urlsplit(url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._timeout = timeout
        self._connection: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: bytes = b"", content_type: str = "") -> Reply:
        """One request; a dropped kept-alive connection is reopened once."""
        headers = {"Content-Type": content_type} if content_type else {}
        for attempt in (0, 1):
            if self._connection is None:
                self._connection = http.client.HTTPConnection(
                    self._host, self._port, timeout=self._timeout
                )
            start = time.perf_counter()
            try:
                self._connection.request(method, path, body=body or None, headers=headers)
                answer = self._connection.getresponse()
                data = answer.read()
            except (ConnectionError, http.client.HTTPException):
                self.close()
                if attempt:
                    raise
                continue
            return Reply(
                answer.status,
                data,
                answer.getheader("Content-Type", ""),
                time.perf_counter() - start,
                answer.getheader("Server-Timing", ""),
            )
        raise AssertionError("unreachable")

    def predict(self, inputs: dict, as_npz: bool = False) -> Reply:
        """POST /v1/predict with name -> tensor (or nested list) inputs."""
        if as_npz:
            from aotc_runtime.npz import write_npz

            buffer = io.BytesIO()
            write_npz(buffer, {name: _numpy(value) for name, value in inputs.items()})
            return self.request("POST", "/v1/predict", buffer.getvalue(), NPZ_TYPE)
        body = {"inputs": {name: _list(value) for name, value in inputs.items()}}
        return self.request("POST", "/v1/predict", json.dumps(body).encode(), JSON_TYPE)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _numpy(value: Any) -> Any:
    return value.numpy() if hasattr(value, "numpy") else value


def _list(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value
