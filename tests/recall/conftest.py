"""Recall tests run many small matmuls: one intra-op thread is ~10x faster than two on the shared
CI cores (OpenMP threads spin-wait under load), the same default the CPU backend's CLI uses."""

import torch

torch.set_num_threads(1)
