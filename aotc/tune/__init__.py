"""`aotc build --tune` and `--specialize`: spend build time on the target machine for speed.

candidates.py: what is tried (configs/tune/<device>.yaml); cache.py: where builds and measurements
are kept between runs; search.py: build each candidate (a child process, under the budget), check
it, time the survivors side by side, pick; driver.py: the package that holds the winners.
"""
