"""CI: the installed wheel, run from outside the clone, loads and runs its bundled model.

Run by ``make test-wheel`` with the wheel's venv's Python, in an empty directory, so
``import tfrt_py`` can only find the installed package. Prints the time to the first
result (import, load, first call) and the CLI's answer; exits non-zero on any failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

start = time.perf_counter()
import numpy as np  # noqa: E402

import tfrt_py  # noqa: E402

here = os.path.dirname(tfrt_py.__file__)
assert "site-packages" in here, f"tfrt_py imported from {here}, not the installed wheel"
model_path = os.path.join(here, "examples", "mlp_small.onnx")
model = tfrt_py.load(model_path)
out = model.run({"x": np.zeros((1, 64), np.float32)})
first = time.perf_counter() - start
assert out["probs"].shape == (1, 10), out
np.testing.assert_allclose(out["probs"].sum(), 1.0, rtol=1e-5)
print(f"wheel: tfrt_py {tfrt_py.__version__ if hasattr(tfrt_py, '__version__') else ''} "
      f"from {here}; executor {model.executor}; first result in {first:.2f} s")  # fmt: skip
cli = os.path.join(os.path.dirname(sys.executable), "tfrt-py")
done = subprocess.run([cli, "run", model_path], capture_output=True, text=True, timeout=300)
print(done.stdout.strip())
if done.returncode != 0 or "probs float32[1, 10]" not in done.stdout:
    sys.exit(f"tfrt-py run failed ({done.returncode}): {done.stderr[-2000:]}")
