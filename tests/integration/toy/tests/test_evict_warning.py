from toypkg.fence import Fence


def test_evict_warns_of_pending_jobs(caplog):
    fence = Fence()
    fence.register(1, [3])
    fence.evict(3)
    assert caplog.messages == ["block 3 evicted with 1 jobs pending"]
