"""Build: an export artifact -> a package folder (compiled model + manifest.json).

pipeline (what every build shares, and the pick of a backend), backends/ (one module per
backend: inductor, onnxruntime; their stages), manifest (the one place the manifest is made), precision (placement and
dtypes), inductor_options, toolchain, ptxas and cpu_isa (compilers), profile (Inductor's phase timers),
verify and verify_child (the numeric check against eager), tolerances, package_writer (atomic folder).
"""
