//! libvgpu.so: the CUDA/NVML interposer (see docs/hook.md).
