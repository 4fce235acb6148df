# The whole set-up is two commands: `make demo` and `make test`. Each makes its own
# virtual environment on first use (.venv-demo: only what the demo needs, the native tier
# and onnxruntime; .venv: the test extra) and reinstalls when pyproject.toml changes.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: bench-first-result demo dist test test-slow test-floor test-fallbacks test-wheel lint unit conformance bench bench-zoo bench-zoo-classic \
	bench-zoo-transformers bench-zoo-vision bench-detection bench-zoo-quant bench-dynamic bench-generate bench-generate-streamed \
	bench-kernels zoo-transformers-test-files clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

EXAMPLE := tfrt_py/examples/mlp_small.onnx
DEMO_VENV := .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed

$(DEMO_STAMP): pyproject.toml
	$(PY) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(DEMO_VENV)/bin/python -m pip install --quiet -e ".[native,bench]"
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/tfrt-py inspect $(EXAMPLE)
	$(DEMO_VENV)/bin/tfrt-py run $(EXAMPLE)
	$(DEMO_VENV)/bin/tfrt-py bench $(EXAMPLE) --seconds 3

# The wheel (dist/), and what CI checks of it: installed into a fresh venv with the native
# extra, outside the clone, it loads and runs its bundled model (.ci/wheel_smoke.py).
WHEEL_VENV := .venv-wheel
dist: $(STAMP)
	rm -rf dist build
	$(BIN)/python -m pip wheel --quiet --no-deps --wheel-dir dist .

test-wheel: dist
	rm -rf $(WHEEL_VENV)
	$(PY) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(WHEEL_VENV)/bin/python -m pip install --quiet "$$(ls dist/tfrt_py-*.whl)[native]"
	cd "$$(mktemp -d)" && $(CURDIR)/$(WHEEL_VENV)/bin/python $(CURDIR)/.ci/wheel_smoke.py

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

# The model zoos: real exporters' models from fixed seeds (nothing downloaded), tfrt_py auto
# against onnxruntime in one process, interleaved. Their exporters are heavy (torch alone is
# several GB) and are installed into .venv here, never by `make test` (the tests use small
# committed files: tests/data/). OpenBLAS runs the kernels it picks for this CPU (the anchor
# machines pin OPENBLAS_CORETYPE for the tests only). `make bench-zoo` runs every zoo.
# optimum-onnx exports the decoders with their KV cache (bench-dynamic); it pins
# transformers below 4.58; onnxruntime-genai 0.11.4 is the last whose model builder imports
# with it (the llama-genai decoder of bench-generate).
ZOO_PACKAGES := "torch==2.14.1" "torchvision==0.29.1" timm onnxscript transformers \
	lightgbm xgboost onnxmltools optimum-onnx catboost "onnxruntime-genai==0.11.4"
ZOO_RUN := env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=. $(BIN)/python
ZOO_OUT := benchmarks/results
ZOO_STAMP := $(VENV)/.zoo-installed

$(ZOO_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]" $(ZOO_PACKAGES)
	touch $(ZOO_STAMP)

bench-zoo: bench-zoo-classic bench-zoo-transformers bench-zoo-vision

# sklearn/skl2onnx, LightGBM and XGBoost (onnxmltools), CatBoost (its own export) at batch
# 1 and 1000.
bench-zoo-classic: $(ZOO_STAMP)
	$(ZOO_RUN) benchmarks/zoo_build.py --out benchmarks/zoo
	$(ZOO_RUN) benchmarks/zoo.py --zoo benchmarks/zoo --out $(ZOO_OUT)

# BERT, DistilBERT, GPT-2, T5-encoder (TorchScript, dynamo, onnxruntime-optimized exports).
bench-zoo-transformers: $(ZOO_STAMP)
	$(ZOO_RUN) benchmarks/zoo_transformers.py --out $(ZOO_OUT)/zoo_transformers

zoo-transformers-test-files: $(ZOO_STAMP)
	$(ZOO_RUN) benchmarks/zoo_transformers.py --write-test-files tests/data/transformers

