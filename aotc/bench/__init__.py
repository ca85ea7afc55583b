"""`aotc bench`: a package against eager and torch.compile of its artifact.

harness (the plan and the steady-state measurement), target (device, artifact and batch sizes,
checked), contenders (each contender loaded, its first call, the interleaved timed rounds), cold and
cold_child (fresh-process cold starts), generation and generation_bench (text-generation packages,
per token), machine (what it ran on), report (table and JSON), plot.
"""
