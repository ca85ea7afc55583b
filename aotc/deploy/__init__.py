"""What takes a built package to where it runs: `aotc verify`'s checks (verify_package.py), the C++
runner's build and lookup (cpp_runner.py) and self-contained bundles (bundle.py)."""
