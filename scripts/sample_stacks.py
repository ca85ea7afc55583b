"""Run a Python command under a stack sampler and report where its main thread spends its time.

For builds that are slow for reasons no log explains (py-spy is not on the GPU machine). Every
--interval seconds the main thread's stack is read from sys._current_frames(); each function on it
gets a sample ("inclusive"), the innermost one also a "self" sample. The report is rewritten every
--report-every seconds, so a run cut off by a time limit still leaves one.

usage: python scripts/sample_stacks.py --out report.txt [--interval 0.2] -- -m aotc build ...
"""

from __future__ import annotations

import argparse
import collections
import runpy
import sys
import threading
import time


def frame_label(frame) -> str:
    code = frame.f_code
    return f"{code.co_filename.split('site-packages/')[-1]}:{code.co_firstlineno} {code.co_name}"


class Sampler(threading.Thread):
    def __init__(self, target_thread: int, interval: float, out: str, report_every: float):
        super().__init__(daemon=True)
        self.target, self.interval, self.out, self.report_every = target_thread, interval, out, report_every
        self.inclusive: collections.Counter = collections.Counter()
        self.innermost: collections.Counter = collections.Counter()
        self.samples = 0
        self.started = time.perf_counter()

    def run(self) -> None:
        last_report = time.perf_counter()
        while True:
            time.sleep(self.interval)
            frame = sys._current_frames().get(self.target)
            if frame is None:
                continue
            self.samples += 1
            self.innermost[frame_label(frame)] += 1
            seen = set()
            while frame is not None:
                label = frame_label(frame)
                if label not in seen:  # recursion counts once per sample
                    seen.add(label)
                    self.inclusive[label] += 1
                frame = frame.f_back
            if time.perf_counter() - last_report > self.report_every:
                self.write()
                last_report = time.perf_counter()

    def write(self) -> None:
        lines = [f"{self.samples} samples over {time.perf_counter() - self.started:.0f} s", "", "inclusive:"]
        lines += [f"{100 * n / self.samples:5.1f}%  {label}" for label, n in self.inclusive.most_common(60)]
        lines += ["", "innermost:"]
        lines += [f"{100 * n / self.samples:5.1f}%  {label}" for label, n in self.innermost.most_common(30)]
        with open(self.out, "w") as handle:
            handle.write("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--report-every", type=float, default=20.0)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-m module args... | script.py args...")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    sampler = Sampler(threading.main_thread().ident, args.interval, args.out, args.report_every)
    sampler.start()
    try:
        if command[0] == "-m":
            sys.argv = [command[1], *command[2:]]
            runpy.run_module(command[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = command
            runpy.run_path(command[0], run_name="__main__")
    finally:
        sampler.write()


if __name__ == "__main__":
    main()
