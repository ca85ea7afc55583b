// How many CPU threads a package's calls use: the rule of runtime/aotc_runtime/threads.py, so that
// aotc-runner and the Python runtime pick the same number on the same machine.
#pragma once

namespace aotc {

// The most threads --threads takes: far past any machine's cores; a typo must not start a million.
constexpr int kMaxThreads = 1024;

// One thread per physical core of the process's affinity mask (CPUs that sysfs lists as one core
// count once; without topology data every CPU counts), at most its cgroup's CPU quota rounded up,
// at least 1.
int default_threads();

// `requested` when above 0; else OMP_NUM_THREADS when it is a whole number from 1 to kMaxThreads
// (the user's explicit choice); else default_threads().
int chosen_threads(int requested);

// Sets ATen's intra-op threads (OpenMP's, of the calling thread, which calls the package) and its
// inter-op threads to chosen_threads(requested); returns the intra-op threads ATen now uses.
int set_threads(int requested);

}  // namespace aotc
