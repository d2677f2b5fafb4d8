"""``--pr-url``: an opened PR recorded in its patches' ``Forwarded:`` lines (messages only: the trees,
authors and committers of the patch commits stay as they are), then the series re-exported."""

from __future__ import annotations

import re
import time

from bf16k import gitutil, patches, prs, series
from bf16k.errors import ToolError
from bf16k.project import Target
from bf16k.wheel import applied_tree


def parse_pr_urls(items: list[str], names: list[str], prmap: prs.PRMap | None = None) -> dict[str, str]:
    """`ID=URL` (every patch of that PR) or `PATCH=URL` (one patch) -> {series file name: URL}."""
    urls: dict[str, str] = {}
    ids = {pr.id: pr for pr in prmap.prs} if prmap else {}
    local = {loc.patch for loc in prmap.local} if prmap else set()
    for item in items:
        key, sep, url = item.partition("=")
        if not sep or not key or not url:
            raise ToolError(f"--pr-url expects ID=URL or PATCH=URL, got {item!r}")
        if not url.startswith("https://") or any(c.isspace() for c in url):
            raise ToolError(
                f"--pr-url: {url!r} is not an https URL (Forwarded: takes no, not-needed or a URL)"
            )
        if key in ids:
            for name in ids[key].patches:
                urls[name] = url
            continue
        name = key if key.endswith(".patch") else key + ".patch"
        if name not in names:
            known = ", ".join(sorted(ids)) + ("; " if ids else "") + ", ".join(names)
            raise ToolError(f"--pr-url: no PR or patch {key!r} (known: {known or 'none'})")
        if name in local:
            raise ToolError(
                f"--pr-url: {name} is local only (Forwarded: not-needed in the PR map); no PR carries it"
            )
        urls[name] = url
    return urls


def set_trailers(message: bytes, updates: dict[str, str]) -> bytes:
    """The commit message with trailers in its last paragraph set (replaced, or added before
    `Patch-Filename:` so the export keeps that line last)."""
    text = message.decode("utf-8")
    body = text.rstrip("\n")
    cut = body.rfind("\n\n")
    head, block = (body[: cut + 2], body[cut + 2 :]) if cut >= 0 else ("", body)
    lines = block.split("\n")
    if not all(series.TRAILER.match(line) for line in lines):
        head, lines = body + "\n\n", []  # no trailer block yet
    for key, value in updates.items():
        hits = [i for i, line in enumerate(lines) if line.startswith(f"{key}:")]
        if hits:
            lines[hits[0]] = f"{key}: {value}"
        else:
            at = next((i for i, line in enumerate(lines) if line.startswith("Patch-Filename:")), len(lines))
            lines.insert(at, f"{key}: {value}")
    return (head + "\n".join(lines) + "\n").encode("utf-8")


_IDENT = re.compile(r"^(author|committer) (.*) <(.*)> (\d+ [+-]\d{4})$")


def _commit_env(raw: str) -> dict[str, str]:
    """Author and committer of a commit, as the env that makes commit-tree reproduce them."""
    env: dict[str, str] = {}
    for line in raw.split("\n\n", 1)[0].splitlines():
        m = _IDENT.match(line)
        if m:
            role = "AUTHOR" if m.group(1) == "author" else "COMMITTER"
            env[f"GIT_{role}_NAME"], env[f"GIT_{role}_EMAIL"], env[f"GIT_{role}_DATE"] = m.group(2, 3, 4)
    return env


def record_pr_urls(t: Target, urls: dict[str, str], today: str | None = None) -> list[str]:
    """Rewrite `Forwarded:` (and `Last-Update:`) of the named patch commits and re-export."""
    tree = applied_tree(t, "pr-drafts --pr-url")
    repo = tree.repo
    commits = gitutil.out(["rev-list", "--reverse", f"{tree.base}..{tree.head}"], repo).split()
    today = today or time.strftime("%Y-%m-%d", time.gmtime())
    changed = [
        name
        for name, url in urls.items()
        if series.parse_patch(t.series_dir / name).trailers.get("Forwarded") != url
    ]
    if not changed:
        return []
    first = min(tree.names.index(n) for n in changed)
    parent = commits[first - 1] if first else tree.base
    for name, commit in zip(tree.names[first:], commits[first:]):
        raw = gitutil.git(["cat-file", "commit", commit], repo).stdout
        message = raw.split(b"\n\n", 1)[1]
        if name in changed:
            message = set_trailers(message, {"Forwarded": urls[name], "Last-Update": today})
        # Same tree, same author and committer: only the message (and so the ids) change.
        tree_id = gitutil.out(["rev-parse", f"{commit}^{{tree}}"], repo)
        parent = gitutil.out(
            ["commit-tree", tree_id, "-p", parent, "-F", "-"],
            repo,
            input_bytes=message,
            env=_commit_env(raw.decode("utf-8", errors="replace")),
        )
    gitutil.git(["update-ref", "-m", "bf16k pr-drafts: record PR URLs", "HEAD", parent, tree.head], repo)
    patches.export(t)
    return changed
