"""What the native tier costs at load: cold load (empty cache), warm load (cached), and
compile time, for the anchor models M1-M4.

    python benchmarks/native_compile.py [--models M1,M2,...]

Each model is loaded with ``executor="native", native="eager"`` (so ``load`` returns with
the compiled function) into a fresh cache dir (cold: numba compiles), then again (warm:
numba's cache answers). "compile" is the time inside ``compile_lowered`` (write, import,
numba compile or cache load); "lower" is graph -> source. Every load runs in its own
subprocess, so numba's import cost (paid once per process) is in every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

#: Run with benchmarks/ as the working directory, which ``python -c`` imports from first.
_CHILD = """
import json, sys, time
from anchor_models import ANCHORS
import tfrt_py
from tfrt_py.native.lower.graph import lower
a = ANCHORS[{key!r}]()
data = a.model.SerializeToString()
sync = tfrt_py.load(data, executor="sync")
t0 = time.perf_counter()
lower(sync.graph, sync._program)
lower_s = time.perf_counter() - t0
t0 = time.perf_counter()
m = tfrt_py.load(data, executor="native", native="eager")
load_s = time.perf_counter() - t0
m.run(a.feeds)
c = m.native.compiled
print(json.dumps({{"load": load_s, "compile": c.seconds, "hit": c.cache_hit, "lower": lower_s}}))
"""


def _measure(key: str, cache: str) -> dict[str, float]:
    env = dict(os.environ, TFRT_PY_CACHE_DIR=cache)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD.format(key=key)],
        cwd=HERE,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="M1,M2,M2b,M3,M4")
    a = ap.parse_args()
    print(
        "| model | cold load (s) | compile, cold (s) | warm load (s) | cache load (s) "
        "| lower (ms) |"
    )
    print("|---|---|---|---|---|---|")
    for key in a.models.split(","):
        with tempfile.TemporaryDirectory(prefix="tfrt_native_") as cache:
            cold = _measure(key, cache)
            warm = _measure(key, cache)
        assert not cold["hit"] and warm["hit"], (cold, warm)
        print(
            f"| {key} | {cold['load']:.2f} | {cold['compile']:.2f} | {warm['load']:.2f} | "
            f"{warm['compile']:.2f} | {cold['lower'] * 1e3:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
