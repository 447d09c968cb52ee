"""``python -m audit`` is the same as the ``fence-audit`` command."""

from audit.cli import entry

raise SystemExit(entry())
