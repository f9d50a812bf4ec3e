//! Types shared by every part of vgpu.
//!
//! `no_std` so the eBPF programs can use the event records; the `std`
//! feature adds what only host code needs (limit parsing, the mapped view
//! over a region file, the unmapped access privileged processes use, the
//! region lock).
#![cfg_attr(not(feature = "std"), no_std)]

pub mod entry;
pub mod env;
pub mod event;
pub mod paths;
#[cfg(not(target_arch = "bpf"))]
pub mod region;

#[cfg(feature = "std")]
pub mod abi;
#[cfg(feature = "std")]
pub mod clock;
#[cfg(feature = "std")]
pub mod devices;
#[cfg(feature = "std")]
pub mod limit;
#[cfg(feature = "std")]
pub mod lock;
#[cfg(feature = "std")]
pub mod node;
#[cfg(feature = "std")]
pub mod proc_identity;
#[cfg(feature = "std")]
pub mod reclaim;
#[cfg(feature = "std")]
pub mod region_io;
#[cfg(feature = "std")]
pub mod region_place;
#[cfg(feature = "std")]
pub mod shared_file;
#[cfg(feature = "std")]
pub mod sidecar;
#[cfg(feature = "std")]
pub mod view;
