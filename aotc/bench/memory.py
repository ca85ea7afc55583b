"""The extra memory a block of calls needs: the CUDA allocator's peak above the start, or RSS growth."""

from __future__ import annotations

import os
import threading
from pathlib import Path


class MemoryWatch:
    """Extra memory a block of calls needs: CUDA allocator peak above the start, or RSS growth sampled every ms."""

    def __init__(self, device):
        self.device = device
        self.peak_mb = None

    def __enter__(self):
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return self
        self._base = self._peak = _rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        if self._base is not None:
            self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.001):
            self._peak = max(self._peak, _rss_bytes() or 0)

    def __exit__(self, *exc):
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_mb = (torch.cuda.max_memory_allocated(self.device) - self._base) / 2**20
        elif self._base is not None:
            self._stop.set()
            self._thread.join()
            self._peak = max(self._peak, _rss_bytes() or 0)
            self.peak_mb = (self._peak - self._base) / 2**20
        return False


def _rss_bytes():
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
