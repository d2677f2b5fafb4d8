"""What several verification tiers share and no tier owns. The tiers import from here, never
from each other; nothing here imports a tier.

- ``upstream``: the one loader of upstream's functions, by role; ``platform``: the platform
  profiles; ``probe`` (with ``rig`` and ``stand_ins``): which function each profile's dispatch
  calls, read off upstream's own forward.
- ``formats``, ``scoring``, ``metrics``, ``deepseek_reference``: the index-K formats' emulation,
  the scorers' reference math with ``calc_diff``, the recall metrics, DeepSeek's reference numerics.
- ``oracles``: what the recall oracles mean, the sentence every report shares (no torch).
- ``read_reference``, ``store_cases``, ``store_layout``, ``store_reference``, ``store_driver``: the
  read and store cases the tiers and the bench build, and their reference math.
- ``fp8_twin``: the Triton fp8 twin of the bf16 kernel; ``forward_runs``: forward-tier runs read
  back; ``provenance``: the series hash every result records.
"""
