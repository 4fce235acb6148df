"""Lowering: a prepared graph -> the source of one numba function (load time).

``graph`` writes the module (``lower``, ``blockers``; rows mode's entries
``rows_source``), ``generic`` one module for a box of dims; ``registry`` holds one record
per op (``records.OpLowering``: emitter, row rule, view, product, budget weight),
registered by the ops modules ``ops``, ``ops_tx``, ``ops_dec`` and ``ops_ml``; ``emit``, ``loops``,
``scalar``, ``products`` and ``context`` are what emitters write with; ``rowwise`` and
``rows`` decide rows mode, ``runs`` stacks runs of identical Linear layers, ``fold`` the
shape arithmetic a signature fixes, ``budget`` the compile budget, ``source`` keeps model
text out of the code (``literal``, ``audit``, ``Declined``), ``ml_pack`` the forests' and
SVMs' tables.
"""
