"""The fence suite's state machines: random workloads over the real scheduler, with
the oracle after every step.

Hypothesis drives a rule-based state machine: requests of random lengths arrive
(some sharing a prefix, so the GPU prefix cache and the CPU tier both hit), steps
run, requests are aborted or preempted, transfers complete after random delays or
are held, caches are reset, every running request is preempted at once, a client
sends its next turn the moment an answer arrives; pools and the CPU tier are tight,
and a two-rank engine's second rank may be a non-writer (a replicated layout). Each
program enables a random subset of those actions (swarm testing), and a hybrid
layout may give its two groups different block sizes.
After every step the oracle (``fence_oracle``) checks the invariants and the harness
checks that no block is overwritten while a store still reads it. At the end every
transfer is released and the fence must drain to nothing.

``FenceMachine`` is that machine; ``PeriodicMachine``, ``SpeculativeMachine``,
``RemoteWindowMachine`` and ``WindowMachine`` weight its programs towards one
configuration each, and ``RecurrentMachine`` (``fence_recurrent``) drives the recurrent
layout at the unit layer. What each may draw on the installed release follows its
known bugs (``fence_tolerance``). :data:`MACHINES` registers the machines a hunt runs
(``fence_hunt.py``), :func:`hunt_settings` widens their draws to a hunt's, and
:func:`replay` starts a program a hunt kept (``test_fence_replays.py``).
``test_fence_stateful.py`` runs them under the profiles (``fence_profiles``).
"""

from __future__ import annotations

import copy
import math
import random
import sys
from dataclasses import dataclass
from typing import Any, TypeVar

