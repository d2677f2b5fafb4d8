"""The carry (`rebase`, `rebase-check`): the series to another upstream release, until its own tests
pass there.

How a carry works (Electron's roll procedure, with `git am -3` instead of quilt):

- The carry happens in the target's own tree, ``build/upstream/<version>`` (``Target(root,
  version).upstream_dir``); ``sglang-upstream/``, ``series/`` and ``pin.toml`` are not touched
  until the carry has succeeded, so ``--abort`` only has that tree to restore.
- The old base is the pinned wheel import (the same deterministic commit everywhere). A release
  from PyPI is imported as a *child* of it (``upstream.cached_import`` with a parent), so the
  target's base descends from the old one: 3-way merges and range-diff see exactly the release's
  change, and ``apply --upstream <version>`` later rebuilds the same commit id (recorded in the
  carried pin, the parent in ``carried.toml``). A git-ref target is the real upstream commit.
- The series is applied once on the old base (the "before" for range-diff). When the release
  already has a carried series (a re-carry, ``--force`` / ``--recarry``), its resolutions are
  replayed first (:mod:`bf16k.replay`); the rest is carried with ``git am -3``. rerere is
  cleared and stays off: a silently replayed rerere resolution carries no reason.
- Stops: a conflict (the patch, files, each hunk with its scope, upstream's change to those
  scopes only, the next command); then the series' own tests on the carried tree and the bisect
  of every prefix. A failing test stops the carry the same way, naming the test, its patch and
  upstream's change to the functions it ran. ``--continue`` takes the maintainer's one-line
  reason per hand-made hunk (``-m``); the reasons go to ``carried.toml``, the range-diff and
  the CHANGELOG entry.
- A stop leaves git's own ``rebase-apply`` state (while patches are still being applied) plus
  ``bf16k-rebase.json`` (in the tree's git dir); ``--continue``, ``--skip`` and ``--abort`` read
  it from there.
- After success the carried commits are exported byte-deterministically (``Last-Update:``
  bumped on patches whose own lines changed). With a known upstream commit the pin moves and
  they become ``series/``; otherwise they go to ``series/next/<version>/`` with a pin whose
  ``commit`` is empty. A commit id is never guessed.

The package, along a carry's steps:

- :mod:`~bf16k.carry.releases`: which release a target names, its wheel and pin, what the index
  offers, whether a release already contains a patch's change;
- :mod:`~bf16k.carry.state`: the typed state a stopped carry keeps (:class:`~bf16k.carry.state.CarryState`);
- :mod:`~bf16k.carry.chains`: the series applied as commit chains, and what a re-carry replays;
- :mod:`~bf16k.carry.engine`: ``start``, ``advance``, ``resume``, ``skip``, ``abort``;
- :mod:`~bf16k.carry.gate`: the series' tests and the bisect, handed to the engine as a callable;
- :mod:`~bf16k.carry.messages`: what each stop says;
- :mod:`~bf16k.carry.finish`: series/next/<version>/ or the moved pin, range-diff and CHANGELOG;
- :mod:`~bf16k.carry.check`: ``rebase-check``, what a carry would meet (changes nothing);
- :mod:`~bf16k.carry.status`: what ``status`` shows of a carry.
"""
