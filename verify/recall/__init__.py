"""Tier 2 of verify_recall: indexer-level recall of bf16 vs fp8 (vs fp4-sim) index keys, and the
diagnosis of which explanation (fp8 precision or an fp8 path bug) the measurements support.

Modules: ``formats`` (storage-format emulation), ``generator`` (seeded structured keys/queries,
planted needles), ``scoring`` (oracle and emulated scorers), ``backend`` / ``gpu_backend``
(emulation vs production kernels), ``runner`` (one length), ``metrics``, ``gate``, ``report``,
``diagnose``, ``replay_format`` / ``replay`` (captured tensors), ``cli``.
"""
