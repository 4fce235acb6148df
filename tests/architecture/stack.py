"""The layer stack of ``tfrt_py`` and each package's line budget: the one source the layer
tests (``test_layers.py``, ``test_runtime_calls.py``) and the generated package map of
``docs/architecture.md`` (``package_map.py``) read."""

from __future__ import annotations

__all__ = ["INNER_LAYERS", "LAYERS", "LINE_BUDGET", "MODULE_BUDGET", "OTHERS"]

#: The stack, lowest first. A module may import from its own top-level package and from
#: packages in lower layers; never from the same layer's other packages or from above.
#: ("tfrt_py" is the package root, the public facade that re-exports ``model``.)
LAYERS: list[set[str]] = [
    {"errors", "records"},
    {"concurrency", "calls"},
    {"ir", "metadata"},
    {"feeds", "kernels", "frontends"},
    {"executors"},
    {"compiler"},
    {"native", "streaming"},
    {"selection", "profiling", "sharing", "cold_start", "generation", "reading", "row_split"},
    {"model"},
    {"tfrt_py", "onnx_backend"},
    {"bench", "ray"},
    {"serving"},
    {"cli", "examples"},
]

#: Stacks inside packages, lowest first: a package's parts (its direct modules and
#: subpackages, by name) import only parts of lower layers, never a part of their own layer
#: (so ``plan*`` and ``dataflow*`` of one layer stay apart) nor above. ``OTHERS`` is every
#: part not named (the kernel families, added without an edit here); a package without it
#: must name every part, so a new module is placed on purpose. The package's
#: ``__init__`` (its facade) may import any part.
OTHERS = "*"
INNER_LAYERS: dict[str, list[set[str]]] = {
    "kernels": [
        {"base"},
        {"registry", "common", "lib"},
        {OTHERS},
        {"fused"},
        {"families"},
        {"custom"},
    ],
    "native": [{"kernels", "lower"}, {"runtime"}],
    "executors": [
        {"inline_policy", "dims", "plan"},
        {"base", "program", "straight"},
        {"plan_probe", "plan_build", "dataflow_schedule"},
        {"plan_codegen", "dataflow_run"},
        {"plan_generic", "dataflow_control"},
        {"interpreter", "dataflow"},
        {"async_executor"},
    ],
    "serving": [
        {"limits", "grpc_schema", "gen_cache", "json_pieces"},
        {"errors", "run", "metrics", "gen_batching"},
        {"admission", "arrays", "batching", "codec", "repository", "prefork"},
        {"body", "served", "v2_codec"},
        {"hub", "v2_binary"},
        {"handling"},
        {"v2", "generate"},
        {"grpc_service"},
        {"app"},
    ],
    "streaming": [{"gate", "rows"}, {"partition"}, {"transfer"}, {"pipeline"}, {"chain", "loader"}],
}

