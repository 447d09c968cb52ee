"""The baseline stage: the suite under per-test coverage in a test process, its cache,
and the coverage map the later stages read.
"""
