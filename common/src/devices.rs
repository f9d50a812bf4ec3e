//! Which physical device each CUDA ordinal of a process is, and its index
//! in its container, from the host's NVML list and the process's
//! environment (`vgpu trace` labels context calls with it), and the
//! container's device order the hook indexes shared words by.
//!
//! The container index is the one the hook indexes every shared per-device
//! word by (hook/src/devices.rs): the device's position in
//! `NVIDIA_VISIBLE_DEVICES` when that lists UUIDs (HAMi's device plugin
//! sets it to the devices it allocated, in the order of its `_<i>`
//! limits), else its position among the container's devices in NVML order.
//!
//! The values come from a file the tenant controls
//! (`/proc/<pid>/environ`): anything unexpected names fewer devices, never
//! an error.

/// One CUDA ordinal of a process, as the host names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrdinalDevice {
    /// NVML's UUID (`GPU-…`).
    pub uuid: String,
    /// The device's index in its container.
    pub index: usize,
}

/// A UUID (or a prefix of one) rather than an index.
fn is_uuid(s: &str) -> bool {
    s.starts_with("GPU-") || s.starts_with("MIG-")
}

/// The entries of a comma-separated device list, trimmed, empty ones left out.
fn entries(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// Where the NVML list a caller passes comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NvmlView {
    /// The host's devices (the daemon, `vgpu trace`): host indices in
    /// `NVIDIA_VISIBLE_DEVICES` select from it.
    Host,
    /// The container's own devices (the hook): the runtime already left out
    /// the others, so host indices say nothing more.
    Container,
}

/// The container's devices in its index order: the UUIDs of
/// `NVIDIA_VISIBLE_DEVICES` when it lists only UUIDs (HAMi's device plugin
/// lists the devices it allocated in the order of its `_<i>` limits; a
/// prefix is completed from `nvml`), else the `nvml` devices it names by
/// host index (unset, empty or `all`: every one), in NVML order.
pub fn container_devices(
    nvml: &[String],
    nvidia_visible: Option<&str>,
    view: NvmlView,
) -> Vec<String> {
    let listed: Vec<&str> = nvidia_visible
        .map(|v| entries(v).collect())
        .unwrap_or_default();
    if listed.is_empty() || listed.contains(&"all") {
        return nvml.to_vec();
    }
    if listed.iter().all(|l| is_uuid(l)) {
        return listed
            .iter()
            .map(|l| {
                nvml.iter()
                    .find(|u| u.starts_with(l))
                    .cloned()
                    .unwrap_or_else(|| (*l).to_owned())
            })
            .collect();
    }
    match view {
        NvmlView::Container => nvml.to_vec(),
        NvmlView::Host => nvml
            .iter()
            .enumerate()
            .filter(|(i, u)| {
                listed.iter().any(|l| {
                    if is_uuid(l) {
                        u.starts_with(l)
                    } else {
                        l.parse::<usize>().is_ok_and(|n| n == *i)
                    }
                })
            })
            .map(|(_, u)| u.clone())
            .collect(),
    }
}

/// The devices a process's CUDA driver sees, by CUDA ordinal.
///
/// - `host`: the host's device UUIDs in NVML index order.
/// - `nvidia_visible`: the container's `NVIDIA_VISIBLE_DEVICES`
///   ([`container_devices`]); entries naming no host device (`none`,
///   `void`, a MIG device) are left out. The driver enumerates the
///   container's devices in NVML order.
/// - `cuda_visible`: the process's `CUDA_VISIBLE_DEVICES`: ordinals into
///   that enumeration or UUID prefixes, read up to the first entry that
///   names no device or repeats one (as the CUDA driver does); unset:
///   every container device in order.
pub fn process_devices(
    host: &[String],
    nvidia_visible: Option<&str>,
    cuda_visible: Option<&str>,
) -> Vec<OrdinalDevice> {
    let by_index = container_devices(host, nvidia_visible, NvmlView::Host);
    let enumerated: Vec<&str> = host
        .iter()
        .filter(|u| by_index.contains(u))
        .map(String::as_str)
        .collect();
    let picked: Vec<&str> = match cuda_visible {
        None => enumerated.clone(),
        Some(v) => {
            let mut out: Vec<&str> = Vec::new();
            for item in v.split(',').map(str::trim) {
                let found = if is_uuid(item) {
                    enumerated.iter().find(|c| c.starts_with(item)).copied()
                } else {
                    item.parse::<usize>()
                        .ok()
                        .and_then(|i| enumerated.get(i).copied())
                };
                match found {
                    Some(d) if !out.contains(&d) => out.push(d),
                    _ => break,
                }
            }
            out
        }
    };
    picked
        .into_iter()
        .filter_map(|u| {
            Some(OrdinalDevice {
                uuid: u.to_owned(),
                index: by_index.iter().position(|c| c == u)?,
            })
        })
        .collect()
}

