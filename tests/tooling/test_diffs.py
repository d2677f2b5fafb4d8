"""The one reader of unified diffs: what every walker of a patch or a `git diff` relies on."""

from __future__ import annotations

from bf16k import diffs

PATCH = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
Subject: [PATCH] a patch

The message and the diffstat belong to no file.
---
 a.py | 4 ++--
 2 files changed

diff --git a/a.py b/a.py
index 1111111..2222222 100644
--- a/a.py
+++ b/a.py
@@ -1,4 +1,4 @@
 keep
--- a removed line that looks like a header
+++ an added line that looks like a header
 keep
-x
+y
@@ -10 +10,2 @@
-last
\\ No newline at end of file
+last
+more
diff --git a/new.py b/new.py
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/new.py
@@ -0,0 +1 @@
+VALUE = 1
diff --git a/gone.py b/gone.py
deleted file mode 100644
index 4444444..0000000
--- a/gone.py
+++ /dev/null
@@ -1 +0,0 @@
-VALUE = 0
--
2.43.0
"""


def test_files_hunks_and_lines_are_read_by_the_hunk_counts() -> None:
    files = diffs.parse(PATCH)
    assert [(f.old_path, f.path, f.new_file, f.deleted) for f in files] == [
        ("a.py", "a.py", False, False),
        ("new.py", "new.py", True, False),
        ("gone.py", "gone.py", False, True),
    ]
    a = files[0]
    assert a.header[0] == "diff --git a/a.py b/a.py" and a.header[-1] == "+++ b/a.py"
    assert [(h.old_start, h.old_count, h.new_start, h.new_count) for h in a.hunks] == [
        (1, 4, 1, 4),
        (10, 1, 10, 2),
    ]
    assert a.removed == ["-- a removed line that looks like a header", "x", "last"]
    assert a.added == ["++ an added line that looks like a header", "y", "last", "more"]
    assert a.hunks[1].lines == ["-last", "\\ No newline at end of file", "+last", "+more"]
    # format-patch's signature after the last hunk belongs to no file.
    assert files[2].hunks[0].lines == ["-VALUE = 0"]


def test_runs_are_consecutive_lines_of_one_kind_within_a_hunk() -> None:
    a = diffs.parse(PATCH)[0]
    assert a.runs("-") == [["-- a removed line that looks like a header"], ["x"], ["last"]]
    assert a.runs("+") == [["++ an added line that looks like a header"], ["y"], ["last", "more"]]


def test_a_hunk_header_without_counts_is_one_line() -> None:
    (f,) = diffs.parse("diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -3 +3 @@\n-a\n+b\n")
    assert (f.hunks[0].old_count, f.hunks[0].new_count, f.removed, f.added) == (1, 1, ["a"], ["b"])
