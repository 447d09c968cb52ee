"""Development tools, apart from the audit's path: the benchmark behind every timing
claim, the random workloads' benchmark, and the hunt's vLLM-free part.
"""
