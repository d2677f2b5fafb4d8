"""What each C4 index-K format costs on DeepSeek-V4, measured through upstream's own code.

``python -m verify.cost`` (no GPU): KV-pool tokens from upstream's ``DSV4PoolConfigurator`` per
format (fp8, fp4, bf16), decode KV bytes per generated token and the indexer's share of them,
the indexer's share of prefill FLOPs, and the TTFT / decode factors the committed H200 bench's
kernel ratios imply. It prints its assumptions and writes a JSON artifact (``--out``).
"""
