//! What the kernel says about a process and the machine: CPU time (utime + stime, the
//! figure the targets are stated in), peak resident memory, and the load other
//! processes put on the machine while a phase runs (the benchmark shares two cores with
//! whoever else builds or tests here, so every figure carries that context).

use std::sync::OnceLock;

/// Clock ticks per second of `/proc/*/stat` times (100 on Linux, asked once).
fn ticks_per_second() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
        let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if t > 0 {
            t as f64
        } else {
            100.0
        }
    })
}

/// utime + stime of process `pid` (all its threads), in seconds; `None` once it is gone.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    cpu_from_stat(&stat)
}

/// utime + stime of this process, in seconds.
pub fn self_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    cpu_from_stat(&stat)
}

fn cpu_from_stat(stat: &str) -> Option<f64> {
    let (utime, stime) = user_system_from_stat(stat)?;
    Some(utime + stime)
}

/// (utime, stime) in seconds.
fn user_system_from_stat(stat: &str) -> Option<(f64, f64)> {
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ... utime is field 14, stime 15 (1-based, whole line).
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime / ticks_per_second(), stime / ticks_per_second()))
}

/// The kernel's (system) part of process `pid`'s CPU time, in seconds.
pub fn system_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    user_system_from_stat(&stat).map(|(_, s)| s)
}

/// Whether process `pid` still runs (not gone, not a zombie waiting to be reaped).
pub fn is_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat.get(i + 2..i + 3))
        .unwrap_or("");
    !matches!(state, "Z" | "X" | "x" | "")
}

/// A `Vm*` line of `/proc/PID/status` (`VmHWM` = peak RSS), in bytes.
pub fn vm_bytes(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        let value = line.strip_prefix(key)?.strip_prefix(':')?;
        let kib: u64 = value.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib * 1024)
    })
}

/// CPU seconds the whole machine spent busy (every core: user, nice, system, irq,
/// softirq, steal), from the first line of `/proc/stat`.
pub fn machine_busy_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy = f.first()? + f.get(1)? + f.get(2)? + f.get(5)? + f.get(6)? + f.get(7)?;
    Some(busy / ticks_per_second())
}

/// The 1, 5 and 15 minute load averages.
pub fn loadavg() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// Online CPUs.
pub fn cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// `uname -sr`, roughly: the kernel release.
pub fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_a_strange_name() {
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0";
        let s = cpu_from_stat(stat).expect("parses");
        assert!((s - 300.0 / ticks_per_second()).abs() < 1e-9);
    }
}
