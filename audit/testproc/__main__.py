"""``python -m audit.testproc SPEC.json``: the test process's entry point."""

from __future__ import annotations

import sys
from pathlib import Path

from audit.core.protocol import BaselineSpec, MutationSpec, PlainRunSpec, read_spec
from audit.testproc import baseline, heap, isolation, loop, signatures


def main(argv: list[str]) -> int:
    isolation.die_with_parent()
    spec = read_spec(Path(argv[0]))
    # Before anything imports vLLM: the overlay must win the import of the target.
    if spec.overlay:
        isolation.install_overlay({name: Path(file) for name, file in spec.overlay.items()})
    isolation.block_network()
    if isinstance(spec, PlainRunSpec):  # one run, no fork
        return baseline.run_plain(spec)
    # A warm process: its heap frozen as it is built, up to its run loop; what its
    # tests parse here, its forks find parsed.
    heap.freeze_while_building()
    signatures.install()
    if isinstance(spec, BaselineSpec):
        return baseline.run(spec)
    assert isinstance(spec, MutationSpec)
    return loop.run(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
