//! Host CPU and memory counters from `/proc` and `/sys`.
//!
//! Devices: one per NUMA node (`numa:<n>`, from
//! `<sys_root>/devices/system/node/node<n>/cpulist`) and the host as a
//! whole (`host`). Each read takes:
//!
//! * `host_cpu_util`: from `<proc_root>/stat`, the share of CPU time (of
//!   the node's CPUs, or all of them) that was neither idle nor iowait
//!   between two reads: an exact window mean, like a GPM counter pair;
//! * `host_cpu_freq_mhz`: the mean of the CPUs'
//!   `<sys_root>/devices/system/cpu/cpu<i>/cpufreq/scaling_cur_freq` (kHz),
//!   each CPU's file read once per read whatever the groups it is in; CPUs
//!   with no such file when the reader starts (most virtual machines) are
//!   not tried again at every read;
//! * `host_mem_available_bytes`: `MemAvailable` of `<proc_root>/meminfo`
//!   for the host, `MemFree` of the node's `meminfo` for a NUMA node.
//!
//! A file that cannot be read leaves its metric out of that read.

use super::node::{DeviceReader, DeviceReading};
use super::Reading;
use flopwatch_proto::metrics as m;
use flopwatch_proto::model::{DeviceInfo, DEVICE_HOST, DEVICE_NUMA_NODE};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Parses a kernel CPU list (`0-3,8,10-11`); `None` when malformed.
pub fn parse_cpulist(s: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 65_536 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.trim().parse().ok()?),
        }
    }
    Some(out)
}

/// A `/proc` or `/sys` file read at every capture: opened once and read
/// again from offset 0 (the kernel makes the text anew for each read from
/// the start) into a buffer kept between reads. Opening, sizing and
/// closing it each time took three more system calls, and reading a proc
/// file (size 0) into a fresh string a few more as the string grew. A
/// read that does not fill the buffer ends the text: the kernel makes
/// these files whole at the first read and hands out all that fits (as a
/// regular file does short of its end), so the read that would return 0
/// is not made.
struct Reread {
    path: PathBuf,
    file: Option<std::fs::File>,
    buf: Vec<u8>,
}

impl Reread {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            file: None,
            buf: Vec::new(),
        }
    }

    /// The file's text now; `None` when it cannot be read (it is opened
    /// again at the next read).
    fn read(&mut self) -> Option<&str> {
        use std::os::unix::fs::FileExt;
        if self.file.is_none() {
            self.file = std::fs::File::open(&self.path).ok();
        }
        let file = self.file.as_ref()?;
        if self.buf.is_empty() {
            self.buf.resize(4096, 0);
        }
        let mut n = 0;
        loop {
            if n == self.buf.len() {
                self.buf.resize(n * 2, 0);
            }
            match file.read_at(&mut self.buf[n..], n as u64) {
                Ok(0) => break,
                Ok(k) => {
                    n += k;
                    if n < self.buf.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.file = None;
                    return None;
                }
            }
        }
        std::str::from_utf8(&self.buf[..n]).ok()
    }
}

/// (busy, total) jiffies per CPU (`None` key: the aggregate `cpu` line)
/// from the text of `/proc/stat`.
fn parse_stat(text: &str) -> HashMap<Option<u32>, (u64, u64)> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let Some(name) = f.next().and_then(|n| n.strip_prefix("cpu")) else {
            continue;
        };
        let key = if name.is_empty() {
            None
        } else {
            match name.parse::<u32>() {
                Ok(n) => Some(n),
                Err(_) => continue,
            }
        };
        // user nice system idle iowait irq softirq steal (guest time is
        // already inside user and nice).
        let v: Vec<u64> = f.take(8).filter_map(|x| x.parse().ok()).collect();
        if v.len() < 5 {
            continue;
        }
        let total: u64 = v.iter().sum();
        let idle = v[3] + v[4];
        out.insert(key, (total - idle, total));
    }
    out
}

fn meminfo_kb(text: &str, key: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        // "MemAvailable:  123 kB" or "Node 0 MemFree:  123 kB".
        let (k, v) = l.split_once(':')?;
        if k.split_whitespace().last()? != key {
            return None;
        }
        v.split_whitespace().next()?.parse::<f64>().ok()
    })
}

