//! eBPF event records shared by `ebpf/` and `loader/` (filled in by the trace work).
