//! What the overhead bench reads from Linux's `/proc`: a process's CPU time and resident memory,
//! the whole machine's CPU time (to tell how much of it other processes took), the load average,
//! and the open-files limit that thousands of streams through several ways need raised.
//! Everything here answers `None` where there is no `/proc`, and the report prints "n/a".

use std::process::Command;

/// User plus system CPU time of `pid`, all its threads, in clock ticks.
pub(crate) fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses; the fields proper follow the last `)`,
    // starting with field 3 (state), so utime (14) and stime (15) are the 12th and 13th.
    let mut fields = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// A process's CPU time read to the nanosecond: the time each of its threads has run
/// (`/proc/PID/task/TID/schedstat`, the scheduler's own account), and the clock-tick figure
/// beside it for when a thread came or went between two readings (an exited thread's time is
/// no longer listed per thread).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CpuReading {
    ns: Option<u64>,
    threads: Vec<u32>,
    ticks: u64,
    /// The time the OpenTelemetry exporter's thread (`tokenmeter-otel`) has run, when there is
    /// one: its share of the process's CPU is export's own cost, read without the noise of
    /// comparing two processes.
    exporter_ns: Option<u64>,
}

/// The CPU time of `pid`, all its threads.
pub(crate) fn cpu_reading(pid: u32) -> Option<CpuReading> {
    let ticks = cpu_ticks(pid)?;
    let mut threads = Vec::new();
    let mut ns = Some(0u64);
    let mut exporter_ns = None;
    match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(tasks) => {
            for task in tasks.flatten() {
                let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                    continue;
                };
                threads.push(tid);
                let ran = std::fs::read_to_string(task.path().join("schedstat"))
                    .ok()
                    .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
                ns = ns.zip(ran).map(|(a, b)| a + b);
                let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
                if comm.trim_end() == "tokenmeter-otel" {
                    exporter_ns = ran;
                }
            }
        }
        Err(_) => ns = None,
    }
    threads.sort_unstable();
    Some(CpuReading {
        ns,
        threads,
        ticks,
        exporter_ns,
    })
}

/// Nanoseconds the exporter thread ran between two readings, when both saw it.
pub(crate) fn exporter_ns_between(before: &CpuReading, after: &CpuReading) -> Option<u64> {
    after.exporter_ns?.checked_sub(before.exporter_ns?)
}

/// Nanoseconds of CPU between two readings of one process: the threads' own account when the
/// same threads ran throughout, else the clock ticks (10 ms each on every Linux build).
pub(crate) fn cpu_ns_between(before: &CpuReading, after: &CpuReading, tick_ns: u64) -> u64 {
    match (before.ns, after.ns) {
        (Some(b), Some(a)) if before.threads == after.threads && a >= b => a - b,
        _ => after.ticks.saturating_sub(before.ticks) * tick_ns,
    }
}

/// Busy and total CPU ticks of the whole machine, all cores, from `/proc/stat`. Busy is user,
/// nice and system time plus what the hypervisor stole; interrupt time is left out because the
/// kernel spends it on this run's own loopback traffic without charging any process for it.
pub(crate) fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user already)
    let [user, nice, system, idle, iowait, irq, softirq, steal, ..] = fields[..] else {
        return None;
    };
    let busy = user + nice + system + steal;
    Some((busy, busy + idle + iowait + irq + softirq))
}

/// CPU ticks of all of `pids` together.
pub(crate) fn ticks_of(pids: &[u32]) -> Option<u64> {
    pids.iter().map(|&pid| cpu_ticks(pid)).sum()
}

/// Busy ticks of other processes and all ticks of the machine between two readings of
/// ([`machine_ticks`], our processes' ticks). A lower bound: softirq time spent on our own
/// loopback traffic may be charged to our processes but is not in the machine's busy time.
pub(crate) fn others_between(
    before: Option<((u64, u64), u64)>,
    after: Option<((u64, u64), u64)>,
) -> Option<(u64, u64)> {
    let (((busy0, all0), ours0), ((busy1, all1), ours1)) = (before?, after?);
    Some((
        busy1
            .saturating_sub(busy0)
            .saturating_sub(ours1.saturating_sub(ours0)),
        all1.saturating_sub(all0),
    ))
}

/// A `kB` line of `/proc/<pid>/status`, such as `VmRSS:`.
pub(crate) fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}

/// Resident memory of `pid` now, in KiB.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// The 1-, 5- and 15-minute load averages, as `uptime` prints them.
pub(crate) fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let fields: Vec<&str> = text.split_whitespace().take(3).collect();
    (fields.len() == 3).then(|| fields.join(", "))
}

/// Clock ticks per second, from `getconf CLK_TCK`; 100 (every Linux build) if that fails.
pub(crate) fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(100)
}

/// The soft and hard limits on open files of this process, from `/proc/self/limits`.
fn open_files_limits() -> Option<(u64, u64)> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut fields = line.split_whitespace().skip(3);
    let soft = fields.next()?.parse().ok()?;
    // "unlimited" is as good as any number here.
    let hard = fields.next()?.parse().unwrap_or(u64::MAX);
    Some((soft, hard))
}

/// Makes room for `needed` open files, raising the soft limit towards the hard one if it must.
/// Called before the proxies start, so they inherit the raised limit. Many desktops start at a
/// soft limit of 1,024, far too few for 1,024 streams; `prlimit` (util-linux) raises it without
/// `unsafe`. Returns the error to report otherwise.
pub(crate) fn ensure_open_files(needed: u64) -> Result<(), String> {
    let Some((soft, hard)) = open_files_limits() else {
        return Ok(());
    };
    if soft >= needed {
        return Ok(());
    }
    let wanted = needed.next_power_of_two().min(hard);
    let _ = Command::new("prlimit")
        .arg("--pid")
        .arg(std::process::id().to_string())
        .arg(format!("--nofile={wanted}:"))
        .status();
    match open_files_limits() {
        Some((soft, _)) if soft >= needed => Ok(()),
        Some((soft, _)) => Err(format!(
            "needs about {needed} open files and the limit is {soft}; raise it with `ulimit -n {}` or run fewer streams (TOKENMETER_BENCH_STREAMS)",
            needed.next_power_of_two()
        )),
        None => Ok(()),
    }
}