/// The value of `name` in a `/proc/<pid>/environ` image (NUL-separated
/// `NAME=value` entries); the first one wins, as `getenv` does. A value
/// that is not UTF-8 is read lossily (its devices then name nothing).
pub fn environ_value(environ: &[u8], name: &str) -> Option<String> {
    environ
        .split(|&b| b == 0)
        .find_map(|e| {
            e.strip_prefix(name.as_bytes())
                .and_then(|rest| rest.strip_prefix(b"="))
        })
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "GPU-aaaaaaaa-0000";
    const B: &str = "GPU-bbbbbbbb-1111";
    const C: &str = "GPU-cccccccc-2222";

    fn host() -> Vec<String> {
        [A, B, C].iter().map(|s| s.to_string()).collect()
    }

    /// (uuid, index) of each ordinal.
    fn map(nv: Option<&str>, cuda: Option<&str>) -> Vec<(&'static str, usize)> {
        process_devices(&host(), nv, cuda)
            .into_iter()
            .map(|d| {
                let u = [A, B, C].into_iter().find(|u| *u == d.uuid).unwrap_or("?");
                (u, d.index)
            })
            .collect()
    }

    #[test]
    fn without_either_variable_ordinals_are_nvmls_devices() {
        let all = vec![(A, 0), (B, 1), (C, 2)];
        assert_eq!(map(None, None), all);
        assert_eq!(map(Some("all"), None), all);
        assert_eq!(map(Some(""), None), all);
    }

    #[test]
    fn cuda_visible_devices_picks_and_orders_the_containers_devices() {
        assert_eq!(map(None, Some("1")), vec![(B, 1)]);
        assert_eq!(map(None, Some("2,0")), vec![(C, 2), (A, 0)]);
        assert_eq!(map(None, Some("GPU-bbbb,0")), vec![(B, 1), (A, 0)]);
        // Up to the first entry that names no device, or repeats one.
        assert_eq!(map(None, Some("1,7,0")), vec![(B, 1)]);
        assert_eq!(map(None, Some("1,x,0")), vec![(B, 1)]);
        assert_eq!(map(None, Some("1,1,0")), vec![(B, 1)]);
        assert_eq!(map(None, Some("")), vec![]);
    }

    #[test]
    fn host_indices_filter_in_nvml_order_and_index_by_position() {
        // The container sees B and C as its devices 0 and 1, whatever the
        // list's order.
        assert_eq!(map(Some("2,1"), None), vec![(B, 0), (C, 1)]);
        // CUDA ordinals index the container's devices, not the host's.
        assert_eq!(map(Some("2,1"), Some("1")), vec![(C, 1)]);
        assert_eq!(map(Some("2,1"), Some("2")), vec![]);
    }

    #[test]
    fn a_uuid_list_gives_the_container_index_by_its_own_order() {
        let nv = format!("{C},{A}");
        // The driver enumerates in NVML order; the index is the list's.
        assert_eq!(map(Some(&nv), None), vec![(A, 1), (C, 0)]);
        assert_eq!(map(Some(&nv), Some("1")), vec![(C, 0)]);
        assert_eq!(map(Some("GPU-cccc"), Some("0")), vec![(C, 0)], "a prefix");
    }

    #[test]
    fn hostile_values_name_fewer_devices_and_never_fail() {
        assert_eq!(map(Some("none"), None), vec![]);
        assert_eq!(map(Some("void"), Some("0")), vec![]);
        assert_eq!(map(Some("GPU-zzzz"), None), vec![]);
        assert_eq!(map(Some(",,,"), None), map(None, None));
        assert_eq!(map(None, Some("-1")), vec![]);
        assert_eq!(map(None, Some("99999999999999999999999")), vec![]);
        let long = "0,".repeat(100_000);
        assert_eq!(map(Some(&long), Some(&long)), vec![(A, 0)]);
        assert_eq!(process_devices(&[], Some("all"), Some("0")), vec![]);
    }

    #[test]
    fn the_container_order_is_the_uuid_list_else_nvmls() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let h = host();
        for view in [NvmlView::Host, NvmlView::Container] {
            assert_eq!(container_devices(&h, None, view), h);
            assert_eq!(container_devices(&h, Some("all"), view), h);
            assert_eq!(
                container_devices(&h, Some(&format!("{C},{A}")), view),
                s(&[C, A])
            );
            assert_eq!(
                container_devices(&h, Some("GPU-bbbb"), view),
                s(&[B]),
                "a prefix is completed"
            );
        }
        assert_eq!(
            container_devices(&h, Some("2,0"), NvmlView::Host),
            s(&[A, C])
        );
        assert_eq!(
            container_devices(&h, Some("2,0"), NvmlView::Container),
            h,
            "inside, NVML lists only the container's devices already"
        );
    }

    #[test]
    fn environ_values_are_found_exactly_and_first_wins() {
        let env = b"PATH=/bin\0XCUDA_VISIBLE_DEVICES=9\0CUDA_VISIBLE_DEVICES=1,0\0CUDA_VISIBLE_DEVICES=2\0EMPTY=\0";
        assert_eq!(
            environ_value(env, "CUDA_VISIBLE_DEVICES").as_deref(),
            Some("1,0")
        );
        assert_eq!(environ_value(env, "EMPTY").as_deref(), Some(""));
        assert_eq!(environ_value(env, "PAT"), None);
        assert_eq!(environ_value(env, "NVIDIA_VISIBLE_DEVICES"), None);
        assert_eq!(
            environ_value(b"V=\xff1\0", "V").as_deref(),
            Some("\u{fffd}1")
        );
    }
}
