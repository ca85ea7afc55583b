"""The `aotc` command line: one module per command (export, build, run, bench, explain), the group in main.py.

Each command parses flags into a config, calls one aotc.api function and prints the result.
"""
