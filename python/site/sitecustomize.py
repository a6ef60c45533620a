"""Read by Python at start-up in every process of a command ups-doctor runs: ups-doctor writes
this file into the scenario's log folder and puts that folder first on `PYTHONPATH` (unless you
set `PYTHONUNBUFFERED` yourself). It is not the helper (`python/ups_doctor.py`); you never import
it.

It makes `sys.stdout` and `sys.stderr` line-buffered: each line reaches the pipe in one write as
soon as it ends. ups-doctor also sets `PYTHONUNBUFFERED=1` (for a process started with `-I` or `-S`,
which does not read this file), and unbuffered alone sends `print`'s text and its newline in two
writes: under a launcher every rank shares one stdout, and another rank's line can land between
the two (`rank 1 step 5 loss 2.7400training finished`), which a line-anchored completion pattern
then misses. Then it runs the `sitecustomize` it shadows, if there is one further on the path.
"""

import sys


def _line_buffered():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=False)
        except Exception:  # None (no console), or not a TextIOWrapper: leave it as it is
            pass


def _chain():
    import importlib.machinery
    import importlib.util
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_line_buffered()
_chain()
