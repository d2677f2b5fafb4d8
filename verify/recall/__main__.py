"""``python -m verify.recall``: see :mod:`verify.recall.cli`."""

from .cli import entry

raise SystemExit(entry())
