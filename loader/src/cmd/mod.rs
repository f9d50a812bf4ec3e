//! One module per subcommand.

pub mod cleanup;
pub mod daemon;
pub mod inspect;
pub mod install_hook;
pub mod set_limit;
pub mod suspend;
pub mod trace;
pub mod turns;
pub mod unlock;
