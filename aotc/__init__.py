"""aotc: ahead-of-time export and compile for PyTorch models.

The compiler side. Heavy imports (torch) happen inside functions so `aotc --help` is fast.
"""

__version__ = "0.1.0"
