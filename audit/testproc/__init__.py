"""The code that runs inside a test process, and nothing else.

fence-audit starts one test process per run (``python -m audit.testproc SPEC``):
it runs the baseline under coverage (:mod:`.baseline`, :mod:`.recorder`), then stays, warm, and
judges mutants on command (:mod:`.loop`, :mod:`.pool`, :mod:`.judge`), swapping
one function's code at a time (:mod:`.codeswap`). Everything it exchanges with
fence-audit is a message of :mod:`audit.core.protocol`.

This package imports only the standard library, pytest, coverage and
:mod:`audit.core.protocol`: it is loaded before vLLM, inside the hermetic environment,
and what it imports is part of every test's process.
"""
