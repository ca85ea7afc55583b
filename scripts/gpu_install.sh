#!/usr/bin/env bash
# Installs aotc for the GPU tests beside a GPU machine's own torch (`make test-gpu` and
# scripts/gpu_checks.sh run it first): aotc and aotc-runtime from this checkout, then the tests'
# dependencies the machine may lack (jsonschema, llguidance for structured output, and nlohmann-json
# for the C++ runner) from the wheels in .gpu/wheels (`make gpu-wheels` downloads them on a machine with the package registry),
# else from the registry. Fails naming what is missing, so no test stops later on an import.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
NEEDED=(jsonschema==4.26.0 nlohmann-json==3.12.0 importlib-resources==7.1.0 llguidance==1.9.1)
"$PYTHON" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e ./runtime -e .
if [ -d .gpu/wheels ] && compgen -G ".gpu/wheels/*.whl" > /dev/null; then
  # offline: the named requirements, their dependencies found among the wheels
  "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --find-links .gpu/wheels "${NEEDED[@]}"
else
  "$PYTHON" -m pip install -q --disable-pip-version-check "${NEEDED[@]}"
fi
"$PYTHON" -c "import jsonschema, llguidance, nlohmann_json, aotc, aotc_runtime" \
  || { echo "error: the GPU tests' dependencies did not install; see docs/gpu.md" >&2; exit 1; }
