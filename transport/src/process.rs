//! The metrics every flopwatch process exports about itself, under the
//! names client libraries of other languages use, so the usual process
//! dashboards and alerts apply: `process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_virtual_memory_bytes`,
//! `process_start_time_seconds`, `process_open_fds`, `process_max_fds`, and
//! `flopwatch_build_info{component,version,arch,os} 1`.
//!
//! The process figures come from `/proc/self` (Linux). Where it cannot be
//! read, the process families are left out rather than reported as zero.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

/// Clock ticks per second of `/proc` times (`USER_HZ`): part of the
/// kernel's user-space ABI, 100 on every architecture Linux supports.
const USER_HZ: f64 = 100.0;

/// Build information and process metrics of one flopwatch component.
#[derive(Debug)]
pub struct ProcessCollector {
    component: &'static str,
}

impl ProcessCollector {
    /// For `component` (`agent`, `collector`), the `component` label of
    /// `flopwatch_build_info`.
    pub fn new(component: &'static str) -> Self {
        Self { component }
    }
}

/// What `/proc/self` says about this process.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU time, seconds.
    pub cpu_seconds: f64,
    /// Resident set size, bytes.
    pub resident_bytes: f64,
    /// Virtual memory size, bytes.
    pub virtual_bytes: f64,
    /// Start time, seconds since the epoch.
    pub start_time_seconds: f64,
    /// Open file descriptors.
    pub open_fds: f64,
    /// The soft limit on open file descriptors, when there is one.
    pub max_fds: Option<f64>,
}

impl ProcessStats {
    /// Reads `/proc/self`; `None` where it is not there (not Linux) or is
    /// not in the expected form.
    pub fn read() -> Option<Self> {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let mut s = parse_stat(&read("/proc/self/stat")?, &read("/proc/stat")?)?;
        let status = read("/proc/self/status")?;
        s.resident_bytes = status_kib(&status, "VmRSS:")? * 1024.0;
        s.virtual_bytes = status_kib(&status, "VmSize:")? * 1024.0;
        s.open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
        s.max_fds = read("/proc/self/limits").and_then(|l| max_open_files(&l));
        Some(s)
    }
}

/// CPU seconds and start time from `/proc/self/stat` and the boot time in
/// `/proc/stat`.
fn parse_stat(stat: &str, proc_stat: &str) -> Option<ProcessStats> {
    // The command name (field 2) is in parentheses and may hold spaces or
    // parentheses itself: the fields that follow start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): field n is f[n - 3].
    let num = |n: usize| f.get(n - 3)?.parse::<f64>().ok();
    let (utime, stime, start) = (num(14)?, num(15)?, num(22)?);
    let btime: f64 = proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(ProcessStats {
        cpu_seconds: (utime + stime) / USER_HZ,
        start_time_seconds: btime + start / USER_HZ,
        ..Default::default()
    })
}

/// A `kB` line of `/proc/self/status`, in KiB.
fn status_kib(status: &str, key: &str) -> Option<f64> {
    let v = status.lines().find_map(|l| l.strip_prefix(key))?;
    v.split_whitespace().next()?.parse().ok()
}

/// The soft limit of "Max open files" in `/proc/self/limits`.
fn max_open_files(limits: &str) -> Option<f64> {
    let v = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?;
    v.split_whitespace().next()?.parse().ok()
}

fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: f64,
) -> std::fmt::Result {
    ConstGauge::new(v).encode(enc.encode_descriptor(name, help, unit, MetricType::Gauge)?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        {
            let labels = [
                ("component", self.component),
                ("version", env!("CARGO_PKG_VERSION")),
                ("arch", std::env::consts::ARCH),
                ("os", std::env::consts::OS),
            ];
            let mut m = enc.encode_descriptor(
                "flopwatch_build_info",
                "Always 1; the labels say which flopwatch build runs.",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(1).encode(m.encode_family(&labels)?)?;
        }
        let Some(s) = ProcessStats::read() else {
            return Ok(());
        };
        let seconds = Unit::Seconds;
        let bytes = Unit::Bytes;
        ConstCounter::new(s.cpu_seconds).encode(enc.encode_descriptor(
            "process_cpu",
            "Total user and system CPU time spent in seconds.",
            Some(&seconds),
            MetricType::Counter,
        )?)?;
        gauge(
            &mut enc,
            "process_resident_memory",
            "Resident memory size in bytes.",
            Some(&bytes),
            s.resident_bytes,
        )?;
        gauge(
            &mut enc,
            "process_virtual_memory",
            "Virtual memory size in bytes.",
            Some(&bytes),
            s.virtual_bytes,
        )?;
        gauge(
            &mut enc,
            "process_start_time",
            "Start time of the process since unix epoch in seconds.",
            Some(&seconds),
            s.start_time_seconds,
        )?;
        gauge(
            &mut enc,
            "process_open_fds",
            "Number of open file descriptors.",
            None,
            s.open_fds,
        )?;
        if let Some(max) = s.max_fds {
            gauge(
                &mut enc,
                "process_max_fds",
                "Maximum number of open file descriptors.",
                None,
                max,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_a_command_name_holding_spaces_and_parentheses() {
        // Fields 3.. of a real /proc/self/stat: utime 250, stime 50 ticks,
        // start 1000 ticks after boot.
        let stat = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    250 50 0 0 20 0 8 0 1000 123456789 2000 18446744073709551615";
        let s = parse_stat(stat, "cpu  1 2 3\nbtime 1700000000\nprocesses 5\n").unwrap();
        assert_eq!(s.cpu_seconds, 3.0);
        assert_eq!(s.start_time_seconds, 1_700_000_010.0);
    }

    #[test]
    fn malformed_proc_files_give_none_not_a_panic() {
        assert_eq!(parse_stat("", ""), None);
        assert_eq!(parse_stat("1 (x) S 1 2", "btime 5\n"), None);
        assert_eq!(
            parse_stat("1 (x) S 1 2 3 4 5 6 7 8 9 a b", "btime 5\n"),
            None
        );
        assert_eq!(status_kib("VmRSS:\n", "VmRSS:"), None);
        assert_eq!(
            max_open_files("Max open files unlimited unlimited files"),
            None
        );
    }

    #[test]
    fn limits_and_status_lines() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024.0));
        assert_eq!(
            status_kib("Name:\tx\nVmRSS:\t  2048 kB\n", "VmRSS:"),
            Some(2048.0)
        );
    }

    #[test]
    fn this_process_is_described() {
        let mut r = prometheus_client::registry::Registry::default();
        r.register_collector(Box::new(ProcessCollector::new("agent")));
        let text = crate::metrics_http::render(&r);
        assert!(
            text.contains("flopwatch_build_info{component=\"agent\",version=\""),
            "{text}"
        );
        if cfg!(target_os = "linux") {
            for name in [
                "process_cpu_seconds_total ",
                "process_resident_memory_bytes ",
                "process_start_time_seconds ",
                "process_open_fds ",
            ] {
                assert!(text.contains(name), "{name} missing:\n{text}");
            }
            let s = ProcessStats::read().unwrap();
            assert!(s.resident_bytes > 0.0 && s.open_fds > 0.0, "{s:?}");
        }
    }
}
