"""What the recall oracles mean, in the one sentence every report and README block shares (no
torch here: the PR drafts render these blocks on machines without it)."""

from __future__ import annotations

ORACLES_NOTE = (
    "None of these is model quality: each oracle says which keys a scorer keeps -- with exact arithmetic "
    "on the production fp8 q (same-q) or on the unquantized q (exact-q), or with the numerics DeepSeek's "
    "reference runs and trained the indexer with (reference: fp4 q x fp4 k in a bf16 container)."
)
