"""The benchmarks are scripts (``python benchmarks/latency.py``; each imports its siblings
by name, as Python puts a script's folder first on ``sys.path``). This file makes them a
package too, so the tests import what they share with them: ``benchmarks.anchor_models``
(the anchor models M1-M4) and ``benchmarks.peers``."""
