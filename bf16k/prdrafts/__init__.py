"""`pr-drafts`: the upstream PR set the series becomes, one draft per PR, a cover, `git am`-ready patches.

The PR map (``series/prs.toml``, :mod:`bf16k.prs`) says which patches make which PR and which stay
local. ``build/pr-drafts/<version>/`` gets:

- ``00-cover.md``: the map (PR -> patches, in order, on which base), the local-only patches and
  why, and the ``git am`` check of each PR on its own base;
- ``pr-<id>.md``: one draft per PR in the section order of SGLang's pull-request template, with
  one motivation, the PR's own evidence only (rendered from the committed results by
  :mod:`bf16k.previdence`), its diffstat, the tests its patches add with their CI registration
  (read by upstream's own parser), the server-argument docs row it needs, the checklist ticked
  only for what exists, and what only real hardware and the real model can still show, with the
  commands that produce it;
- ``patches/<id>/NNNN-*.patch``: each PR's commits for ``git am --keep-non-patch``.

Drafts are written for the newest release the series is carried to when that series fits the map,
else for the pin (the cover says which and why). No draft names a local path or this
repository's harness: :func:`~bf16k.prdrafts.drafts.generate` refuses one that does.

``--check`` also applies each PR on its base in a scratch clone and runs the PR's own tests
there, on the pin and on the newest carried release. ``--pr-url ID=URL`` (a PR) or
``--pr-url PATCH=URL`` (one patch) records an opened PR in the patches' ``Forwarded:`` lines.

The package: :mod:`~bf16k.prdrafts.drafts` (which release; the cover, drafts and patches written),
:mod:`~bf16k.prdrafts.commits` (each PR's commits), :mod:`~bf16k.prdrafts.tree` (what a PR's own
tree says, the ``git am`` check), :mod:`~bf16k.prdrafts.markdown` (the drafts and the cover),
:mod:`~bf16k.prdrafts.prose` (their prose, from ``bf16k/templates/*.md``) and
:mod:`~bf16k.prdrafts.urls` (``--pr-url``).
"""
