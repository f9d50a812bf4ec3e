//! Shared regions as an operator (and the daemon) sees them: finding them
//! under HAMi's container directory ([`discover`]), telling whether the
//! processes in their slots are alive from the host ([`liveness`]), a
//! snapshot with findings ([`summary`]), the admin operations that write
//! them ([`admin`]), and opening them safely ([`open`]).

pub mod admin;
pub mod discover;
pub mod liveness;
pub mod open;
pub mod summary;
pub mod top;
