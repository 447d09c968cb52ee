"""A run's results: scores and ``audit.json`` written, read back and checked; shards and
their merge; the gate on thresholds and on a release's recorded standing.
"""
