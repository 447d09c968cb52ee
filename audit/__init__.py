"""fence-audit: mutation-testing and coverage audit of vLLM's KV-offloading fence."""

__version__ = "0.1.0.dev0"
