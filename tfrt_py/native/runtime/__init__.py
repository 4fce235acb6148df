"""The native tier at run time: compiling, caching, serving and switching over.

``compile`` (numba, the verified disk cache, ``available``), ``cachedir`` (the private
cache dir), ``tier`` (the Executor: the switch-over from the sync interpreter, hot
signatures, auto's measured trial), ``entry`` (the fast entry and per-signature entries),
``worker`` (the background compile thread: lowering, compile, load), ``compile_server``
(the child process that compiles, so no compile holds the serving process's GIL).
"""
