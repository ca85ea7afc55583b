"""The compiler behind `aotc build`: an export artifact -> a package folder (compiled model +
manifest.json). It knows nothing of tuning: aotc/tune builds each candidate through it.

pipeline (the config checked, the pick of a backend), backends/ (one module per backend: inductor,
onnxruntime; their stages), finish (the last step every backend shares), manifest (the one place
the manifest is made), state_file, inductor_options, toolchain, ptxas and cpu_isa (compilers),
profile (Inductor's phase timers), verify and verify_child (the numeric check against eager),
tolerances, package_writer (atomic folder), specialize and shared_weights (what --specialize
members need), reproducible, disk_space.
"""
