//! Shared regions as an operator (and the daemon) sees them: finding them
//! under HAMi's container directory ([`discover`]), telling whether the
//! processes in their slots are alive from the host ([`liveness`]), a
//! snapshot with findings ([`summary`]), and the admin operations that write
//! them ([`admin`]).

pub mod admin;
pub mod discover;
pub mod liveness;
pub mod summary;
pub mod top;