#: Lines of Python a top-level package may hold (its subpackages included) before it is
#: split or trimmed: the growth a reviewer sees in ``make lint``'s table. Raising one is a
#: decision recorded in the commit that does it.
LINE_BUDGET: dict[str, int] = {
    # 2026-11-29: onnxruntime's quantized ops (contrib/quantized*.py); then the integer
    # kernels (lib/qgemm_packed.py, lib/qgemm_rows.py, nn/conv_qint8.py: issue 36); then
    # QLinearSoftmax/AveragePool/Where, GatherBlockQuantized and the 4-bit GEMV (issue 36);
    # then the float convs without BLAS (lib/gemm_cols.py, nn/conv_cols.py: issue 35);
    # 2026-11-30: the generated index of the lazy registry (module_ops.py, 300 lines: issue 33),
    # the depthwise kernels with taps in registers (nn/conv_depthwise_same.py: issue 35);
    # the packed Linear of any width, split by columns for a few rows (lib/linear_par.py:
    # decode steps, issues 32 and 37); the rotary embedding's kernel (fused/rotary.py);
    # 2026-12-01: com.microsoft MultiHeadAttention (contrib/mha.py: issue 37); the depthwise
    # QLinearConv's float32 sums and bands (nn/conv_qdepthwise.py), fused::QTable (issue 36);
    # GroupQueryAttention's compiled decode-step pass (contrib/gqa_jit.py: issue 37);
    # 2026-12-01 (later): fused::TextVectorize, a text vectorizer and its linear model on
    # sparse counts, one row's softmax in Python's floats (fused/text.py); StringIds and
    # the LabelEncoder's shared table (fused/ml.py, ml/encode.py): issue 39;
    # the tree ensembles' compiled walk (ml/tree_jit.py); a text's one-row sparse scores and
    # softmax in one compiled pass (fused/text_jit.py); 2026-12-02: 3x3 stride-2 MaxPool's
    # whole-plane passes and GRID's fused crop (nn/pool_direct.py, nn/conv_cols.py: issue 35);
    # 2026-12-02 (later): the float-storing integer kernel (lib/qgemm_packed.py), the stems'
    # in-place rows (nn/conv_qrows.py), DynamicQuantizeLinear's one compiled call
    # (lib/quant.py), the stacked products' plans (lib/gemm.py), QAttention's integer
    # projection, a batch's squeeze-excitation scales (contrib/): issue 36
    # 2026-12-03: the depthwise row kernel in LLVM IR (lib/qdepthwise_ir.py) and the ring
    # of staged rows that drives it (nn/conv_qdepthwise.py); the byte-table kernel
    # (lib/qlookup_ir.py) and the per-channel and channels-last pooling loops
    # (contrib/quantized_elementwise.py): issue 36; 12-03 (39th session): MatMulNBits at
    # accuracy_level=4, A's int8 blocks times 4-bit codes in LLVM IR (lib/qnbits_ir.py,
    # contrib/matmul_nbits_int8.py): issue 36; 12-03 (40th): strings and a text batch's
    # tokens to ids, and its n-grams to columns, in compiled passes (fused/string_ids_jit.py,
    # fused/text_grams_jit.py): issue 39; 12-03 (41st): few-pixel convs as pixel rows
    # times the packed filters (nn/conv_packed.py): issue 35; 12-03 (42nd): a Linear's big
    # weight packed on its first product of two rows, split by rows (lib/linear_par.py);
    # 12-03 (43rd): MaxPool's and AveragePool's common windows in LLVM IR (lib/pool_ir.py,
    # nn/pool_avg.py): issue 35; 12-03 (44th): a linear model's sums over many rows in LLVM
    # IR (lib/linear_rows_ir.py): issue 39; a decode step's probabilities times the values
    # of its past with the sums in registers (lib/rowvec_ir.py): issue 37; 12-03 (45th):
    # a decode step's scores for a group of query heads in LLVM IR (lib/dotrows_ir.py),
    # the values' product a group at a time (lib/rowvec_ir.py), a long softmax row's max
    # and sum in vector registers (lib/rowreduce_ir.py), and what the float32 IR kernels
    # share (lib/ir_kernels.py): issue 37; 2026-12-04: strided convs' GRID over the
    # input's phases (nn/conv_cols.py: issue 35); 12-04 (49th): NonMaxSuppression on a
    # multi-level grid of the kept boxes (image/nms_jit.py), RoiAlign's bins over a
    # channels-last map (image/roi_align_jit.py), ScatterElements' slabs, GroupNorm with its
    # affine in one pass (nn/norm_group_jit.py): issue 35, detection; 12-04 (50th):
    # NonMaxSuppression's NumPy paths, the pair path for a cold process (image/nms_numpy.py);
    # 12-04 (51st): the NumPy depthwise conv's blocks across images and flat grid
    # (nn/conv_common.py), a cold start's stand-in beside its warm-up; 12-04 (52nd): kernels
    # that pick a compiled function per call compile it at build (issue 32: no compile in
    # a call; lib/sdpa.py, nn/conv_cols.py), NumPy 2.5's shape deprecation; 12-04 (54th):
    # a batch's few-pixel convs on the packed route in chunks of images (nn/conv_packed.py:
    # issue 32's random batches); 12-05 (55th): the conv product reading its taps in place
    # with NCHW stores (lib/gemm_indirect.py: issue 35, 3x3 convs at every plane), and its
    # copy into the padded channels-last image transposed in registers; few-pixel 1x1 convs
    # on it (nn/conv_packed.pointwise_pays), a chunk's buffers bounded; 12-05 (56th): the
    # depthwise conv as an LLVM IR kernel, stride 1 from the input in blocks of rows, stride
    # 2 on the extended grid, an 8-float build for narrow planes (lib/depthwise_ir.py,
    # nn/conv_depthwise_grid.py: issue 35, the mobile family's depthwise convs); 12-05
    # (57th): gemm_cols' row prefetches, the packed products' four-step k loop with its
    # remainder loop (lib/gemm_cols.py, lib/gemm_packed.py: issue 35 on Intel AVX-512);
    # 12-05 (60th): the float-storing integer product on AMX tiles (lib/qgemm_amx.py:
    # issue 36's int8 transformers on Sapphire Rapids and later); 12-05 (61st): 3x3/2 stem
    # convs of few channels in LLVM IR, n filters' sums in registers (lib/stem_ir.py,
    # nn/conv_stem.py: issue 35, the mobile family's first conv); 12-05 (62nd): the cold
    # start's stand-ins call depthwise_ir through ctypes (nn/conv_depthwise_grid.py: issue
    # 32's first seconds) and a float32 GELU in LLVM IR for them (lib/gelu_ir.py), a Conv
    # bias's length checked (security); 12-06 (63rd): the stand-ins' one-group convs on
    # gemm_cols through ctypes (nn/conv_cols_raw.py), the kernels' loops over images
    # (lib/ir_kernels.py), Sigmoid and SiLU beside the GELU (lib/activation_ir.py); 12-06
    # (65th): depthwise_ir and dotrows_ir built a kind / vector count at a time through a
    # table of functions (issue 32: 2.4-5.5 s of a cold start's warm-up); 12-06 (66th): the
    # indirect conv's whole tiles fetch their output and residual lines, its padded copy
    # the next row (lib/gemm_indirect.py: issues 32 and 35, a batch's convs out of L2); the
    # stand-ins' one-group convs on gemm_indirect through ctypes, where the AVX-512 build
    # stores NCHW (nn/conv_packed_raw.py: issue 32, a cold start's first seconds); 12-06
    # (67th): ReduceSumSquare/ReduceL2 added in order (reduce/reductions.py): issue 39;
    # 12-06 (68th): the SVC's distances, decisions and coupling in onnxruntime's order (ml/svm.py);
    # 12-06 (69th): MLAS's tanh for sigmoid SVMs (ml/svm.py): issue 39; gemv_cols passes
    # read-only operands (lib/gemm.py: a compile in a model's first split call); MLAS's tanh
    # constants in one module both tiers read (lib/mlas_tanh.py)
    # 12-07 (71st): grouped convs a product a group on conv_cols' kernel
    # (nn/conv_cols_grouped.py: issue 35, RegNetX's 16-channel groups 2.2x faster); a
    # pre-activation BatchNormalization and its activation in one pass (nn/norm_affine.py);
    # HardSwish/HardSigmoid one compiled pass (elementwise/activation.py); 12-07 (72nd):
    # column stride 2's two phases filled in one pass over a row (nn/conv_cols.py: issue
    # 35, the strided grouped convs' copies 2-3x faster); BatchNormAct split by channels
    # on native threads (nn/norm_affine.py: DenseNet's 62 at two threads); a one-row
    # product by a big transB weight as dot products (lib/gemm.py: classifier heads);
    # 12-07 (73rd): those dot products four rows at once and chosen by a per-host probe
    # against BLAS's gemv (lib/gemm.py: Zen 3 lost with them), SVM kernel values as one
    # fused multiply-add chain on the interpreter (ml/svm.py: onnxruntime's bits on AVX2);
    # 12-07 (74th): plain moves beside the masked ones where a vector lies inside the row
    # (lib/depthwise_ir.py, stem_ir.py, pool_ir.py, gemm_indirect.py: issue 35, AVX2's
    # masked stores cost ~4 ns each on Zen 3); small stride-1 planes copied padded and
    # taps loaded from memory on AVX2 (lib/depthwise_ir.py: issue 35); the rows-storing
    # builds' product put back as NCHW runs in registers (lib/gemm_indirect.py,
    # nn/conv_packed.py: issue 35, a scalar loop of ~3 ns an output on Zen 3)
    # 2026-12-07: vpmaddubsw products for weights proved not to saturate (lib/qgemm_packed.py,
    # nn/conv_qint8.py: issue 36, AVX2 hosts' 7-bit weights)
    "kernels": 37300,
    # 2026-11-30: one function per box of dims (lower/generic.py: issue 32, item 2); a
    # decoder step's fused ops (lower/ops_dec.py: issues 32 and 37)
    # 2026-11-30: boxes keep length-dependent shape arithmetic as code (Range,
    # ConstantOfShape, integer elementwise maps); 2026-12-01: the generated function cut into
    # parts numba types one at a time (lower/split.py: a Llama box compiles in 18 s, not 32);
    # onnxruntime-genai's GroupQueryAttention (lower/ops_gqa.py) and its tied dims (issue 37);
    # string inputs mapped to ids at the entry, OneHotEncoder and LabelEncoder
    # (lower/ops_encode.py: issue 39); 2026-12-01: a KV cache written in place and decode
    # scores by dot products (lower/cache.py, kernels/rowdot.py: issue 37); 12-02: packed
    # QKV and presents in place in GroupQueryAttention (lower/ops_gqa.py: issue 37); rows
    # narrower than ROW_VIEW_MIN read at offsets, not through views (rows_source.row_refs);
    # 12-03: MatMulNBits at a decode step's rows (lower/ops_nbits.py, kernels/nbits.py:
    # issue 36); at accuracy_level=4 over A's int8 blocks, and the trial's tolerance of a
    # flipped rounding (entry.rounding_tolerance), 4-bit codes on the integer kernels
    # (kernels/nbits_int8.py): issue 36; a LinearClassifier's rows four at a time in rows
    # mode's tiles (kernels/svm.linear_cls_rows, OpLowering.grouped): issue 39; their sums
    # on the LLVM IR kernel (kernels/linear_ir.py): issue 39; a decode step's attention
    # output on lib/rowvec_ir (lower/ops_dec.rows_times_cache): issue 37; 12-03 (45th):
    # grouped KV heads' scores and values a group a call (lower/ops_dec.py), long softmax
    # rows on lib/rowreduce_ir (lower/ops.py): issue 37; 12-04 (53rd): repeated layers
    # compiled once (lower/outline.py), a cache check as one call (kernels/rowdot.py): issue
    # 32's compile time; 12-05 (59th): quantize_dynamic's DynamicQuantizeLinear,
    # MatMulIntegerToFloat, DequantizeLinear, QAttention and QEmbedLayerNormalization
    # (lower/ops_quant.py, kernels/qdynamic.py) and 8-bit values in the arenas: issue 36's
    # int8 BERTs on the native tier; 12-06 (67th): products over at most 128 terms and
    # ReduceSumSquare/ReduceL2 summed in onnxruntime's order (lower/products.py padded
    # widths, lower/emit.py CHAIN_K, kernels/fastmath.rounded): issue 39's GaussianMixture;
    # 12-06 (68th): fastmath.expf_rn and the SVC's coupling in float32 (kernels/svm.py), a
    # variadic Sum/Max/Min and Sign (lower/ops.py, scalar.py), kernel offsets as int64;
    # 12-06 (69th): forests walked a tree for eight rows at once in rows mode's tiles
    # (kernels/trees.forest_rows_*, lower/ops_ml._forest), SVC decisions four pairs at a
    # time and MLAS's tanh (kernels/svm.py, fastmath.tanhf_mlas), float32 Exp through
    # fastmath.expf_rn (lower/scalar.py): issue 39's batch 1000; 12-06 (70th): one-row
    # narrow products summed in scalars (lower/emit.py), tiles for small graphs with Exp or
    # many-row code (lower/graph._vector_math), Pow by 2 as x * x (lower/ops._squares):
    # issue 39's batch 1000; 12-07 (77th): the kernels' disk cache for closures
    # (kernels/closure_cache.py): a fresh process's native compile no longer compiles them,
    # and their stamps joined (a change to any kernel file recompiles every kernel)
    "native": 10190,
    # 2026-11-30: a bucket's check keeps shapes only (Program.run_shapes); baked parts shared;
    # 2026-12-01: genai's total_sequence_length tied to past + sequence (dims.genai_tied);
    # straight-line code for the interpreter's unplanned calls (straight.py); 12-04 (50th):
    # the planner's greedy by vector scans (plan.py)
    "executors": 4870,
    # 2026-11-29: fuse_qdq and channels_last (integer QDQ graphs, issue 36); 2026-11-30:
    # fuse_rotary (Llama-style decoders' rotary embedding, issue 37); 2026-12-01: fuse_qtable
    # (a quantized SiLU as one lookup, issue 36); fuse_text (a text vectorizer's front and
    # linear model) and encode_strings (string columns as ids, CategoryMapper), issue 39;
    # encode_maps (a DictVectorizer's map input as its row); 12-04 (49th): torch's GroupNorm
    # export as one node (fuse_vision, issue 35: RetinaNet's and FCOS's heads); 12-04
    # (50th): the shape model's probes stop at a measured work bound (detectors' loads) and
    # identities read through in one walk (cleanup.py); 12-05 (57th): the dynamo exporter's
    # squeeze-and-excite (ReduceMean over the plane) fused too (fuse_vision, issue 35);
    # 12-05 (58th): a pool pushed below the channel join it alone reads, a conv over the
    # join's parts (hoist.py, issue 35: SqueezeNet's fire modules join nothing); 12-07
    # (71st): a BatchNormalization no conv took, with its activation, and a product's
    # BatchNorm1d folded into its weights (fuse_vision, issue 35: DenseNet, LeViT); 12-07
    # (72nd): parallel conv branches of one input merged into one conv (merge_branches,
    # issue 35: RepVGG's 3x3 + 1x1 + identity)
    "compiler": 6750,
    # 2026-11-29: gRPC (grpc_schema, grpc_service), ZipMap, the generate extension; 2026-11-30:
    # Triton's metrics and gauges across workers (metrics.py), JSON answers in pieces; 12-02:
    # continuous batching's batch-wide cache (gen_cache.py)
    "serving": 6000,
    # 2026-11-29: the ISA choice (isa.py), numba's vector width (numba_target.py), the
    # private cache dir moved down from native/runtime (cachedir.py) for the cached LLVM objects
    # 12-03 (40th session): once.Once, the decide-once-under-a-lock of the LLVM kernels;
    # 12-05 (56th): LLVM's asm parser (depthwise_ir's inline valignd); 12-06 (65th): a
    # GPU's BLAS passed over by openblas.direct_blas (torch's cuBLAS)
    "concurrency": 2770,
    # 2026-11-30: the import cache (graph_cache.py, graph_codec.py: issue 33's first result);
    # 12-04 (50th): ONNX's shape inference without the weights' bytes (importer.py)
    "frontends": 2030,
    "streaming": 1650,
    "ir": 900,
    "bench": 500,
    "ray": 400,
    # 11-29: generate/stream; 12-01: step chains; 12-02: warm-up; 12-04: Steps.took and
    # keep_outside for batched ticks (issue 37)
    "generation": 1030,
}
#: The budget of a top-level module (``model.py``, ``cli.py``, ...).
MODULE_BUDGET = 600
