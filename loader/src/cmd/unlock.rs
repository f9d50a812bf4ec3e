//! `vgpu unlock`: recover a region lock whose holder died.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::regions::admin::unlock;

/// Recover a region's lock after its holder died.
///
/// vgpu's region lock is an OFD lock on the file, which the kernel releases
/// when the holder dies, so there is never a lock to break. What is left
/// behind is owner_pid naming the dead process (and, with a HAMi-core
/// process, its semaphore stuck at 0). This clears owner_pid when it names
/// a dead process, and resets HAMi-core's semaphore from 0 to 1 when its
/// owner is dead. Refuses while the lock is held by a live process ("held
/// by live pid N"), while owner_pid is alive, or while the lock is held by
/// a process that did not record itself.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The region file.
    path: PathBuf,
}

/// Runs `vgpu unlock`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let file =
        crate::regions::open::open_region(&args.path, crate::regions::open::Access::ReadWrite)?;
    let r = unlock(&file)?;
    if r.owner_pid == 0 {
        println!("the region lock is free and no owner is recorded; nothing to do");
    } else if r.cleared_owner {
        println!(
            "owner_pid {} was dead: cleared it (the kernel had already released its region lock)",
            r.owner_pid
        );
    } else {
        println!("owner_pid changed while recovering; nothing cleared (run vgpu inspect)");
    }
    if r.sem_reset {
        println!("reset HAMi-core's semaphore from 0 to 1 (its owner was dead)");
    }
    if r.sem_zero_without_owner {
        println!(
            "note: HAMi-core's semaphore is 0 but no owner is recorded; left alone \
             (a HAMi-core process may be between taking it and recording itself)"
        );
    }
    Ok(ExitCode::SUCCESS)
}
