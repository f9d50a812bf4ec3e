#!/usr/bin/env python3
"""Allocate 64 MiB tensors until PyTorch refuses; print what it got.

Run under the hook with CUDA_DEVICE_MEMORY_LIMIT set. Prints one line:
  torch_limit got_mib <N> meminfo_total_mib <T> meminfo_free_mib <F> error <first line>
"""
import torch

CHUNK = 64 << 20
free, total = torch.cuda.mem_get_info()
held = []
err = "none"
try:
    while len(held) < 100000:
        held.append(torch.empty(CHUNK, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError as e:  # the hook's CUDA_ERROR_OUT_OF_MEMORY, as PyTorch reports it
    err = str(e).splitlines()[0][:160]
print(
    f"torch_limit got_mib {len(held) * 64} meminfo_total_mib {total >> 20} "
    f"meminfo_free_mib {free >> 20} error {err}"
)
