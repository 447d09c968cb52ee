from toypkg.fence import Fence


def test_evict_drops_the_pending_jobs():
    fence = Fence()
    fence.register(1, [3])
    assert fence.evict(3)
    assert fence.pending == {}
