# The same commands CI runs. `make demo` and `make test` each create .venv if missing and install.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
AOTC := $(VENV)/bin/aotc
DEMO := demo_out

.PHONY: install demo test test-newest test-kernels test-gpu gpu-wheels bench lint format runner clean

install: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml runtime/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e ./runtime -e .
	touch $@

demo: install
	rm -rf $(DEMO) && mkdir -p $(DEMO)
	@echo "== 1/3 export: examples/mlp.py (the seeds' MLP 128->256->10) at batch 32"
	$(AOTC) export examples/mlp.py --input-shape 32x128 -o $(DEMO)/mlp.pt2
	@echo "== 2/3 build: AOTInductor package for CPU, mode default, checked against eager"
	$(AOTC) build $(DEMO)/mlp.pt2 --mode default --device cpu -o $(DEMO)/mlp_pkg
	@echo "== 3/3 run: the package through the thin runtime on a saved input, 100 timed calls"
	$(PY) -c "import numpy; numpy.save('$(DEMO)/x.npy', numpy.random.default_rng(0).standard_normal((32, 128), dtype=numpy.float32))"
	$(AOTC) run $(DEMO)/mlp_pkg --input $(DEMO)/x.npy --output $(DEMO)/y.npz --iters 100
	$(PY) scripts/compare_with_eager.py examples/mlp.py $(DEMO)/x.npy $(DEMO)/y.npz
	@echo "demo done: artifact $(DEMO)/mlp.pt2, package $(DEMO)/mlp_pkg/ (see its manifest.json), outputs $(DEMO)/y.npz"

test: install runner
	@command -v tmux >/dev/null || test "$$(id -u)" != 0 || (apt-get update -q && apt-get install -y -q tmux)  # aotc chat's terminal test
	$(PY) -m pytest -q --durations=25 -n 2 tests --ignore=tests/test_transformers_release.py --ignore=tests/test_kernel_frontend.py --ignore=tests/test_kernel_interpreter.py  # run by test-newest, test-kernels
	$(MAKE) test-newest test-kernels

# The text-generation parity tests again on the newest transformers of the supported range
# (requirements-newest.txt), installed beside the pinned one in $(NEWEST) and put first on the
# path: the rest of .venv is shared, and only the export is tested again (a few minutes).
NEWEST := .transformers-newest

$(NEWEST)/.installed: requirements-newest.txt $(VENV)/.installed
	rm -rf $(NEWEST)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --target $(NEWEST) -r requirements-newest.txt
	PYTHONPATH=$(CURDIR)/$(NEWEST) $(PY) -m pip check --disable-pip-version-check >/dev/null  # its requirements are met
	touch $@

test-newest: install $(NEWEST)/.installed
	PYTHONPATH=$(CURDIR)/$(NEWEST) $(PY) -m pytest -q -p no:cacheprovider tests/test_transformers_release.py

# aotc's Triton kernels through Triton's front end and AOTInductor's analysis, a Hopper target
# stubbed in (no GPU needed): Triton installed beside .venv in $(KERNELS) and put on the path for
# this run only, so the other tests still run as a CPU user's machine does, without Triton.
# Then what the kernels compute, in Triton's interpreter (tests/test_kernel_interpreter.py). Its
# numpy beside Triton: Triton 3.6's interpreter calls int() on one-element arrays, which the numpy
# of .venv (2.4) refuses.
KERNELS := .triton-kernels
TRITON := triton==3.6.0 numpy==2.2.6

$(KERNELS)/.installed: Makefile $(VENV)/.installed
	rm -rf $(KERNELS)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --target $(KERNELS) $(TRITON)
	touch $@

test-kernels: install $(KERNELS)/.installed
	PYTHONPATH=$(CURDIR)/$(KERNELS) $(PY) -m pytest -q -p no:cacheprovider tests/test_kernel_frontend.py
	PYTHONPATH=$(CURDIR)/$(KERNELS) TRITON_INTERPRET=1 $(PY) -m pytest -q -p no:cacheprovider tests/test_kernel_interpreter.py

# On a GPU machine, with its own torch (not .venv's CPU build): aotc installed beside it, the tests'
# dependencies from .gpu/wheels when there (offline machines), then the GPU tests. PYTEST_ARGS adds
# pytest options, e.g. PYTEST_ARGS='-k "not max-autotune"'.
test-gpu:
	PYTHON=$(PYTHON) scripts/gpu_install.sh
	$(PYTHON) -m pytest -q -m gpu -p no:cacheprovider tests $(PYTEST_ARGS)

# On a machine with the package registry: the wheels scripts/gpu_install.sh installs offline, for the
# GPU machine's Python (GPU_PYTHON_VERSION, 3.12 by default), into .gpu/wheels.
GPU_PYTHON_VERSION ?= 3.12
gpu-wheels: install
	$(PY) -m pip download -q --disable-pip-version-check --only-binary=:all: --platform manylinux2014_x86_64 \
	  --platform manylinux_2_31_x86_64 --python-version $(GPU_PYTHON_VERSION) -d .gpu/wheels \
	  jsonschema==4.26.0 nlohmann-json==3.12.0 importlib-resources==7.1.0 llguidance==1.9.1

# The C++ runner (runtime/cpp) against the installed torch: runtime/cpp/build/aotc-runner, linked into
# .venv/bin. Needs cmake, g++ and the OpenSSL and zlib headers (installed with apt when missing and root).
runner: install
	@test -f /usr/include/openssl/evp.h -a -f /usr/include/zlib.h || test "$$(id -u)" != 0 || \
	  (apt-get update -q && apt-get install -y -q libssl-dev zlib1g-dev cmake g++)
	$(PY) -m aotc.deploy.cpp_runner build
	ln -sf $(CURDIR)/runtime/cpp/build/aotc-runner $(VENV)/bin/aotc-runner

# Formatter check, linter, types (settings in pyproject.toml); `make format` applies the formatter.
lint: install
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: install
	rm -rf bench_out && mkdir -p bench_out
	@echo "== 1/3 export: examples/mlp.py at batch 32"
	$(AOTC) export examples/mlp.py --input-shape 32x128 -o bench_out/mlp.pt2
	@echo "== 2/3 build: mode default (device auto: the GPU if torch sees one, else the CPU)"
	$(AOTC) build bench_out/mlp.pt2 --mode default -o bench_out/mlp_pkg
	@echo "== 3/3 bench: the package against eager and torch.compile, steady state and cold starts"
	$(AOTC) bench bench_out/mlp_pkg --json bench_out/bench.json --plot bench_out/bench.png
	@echo "bench done: table above, report bench_out/bench.json, plot bench_out/bench.png"

clean:
	rm -rf $(DEMO) bench_out .pytest_cache
