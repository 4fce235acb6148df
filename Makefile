# The whole set-up is two commands: `make demo` and `make test`. Each makes its own
# virtual environment (.venv) on first use and reinstalls when pyproject.toml changes.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-floor lint unit conformance bench bench-zoo bench-zoo-transformers zoo-transformers-test-files clean

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
# to the release this machine keeps on disk (one torch for the peers and the zoos).
PEER_PACKAGES := "torch==2.14.1" "jax jaxlib" "ai-edge-litert"

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	@for spec in $(PEER_PACKAGES); do \
	  $(BIN)/python -m pip install --quiet $$spec >/dev/null 2>&1 \
	    || echo "bench: could not install $$spec; its column will be absent"; \
	done
	PYTHONPATH=. $(BIN)/python benchmarks/latency.py --out benchmarks/results

# The transformer zoo (benchmarks/zoo_transformers.py): transformers-library models exported
# by torch.onnx, against onnxruntime. The exporters are heavy (torch is several GB), so this
# is out of `make test`; the tests use the small files in tests/data/transformers, which
# `make zoo-transformers-test-files` rewrites.
ZOO_PACKAGES := "torch==2.14.1" transformers onnxscript

bench-zoo-transformers: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]" $(ZOO_PACKAGES)
	PYTHONPATH=. $(BIN)/python benchmarks/zoo_transformers.py --out benchmarks/results/zoo_transformers

zoo-transformers-test-files: $(STAMP)
	$(BIN)/python -m pip install --quiet $(ZOO_PACKAGES)
	$(BIN)/python benchmarks/zoo_transformers.py --write-test-files tests/data/transformers

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

# The suite on the declared minimum versions (.ci/floor.txt) in a venv of its own. The
# slow tests (the ONNX node cases, whose expected outputs belong to the installed onnx,
# and onnx's own reference evaluator on large inputs) run in `make test` only.
FLOOR_VENV := .venv-floor
FLOOR_STAMP := $(FLOOR_VENV)/.installed

$(FLOOR_STAMP): pyproject.toml .ci/floor.txt
	$(PY) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(FLOOR_VENV)/bin/python -m pip install --quiet -c .ci/floor.txt -e ".[test]"
	touch $(FLOOR_STAMP)

test-floor: $(FLOOR_STAMP)
	$(FLOOR_VENV)/bin/python -m pytest -q -p no:cacheprovider -m "not slow"

# The ONNX backend node cases, each data set called twice on one loaded model (the second
# call runs the planned code); benchmarks/conformance.py --help for the counting rules.
conformance: $(STAMP)
	$(BIN)/python benchmarks/conformance.py

clean:
	rm -rf $(VENV) $(FLOOR_VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
