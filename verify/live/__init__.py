"""Live-server tier of `verify_recall`: long-context recall against any OpenAI-compatible SGLang.

Run it as `python -m verify.live --server URL [--baseline URL] --out DIR`. It sends deterministic,
exactly-sized needle prompts (sizes measured with the server's own tokenizer), scores the answers
by exact match, and writes JSONL per request, a CSV summary, heatmaps and a markdown report.
Why a live tier at all: the DeepSeek-V4 indexer selects *every* cached key below ~2K tokens, so
only prompts well past that length can show an index-key precision or layout defect end to end.
"""

# Bumped when what a record means changes: a resumed run refuses records of another version.
# 2: one state per request (states.py); 3: records hold observations, states are judged when reported.
HARNESS_VERSION = "3"
