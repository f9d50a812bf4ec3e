//! Names of the environment variables vgpu reads. They are the ones
//! HAMi-core's `libvgpu.so` reads (<https://github.com/Project-HAMi/HAMi-core>), so a container
//! set up for HAMi works unchanged.

/// Memory limit for every device; `_<N>` suffixed variants override per device.
pub const MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
/// SM (compute) share in percent; `_<N>` suffixed variants override per device.
pub const SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
/// Path of the shared region file.
pub const SHARED_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
/// HAMi's default region path when [`SHARED_CACHE`] is unset.
pub const SHARED_CACHE_DEFAULT: &str = "/tmp/cudevshr.cache";
/// The directory a host mounts at the same path on the node and in the
/// container (KAI's resource isolator: `/usr/local/vgpu`); with [`POD_UID`]
/// and [`CONTAINER_NAME`] and no [`SHARED_CACHE`], the region lies at
/// `<mount>/containers/<pod uid>_<container>/usage.cache`, where a node
/// monitor finds it (HAMi-core's layout for hosts that set no cache path).
pub const CONTAINER_VGPU_MOUNT: &str = "CONTAINER_VGPU_MOUNT";
pub const POD_UID: &str = "POD_UID";
pub const CONTAINER_NAME: &str = "CONTAINER_NAME";
/// The region file's name in a per-container directory named by the three.
pub const PER_CONTAINER_CACHE: &str = "usage.cache";
/// `true`: HAMi's device plugin hands out more memory than the device has
/// (`deviceMemoryScaling` above 1); an allocation that fits the limit but
/// not the device may be served from host memory.
pub const OVERSUBSCRIBE: &str = "CUDA_OVERSUBSCRIBE";
/// With `CUDA_OVERSUBSCRIBE`, device memory left free for what cannot go to
/// host memory (GPU code loaded later, libraries' own allocations): a size
/// as the limits take it; default `OVERSUBSCRIBE_RESERVE_DEFAULT`.
pub const OVERSUBSCRIBE_RESERVE: &str = "VGPU_OVERSUBSCRIBE_RESERVE";
pub const OVERSUBSCRIBE_RESERVE_DEFAULT: u64 = 512 << 20;
/// `default` / `force` / `disable`.
pub const UTILIZATION_POLICY: &str = "GPU_CORE_UTILIZATION_POLICY";
/// Written into the region's `priority` when the region is created.
pub const TASK_PRIORITY: &str = "CUDA_TASK_PRIORITY";
/// 0 errors … 4 debug.
pub const LOG_LEVEL: &str = "LIBCUDA_LOG_LEVEL";
/// The container runtime's device list; HAMi's device plugin sets it to the
/// UUIDs of the devices it allocated, in the order of the `_<N>` limits.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// The CUDA driver's own device selection, per process (`vgpu trace`
/// reads it to name a context's device).
pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";
/// Directory HAMi's device plugin bind-mounts per container (host side).
pub const HAMI_CONTAINERS_DIR: &str = "/usr/local/vgpu/containers";
