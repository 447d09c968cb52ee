from toypkg.fence import Fence


def test_register_skips_null_block():
    fence = Fence()
    fence.register(1, [0, 3])
    assert fence.pending == {3: {1}}


def test_register_then_remove_drains():
    fence = Fence()
    fence.register(1, [3])
    fence.remove(1, [3])
    assert fence.pending == {}


def test_register_only():
    Fence().register(2, [4])


def test_drain_counts_steps():
    assert Fence().drain(3) == 3