struct Group {
    /// CPUs of the group; `None` for the host (the aggregate line).
    cpus: Option<Vec<u32>>,
    meminfo: Reread,
    mem_key: &'static str,
    last: Option<(i64, u64, u64)>,
}

/// The NUMA nodes and the host.
pub struct HostReader {
    /// `/proc/stat`.
    stat: Reread,
    /// Each CPU that has a frequency file.
    freq_files: Vec<(u32, Reread)>,
    all_cpus: Vec<u32>,
    groups: Vec<Group>,
    devices: Vec<DeviceInfo>,
    /// When the reader was last asked for anything, unix ms.
    last_read_ms: Option<i64>,
}

impl HostReader {
    /// Finds the NUMA nodes under `sys_root`; reads `/proc` under
    /// `proc_root`. A host without NUMA information has only `host`.
    pub fn discover(sys_root: &Path, proc_root: &Path) -> Self {
        let node_dir = sys_root.join("devices/system/node");
        let mut nodes: Vec<(u32, Vec<u32>)> = std::fs::read_dir(&node_dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let n: u32 = e.file_name().to_str()?.strip_prefix("node")?.parse().ok()?;
                let cpus = parse_cpulist(&std::fs::read_to_string(e.path().join("cpulist")).ok()?)?;
                Some((n, cpus))
            })
            .collect();
        nodes.sort();
        let mut groups = Vec::new();
        let mut devices = Vec::new();
        let mut all_cpus = Vec::new();
        for (n, cpus) in nodes {
            all_cpus.extend(cpus.iter().copied());
            devices.push(DeviceInfo {
                id: format!("numa:{n}"),
                kind: DEVICE_NUMA_NODE.into(),
                name: n.to_string(),
            });
            groups.push(Group {
                cpus: Some(cpus),
                meminfo: Reread::new(node_dir.join(format!("node{n}/meminfo"))),
                mem_key: "MemFree",
                last: None,
            });
        }
        if all_cpus.is_empty() {
            // No NUMA information: the CPUs the aggregate line covers.
            let text = std::fs::read_to_string(proc_root.join("stat")).unwrap_or_default();
            all_cpus = parse_stat(&text).keys().flatten().copied().collect();
            all_cpus.sort_unstable();
        }
        devices.push(DeviceInfo {
            id: "host".into(),
            kind: DEVICE_HOST.into(),
            name: "host".into(),
        });
        groups.push(Group {
            cpus: None,
            meminfo: Reread::new(proc_root.join("meminfo")),
            mem_key: "MemAvailable",
            last: None,
        });
        let cpu_dir = sys_root.join("devices/system/cpu");
        let freq_files = all_cpus
            .iter()
            .map(|c| (*c, cpu_dir.join(format!("cpu{c}/cpufreq/scaling_cur_freq"))))
            .filter(|(_, p)| p.exists())
            .map(|(c, p)| (c, Reread::new(p)))
            .collect();
        Self {
            stat: Reread::new(proc_root.join("stat")),
            freq_files,
            all_cpus,
            groups,
            devices,
            last_read_ms: None,
        }
    }

    /// Every CPU's current frequency, kHz (CPUs whose file could not be
    /// read are left out).
    fn freqs_khz(&mut self) -> HashMap<u32, f64> {
        self.freq_files
            .iter_mut()
            .filter_map(|(c, f)| {
                let khz = f.read()?.trim().parse::<f64>().ok()?;
                Some((*c, khz))
            })
            .collect()
    }
}

/// The mean frequency of `cpus`, MHz, from [`HostReader::freqs_khz`].
fn freq_mhz(khz: &HashMap<u32, f64>, cpus: &[u32]) -> Option<f64> {
    let f: Vec<f64> = cpus.iter().filter_map(|c| khz.get(c).copied()).collect();
    (!f.is_empty()).then(|| f.iter().sum::<f64>() / f.len() as f64 / 1000.0)
}

impl DeviceReader for HostReader {
    fn name(&self) -> &'static str {
        "host"
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn read(&mut self, now_ms: i64) -> Vec<DeviceReading> {
        self.read_planned(now_ms, &|_, _| true)
    }

