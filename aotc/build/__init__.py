"""Build: an export artifact -> a package folder (AOTInductor model.pt2 + manifest.json).

pipeline (the stages), manifest (the one place the manifest is made), precision (placement and
dtypes), inductor_options, toolchain and ptxas (compilers), profile (Inductor's phase timers),
verify and verify_child (the numeric check against eager), tolerances, package_writer (atomic folder).
"""
