"""Device memory of other clients against the hook's count, stage by stage.
    python3 mem_clients.py VGPU REGION torch-expandable|cupy|jax
Under the hook, one GPU; prints what vllm_like.stager prints at each stage.
"""
import os, sys

from vllm_like import stager


def torch_expandable(vgpu, region):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch
    dev = torch.cuda.current_device()
    stage = stager(vgpu, region, dev, "GPU-" + str(torch.cuda.get_device_properties(dev).uuid),
                   torch.cuda.synchronize)
    torch.zeros(1, device="cuda")
    stage("context (expandable_segments)")
    xs = [torch.empty(n << 20, dtype=torch.uint8, device="cuda") for n in (1, 3, 20, 100, 300, 600)]
    stage("1+3+20+100+300+600 MiB tensors")
    del xs[3:]
    torch.cuda.empty_cache()
    stage("three largest freed, cache emptied")
    del xs
    torch.cuda.empty_cache()
    stage("all freed")


def cupy_client(vgpu, region):
    import cupy as cp
    dev = cp.cuda.Device().id
    uuid = "GPU-" + cp.cuda.runtime.getDeviceProperties(dev)["uuid"].hex()
    uuid = uuid[:12] + "-" + uuid[12:16] + "-" + uuid[16:20] + "-" + uuid[20:24] + "-" + uuid[24:]
    stage = stager(vgpu, region, dev, uuid, cp.cuda.Device().synchronize)
    cp.zeros(1)
    stage("context (CuPy)")
    xs = [cp.empty(n << 20, dtype=cp.uint8) for n in (1, 3, 20, 100, 300, 600)]
    stage("1+3+20+100+300+600 MiB arrays")
    del xs
    cp.get_default_memory_pool().free_all_blocks()
    stage("freed, pool emptied")


def jax_client(vgpu, region):
    import jax, jax.numpy as jnp
    import subprocess
    d = jax.devices()[0]
    uuid = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", str(d.id)],
                          capture_output=True, text=True).stdout.strip()
    stage = stager(vgpu, region, d.id, uuid, lambda: jnp.zeros(1).block_until_ready())
    jnp.zeros(1).block_until_ready()
    stage("context (JAX, preallocated)")
    xs = [jnp.ones((n << 18,), dtype=jnp.float32) for n in (100, 300, 600)]
    [x.block_until_ready() for x in xs]
    stage("100+300+600 MiB arrays")


if __name__ == "__main__":
    {"torch-expandable": torch_expandable, "cupy": cupy_client, "jax": jax_client}[sys.argv[3]](
        sys.argv[1], sys.argv[2])
