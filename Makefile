# The whole set-up is two commands: `make demo` and `make test`. Each makes its own
# virtual environment (.venv) on first use and reinstalls when pyproject.toml changes.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint unit conformance bench bench-zoo bench-zoo-classic clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

EXAMPLE := tfrt_py/examples/mlp_small.onnx

demo: $(STAMP)
	$(BIN)/tfrt-py inspect $(EXAMPLE)
	$(BIN)/tfrt-py run $(EXAMPLE)
	$(BIN)/tfrt-py bench $(EXAMPLE) --seconds 3

# Optional peers (benchmarks/peers.py): each is measured where it installs. torch is pinned
# to the CPU wheel: a plain `torch` would pull the CUDA build (GBs).
PEER_PACKAGES := "torch==2.13.0" "jax jaxlib" "ai-edge-litert"

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	@for spec in $(PEER_PACKAGES); do \
	  $(BIN)/python -m pip install --quiet $$spec >/dev/null 2>&1 \
	    || echo "bench: could not install $$spec; its column will be absent"; \
	done
	$(BIN)/python benchmarks/latency.py --out benchmarks/results

# The model zoo: real exporters' models from fixed seeds (nothing downloaded), tfrt_py auto
# vs onnxruntime. Each family is its own target; bench-zoo runs them all.
ZOO_CLASSIC_PACKAGES := lightgbm xgboost onnxmltools

bench-zoo: bench-zoo-classic

bench-zoo-classic: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]" $(ZOO_CLASSIC_PACKAGES)
	$(BIN)/python benchmarks/zoo_build.py --out benchmarks/zoo
	$(BIN)/python benchmarks/zoo.py --zoo benchmarks/zoo --out benchmarks/results

lint: $(STAMP)
	$(BIN)/ruff check tfrt_py tests benchmarks
	$(BIN)/ruff format --check tfrt_py tests benchmarks
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider

test: lint unit

conformance: $(STAMP)
	$(BIN)/python ../shared/tools/conformance.py tfrt_py.onnx_backend

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
