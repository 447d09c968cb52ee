"""Random programs over the toy fence, as a Hypothesis state machine: the ``ci``
profile's programs are too short to fence four blocks at once, the ``deep`` one's
are not."""

import os

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test
from toypkg.fence import Fence

settings.register_profile(
    "ci", max_examples=10, stateful_step_count=3, derandomize=True, database=None
)
settings.register_profile(
    "deep", max_examples=200, stateful_step_count=20, derandomize=True, database=None
)


class Stores(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.fence = Fence()
        self.jobs = 0

    @rule(block=st.integers(1, 6))
    def store(self, block):
        self.jobs += 1
        self.fence.register(self.jobs, [block])
        assert self.fence.busy() == (len(self.fence.pending) >= 4)


def test_random_stores():
    profile = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
    run_state_machine_as_test(Stores, settings=profile)
