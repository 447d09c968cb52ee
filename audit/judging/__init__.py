"""The mutants judged: jobs for the test process, the fork engine's parent side, the
verdict cache, and the second judgements (``--random-alone``, ``--deep``).
"""
