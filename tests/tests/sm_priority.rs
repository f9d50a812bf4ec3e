//! Priority (`CUDA_TASK_PRIORITY`) as HAMi deploys it: its device plugin
//! always sets `CUDA_DEVICE_SM_LIMIT`, 0 when the pod asks no `gpucores`
//! and 100 for a whole share. Both mean "no cap", like the variable unset,
//! and priority must work the same in all three: a trainer at priority 1
//! beside a service at priority 0 keeps its queue short while the service is
//! active. The daemon plans the holds (from the containers' runtime specs
//! and NVML), so every test runs it, with its containers as the kubelet
//! lays them out (`vgpu_tests::planned`). Timing-sensitive, so the tests
//! run one at a time. Needs the built artifacts (`cargo xtask test`).

use std::sync::Mutex;
use std::time::Duration;

use vgpu_tests::planned::{PlannedNode, Tenant};
use vgpu_tests::sim::SimGpu;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts `sm_loop kernel busy_500us 8` in a container of `node` at
/// `priority` (`None`: unset, as HAMi leaves it for a pod that asks no
/// `nvidia.com/priority`), with `CUDA_DEVICE_SM_LIMIT` set to `limit`
/// (unset: `None`) and the policy HAMi's monitor runs most clusters with
/// (`force`), in its runtime spec and its environment alike.
fn start(
    node: &PlannedNode,
    gpu: &SimGpu,
    salt: u64,
    (limit, priority): (Option<&str>, Option<&str>),
    extra: &[(&str, &str)],
) -> Tenant {
    let exe = vgpu_tests::dist::compile_c("sm_loop", &node.wd.path("out"), false);
    let mut vars = vec![("GPU_CORE_UTILIZATION_POLICY", "force")];
    vars.extend_from_slice(extra);
    if let Some(l) = limit {
        vars.push(("CUDA_DEVICE_SM_LIMIT", l));
    }
    if let Some(p) = priority {
        vars.push(("CUDA_TASK_PRIORITY", p));
    }
    let name = format!("prio-{salt}");
    node.run(
        gpu,
        salt,
        &name,
        &vars,
        &exe,
        &["kernel", "busy_500us", "8"],
    )
}

/// The service (priority 0) and the trainer (`trainer`: 1, or unset, which
/// HAMi's default makes 1), both at `limit`, with the daemon planning: the
/// service gets nearly all of the device, the trainer a little (held, not
/// starved). Equal shares would mean priority did nothing. Two runs of
/// three must hold, so one run a loaded host delays decides nothing either
/// way.
fn priority_holds_at(limit: Option<&str>, trainer: Option<&str>) {
    priority_holds_with(limit, trainer, &[]);
}

/// [`priority_holds_at`], the trainer's environment and spec with `extra`.
fn priority_holds_with(limit: Option<&str>, trainer: Option<&str>, extra: &[(&str, &str)]) {
    let what =
        format!("priority 0 beside CUDA_TASK_PRIORITY={trainer:?}, CUDA_DEVICE_SM_LIMIT={limit:?}");
    let mut runs = Vec::new();
    let (mut held, mut not) = (0, 0);
    while held < 2 && not < 2 {
        let gpu = SimGpu::new();
        let node = PlannedNode::start("prio", &gpu);
        let hi = start(&node, &gpu, 1, (limit, Some("0")), &[]);
        let lo = start(&node, &gpu, 2, (limit, trainer), extra);
        std::thread::sleep(Duration::from_millis(1500));
        let s = gpu.process_shares(Duration::from_secs(2), &[hi.pid(), lo.pid()]);
        eprintln!("{what}: high {:.1}%, low {:.1}%", s[0], s[1]);
        let ok = s[0] > 85.0 && s[1] > 0.2 && s[1] < 10.0;
        if ok {
            held += 1;
        } else {
            not += 1;
            eprintln!("{}", node.daemon.log_text());
        }
        let verdict = if ok { "held" } else { "not held" };
        runs.push(format!("high {:.1}%, low {:.1}% ({verdict})", s[0], s[1]));
    }
    assert!(
        held == 2,
        "{what}: {not} runs of {} not held (high > 85 and low 0.2..10 in two of three): {}",
        runs.len(),
        runs.join("; ")
    );
}

#[test]
fn sm_priority_holds_with_the_limit_unset() {
    let _s = serial();
    priority_holds_at(None, Some("1"));
}

#[test]
fn sm_priority_holds_at_limit_0_as_hami_sets_it_without_gpucores() {
    let _s = serial();
    priority_holds_at(Some("0"), Some("1"));
}

#[test]
fn sm_priority_holds_at_limit_100_as_hami_sets_it_for_a_whole_share() {
    let _s = serial();
    priority_holds_at(Some("100"), Some("1"));
}

/// HAMi sets `CUDA_TASK_PRIORITY` only for a pod that asks
/// `nvidia.com/priority`; every other container has HAMi's default, 1
/// (the lowest of its two classes). A service that asks for 0 must hold
/// such a trainer too, at the limits HAMi sets.
#[test]
fn sm_priority_holds_a_trainer_that_states_none_at_limit_0() {
    let _s = serial();
    priority_holds_at(Some("0"), None);
}

#[test]
fn sm_priority_holds_a_trainer_that_states_none_at_limit_100() {
    let _s = serial();
    priority_holds_at(Some("100"), None);
}

/// A trainer whose `VGPU_SM_NODE_DIR` is empty (which once turned
/// priority off for its GPU, as did a junk file in the node directory):
/// the daemon's plan does not depend on any node directory, and it holds.
#[test]
fn sm_priority_holds_a_trainer_whose_node_dir_is_empty() {
    let _s = serial();
    priority_holds_with(Some("0"), None, &[("VGPU_SM_NODE_DIR", "")]);
}
