"""`aotc bench`: a package against eager and torch.compile of its artifact.

harness (plan and interleaved steady-state timing), cold and cold_child (fresh-process cold starts),
machine (what it ran on), report (table and JSON), plot.
"""
