"""The Hypothesis profiles of the random workloads, shared by every state machine.

``HYPOTHESIS_PROFILE`` names one when the test runs: ``ci`` (default; derandomized,
bounded, no example database), ``long`` (many more, longer programs, for a local
hunt), ``deep`` (``long`` derandomized: fence-audit's deep second look) and ``dev``
(the ``ci`` programs without the shrink phase: what a mutant's judgement runs).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test


def _draw_from_the_strategies_alone() -> None:
    """Hypothesis (since 6.131) draws now and then a constant it collected from the
    source of every local module loaded so far, and fence-audit's own package is local.
    A derandomized program then depended on fence-audit's code (an edit of an error
    message in audit/ dealt other programs) and on what the process had imported (an
    audit's test process imports more than pytest alone does, and a test run after
    others more than one run alone): the ci programs found a planted bug in one and
    missed it in the other (2026-12-05). Without the local pool a seed deals the same
    programs in every process. Hypothesis's own constants (0, 1, the edges of a range)
    are still drawn."""
    from hypothesis.internal.conjecture import providers

    empty = providers.Constants()
    providers._get_local_constants = lambda: empty  # read by name at each draw
    providers.CONSTANTS_CACHE.cache.clear()  # what was cached with the local pool


_draw_from_the_strategies_alone()

# ci: 120 programs of 20 steps, about 1.4 times the time of the 75 of 25 it had
# before (measured over seeds 0-7, the three machines together: 5.8 s against 4.1 s
# a seed). Four mutants the random workloads alone had killed stopped being killed
# once the programs were made independent of local code, and whether the ci programs
# met each depended on the seed: planted by hand and run under seeds 0-7 (2026-12-06),
# 75 of 25 met 16 of those 32 (seed, mutant) pairs, 100 of 25 met 19, 150 of 15 met
# 20, 120 of 20 met 24, 150 of 25 met 25 for 2.2 times the time.
settings.register_profile(
    "ci",
    max_examples=120,
    stateful_step_count=20,
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


# The seed of a derandomized profile. Hypothesis would derive it from a digest of the
# machine's source, so that any edit of the class (a docstring, a helper) deals its
# programs anew, and which bugs a run finds changed with it (issue 16). A fixed seed
# keeps the programs until the rules or their strategies change. When they change,
# the seed is the lowest at which the ci programs find every bug the tests of
# test_fence_stateful.py plant, measured over seeds 0-7: with the connector's role
# drawn (2026-12-05), seeds 1, 2, 6 and 7 did; 28 of the 32 (seed, planted bug)
# pairs were found, as many as before that draw. Those draws still held Hypothesis's
# local constants (_draw_from_the_strategies_alone), so they held for the processes
# measured only. Without them (2026-12-05, later), seeds 2, 3, 4 and 6 find all four,
# 28 of the 32 pairs again, in any process. With 120 programs of 20 steps
# (2026-12-06) seeds 0, 1, 3 and 7 find all four, 28 of the 32 pairs, and
# RecurrentMachine's planted bug under all eight; with a fifth planted bug (a
# non-writer rank that never acknowledges a flushed store, found under seeds 0, 4, 5
# and 7), seeds 0 and 7 find all five, 32 of the 40 pairs.
SEED = 0


def run_machine(machine: type[RuleBasedStateMachine], chosen: settings | None = None) -> None:
    """Run ``machine`` under ``chosen`` (default: :func:`profile`), with :data:`SEED`
    when that profile is derandomized."""
    chosen = chosen or profile()
    if chosen.derandomize:
        # a subclass per run, named as Hypothesis prints it; the class itself stays unseeded
        machine = seed(SEED)(type(machine.__name__, (machine,), {}))
    run_state_machine_as_test(machine, settings=chosen)
