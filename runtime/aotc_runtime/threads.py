"""How many CPU threads a package's calls use: `--threads N` of `aotc generate`, `aotc bench`,
`aotc serve` and `aotc-runner`, and the default when it is not given.

The default is one thread per physical core this process may run on: hyper-threads share a
core's vector units, so a second thread per core mostly adds waiting at every OpenMP barrier, and
threads beyond the CPUs the process really gets (its affinity mask, a container's CPU quota)
wait whole scheduler slices at each barrier (seen on a busy 2-core VM: a decode step of 494 ms
where one thread took 2-4 ms). So:

  1. the CPUs of the process's affinity mask (`taskset`, a cpuset), else os.cpu_count();
  2. of those, the physical cores: CPUs listed as one core in sysfs (`core_cpus_list`, or the
     older `thread_siblings_list`) count once; without topology data, every CPU counts;
  3. at most the cgroup's CPU quota, rounded up (v2 `cpu.max`, v1 `cpu.cfs_quota_us` over
     `cpu.cfs_period_us`, along the process's cgroup path up to the root), as Go's GOMAXPROCS,
     the JVM and vLLM's CFS-aware CPU count read it;
  4. at most the machine's CPUs that other work leaves free: os.cpu_count() less the 1-minute
     load average, rounded (/proc/loadavg). Two threads on a 2-core VM where two other processes
     spin decoded SmolLM2 at a fraction of one thread's rate: each OpenMP barrier waits for a
     thread the scheduler has put aside (docs/benchmarks.md, "Threads on a busy machine");
  5. at least 1.

An explicit OMP_NUM_THREADS (a whole number from 1) is the user's choice and is kept. The C++
runner computes the same rule (runtime/cpp/src/threads.cpp); tests/test_threads.py checks that
both agree.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

MAX_THREADS = 1024  # far past any machine's cores; a typo must not start a million threads
_SMALL_FILE = 4096  # sysfs, cgroup and /proc files read here are a line or a few


def parse_threads(text: str, flag: str = "--threads") -> int:
    """A thread count as given on a command line: digits only, 1 to MAX_THREADS; ValueError with
    the one-line message otherwise."""
    text = text.strip()
    if text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_THREADS:
        return int(text)
    raise ValueError(
        f"{flag} must be a whole number from 1 to {MAX_THREADS} (the CPU threads to use), got "
        f"{text!r}; leave it out for one thread per free physical core ({default_threads()} here now)"
    )


def default_threads(root: Path = Path("/"), allowed: set[int] | None = None) -> int:
    """One thread per physical core this process may use, capped by its cgroup's CPU quota.
    `root` and `allowed` (the CPUs of the affinity mask) are for tests: a fake /sys and /proc."""
    cpus = allowed_cpus() if allowed is None else allowed
    count = physical_cores(cpus, root / "sys/devices/system/cpu")
    quota = cgroup_cpu_quota(root)
    if quota is not None:
        count = min(count, quota)
    busy = busy_cpus(root)
    if busy:
        count = min(count, (os.cpu_count() or 1) - busy)
    return max(1, count)


def busy_cpus(root: Path = Path("/")) -> int:
    """The CPUs other work keeps busy: the 1-minute load average of /proc/loadavg (tasks running
    or waiting to run, averaged), rounded; 0 when it cannot be read. A command counts itself in it
    only after it has run a while, which a default chosen at its start has not."""
    fields = (_read_small(root / "proc/loadavg") or "").split()
    try:
        load = float(fields[0])
    except (IndexError, ValueError):
        return 0
    return int(load + 0.5) if 0 <= load < MAX_THREADS else 0


def chosen_threads(requested: int | None = None) -> int:
    """The threads a command uses: `requested`, else a valid OMP_NUM_THREADS, else the default."""
    if requested is not None:
        return requested
    from_env = _whole_number(os.environ.get("OMP_NUM_THREADS", ""))
    if from_env is not None and from_env <= MAX_THREADS:
        return from_env
    return default_threads()


def set_threads(requested: int | None = None) -> int:
    """Set torch's intra-op threads (of the calling thread, where OpenMP keeps them: call it in
    the thread that calls the package) and, when still possible, its inter-op threads; return
    the intra-op threads torch now uses."""
    import torch

    threads = chosen_threads(requested)
    torch.set_num_threads(threads)
    try:
        # process-wide and settable once, before any inter-op work: a second command in the same
        # process (tests, a server's replica) keeps the first one's
        torch.set_num_interop_threads(threads)
    except RuntimeError:
        pass
    return torch.get_num_threads()


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity mask), else all of os.cpu_count()."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return set(range(os.cpu_count() or 1))


def physical_cores(cpus: set[int], cpu_dir: Path) -> int:
    """How many physical cores `cpus` span: CPUs that sysfs lists as one core count once. Without
    a readable topology for every CPU, each CPU counts as a core."""
    cores = set()
    for cpu in cpus:
        topology = cpu_dir / f"cpu{cpu}" / "topology"
        siblings = (_read_small(topology / "core_cpus_list") or "").strip() or (
            _read_small(topology / "thread_siblings_list") or ""
        ).strip()
        if not siblings:
            return len(cpus)
        cores.add(siblings)
    return len(cores)


def cgroup_cpu_quota(root: Path = Path("/")) -> int | None:
    """The CPUs the process's cgroup quota allows, rounded up (None: no quota). The smallest
    along its cgroup path: a limit set on a parent holds for its children too."""
    limits = []
    for controllers, path in _cgroup_paths(root):
        if controllers == "":  # cgroup v2: one hierarchy
            for folder in _folders_up(root / "sys/fs/cgroup", path):
                limits.append(_v2_limit(folder / "cpu.max"))
        elif "cpu" in controllers.split(","):  # cgroup v1: the cpu controller's hierarchy
            for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
                for folder in _folders_up(root / "sys/fs/cgroup" / mount, path):
                    limits.append(_v1_limit(folder))
    found = [limit for limit in limits if limit is not None]
    return max(1, math.ceil(min(found))) if found else None


def _cgroup_paths(root: Path) -> list[tuple[str, str]]:
    """(controllers, path) of each line of /proc/self/cgroup ("0::/a/b", "4:cpu,cpuacct:/a")."""
    text = _read_small(root / "proc/self/cgroup") or ""
    entries = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            entries.append((parts[1], parts[2]))
    return entries


def _folders_up(mount: Path, path: str) -> list[Path]:
    """The cgroup's folder under `mount` and each parent up to the mount itself. Inside a container
    the path may name the host's hierarchy, which the container's mount does not hold: the folders
    that do not exist are skipped, the mount's own files are the container's."""
    parts = [part for part in path.split("/") if part and part not in (".", "..")]
    return [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _v2_limit(cpu_max: Path) -> float | None:
    """`cpu.max` is "QUOTA PERIOD" in microseconds, or "max PERIOD" for none."""
    fields = (_read_small(cpu_max) or "").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    quota, period = _whole_number(fields[0]), _whole_number(fields[1])
    return quota / period if quota and period else None


def _v1_limit(folder: Path) -> float | None:
    """`cpu.cfs_quota_us` (-1: none) over `cpu.cfs_period_us`."""
    quota = _whole_number(_read_small(folder / "cpu.cfs_quota_us") or "")
    period = _whole_number(_read_small(folder / "cpu.cfs_period_us") or "")
    return quota / period if quota and period else None


def _whole_number(text: str) -> int | None:
    text = text.strip()
    if text.isascii() and text.isdigit() and int(text) >= 1:
        return int(text)
    return None


def _read_small(path: Path) -> str | None:
    """The start of a small system file, or None when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return handle.read(_SMALL_FILE).decode("ascii", "replace")
    except OSError:
        return None