from fence_config import LOOKAHEAD_HASHES, Role
from fence_harness import (
    IDLE_DRAFTER,
    PREEMPTED_THEN_FINISHED,
    RELEASE_TOLERANCE,
    FenceEngine,
    Speculation,
)
from fence_oracle import (
    FenceOracle,
    FenceViolation,
    ReplayLiveness,
    SegmentLiveness,
    StoreLiveness,
    WindowLiveness,
)
from fence_recurrent import RecurrentMachine
from fence_tolerance import (
    EAGLE_TOLERANCE,
    FINAL_TAIL_TOLERANCE,
    PREEMPT_ALL,
    REMOTE_SOURCE,
    REMOTE_WINDOW,
    REPLAY_TOLERANCE,
    SHORTER_TOLERANCE,
    SPARSE_SHORTER_HIT,
    STRANDED_TOLERANCE,
    UNALIGNED_FIXED,
    UNALIGNED_TOLERANCE,
    UNSTORED_TOLERANCE,
    WINDOW_TOLERANCE,
)
from hypothesis import strategies as st
from hypothesis.stateful import (
    RULE_MARKER,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

BLOCK = 4
# Prompts are a shared prefix (or not) plus a private tail, so that requests hit
# each other's blocks in the GPU prefix cache and in the CPU tier.
PREFIXES = [(), tuple(range(1, 9)), tuple(range(1, 5)), tuple(range(100, 112))]
# (full-attention, sliding-window) block sizes of a mixed layout: hybrid models
# whose groups differ in block size step in the lcm and hash in the gcd, and a
# sliding-window block smaller than the full-attention one brings in the final
# sliding-window tail.
MIXED_BLOCK_SIZES = [(BLOCK, BLOCK), (8, 4), (BLOCK, 2), (BLOCK, 8)]


MAX_TAIL = 10
MAX_TOKENS = 10
# The longest request of a program; the pool is sized to fit it (_fitting_pool).
LONGEST = max(map(len, PREFIXES)) + MAX_TAIL + MAX_TOKENS


def _fitting_pool(
    layout: str, block_sizes: tuple[int, int] = (BLOCK, BLOCK), lookahead: int = 0
) -> int:
    """The smallest pool that fits the longest request alone (plus the null block),
    so that every request can run; more requests than that compete and preempt.
    ``lookahead``: the slots an EAGLE drafter's config reserves past a request's
    tokens (vLLM's ``num_lookahead_tokens``), which its last steps need too. Drafts
    need none: vLLM schedules none in a step that samples a request's last token.

    The groups share one pool, each taking blocks of its own size. A sliding-window
    group needs every block of a prompt it prefills in one step (it frees the ones
    left behind afterwards): as many as full attention would at its block size.
    """
    full, sliding = block_sizes
    groups = {"full": [full], "sliding": [sliding], "mixed": [full, sliding]}[layout]
    return 1 + sum(-(-(LONGEST + lookahead) // size) for size in groups)


# Swarm testing (Groce et al., "Swarm testing", ISSTA 2012): each program enables a
# random subset of these actions, so that what a uniform choice of rules makes rare
# comes up: stores held with nothing to release them, a pool churned by aborts
# alone, preemptions with no reset in between.
ACTIONS = ("abort", "reset", "preempt", "release")


def _can(action: str) -> Any:
    """A precondition: the engine is running and this program enables ``action``."""
    return lambda self: self.engine is not None and action in self.actions


def _chunk_ending_answer(engine: FenceEngine, prompt: list[int]) -> tuple[list[int], int]:
    """``prompt`` (shortened by whole chunks if need be, to fit the longest
    request) and the fewest tokens, two or more, it can generate so that its
    computed tokens (all but its last) end a chunk of the first group: that chunk is
    left to the final store, since its hash needs the token after it (with async
    scheduling, a step after the chunk is computed)."""
    chunk = engine.group_block_sizes[0] * engine.blocks_per_chunk
    answer = (1 - len(prompt)) % chunk
    answer += chunk if answer < 2 else 0
    excess = len(prompt) + answer - LONGEST
    if excess > 0:
        prompt = prompt[: len(prompt) - -(-excess // chunk) * chunk] or prompt[:1]
        answer = (1 - len(prompt)) % chunk
        answer += chunk if answer < 2 else 0
    return prompt, min(answer, LONGEST - len(prompt))


# What FenceMachine's start draws besides the layout and the features it may fix: the
# engine's shape, then the program's delays, seed, actions and role. Hypothesis draws a
# rule's arguments in the order given, so the two parts keep their places in it.
ENGINE_DRAWS: dict[str, Any] = {
    "block_sizes": st.sampled_from(MIXED_BLOCK_SIZES),
    # Asynchronous scheduling two times in three, and a pool with no spare block
    # one in three: every same-step flush of a finished request's store the ci
    # programs met had both (freed blocks handed out again at once).
    "async_scheduling": st.sampled_from([True, True, False]),
    "spare_blocks": st.sampled_from([0, 0, 0, 1, 2, 4, 8, 12, 12]),
    # a CPU tier of one to three chunks four times in eleven: the programs that
    # met a stored chunk holding a null block (a planted registration of it,
    # seeds 0-7) all had a tier of one to four chunks
    "cpu_chunks": st.sampled_from([1, 1, 2, 2, 3, 4, 6, 8, 12, 16, 24]),
    # one rank; two that both write (the second reports late); or a replicated
    # layout's two, rank 1 a non-writer that acknowledges stores it never runs
    "ranks": st.sampled_from(["one", "one", "two", "replicated"]),
    "second_worker_lag": st.integers(0, 3),
    "blocks_per_chunk": st.sampled_from([1, 1, 2, 3]),
    "window_blocks": st.integers(1, 3),
}
RUN_DRAWS: dict[str, Any] = {
    "delays": st.lists(st.one_of(st.none(), st.integers(0, 4)), min_size=1, max_size=8),
    "seed": st.integers(0, 2**16),
    "enabled": st.lists(st.booleans(), min_size=len(ACTIONS), max_size=len(ACTIONS)),
    # the connector a consumer (as vLLM configures it) two times in three: a
    # producer-only one frees the blocks of a step in flight at once
    "kv_role": st.sampled_from(["kv_both", "kv_both", "kv_producer"]),
}


@dataclass(frozen=True)
class Segments:
    """A periodic checkpoint retention (``prefix_cache_retention_interval`` > 0) of
    ``count`` times the engine's coarsest chunk: a multiple of every group's chunk, as
    vLLM requires of it, and so of the hit alignment."""

    count: int

    def tokens(self, block_sizes: tuple[int, int], blocks_per_chunk: int) -> int:
        return self.count * math.lcm(*(size * blocks_per_chunk for size in block_sizes))


# The periodic retentions a hunt adds to the machines' own (and ci runs of their own
# take), which SegmentLiveness (L4) checks where a program has a window check
PERIODIC_RETENTION: list[int | Segments | None] = [Segments(1), Segments(2)]
# The retentions FenceMachine draws: vLLM's default and dense in the ci programs; a
# hunt adds PERIODIC_RETENTION (hunt_settings), so that EAGLE drafters and the second
# connector meet it too. Read once, when the first program starts (a deferred strategy
# is resolved once): set it before any FenceMachine runs. The deferred draw of these
# two deals the same ci programs as the plain one did (their starts compared, 0.33.0).
FENCE_RETENTION: list[int | Segments | None] = [0, None]


def _start_draws(retention: st.SearchStrategy[Any]) -> dict[str, Any]:
    """FenceMachine's start draws, in the order Hypothesis draws them, with
    ``retention`` the strategy of the retention."""
    return {
        "layout": st.sampled_from(["full", "sliding", "mixed"]),
        **ENGINE_DRAWS,
        "remote_source": st.booleans(),
        "retention": retention,
        "eagle": st.booleans(),
        **RUN_DRAWS,
    }


class FenceMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.engine: FenceEngine | None = None
        self.oracle = FenceOracle()
        self.liveness: StoreLiveness | None = None
        self.next_tail = 1000
        self.actions: frozenset[str] = frozenset()

    @precondition(lambda self: self.engine is None)
    @rule(**_start_draws(st.deferred(lambda: st.sampled_from(FENCE_RETENTION))))
    def start(
        self,
        layout: Any,
        block_sizes: tuple[int, int],
        async_scheduling: bool,
        spare_blocks: int,
        cpu_chunks: int,
        ranks: str,
        second_worker_lag: int,
        blocks_per_chunk: int,
        window_blocks: int,
        remote_source: bool,
        retention: int | Segments | None,
        eagle: bool,
        delays: list[int | None],
        seed: int,
        enabled: list[bool],
        kv_role: Role,
        speculation: Speculation | None = None,
        lookahead_hashes: bool | None = None,
    ) -> None:
        rng = random.Random(seed)
        if lookahead_hashes is None:
            # vLLM 0.34.0's lookahead block hashes (its default) for an EAGLE drafter
            # in the programs of odd seed, its fallback in the others: from the seed,
            # as WindowMachine's retention, with no draw of its own, so that the
            # programs dealt stay those of before (a kept program may name it)
            lookahead_hashes = LOOKAHEAD_HASHES and eagle and seed % 2 == 1
        self.actions = frozenset(a for a, on in zip(ACTIONS, enabled, strict=True) if on)

        def delay(job_id: int, is_store: bool) -> int | None:
            return rng.choice(delays)

        if layout != "mixed":
            block_sizes = (BLOCK, BLOCK)  # one group, one size
        if isinstance(retention, Segments):
            # vLLM (0.29.0 on) refuses a periodic retention with no sliding-window group
            retention = retention.tokens(block_sizes, blocks_per_chunk) if layout != "full" else 0
        # the second connector loads, which a producer-only role does not
        remote_source = remote_source and REMOTE_SOURCE and kv_role == "kv_both"
        # an EAGLE drafter that drops a hit's last block, which the liveness checks do
        # not model (under lookahead hashes it drops none, and they hold as without it)
        eagle_drop = eagle and not lookahead_hashes
        # the layouts where every computed chunk must be offered (StoreLiveness)
        if layout == "full" and not eagle_drop and not remote_source:
            self.liveness = StoreLiveness(BLOCK * blocks_per_chunk)
        # those where every hit boundary's window chunk must be (WindowLiveness), and
        # under the default retention, where the replay boundary's must (ReplayLiveness),
        # and under a periodic one, where each segment's end's must too (SegmentLiveness)
        elif not eagle_drop and not remote_source:
            window_block = block_sizes[1]
            window_group = 0 if layout == "sliding" else 1
            chunk = window_block * blocks_per_chunk
            alignment = block_sizes[0] * blocks_per_chunk  # the first group's chunk
            # unaligned-hybrid-hit-reads-unstored-block, fixed: where the window's chunks
            # are finer than the full-attention chunk (the alignment), the store skips
            # every chunk holding a null block, by design (WindowLiveness's coarse rule)
            any_null = UNALIGNED_FIXED and layout == "mixed" and chunk < alignment
            if retention is None:
                self.liveness = WindowLiveness(
                    window_group,
                    chunk,
                    math.lcm(alignment, chunk),
                    blocks_per_chunk,
                    # a hit reads the window_blocks blocks before it
                    coarse=alignment % window_block != 0
                    or window_blocks >= alignment // window_block
                    or any_null,
                    tolerate=WINDOW_TOLERANCE,
                )
            elif retention == 0:
                self.liveness = ReplayLiveness(
                    window_group,
                    chunk,
                    alignment,
                    blocks_per_chunk,
                    coarse=alignment % window_block != 0,
                    tolerate=REPLAY_TOLERANCE,
                    window_blocks=window_blocks,
                    any_null=any_null,
                )
            else:
                self.liveness = SegmentLiveness(
                    window_group,
                    chunk,
                    alignment,
                    blocks_per_chunk,
                    retention,
                    window_blocks,
                    # a hit reads the window_blocks blocks before it
                    coarse=alignment % window_block != 0
                    or window_blocks >= retention // window_block
                    or any_null,
                    tolerate=REPLAY_TOLERANCE,
                )
        # an EAGLE drafter's lookahead slots: one per draft token
        lookahead = (speculation or IDLE_DRAFTER).tokens if eagle else 0
        self.engine = FenceEngine(
            block_size=block_sizes[0],
            sliding_block_size=block_sizes[1],
            num_gpu_blocks=_fitting_pool(layout, block_sizes, lookahead) + spare_blocks,
            layout=layout,
            window_blocks=window_blocks,
            blocks_per_chunk=blocks_per_chunk,
            async_scheduling=async_scheduling,
            cpu_chunks=cpu_chunks,
            workers=1 if ranks == "one" else 2,
            # the second rank reports in step with the first, or up to 3 steps late
            second_worker_lag=second_worker_lag,
            second_rank_writes=ranks != "replicated",
            delay=delay,
            remote_source=remote_source,
            kv_role=kv_role,
            # vLLM's default checkpoint retention, or dense (which brings in the
            # final sliding-window tail); an EAGLE drafter's sliding-window group
            retention_interval=retention,
            eagle=eagle,
            lookahead_hashes=lookahead_hashes,
            speculation=speculation,
            # Known vLLM bugs, kept in test_vllm_bugs.py: tolerated here so that the
            # random workloads keep hunting for other failures (and this release's
            # tolerated ones, see RELEASE_TOLERANCE). The final-tail bug only where
            # the registry lists this release: elsewhere it would be a regression;
            # likewise the drain that stops on a finished load stranded in the queue.
            tolerate=(
                *RELEASE_TOLERANCE,
                PREEMPTED_THEN_FINISHED,
                *FINAL_TAIL_TOLERANCE,
                *STRANDED_TOLERANCE,
                *UNSTORED_TOLERANCE,
                *UNALIGNED_TOLERANCE,
                *SHORTER_TOLERANCE,
                *EAGLE_TOLERANCE,
            ),
            post_step_fns=[self.oracle, *([self.liveness] if self.liveness else [])],
        )
        if self.liveness is not None:
            self.liveness.attach(self.engine)

    def _live(self) -> bool:
        return self.engine is not None

    @precondition(_live)
    @rule(
        prefix=st.sampled_from(PREFIXES),
        tail=st.integers(0, MAX_TAIL),
        max_tokens=st.integers(1, MAX_TOKENS),
        remote_blocks=st.sampled_from([0, 0, 1, 2, 8]),
    )
    def add_request(
        self, prefix: tuple[int, ...], tail: int, max_tokens: int, remote_blocks: int
    ) -> None:
        """A request; on engines with a second connector, that connector may load its
        first ``remote_blocks`` blocks (if the prompt has them)."""
        assert self.engine is not None
        prompt = list(prefix) + list(range(self.next_tail, self.next_tail + tail))
        self.next_tail += tail
        if not prompt:
            prompt = [self.next_tail]
            self.next_tail += 1
        # whole scheduler blocks (the lcm of the groups' block sizes)
        unit = math.lcm(*self.engine.group_block_sizes)
        remote = min(remote_blocks, (len(prompt) - 1) // unit) * unit
        if not self.engine.remote_source:
            remote = 0
        self.engine.add_request(prompt, max_tokens, remote_tokens=remote)

    @precondition(lambda self: self.engine is not None and self.engine.scheduler.has_requests())
    @rule(wait=st.integers(1, 4), tail=st.integers(0, 3))
    def follow_up(self, wait: int, tail: int) -> None:
        """A chat client's next turn: step until a request finishes (at most ``wait``
        steps), then at once add a request that opens with the first half of that
        one's prompt and output, plus a new tail; its answer is sized so that it,
        too, ends on a chunk boundary (:func:`_chunk_ending_answer`).

        The case it is for: a finished request's final store whose source blocks
        the same step hands out again, so that the store is flushed in the step it
        is created (the inline flush of vLLM PR #48596, the brief's A2, and the
        worker popping that job). A request whose computed tokens end a chunk
        leaves that chunk to its final store, and the chunk's block, often not yet
        in the GPU prefix cache, goes back to the head of the free queue (vLLM
        reuses uncached blocks first): the new request's first fresh block. Sharing
        only half the history keeps the new request from hitting that chunk and
        storing it itself. Without this rule the random workloads met the case only
        by luck (none in the 75 programs of 25 steps the ci profile had then).
        """
        engine = self.engine
        assert engine is not None
        before = {r for r, q in engine.requests.items() if q.is_finished()}
        for _ in range(wait):
            engine.step()
            finished = sorted(
                r for r, q in engine.requests.items() if q.is_finished() and r not in before
            )
            if finished:
                history = list(engine.requests[finished[0]].all_token_ids)
                prompt = history[: len(history) // 2]
                prompt += range(self.next_tail, self.next_tail + tail)
                self.next_tail += tail
                engine.add_request(*_chunk_ending_answer(engine, prompt))
                return

    @precondition(_live)
    @rule(steps=st.integers(1, 4))
    def step(self, steps: int) -> None:
        assert self.engine is not None
        for _ in range(steps):
            self.engine.step()

    @precondition(_can("abort"))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        assert self.engine is not None
        alive = sorted(r for r, q in self.engine.requests.items() if not q.is_finished())
        if alive:
            self.engine.abort(data.draw(st.sampled_from(alive)))

    def _can_reset(self) -> bool:
        # A reset while a sliding-window request runs trips a real vLLM bug (0.28.0-0.33.0)
        # (docs/vllm-bug-reset-sliding-window.md; test_reset_rewinds_sliding_window_to_stale_ids
        # keeps it as an expected failure): the random workloads leave it out so
        # that they keep hunting for other failures.
        engine = self.engine
        if engine is None or engine.reset_since_last_step or "reset" not in self.actions:
            return False
        return engine.layout == "full" or not engine.scheduler.has_unfinished_requests()

    @precondition(_can_reset)
    @rule()
    def reset_cache(self) -> None:
        assert self.engine is not None
        if self.liveness is not None:
            self.liveness.reset(self.engine)
        self.engine.reset_cache()

    def _can_preempt(self) -> bool:
        # vLLM's reset_prefix_cache(reset_running_requests=True) raises when a request
        # that is not running holds blocks (one waiting for a remote load, say): an
        # engine would fail the same way, so the workloads leave that case out.
        engine = self.engine
        if engine is None or "preempt" not in self.actions or not PREEMPT_ALL:
            return False
        running = {r.request_id for r in engine.scheduler.running}
        return all(req_id in running for req_id, _, _ in engine.block_tables())

    @precondition(_can_preempt)
    @rule()
    def preempt_all(self) -> None:
        """Every running request preempted at once, as the engine's
        reset_prefix_cache(reset_running_requests=True) does. The next step reports
        them preempted and may readmit them with a load from the CPU tier; with
        async scheduling, a request can be preempted with its last token in flight."""
        assert self.engine is not None
        self.engine.preempt_all()

    @precondition(_can("release"))
    @rule()
    def release_held(self) -> None:
        assert self.engine is not None
        self.engine.worker.release()

    @invariant()
    def no_content_violation(self) -> None:
        if self.engine is not None:
            assert not self.engine.contents.violations

    def teardown(self) -> None:
        engine = self.engine
        if engine is None or engine.broken or engine.contents.violations or self.oracle.violations:
            return  # already failed; stepping on would only add noise or hide the failure
        engine.drain()
        if engine.stranded:
            return  # a known vLLM bug stopped the engine (STRANDED_FINISHED_LOAD)
        assert engine.fence == {}, f"the fence did not drain: {engine.fence}"
        assert not engine.connector._jobs
        if self.liveness is not None and (lost := self.liveness.check(engine)):
            raise FenceViolation(lost)


class PeriodicMachine(FenceMachine):
    """FenceMachine's rules, every program under a periodic retention of one or two of
    its coarsest chunks: with EAGLE drafters and the second connector too, which
    WindowMachine's never have (a hunt deals these among FenceMachine's others). A rule
    of its own, not FENCE_RETENTION patched: Hypothesis resolves a deferred strategy
    once, so a patched list would reach every FenceMachine run after it in the process
    (an audit's baseline met that: two planted-bug runs found nothing)."""

    @precondition(lambda self: self.engine is None)
    @rule(**_start_draws(st.sampled_from(PERIODIC_RETENTION)))
    def start(self, **drawn: Any) -> None:  # type: ignore[override]
        super().start(**drawn)


# How the target model takes a SpeculativeMachine program's drafts: each step's at
# random, all of them, or none.
ACCEPTANCE = ("random", "random", "all", "none")


class SpeculativeMachine(FenceMachine):
    """FenceMachine's rules, every program with speculative decoding: each step
    schedules up to ``spec_tokens`` drafts per decoding request and accepts a prefix
    of them (``acceptance``). The scheduler allocates the drafts' slots and rolls back
    its count of computed tokens by those rejected, whose KV stays in their slots
    until overwritten (the content model's :class:`~fence_contents.Rejected`): a store
    that read such a slot, or a draft written into a block a store still reads, is a
    content violation. Synchronous engines hand the scheduler the drafter's proposals
    after each step (as many as it draws); an async step schedules placeholders for
    all of them, and the runner computes the next step's tokens as many positions
    lower as the scheduler, a step behind, still counts rejected ones computed."""

    @precondition(lambda self: self.engine is None)
    @rule(
        **_start_draws(st.deferred(lambda: st.sampled_from(FENCE_RETENTION))),
        spec_tokens=st.integers(1, 3),
        acceptance=st.sampled_from(ACCEPTANCE),
    )
    def start(self, spec_tokens: int, acceptance: str, **drawn: Any) -> None:  # type: ignore[override]
        rng = random.Random(drawn["seed"] ^ 0x5EC)  # apart from the delays' draws

        def accepted(req_id: str, step: int, drafts: int) -> int:
            if acceptance == "random":
                return rng.randint(0, drafts)
            return drafts if acceptance == "all" else 0

        speculation = Speculation(
            spec_tokens, lambda req_id, step: rng.randint(0, spec_tokens), accepted
        )
        super().start(**drawn, speculation=speculation)


# The retentions RemoteWindowMachine draws, read when its first program starts. On a
# release with sparse-retention-shorter-hit (vLLM's default retention stores a chunk
# its programs' shorter hits read) its ci programs keep dense retention, as they did
# before that bug was tolerated (SHORTER_TOLERANCE), so that a seed deals the same
# ones; the hunt draws both retentions (hunt_settings). It runs only where
# REMOTE_WINDOW (fence_tolerance) says so.
REMOTE_WINDOW_RETENTION: list[int | Segments | None] = [None] if SPARSE_SHORTER_HIT else [0, None]
# The (full-attention, sliding-window) block sizes RemoteWindowMachine draws for a mixed
# layout, read when its first program starts. The ci programs keep one size, so that
# the programs each seed deals stay those measured (DESIGN.md, "A null block inside a
# stored chunk"); `nox -s hunt` draws FenceMachine's sizes (MIXED_BLOCK_SIZES).
REMOTE_WINDOW_BLOCK_SIZES = [(BLOCK, BLOCK)]


class RemoteWindowMachine(FenceMachine):
    """FenceMachine's rules, its programs weighted towards one configuration (swarm
    testing, with the features fixed rather than drawn): another connector of a
    MultiConnector loads more of a prompt than a sliding-window group's window, so the
    group backs only the window before the loaded tokens and leaves the blocks before
    it null; the chunks its stores then offload may hold such a null block, and a
    later request that shares a shorter prefix hits the CPU tier at an earlier chunk
    boundary, whose window reads it.

    In FenceMachine's programs those conditions (a sliding-window group, chunks of two
    blocks or more, a window of two or more, the second connector, no EAGLE drafter,
    a load longer than the window, then a shorter hit from the CPU tier) met about
    once in fifty programs, and the catalogue's sliding-window-no-reachable-null-skip
    survived the random workloads. Here every program has the layout (a mixed layout's
    two groups share one block size, so that the programs each seed deals stay those
    measured; its other sizes meet unaligned-hybrid-hit-reads-unstored-block on
    0.33.0-0.34.0: DESIGN.md, "A null block inside a stored chunk"); prompts are
    long enough for such a load; the tier holds four chunks or more; and ``reload``
    sends a finished request's prompt again, cut at one of its chunks, after a reset
    of the GPU prefix cache alone, so that its hit comes from the tier.
    """

    @precondition(lambda self: self.engine is None)
    @rule(
        layout=st.sampled_from(["sliding", "mixed"]),
        # a single size draws nothing (sampled_from of one value is just that value)
        block_sizes=st.deferred(lambda: st.sampled_from(REMOTE_WINDOW_BLOCK_SIZES)),
        async_scheduling=st.sampled_from([True, True, False]),
        spare_blocks=st.sampled_from([0, 0, 0, 1, 2, 4, 8, 12, 12]),
        cpu_chunks=st.sampled_from([4, 6, 8, 12, 16, 24]),
        ranks=st.sampled_from(["one", "one", "two", "replicated"]),
        second_worker_lag=st.integers(0, 3),
        blocks_per_chunk=st.sampled_from([2, 3]),
        window_blocks=st.integers(2, 3),
        retention=st.deferred(lambda: st.sampled_from(REMOTE_WINDOW_RETENTION)),
        delays=st.lists(st.one_of(st.none(), st.integers(0, 4)), min_size=1, max_size=8),
        seed=st.integers(0, 2**16),
        enabled=st.lists(st.booleans(), min_size=len(ACTIONS), max_size=len(ACTIONS)),
    )
    def start(self, **drawn: Any) -> None:  # type: ignore[override]
        """FenceMachine's start with the layout this machine fixes: the second
        connector on (so the connector a consumer), no EAGLE drafter."""
        super().start(**drawn, remote_source=True, eagle=False, kv_role="kv_both")

    @precondition(FenceMachine._live)
    @rule(
        prefix=st.sampled_from(PREFIXES[1:]),
        tail=st.integers(4, MAX_TAIL),
        max_tokens=st.integers(1, MAX_TOKENS),
        remote_blocks=st.sampled_from([0, 3, 4, 5, 8]),
    )
    def add_request(self, **drawn: Any) -> None:  # type: ignore[override]
        """A request with a shared prefix and a tail of four tokens or more; the second
        connector may load its first 3, 4, 5 or 8 blocks (as many as it has)."""
        super().add_request(**drawn)

    @precondition(
        lambda self: (
            self.engine is not None and any(q.is_finished() for q in self.engine.requests.values())
        )
    )
    @rule(data=st.data(), tail=st.integers(0, 3), max_tokens=st.integers(1, 4))
    def reload(self, data: st.DataObject, tail: int, max_tokens: int) -> None:
        """Step until the engine is idle (every transfer released), reset the GPU
        prefix cache alone, then send a finished request's prompt again, cut within
        one of its chunks (of the first group), plus a new tail: its hit comes from
        the CPU tier and ends at that chunk's start."""
        engine = self.engine
        assert engine is not None
        engine.drain()
        if not engine.reset_gpu_cache():
            return
        finished = sorted(r for r, q in engine.requests.items() if q.is_finished())
        prompt = list(engine.requests[data.draw(st.sampled_from(finished))].prompt_token_ids)
        chunk = engine.group_block_sizes[0] * engine.blocks_per_chunk
        index = data.draw(st.integers(0, (len(prompt) - 1) // chunk))
        cut = min(len(prompt), max(1, index * chunk + data.draw(st.integers(0, chunk - 1))))
        prompt = prompt[:cut] + list(range(self.next_tail, self.next_tail + tail))
        self.next_tail += tail
        engine.add_request(prompt, max_tokens)


# The retentions WindowMachine's programs take, in turn by their drawn seed: dense alone
# in the ci programs; `nox -s hunt` adds vLLM's default, which ReplayLiveness (L3)
# checks, and PERIODIC_RETENTION (hunt_settings). Not a draw of its own: any new strategy
# in the rule, even one of a single value, changed the ci programs a seed deals after
# the first 16 (0.33.0).
WINDOW_RETENTION: list[int | Segments | None] = [None]


class WindowMachine(FenceMachine):
    """FenceMachine's rules, every program in a layout WindowLiveness (L2) holds to its
    check: a sliding-window group, alone or beside full attention (any of the mixed
    block sizes), under dense retention, with no EAGLE drafter and no second connector.
    FenceMachine's ci run starts 9 of its 138 programs in such a layout (0.33.0), and
    mutmut's ``continue`` -> ``break`` on a null block in the store's chunk loop
    survived them; this machine's ci programs find it. In a hunt a quarter of its
    programs take vLLM's default retention, where ReplayLiveness (L3) holds them
    instead, and half a periodic one, where SegmentLiveness (L4) does
    (``WINDOW_RETENTION``)."""

    @precondition(lambda self: self.engine is None)
    @rule(
        layout=st.sampled_from(["sliding", "mixed"]),
        **ENGINE_DRAWS,
        **RUN_DRAWS,
    )
    def start(self, **drawn: Any) -> None:  # type: ignore[override]
        """FenceMachine's start with what this machine fixes: no EAGLE drafter, no
        second connector, and dense retention but where a hunt adds the others."""
        retention = WINDOW_RETENTION[drawn["seed"] % len(WINDOW_RETENTION)]
        super().start(**drawn, remote_source=False, eagle=False, retention=retention)


# The machines a hunt runs (fence_hunt.py), by name, in the order each of its rounds
# runs them, each with the round's seed: a machine joins the hunt here, and the hunt
# names none itself. Those this release runs: a known bug stops every program of
# RemoteWindowMachine elsewhere (REMOTE_WINDOW). PeriodicMachine's programs are among
# FenceMachine's in a hunt (hunt_settings).
MACHINES: dict[str, type[RuleBasedStateMachine]] = {
    machine.__name__: machine
    for machine in (
        FenceMachine,
        RemoteWindowMachine,
        WindowMachine,
        RecurrentMachine,
        SpeculativeMachine,
    )
    if machine is not RemoteWindowMachine or REMOTE_WINDOW
}

# What a hunt sets before its rounds, as Python statements on this module: the
# retentions and block sizes the ci programs leave out (each list's comment above), so
# that a seed keeps dealing the ci programs measured there. vLLM's default retention
# and the periodic ones beside dense in WindowMachine, the periodic ones beside
# FenceMachine's two; and where RemoteWindowMachine runs, FenceMachine's block sizes
# and vLLM's default retention beside dense, which its ci programs leave out where a
# known bug meets it (tolerated: SHORTER_TOLERANCE), and the periodic ones.
HUNT_SETTINGS = (
    "fence_machines.WINDOW_RETENTION = [None, 0, *fence_machines.PERIODIC_RETENTION]",
    "fence_machines.FENCE_RETENTION = [0, None, *fence_machines.PERIODIC_RETENTION]",
)
REMOTE_WINDOW_HUNT_SETTINGS = (
    "fence_machines.REMOTE_WINDOW_BLOCK_SIZES = fence_machines.MIXED_BLOCK_SIZES",
    "fence_machines.REMOTE_WINDOW_RETENTION = [0, None, *fence_machines.PERIODIC_RETENTION]",
)


def hunt_settings() -> tuple[str, ...]:
    """Widen the machines' draws to a hunt's (:data:`HUNT_SETTINGS`), before any of them
    runs (a deferred strategy reads its list once), and return the statements run:
    hunt.md gives them, since a replay outside the hunt needs them first or it runs
    other programs."""
    statements = HUNT_SETTINGS + (REMOTE_WINDOW_HUNT_SETTINGS if REMOTE_WINDOW else ())
    for statement in statements:  # run as given, so that hunt.md says what ran
        exec(statement, {"fence_machines": sys.modules[__name__]})
    return statements


# How a kept program (a hunt's, replayed by test_fence_replays.py and
# test_vllm_bugs_liveness.py) starts unless it says otherwise: key by key, the value
# most of those programs have, so that each names only where it differs. A machine
# takes the keywords its start rule draws (RemoteWindowMachine and WindowMachine fix
# some themselves, SpeculativeMachine draws two more).
PROGRAM_START: dict[str, Any] = {
    "layout": "mixed",
    "block_sizes": (BLOCK, BLOCK),
    "async_scheduling": True,
    "spare_blocks": 0,
    "cpu_chunks": 1,
    "ranks": "one",
    "second_worker_lag": 0,
    "blocks_per_chunk": 1,
    "window_blocks": 1,
    "remote_source": False,
    "retention": 0,
    "eagle": False,
    "delays": [None],
    "seed": 0,
    "enabled": [False, False, False, False],
    "kv_role": "kv_both",
    "spec_tokens": 2,
    "acceptance": "random",
}

Machine = TypeVar("Machine", bound=FenceMachine)


def replay(machine: type[Machine], **start: Any) -> Machine:
    """A new ``machine`` started as a kept program starts it: ``start`` over
    :data:`PROGRAM_START`, whose keywords it takes where its start rule draws them.
    The program's steps are then the caller's."""
    drawn = getattr(machine.start, RULE_MARKER).arguments
    defaults = {key: value for key, value in PROGRAM_START.items() if key in drawn}
    state = machine()
    state.start(**{**copy.deepcopy(defaults), **start})
    return state
