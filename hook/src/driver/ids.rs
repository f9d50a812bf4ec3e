//! The devices CUDA and NVML list, by UUID: what the container's device
//! table (`crate::devices`) is built from. Apart from the rest of the
//! driver seam because the real driver translates every device it names
//! through that table: the table imports only this.

#![forbid(unsafe_code)]

use std::ffi::c_int;

use crate::ffi::nvmlDevice_t;

/// The devices CUDA and NVML list, by UUID.
pub(crate) trait DeviceIds: Sync {
    /// How many devices CUDA shows this process.
    fn cuda_count(&self) -> Option<c_int>;
    /// The UUID of CUDA ordinal `ordinal`.
    fn cuda_uuid(&self, ordinal: usize) -> Option<[u8; 16]>;
    /// The UUIDs NVML lists, in its index order (empty without NVML).
    fn nvml_uuids(&self) -> Vec<String>;
    /// NVML's handle of the device whose UUID is `uuid`.
    fn nvml_by_uuid(&self, uuid: &str) -> Option<nvmlDevice_t>;
    /// The UUID of NVML's device `dev`.
    fn nvml_uuid(&self, dev: nvmlDevice_t) -> Option<String>;
    /// NVML's index of its device `dev`.
    fn nvml_index(&self, dev: nvmlDevice_t) -> Option<u32>;
}
