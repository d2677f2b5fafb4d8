"""What several verification tiers share: upstream's functions and the platform profiles, the
index-K formats and their reference math, the oracles and metrics, the cases the tiers build and
the fp8 twin. Tiers import from here, never from each other; nothing here imports a tier."""
