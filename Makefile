# The whole set-up is two commands: `make demo` and `make test`. Each makes its own
# virtual environment (.venv) on first use and reinstalls when pyproject.toml changes.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint unit conformance bench bench-zoo clean

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

# The model zoos: real models, tfrt_py against onnxruntime in one process. Their exporters
# (torch, torchvision, timm, onnxscript for the vision zoo) are installed into .venv here
# and never by `make test`. OpenBLAS runs the kernels it picks for this CPU (the anchor
# machines pin OPENBLAS_CORETYPE for the tests; onnxruntime picks its own kernels too).
# One line per zoo run: the vision zoo at batch 1 and 8 (both torch.onnx exporters), then
# at batch 1 with a busy-loop neighbour on one core. Another zoo adds its line(s) at the
# end of the recipe (and its exporters to ZOO_PACKAGES).
ZOO_PACKAGES := "torch==2.14.1" "torchvision==0.29.1" "timm" "onnxscript"
ZOO_RUN := env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(BIN)/python
ZOO_OUT := benchmarks/results

bench-zoo: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]" $(ZOO_PACKAGES)
	mkdir -p $(ZOO_OUT)
	$(ZOO_RUN) benchmarks/vision_zoo.py --batches 1,8 --exporter both \
	    --png $(ZOO_OUT)/vision_zoo.png --json $(ZOO_OUT)/vision_zoo.json
	$(ZOO_RUN) benchmarks/vision_zoo.py --batches 1 --busy \
	    --png $(ZOO_OUT)/vision_zoo_busy.png --json $(ZOO_OUT)/vision_zoo_busy.json

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
