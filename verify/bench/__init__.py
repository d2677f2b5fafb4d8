"""Kernel benchmarks of the bf16 index-K series (GPU; measured, never asserted)."""