    /// Only the files some wanted metric needs are read: `/proc/stat`
    /// for CPU utilization, the frequency files for the frequency, a
    /// group's `meminfo` for its memory. A group whose utilization is
    /// skipped keeps its last counters, so its next utilization is the
    /// exact mean since then (`window_ms` set to that span).
    fn read_planned(
        &mut self,
        now_ms: i64,
        wants: &dyn Fn(usize, &'static str) -> bool,
    ) -> Vec<DeviceReading> {
        let want =
            |metric| -> Vec<bool> { (0..self.groups.len()).map(|d| wants(d, metric)).collect() };
        let (util, freq_w, mem) = (
            want(m::HOST_CPU_UTIL),
            want(m::HOST_CPU_FREQ_MHZ),
            want(m::HOST_MEM_AVAILABLE_BYTES),
        );
        let stat = if util.contains(&true) {
            self.stat.read().map(parse_stat).unwrap_or_default()
        } else {
            HashMap::new()
        };
        let mut out = Vec::with_capacity(self.groups.len());
        let khz = if freq_w.contains(&true) {
            self.freqs_khz()
        } else {
            HashMap::new()
        };
        let freqs: Vec<Option<f64>> = self
            .groups
            .iter()
            .map(|g| freq_mhz(&khz, g.cpus.as_deref().unwrap_or(&self.all_cpus)))
            .collect();
        // The capture's window: since the previous read of any metric.
        let capture_ms = self
            .last_read_ms
            .filter(|&t| t < now_ms)
            .map_or(0, |t| u32::try_from(now_ms - t).unwrap_or(u32::MAX));
        self.last_read_ms = Some(now_ms);
        for (device, (g, freq)) in self.groups.iter_mut().zip(freqs).enumerate() {
            let mut readings = Vec::new();
            let jiffies = match &g.cpus {
                None => stat.get(&None).copied(),
                Some(cpus) => {
                    let v: Vec<(u64, u64)> = cpus
                        .iter()
                        .filter_map(|c| stat.get(&Some(*c)).copied())
                        .collect();
                    (!v.is_empty())
                        .then(|| v.iter().fold((0, 0), |(b, t), (b2, t2)| (b + b2, t + t2)))
                }
            };
            let mut window_ms = 0;
            if let Some((busy, total)) = jiffies.filter(|_| util[device]) {
                if let Some((ts, b0, t0)) = g.last.filter(|l| l.0 < now_ms) {
                    // Counters only grow; a CPU going offline can shrink a
                    // group's sum, which just skips the window.
                    if total > t0 && busy >= b0 {
                        window_ms = u32::try_from(now_ms - ts).unwrap_or(u32::MAX);
                        let mut r = Reading::new(
                            m::HOST_CPU_UTIL,
                            ((busy - b0) as f64 / (total - t0) as f64).clamp(0.0, 1.0),
                        );
                        // Reads skipped since the last: the span, apart
                        // from the capture's window.
                        if capture_ms > 0 && window_ms != capture_ms {
                            r.window_ms = Some(window_ms);
                            window_ms = capture_ms;
                        }
                        readings.push(r);
                    }
                }
                if g.last.is_none_or(|l| l.0 < now_ms) {
                    g.last = Some((now_ms, busy, total));
                }
            }
            if let Some(f) = freq.filter(|_| freq_w[device]) {
                readings.push(Reading::new(m::HOST_CPU_FREQ_MHZ, f));
            }
            if mem[device] {
                if let Some(kb) = g.meminfo.read().and_then(|t| meminfo_kb(t, g.mem_key)) {
                    readings.push(Reading::new(m::HOST_MEM_AVAILABLE_BYTES, kb * 1024.0));
                }
            }
            if readings.is_empty() && !util[device] {
                continue;
            }
            out.push(DeviceReading {
                device,
                window_ms,
                readings,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reread_file_gives_its_whole_text_each_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stat");
        // Longer than the first buffer: a full read is not the end.
        let long = "cpu0 1 2 3 4 5 6 7 8\n".repeat(700);
        std::fs::write(&path, &long).unwrap();
        let mut r = Reread::new(path.clone());
        assert_eq!(r.read(), Some(long.as_str()));
        std::fs::write(&path, "cpu 1 2 3 4 5\n").unwrap();
        assert_eq!(r.read(), Some("cpu 1 2 3 4 5\n"));
        assert_eq!(r.read(), Some("cpu 1 2 3 4 5\n"));
    }

    #[test]
    fn cpulists_parse_and_bad_ones_are_refused() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpulist(""), Some(vec![]));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("x"), None);
    }
}
