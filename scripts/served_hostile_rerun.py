"""The served hostile cases, rerun against a real `aotc serve` (local Ray, 127.0.0.1), with the
replica's and Ray Serve proxy's memory before and after each: what docs/reliability.md's table
says of a replica, measured on one.

    python scripts/served_hostile_rerun.py PACKAGE [--port 8123] > rerun.json

PACKAGE: a text-generation package with the word-level tokenizer of the tests ("w7" is id 7), an
embedding row 500 of NaN (tests/test_non_finite_rows.py builds one), a chat template that loops
on the message "hang" and builds 4 GB on "grow" (tests/test_serve_hostile_clients.py), a cache of
512 and 8 rows. Cases:

- non-finite: a sampled completion whose prompt holds token 500, beside two greedy streams;
- template: chat messages "grow" and "hang", and /v1/health's latency while "hang" renders;
- unread streams: four streaming completions (n=128, 200 tokens, logprobs 20) whose clients never
  read, held 30 s, then closed;
- row share: a 1-token request sent 1 s after an n=128, max_tokens=200 request.

Every request but the poisoned one is greedy on a prompt whose 200 tokens never include 500 (a row
that makes the poisoned token itself ends in error on its next step, as it should).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


def rss_mib(pattern: str) -> float:
    """The resident memory of the Ray worker whose command line holds `pattern` (ps)."""
    listing = subprocess.run(["ps", "-eo", "rss=,args="], capture_output=True, text=True).stdout
    sizes = [int(line.split()[0]) for line in listing.splitlines() if pattern in line]
    return round(max(sizes, default=0) / 1024, 1)


def memory() -> dict:
    return {"replica_mib": rss_mib("ServeReplica:aotc"), "proxy_mib": rss_mib("ProxyActor")}


def post(url: str, path: str, body: dict, timeout: float = 120) -> tuple[int, dict | str]:
    request = urllib.request.Request(url + path, json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            text = reply.read().decode()
            status = reply.status
    except urllib.error.HTTPError as error:
        text, status = error.read().decode(), error.code
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text  # a stream's events


def health_seconds(url: str) -> float:
    started = time.perf_counter()
    urllib.request.urlopen(url + "/v1/health", timeout=120).read()
    return round(time.perf_counter() - started, 3)


def in_background(call, *args) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run():
        started = time.perf_counter()
        result["reply"] = call(*args)
        result["seconds"] = round(time.perf_counter() - started, 2)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def non_finite(url: str) -> dict:
    streams = [
        in_background(post, url, "/v1/completions",
                      {"prompt": "w9 w300", "max_tokens": 200, "temperature": 0,
                       "stream": True, "ignore_eos": True})
        for _ in range(2)
    ]  # fmt: skip
    time.sleep(0.2)
    status, answer = post(url, "/v1/completions",
                          {"prompt": "w5 w500 w7", "max_tokens": 20, "temperature": 0.7})  # fmt: skip
    for thread, _ in streams:
        thread.join()
    bystanders = [result["reply"][1] for _, result in streams]
    return {
        "poisoned_status": status,
        "poisoned_error": answer["error"]["message"] if isinstance(answer, dict) else answer,
        "bystanders_finished": [
            text.rstrip().endswith("data: [DONE]") and '"error"' not in text for text in bystanders
        ],  # fmt: skip
    }


def template(url: str) -> dict:
    found = {}
    for content in ("grow", "hang"):
        thread, result = in_background(
            post, url, "/v1/chat/completions",
            {"messages": [{"role": "user", "content": content}], "max_tokens": 3},
        )  # fmt: skip
        time.sleep(0.5)
        health = health_seconds(url)
        thread.join()
        status, answer = result["reply"]
        found[content] = {
            "status": status,
            "message": answer["error"]["message"][:120] if isinstance(answer, dict) else answer,
            "seconds": result["seconds"],
            "health_seconds_meanwhile": health,
        }
    return found


def unread_streams(url: str, hold_s: float) -> dict:
    host, port = url.split("//")[1].split(":")
    body = json.dumps({"prompt": "w9 w300", "n": 128, "max_tokens": 200, "logprobs": 20,
                       "stream": True, "temperature": 0, "ignore_eos": True}).encode()  # fmt: skip
    sockets = []
    for _ in range(4):
        connection = socket.create_connection((host, int(port)))
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        connection.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        sockets.append(connection)
    time.sleep(hold_s)
    during = memory()
    for connection in sockets:
        connection.close()
    time.sleep(5)
    return {"during": during, "after_close": memory(), "health_seconds": health_seconds(url)}


def row_share(url: str) -> dict:
    large, result = in_background(
        post, url, "/v1/completions",
        {"prompt": "w9 w300", "n": 128, "max_tokens": 200, "temperature": 0, "ignore_eos": True},
    )  # fmt: skip
    time.sleep(1.0)
    started = time.perf_counter()
    status, _ = post(url, "/v1/completions", {"prompt": "w9", "max_tokens": 1})
    small = round(time.perf_counter() - started, 2)
    large.join()
    return {"small_status": status, "small_seconds": small, "large_seconds": result["seconds"],
            "large_status": result["reply"][0]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--hold-s", type=float, default=30.0)
    options = parser.parse_args()
    url = f"http://127.0.0.1:{options.port}"
    aotc = Path(sys.executable).parent / "aotc"
    server = subprocess.Popen([str(aotc), "serve", str(options.package), "--port",
                               str(options.port)], stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                health_seconds(url)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the server did not start") from None
                time.sleep(1)
        report = {"started": memory()}
        for name, case in (("non_finite", non_finite), ("template", template),
                           ("row_share", row_share)):  # fmt: skip
            report[name] = case(url)
            report[f"after_{name}"] = memory()
        report["unread_streams"] = unread_streams(url, options.hold_s)
        report["end"] = memory()
        print(json.dumps(report, indent=1))
    finally:
        server.terminate()
        server.wait(timeout=120)


if __name__ == "__main__":
    main()
