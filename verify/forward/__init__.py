"""The forward tier: upstream's C4 indexer forward as the server runs it (``python -m verify.forward``)."""
