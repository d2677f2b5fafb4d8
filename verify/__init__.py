"""Verification suites for the bf16 index-K patch series (kernel parity, recall, live server)."""