# torchvision/timm models at batch 1 and 8 (both exporters), then at batch 1 with a
# busy-loop neighbour on one core.
bench-zoo-vision: $(ZOO_STAMP)
	mkdir -p $(ZOO_OUT)
	$(ZOO_RUN) benchmarks/vision_zoo.py --batches 1,8 --exporter both \
	    --png $(ZOO_OUT)/vision_zoo.png --json $(ZOO_OUT)/vision_zoo.json
	$(ZOO_RUN) benchmarks/vision_zoo.py --batches 1 --busy \
	    --png $(ZOO_OUT)/vision_zoo_busy.png --json $(ZOO_OUT)/vision_zoo_busy.json
	$(ZOO_RUN) benchmarks/vision_zoo.py --set wide --batches 1 \
	    --png $(ZOO_OUT)/vision_zoo_wide.png --json $(ZOO_OUT)/vision_zoo_wide.json

# torchvision's detectors with their post-processing (SSDLite, Faster R-CNN, RetinaNet,
# FCOS; benchmarks/detection.py --help): 320x320 images, quiet and with a busy neighbour,
# then a new image size on every call.
bench-detection: $(ZOO_STAMP)
	mkdir -p $(ZOO_OUT)
	$(ZOO_RUN) benchmarks/detection.py --json $(ZOO_OUT)/detection.json
	$(ZOO_RUN) benchmarks/detection.py --busy --json $(ZOO_OUT)/detection_busy.json
	$(ZOO_RUN) benchmarks/detection.py --sizes 320x320,480x640,600x400,333x517 \
	    --json $(ZOO_OUT)/detection_sizes.json

# Each kernel path this host has (TFRT_PY_ISA=avx512, avx2, ...; a child process each):
# GFLOP/s of the packed gemm and the convs against the path's measured FMA peak and
# onnxruntime on the zoo's shapes, one thread (issue 35).
bench-kernels: $(STAMP)
	$(ZOO_RUN) benchmarks/kernels.py --json $(ZOO_OUT)/kernels.json

# onnxruntime.quantization's models (QDQ / QOperator static int8 CNNs, dynamic int8 BERTs,
# a 4-bit MatMulNBits Llama decoder step at accuracy_level 0 and 4), tfrt_py int8 against
# onnxruntime int8 and tfrt_py fp32, interleaved, batch 1 and 8 (benchmarks/quant_zoo.py
# --help); then single MatMulNBits nodes up to 2048 x 8192 at both levels
# (benchmarks/nbits_nodes.py --help).
bench-zoo-quant: $(ZOO_STAMP)
	mkdir -p $(ZOO_OUT)
	$(ZOO_RUN) benchmarks/quant_zoo.py --batches 1,8 --json $(ZOO_OUT)/quant_zoo.json
	$(ZOO_RUN) benchmarks/nbits_nodes.py

# Shapes that change on every call (issue 32): variable-length text on the transformer zoo,
# random batches on the vision zoo, greedy generation on optimum's GPT-2 and Llama exports,
# calls while a new shape compiles, and tfrt-py serve under variable-length traffic; every
# figure against onnxruntime in one process, interleaved, the first 10 s after load apart.
bench-dynamic: $(ZOO_STAMP)
	$(ZOO_RUN) benchmarks/dynamic_shapes.py --out $(ZOO_OUT)/dynamic_shapes

# Generation (issue 37): Model.generate against onnxruntime's NumPy loop, plain and with IO
# binding, on optimum's GPT-2, Llama (grouped KV heads) and a ~110M GPT-2-small-shaped
# export: tokens/s, the first generation after load, decode steps at past 16..512.
bench-generate: $(ZOO_STAMP)
	$(ZOO_RUN) benchmarks/generate.py --out $(ZOO_OUT)/generate

# Generation from a decoder larger than its memory_budget (issue 37): GPT-2-small-shaped and
# GPT-2 4L/256 with a quarter of their weights as budget, each decode step against the bound
# max(compute, read) measured beside it.
bench-generate-streamed: $(ZOO_STAMP)
	$(ZOO_RUN) benchmarks/generate_streamed.py --out $(ZOO_OUT)/generate_streamed

# A new process's first result (issue 33): whole processes (import, load, run, exit) of
# tfrt_py and onnxruntime interleaved, tfrt_py with its import cache warm, cold and off.
bench-first-result: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(ZOO_RUN) benchmarks/first_result.py

