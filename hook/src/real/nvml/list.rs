//! NVML's list queries (`nvmlDeviceGetComputeRunningProcesses_v2/_v3`,
//! `nvmlDeviceGetProcessUtilization`) fill a caller's buffer and answer
//! `NVML_ERROR_INSUFFICIENT_SIZE`, with the count they need, when it is too
//! small: [`grow_list`] is the one loop that grows the buffer and asks
//! again. (The loader asks NVML through the nvml-wrapper crate, which has
//! this loop inside; the hook cannot use that crate: it calls the real
//! library through its own function table, never through its own exports.)

use std::ffi::c_uint;

use super::NvmlError;
use crate::ffi::{nvmlReturn_t, NVML_ERROR_INSUFFICIENT_SIZE, NVML_SUCCESS};

/// Entries the first call has room for.
const FIRST: usize = 64;
/// Calls before giving up on a list that keeps growing.
const TRIES: usize = 4;
/// Room added beyond what NVML asked for: the list may grow between calls.
const SLACK: usize = 16;

/// Calls `call(buf, count)` with a buffer of default entries and `count`
/// its length (`call` hands both to NVML), growing it while NVML answers
/// `NVML_ERROR_INSUFFICIENT_SIZE`. Returns the entries NVML filled, never
/// more than the buffer.
///
/// # Errors
/// NVML's code; `NVML_ERROR_INSUFFICIENT_SIZE` when the list outgrew every
/// try.
pub(super) fn grow_list<T: Clone + Default>(
    mut call: impl FnMut(&mut [T], &mut c_uint) -> nvmlReturn_t,
) -> Result<Vec<T>, NvmlError> {
    let mut cap = FIRST;
    for _ in 0..TRIES {
        let mut buf = vec![T::default(); cap];
        // `count` never exceeds the buffer, whatever `cap` is.
        let mut count = c_uint::try_from(cap).unwrap_or(c_uint::MAX);
        match call(&mut buf, &mut count) {
            NVML_SUCCESS => {
                buf.truncate((count as usize).min(cap));
                return Ok(buf);
            }
            NVML_ERROR_INSUFFICIENT_SIZE => cap = (count as usize).max(cap) + SLACK,
            rc => return Err(NvmlError(rc)),
        }
    }
    Err(NvmlError(NVML_ERROR_INSUFFICIENT_SIZE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::NVML_ERROR_NOT_FOUND;

    /// A fake list query over `have` entries (each its index + 1): what
    /// NVML does with the buffer and the count.
    fn fake(have: usize, buf: &mut [u32], count: &mut c_uint) -> nvmlReturn_t {
        if (*count as usize) < have {
            *count = have as c_uint;
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (i, e) in buf.iter_mut().take(have).enumerate() {
            *e = i as u32 + 1;
        }
        *count = have as c_uint;
        NVML_SUCCESS
    }

    #[test]
    fn a_short_buffer_is_grown_and_the_call_made_again() {
        let mut calls = Vec::new();
        let got = grow_list(|buf: &mut [u32], count| {
            calls.push((buf.len(), *count));
            fake(100, buf, count)
        })
        .unwrap();
        assert_eq!(got, (1..=100).collect::<Vec<u32>>());
        assert_eq!(calls, vec![(64, 64), (116, 116)]);
        // A short list: one call, only the filled entries.
        assert_eq!(
            grow_list(|b: &mut [u32], c| fake(3, b, c)),
            Ok(vec![1, 2, 3])
        );
    }

    #[test]
    fn other_errors_pass_through_and_a_list_that_keeps_growing_gives_up() {
        assert_eq!(
            grow_list(|_: &mut [u32], _| NVML_ERROR_NOT_FOUND),
            Err(NvmlError(NVML_ERROR_NOT_FOUND))
        );
        let mut have = FIRST;
        let mut calls = 0;
        let got = grow_list(|b: &mut [u32], c| {
            calls += 1;
            have *= 4;
            fake(have, b, c)
        });
        assert_eq!(got, Err(NvmlError(NVML_ERROR_INSUFFICIENT_SIZE)));
        assert_eq!(calls, TRIES);
    }

    /// A count past the buffer (a driver that lies) never reads past it.
    #[test]
    fn a_count_past_the_buffer_is_clamped() {
        let got = grow_list(|b: &mut [u32], c| {
            b.fill(7);
            *c = 1000;
            NVML_SUCCESS
        })
        .unwrap();
        assert_eq!(got, vec![7; FIRST]);
    }
}
