"""Decoding request bodies and encoding answers off the ingress's event loop, in worker processes.

Why processes and not threads: json.loads and torch.tensor(nested list) hold the GIL for as long as
they run. 8,192 integers of 4,000 digits (a 33 MB JSON body the protocol's counts allow for a
64x128 input) take 1.9 s to parse on a 2-core VM; in a thread, the event loop, and with it
/v1/health, would wait as long. A worker is another interpreter: the loop only waits on a pipe.

Bodies up to INLINE_BYTES, most requests, are still decoded on the loop: there the worst one costs
milliseconds, less than the trip to a worker and back. Answers are encoded the same way.

The pool is bounded: WORKERS processes, each on one job at a time, and the bodies waiting for one
hold at most WAITING_BODIES x the body limit (256 MiB by default: hundreds of ordinary requests,
four of the largest). Beyond that a request gets 503 with Retry-After at once, instead of holding
its body in memory while it waits.

Workers run at a lower scheduling priority (nice WORKER_NICENESS): on a machine with as many busy
workers as cores (CI's VM has two), the ingress's loop (health checks, small requests) should not
wait for the kernel's time slices behind a bulk decode.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import IO, TYPE_CHECKING, Any

from aotc_runtime.serve.protocol import RequestError, decode_request, encode_response, said_whole

if TYPE_CHECKING:
    import torch

    from aotc_runtime import Signature

INLINE_BYTES = 64 << 10  # a body's bytes, or an answer's tensor bytes
WORKERS = 2
WORKER_NICENESS = 10
WAITING_BODIES = 4
RETRY_AFTER_S = 1
_LENGTH = struct.Struct("<Q")


class CodecBusyError(RequestError):
    """503: every worker is busy and the bodies waiting for one fill their budget."""

    def __init__(self, waiting_bytes: int):
        super().__init__(
            503,
            f"the server's decoding workers are busy and {waiting_bytes} bytes of requests wait "
            f"for them; retry in {RETRY_AFTER_S} s, or send smaller requests",
        )
        self.headers = {"Retry-After": str(RETRY_AFTER_S)}


class Codec:
    """decode(body) -> input tensors and encode(outputs) -> body, as protocol.py does them, with
    large ones done by worker processes."""

    def __init__(
        self,
        signature_json: dict,
        max_bytes: int,
        workers: int = WORKERS,
        waiting_bytes: int | None = None,
    ):
        from aotc_runtime import Signature

        self._signature = Signature.from_json(signature_json)
        self._max_bytes = max_bytes
        settings = {"signature": signature_json, "max_bytes": max_bytes}
        # started now, and waited for: their imports (torch: seconds, ~300 MB each) are done before
        # the ingress answers anything, so no request pays for them or sees them in its memory
        self._workers = [_Worker(settings) for _ in range(workers)]
        for worker in self._workers:
            worker.wait_ready()
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        for worker in self._workers:
            self._idle.put_nowait(worker)
        # one thread per worker, blocked on its pipes (the GIL is released while it waits)
        self._threads = ThreadPoolExecutor(workers, thread_name_prefix="aotc-codec")
        self._waiting = 0
        self._most_waiting = (
            waiting_bytes if waiting_bytes is not None else WAITING_BODIES * max_bytes
        )

    async def decode(self, body: bytes, content_type: str) -> list[torch.Tensor]:
        if len(body) <= INLINE_BYTES:
            return decode_request(body, content_type, self._signature, self._max_bytes)
        return unpack(await self._run(("decode", content_type, body), len(body)))

    async def encode(self, outputs: object, content_type: str) -> tuple[bytes, str]:
        from aotc_runtime import flatten_outputs

        tensors = [t.detach().cpu() for t in flatten_outputs(outputs)]
        size = sum(t.numel() * t.element_size() for t in tensors)
        if size <= INLINE_BYTES:
            return encode_response(tensors, self._signature, content_type)
        return await self._run(("encode", content_type, pack(tensors)), size)

    async def _run(self, job: tuple, size: int) -> Any:
        if self._idle.empty() and self._waiting + size > self._most_waiting:
            raise CodecBusyError(self._waiting)
        self._waiting += size
        try:
            worker = await self._idle.get()
        finally:
            self._waiting -= size
        loop = asyncio.get_running_loop()
        running = self._threads.submit(worker.call, job)
        # back to the idle queue when the thread is done with it, not when this request is (a
        # client that hangs up cancels the request while its worker is still busy)
        running.add_done_callback(
            lambda _: loop.call_soon_threadsafe(self._idle.put_nowait, worker)
        )
        reply = await asyncio.wrap_future(running)
        if reply[0] == "refused":
            raise RequestError(*reply[1:])
        if reply[0] == "failed":
            raise RequestError(500, reply[1])
        return reply[1]

    def close(self) -> None:
        for worker in self._workers:
            worker.stop()
        self._threads.shutdown(wait=False, cancel_futures=True)


class _Worker:
    """One worker process (`python -m aotc_runtime.serve.codec`) and its pipes; used by one thread
    at a time. One that dies is started again for the next job."""

    def __init__(self, settings: dict):
        self._settings = settings
        self._process = self._start()
        self._ready = False

    def wait_ready(self) -> None:
        """Until the worker has imported what it needs and read its settings (it says "ready")."""
        if self._ready:
            return
        assert self._process.stdout is not None
        try:
            receive(self._process.stdout)
        except (EOFError, OSError):  # it died starting: call() starts it again and says how
            return
        self._ready = True

    def _start(self) -> subprocess.Popen:
        # the worker imports what this process imported: Ray puts the driver's folders on a
        # replica's sys.path, and `-m` puts the working folder first (here: aotc's own root)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        process = subprocess.Popen(
            [sys.executable, "-m", "aotc_runtime.serve.codec"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=root,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        )
        try:  # lowering another process's priority needs no privilege
            os.setpriority(
                os.PRIO_PROCESS, process.pid, os.getpriority(os.PRIO_PROCESS, 0) + WORKER_NICENESS
            )
        except OSError:  # it has ended already: the next call starts it again
            pass
        assert process.stdin is not None
        send(process.stdin, self._settings)
        return process

    def call(self, job: tuple) -> Any:
        if self._process.poll() is not None:
            self._process, self._ready = self._start(), False
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        try:
            self.wait_ready()
            send(stdin, job)
            return receive(stdout)
        except (EOFError, OSError):
            code = self._process.wait()
            if code == -signal.SIGKILL:
                how = "killed by SIGKILL, most often the kernel's out-of-memory killer"
            elif code < 0:
                how = f"killed by {signal.Signals(-code).name}"
            else:
                how = f"exit code {code}; the replica's log has its error"
            return (
                "failed",
                f"the worker process handling this request ended ({how}); retry, or send smaller "
                "requests",
            )

    def stop(self) -> None:
        try:
            if self._process.stdin is not None:
                self._process.stdin.close()  # the worker ends at the end of its input
        except OSError:  # it has ended already
            pass
        try:
            self._process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self._process.kill()


# Tensors cross the pipes as (dtype name, shape, bytes): torch's own pickling goes through
# torch.save, and numpy has no bfloat16.
def pack(tensors: list[torch.Tensor]) -> list[tuple]:
    import torch

    return [
        (
            str(t.dtype).split(".")[-1],
            tuple(t.shape),
            t.contiguous().reshape(-1).view(torch.uint8).numpy(),
        )
        for t in tensors
    ]


def unpack(packed: list[tuple]) -> list[torch.Tensor]:
    import torch

    return [
        torch.from_numpy(raw).view(getattr(torch, dtype)).reshape(shape)
        for dtype, shape, raw in packed
    ]


# Both ends of a pipe are this module, in processes of the same replica: the pickles are ours (a
# request body travels inside one as bytes and is only ever parsed by protocol.py).
def send(stream: IO[bytes], message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)))
    stream.write(data)
    stream.flush()


def receive(stream: IO[bytes]) -> Any:
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError("the other end closed the pipe")
    (size,) = _LENGTH.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the other end closed the pipe mid-message")
    return pickle.loads(data)


def answer(job: tuple, signature: Signature, max_bytes: int) -> tuple:
    """A worker's reply to one job: ("ok", result), ("refused", status, message, param, code) or
    ("failed", message)."""
    operation, content_type, payload = job
    try:
        if operation == "decode":
            return ("ok", pack(decode_request(payload, content_type, signature, max_bytes)))
        return ("ok", encode_response(unpack(payload), signature, content_type))
    except RequestError as exc:
        return ("refused", exc.status, str(exc), exc.param, exc.code)
    except MemoryError:
        message = "decoding this request ran out of memory; send smaller requests"
        return ("refused", 413, message, None, "request_too_large")
    except Exception as exc:  # our bug: this request gets a 500 naming it, the worker goes on
        said = said_whole(str(exc))
        detail = f"{type(exc).__name__}: {said}" if said else type(exc).__name__
        return ("failed", f"the server failed on this request ({detail})")


def main() -> None:
    """A worker: its settings, then one reply per job, until the replica closes the pipe."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what a library prints goes to the replica's log, not into the replies
    import torch

    from aotc_runtime import Signature

    torch.set_num_threads(1)  # decoding is not compute: leave the cores to the model replicas
    jobs = sys.stdin.buffer
    try:
        settings = receive(jobs)
        assert isinstance(settings, dict)
        signature = Signature.from_json(settings["signature"])
        send(replies, ("ready",))
        while True:
            job = receive(jobs)
            assert isinstance(job, tuple)
            send(replies, answer(job, signature, settings["max_bytes"]))
    except (EOFError, BrokenPipeError):  # the replica is gone or stopping
        return


if __name__ == "__main__":
    main()