# mypy checks tfrt_py and the tests pyproject.toml names; the last line prints each
# package's lines against its budget (tests/architecture/stack.py).
lint: $(STAMP)
	$(BIN)/ruff check tfrt_py tests benchmarks
	$(BIN)/ruff format --check tfrt_py tests benchmarks
	$(BIN)/mypy
	PYTHONPATH=. $(BIN)/python -m tests.architecture.package_map --budget

# `make test` is the suite a developer runs (under 15 minutes on 2 cores): every test, but
# of a parametrized one at most $(UNIT_SAMPLE) cases (its first, its last and some between:
# --param-sample, tests/support/param_sample.py). The slow part is `make test-slow`, which
# CI runs too (.ci/run): the tests marked `slow` (the ONNX node-case sweep, the classic
# CNNs), those marked `compiles` (on a clean clone's cold numba cache each compiles native
# modules or kernels for seconds: a clean clone's make test took 26:43 on 2 cores with
# them, 14:24-16:11 without, its venv and lint included) and the cases `make test` left out
# (--param-rest), so CI runs every case once.
# Tests run in TEST_WORKERS processes (pytest-xdist), a test file's tests in one of them
# (their module fixtures built once): on a clean clone much of the time is numba
# compiling the kernels into their cache.
TEST_WORKERS ?= 2
UNIT_SAMPLE := 8
PYTEST := -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile
UNIT := not slow and not compiles
unit: $(STAMP)
	$(BIN)/python $(PYTEST) -m "$(UNIT)" --param-sample $(UNIT_SAMPLE)

test: lint unit

test-slow: $(STAMP)
	$(BIN)/python $(PYTEST) -m "slow or compiles"
	$(BIN)/python $(PYTEST) -m "$(UNIT)" --param-rest $(UNIT_SAMPLE)

# The suite on the declared minimum versions (.ci/floor.txt) in a venv of its own. The
# slow tests (the ONNX node cases, whose expected outputs belong to the installed onnx,
# and onnx's own reference evaluator on large inputs) run in `make test` only. This leg and
# the native-pool leg below ask whether each module's paths run there, so they run at most
# 3 cases of a parametrized test and then 5 tests of each test file (first, last and
# between: tests/support/param_sample.py); `make test` and `make test-slow` run every case.
SAMPLE := --param-sample 3 --file-sample 5
FLOOR_VENV := .venv-floor
FLOOR_STAMP := $(FLOOR_VENV)/.installed

$(FLOOR_STAMP): pyproject.toml .ci/floor.txt
	$(PY) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(FLOOR_VENV)/bin/python -m pip install --quiet -c .ci/floor.txt -e ".[test]"
	touch $(FLOOR_STAMP)

test-floor: $(FLOOR_STAMP)
	$(FLOOR_VENV)/bin/python $(PYTEST) -m "not slow" $(SAMPLE)

# The fallback legs (CI): the fast paths switched off, so what runs where they are off runs
# too. Compiled kernels and the packed gemm off: every kernel's NumPy path, on the kernel,
# executor and model tests. The native pool off: numba's own TBB workers under the
# native tier and the split kernels.
FALLBACK_TESTS := tests/kernels tests/executors tests/models tests/test_api.py
test-fallbacks: $(STAMP)
	TFRT_PY_JIT=0 TFRT_PY_PACKED_GEMM=0 $(BIN)/python $(PYTEST) -m "not slow" $(FALLBACK_TESTS)
	TFRT_PY_NATIVE_POOL=0 $(BIN)/python $(PYTEST) -m "not slow" $(SAMPLE) \
	    tests/native tests/concurrency/test_native_threads.py

# The ONNX backend node cases, each data set called twice on one loaded model (the second
# call runs the planned code); benchmarks/conformance.py --help for the counting rules.
conformance: $(STAMP)
	$(BIN)/python benchmarks/conformance.py

clean:
	rm -rf $(VENV) $(FLOOR_VENV) $(DEMO_VENV) $(WHEEL_VENV) build dist *.egg-info .mypy_cache \
	    .ruff_cache .pytest_cache
