"""Tier 1: kernel parity of the bf16 index-K store and read paths (GPU, no model weights)."""
