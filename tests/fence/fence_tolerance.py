"""The random workloads' per-release tolerance table: which known vLLM bugs
(``docs/findings.toml``) the state machines (``fence_machines``) tolerate on the
installed release, recording what meets them instead of failing, and which features
they leave out there because a known bug would stop their every program.

Each entry is empty, or off, where the registry does not list its bug for this
release: there the same workloads hold vLLM to the fixed behaviour.
"""

from __future__ import annotations

from fence_findings import fixed, has_bug
from fence_harness import (
    EAGLE_POPPED,
    FINAL_SLIDING_WINDOW_TAIL,
    SHORTER_HIT,
    STRANDED_FINISHED_LOAD,
    UNALIGNED_HIT,
    UNSTORED_SLOT,
)
from fence_oracle import (
    DRAFTED_CHUNK_ZEROED,
    FINISHED_CHUNK_ZEROED,
    HIT_TAKEN_FOR_REUSED,
    RESUMED_FRONTIER,
)

# The final sliding-window tail's stale reads, and the drain that stops on a finished
# load stranded in the queue: only where the registry lists them (elsewhere each would
# be a regression).
FINAL_TAIL_TOLERANCE = (FINAL_SLIDING_WINDOW_TAIL,) if has_bug("final-sliding-window-tail") else ()
STRANDED_TOLERANCE = (STRANDED_FINISHED_LOAD,) if has_bug("stranded-finished-load") else ()
# A release with reachable-null-block-chunk-stored: a sliding-window program under
# async scheduling meets it without a second connector (a hunt on 0.31.0 did, within
# five minutes); the loads of the slots its stores left unwritten are tolerated there.
UNSTORED_TOLERANCE = (UNSTORED_SLOT,) if has_bug("reachable-null-block-chunk-stored") else ()
# A release with unaligned-hybrid-hit-reads-unstored-block: a mixed layout's program
# with the second connector meets it (a hunt on 0.34.0 did, in round 112); the loads
# of the slots such a hit reads are tolerated there.
UNALIGNED_TOLERANCE = (
    (UNALIGNED_HIT,) if has_bug("unaligned-hybrid-hit-reads-unstored-block") else ()
)
# The releases whose connector zeroes a sliding-window block that is not stale, and so
# drops the chunk holding it (docs/vllm-bug-window-zeroing-drops-live-chunks.md), or
# offers a chunk that accepted drafts completed only after the window freed its block
# (docs/vllm-bug-draft-completed-window-chunk-dropped.md): the window liveness check
# (WindowLiveness) records such a chunk there, not reports it.
WINDOW_TOLERANCE = (
    *((HIT_TAKEN_FOR_REUSED,) if has_bug("prefix-hit-taken-for-reused-window-block") else ()),
    *((FINISHED_CHUNK_ZEROED,) if has_bug("finished-window-chunk-dropped") else ()),
    *((DRAFTED_CHUNK_ZEROED,) if has_bug("draft-completed-window-chunk-dropped") else ()),
)
# A release with resumed-frontier-skips-recomputed-chunks (or its junction shape,
# resumed-junction-chunk-never-offered) keeps a resumed request's store frontier, so a
# window chunk it computes again below that frontier (at its replay boundary below its
# first run's hit, or at a junction its new lookup found) is never offered: the
# default-retention check (ReplayLiveness) records such a chunk there.
REPLAY_TOLERANCE = (
    *WINDOW_TOLERANCE,
    *(
        (RESUMED_FRONTIER,)
        if has_bug("resumed-junction-chunk-never-offered")
        or has_bug("resumed-frontier-skips-recomputed-chunks")
        else ()
    ),
)
# A release with multiconnector-allocation-unseen lets the other connector of a
# MultiConnector load into a block a store still reads: on such a release any program
# with the remote source could stop on that known bug, so the source stays off there.
REMOTE_SOURCE = not has_bug("multiconnector-allocation-unseen")
# A release with reset-preempt-reload fails an assertion of the preemption flush when
# a request preempted by reset_prefix_cache(reset_running_requests=True) is readmitted
# with a load in the same step: there preempt_all stays off, for the same reason.
PREEMPT_ALL = not has_bug("reset-preempt-reload")
# A release with sparse-retention-shorter-hit-reads-unstored-block stores, under vLLM's
# default checkpoint retention (0), a sliding-window chunk without a null block that a
# shorter request's hit reads: a hunt's FenceMachine programs met it within two minutes.
# The loads of the slots such a store left out are tolerated there.
SPARSE_SHORTER_HIT = has_bug("sparse-retention-shorter-hit-reads-unstored-block")
SHORTER_TOLERANCE = (SHORTER_HIT,) if SPARSE_SHORTER_HIT else ()
# A release with eagle-popped-chunk-reads-unstored-block: the same loads with an EAGLE
# drafter, which hunts met on 0.33.0 and 0.34.0 once they drew the default retention
# there (2026-12-06); tolerated likewise.
EAGLE_TOLERANCE = (EAGLE_POPPED,) if has_bug("eagle-popped-chunk-reads-unstored-block") else ()
# unaligned-hybrid-hit-reads-unstored-block's fix skips, in a mixed layout whose window
# chunks are finer than the full-attention chunk, every window chunk holding a null block
# (docs/upstream/unaligned-hybrid-hit-reads-unstored-block.md): the liveness checks leave
# those chunks out there, as they do under a coarse mask.
UNALIGNED_FIXED = fixed("unaligned-hybrid-hit-reads-unstored-block")

# RemoteWindowMachine's programs all have the layout where a sliding-window chunk can
# hold a null block a later hit reads. On a release with reachable-null-block-chunk-stored
# (no check for that null block before 0.33.0) any of them could stop on that known bug,
# and where the second connector is off (REMOTE_SOURCE), they have nothing to run: the
# machine runs on neither (its tests skip there, and a hunt leaves it out).
REMOTE_WINDOW = REMOTE_SOURCE and not has_bug("reachable-null-block-chunk-stored")
