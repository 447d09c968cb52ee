"""The mutants: mutmut's mutations (generated and kept), the catalogue's hand-written
bugs, the reviewed equivalents, and which of them a run judges (its scope, a pull
request's changes).
"""
