"""Tooling for the bf16 index-K patch series on upstream SGLang (DeepSeek-V4 C4 indexer)."""
