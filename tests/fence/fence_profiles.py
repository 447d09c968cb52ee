"""The Hypothesis profiles of the random workloads, shared by every state machine.

``HYPOTHESIS_PROFILE`` names one when the test runs: ``ci`` (default; derandomized,
bounded, no example database), ``long`` (many more, longer programs, for a local
hunt), ``deep`` (``long`` derandomized: fence-audit's deep second look) and ``dev``
(the ``ci`` programs without the shrink phase: what a mutant's judgement runs).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

# ci: 75 programs of 25 steps. After vLLM's one-time warm-up (~3 s) they take ~3 s
# (25 took 1 s): 3x the programs for 1.5x the test's time, since at 25 which
# catalogue bugs a derandomized run found was mostly down to its seed (issue 16).
settings.register_profile(
    "ci",
    max_examples=75,
    stateful_step_count=25,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "long",
    max_examples=2000,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# fence-audit's deep second look at survivors (`mutate --deep`): the long search,
# derandomized and without a database, so that the same mutant gets the same search
# every run and its verdict can be cached; the audit time-boxes it per mutant.
settings.register_profile(
    "deep", parent=settings.get_profile("long"), derandomize=True, database=None
)
settings.register_profile(
    "dev", parent=settings.get_profile("ci"), phases=[Phase.explicit, Phase.generate]
)


def profile() -> settings:
    """The profile ``HYPOTHESIS_PROFILE`` names now (default ``ci``): read when the
    test runs, not at import, so a judging fork of the audit can ask for another."""
    return settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
