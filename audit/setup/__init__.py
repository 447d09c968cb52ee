"""What a run is set up from: its configuration, vLLM's tests and the audited file, the
fence regions, the findings registry, the suite root, the test process's session, and
the types that cross stages.
"""
