//! InfiniBand port counters from sysfs, without touching the fabric.
//!
//! Every port under `<sys_root>/class/infiniband/<dev>/ports/<port>/` is a
//! device (`ib:<dev>:<port>`). Each read takes:
//!
//! * `counters/port_xmit_data`, `port_rcv_data`: data in **4-byte words**;
//!   the difference between two reads × 4 over the time between them is
//!   the exact mean throughput of the window (`ib_tx_bytes_s`,
//!   `ib_rx_bytes_s`), as GPM's counter pairs are for a GPU;
//! * `counters/port_xmit_discards`, `port_rcv_errors`, `symbol_error`,
//!   `link_error_recovery`, `link_downed` and `hw_counters/out_of_buffer`:
//!   reported as totals since the agent started (`ib_*_total`);
//! * `state` (`4: ACTIVE`), `phys_state` (`5: LinkUp`) and `rate`
//!   (`400 Gb/sec (4X NDR)`).
//!
//! **Wrap and reset.** A counter that went backwards either wrapped (a
//! 32-bit counter passing 2³², recognised when the previous value fit in
//! 32 bits and the forward distance through 2³² is under 2³¹) or was reset
//! (`perfquery -R`, a driver reload): a wrap is counted through, a reset
//! starts a new baseline and that window reports no rate rather than a
//! wrong one. A 32-bit counter stuck at 2³²−1 (saturated) gives no rate.
//!
//! **Ports that disappear** (a driver unload, a hot-unplugged HCA) report
//! `ib_port_active` 0 and nothing else; their baseline is dropped, so the
//! first read after they come back only re-baselines. Ports that appear
//! after the start are not followed until the agent restarts.

use super::node::{DeviceReader, DeviceReading};
use super::Reading;
use flopwatch_proto::metrics as m;
use flopwatch_proto::model::{DeviceInfo, DEVICE_IB_PORT};
use std::path::{Path, PathBuf};
use tracing::warn;

/// The InfiniBand ports of a node.
pub struct IbReader {
    ports: Vec<Port>,
    devices: Vec<DeviceInfo>,
}

struct Port {
    dir: PathBuf,
    last: Option<Snapshot>,
    /// Totals since the agent started: discards tx, out_of_buffer, rcv
    /// errors, link errors.
    totals: [u64; 4],
    present: bool,
}

#[derive(Debug, Clone, Copy)]
struct Snapshot {
    ts_ms: i64,
    xmit_words: Option<u64>,
    rcv_words: Option<u64>,
    /// Same order as `Port::totals`.
    errs: [Option<u64>; 4],
}

const U32_SPAN: u64 = 1 << 32;

/// Forward distance from `prev` to `cur` for a counter, `None` on a reset.
pub fn counter_delta(prev: u64, cur: u64) -> Option<u64> {
    if cur >= prev {
        return Some(cur - prev);
    }
    if prev < U32_SPAN {
        let through = U32_SPAN - prev + cur;
        if through < U32_SPAN / 2 {
            return Some(through);
        }
    }
    None
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn sorted_dirs(path: &Path) -> Vec<(String, PathBuf)> {
    let Ok(rd) = std::fs::read_dir(path) else {
        return Vec::new();
    };
    let mut v: Vec<(String, PathBuf)> = rd
        .flatten()
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .filter(|(_, p)| p.is_dir())
        .collect();
    v.sort();
    v
}

impl IbReader {
    /// Finds the ports under `<sys_root>/class/infiniband`. None found
    /// (no HCA, no driver) is not an error: the reader has no devices.
    pub fn discover(sys_root: &Path) -> Self {
        let mut ports = Vec::new();
        let mut devices = Vec::new();
        for (dev, dev_dir) in sorted_dirs(&sys_root.join("class/infiniband")) {
            for (port, dir) in sorted_dirs(&dev_dir.join("ports")) {
                if port.parse::<u32>().is_err() {
                    continue;
                }
                devices.push(DeviceInfo {
                    id: format!("ib:{dev}:{port}"),
                    kind: DEVICE_IB_PORT.into(),
                    name: format!("{dev}:{port}"),
                });
                ports.push(Port {
                    dir,
                    last: None,
                    totals: [0; 4],
                    present: true,
                });
            }
        }
        Self { ports, devices }
    }
}

fn port_active(dir: &Path) -> bool {
    let field = |f: &str| {
        std::fs::read_to_string(dir.join(f)).ok().and_then(|s| {
            s.split(':')
                .next()
                .and_then(|n| n.trim().parse::<u32>().ok())
        })
    };
    // state 4 = ACTIVE; phys_state 5 = LinkUp (absent on some drivers).
    field("state") == Some(4) && field("phys_state").is_none_or(|p| p == 5)
}

fn link_rate_gbps(dir: &Path) -> Option<f64> {
    let s = std::fs::read_to_string(dir.join("rate")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}

impl Port {
    fn snapshot(&self, now_ms: i64) -> Option<Snapshot> {
        let c = self.dir.join("counters");
        let hw = self.dir.join("hw_counters");
        if !c.is_dir() {
            return None;
        }
        let sum = |names: &[&str]| -> Option<u64> {
            let vals: Vec<u64> = names.iter().filter_map(|n| read_u64(&c.join(n))).collect();
            (!vals.is_empty()).then(|| vals.iter().fold(0u64, |a, v| a.saturating_add(*v)))
        };
        Some(Snapshot {
            ts_ms: now_ms,
            xmit_words: read_u64(&c.join("port_xmit_data")),
            rcv_words: read_u64(&c.join("port_rcv_data")),
            errs: [
                read_u64(&c.join("port_xmit_discards")),
                read_u64(&hw.join("out_of_buffer")),
                read_u64(&c.join("port_rcv_errors")),
                sum(&["symbol_error", "link_error_recovery", "link_downed"]),
            ],
        })
    }

    fn read(&mut self, now_ms: i64) -> (u32, Vec<Reading>) {
        let Some(snap) = self.snapshot(now_ms).filter(|_| self.dir.is_dir()) else {
            if self.present {
                warn!(port = %self.dir.display(), "InfiniBand port disappeared");
            }
            self.present = false;
            self.last = None;
            return (0, vec![Reading::new(m::IB_PORT_ACTIVE, 0.0)]);
        };
        if !self.present {
            tracing::info!(port = %self.dir.display(), "InfiniBand port is back");
            self.present = true;
        }
        let mut out = vec![Reading::new(
            m::IB_PORT_ACTIVE,
            if port_active(&self.dir) { 1.0 } else { 0.0 },
        )];
        if let Some(r) = link_rate_gbps(&self.dir) {
            out.push(Reading::new(m::IB_LINK_RATE_GBPS, r));
        }
        let mut window_ms = 0;
        if let Some(prev) = self.last.filter(|p| p.ts_ms < now_ms) {
            let secs = (now_ms - prev.ts_ms) as f64 / 1000.0;
            window_ms = u32::try_from(now_ms - prev.ts_ms).unwrap_or(u32::MAX);
            for (metric, p, c) in [
                (m::IB_TX_BYTES_S, prev.xmit_words, snap.xmit_words),
                (m::IB_RX_BYTES_S, prev.rcv_words, snap.rcv_words),
            ] {
                if let (Some(p), Some(c)) = (p, c) {
                    if c == u64::from(u32::MAX) {
                        continue;
                    }
                    if let Some(d) = counter_delta(p, c) {
                        out.push(Reading::new(metric, d as f64 * 4.0 / secs));
                    }
                }
            }
            for i in 0..4 {
                if let (Some(p), Some(c)) = (prev.errs[i], snap.errs[i]) {
                    // A reset counts what the counter holds since then.
                    let d = counter_delta(p, c).unwrap_or(c);
                    self.totals[i] = self.totals[i].saturating_add(d);
                }
            }
        }
        for (i, metric) in [
            m::IB_TX_DISCARDS_TOTAL,
            m::IB_RX_DISCARDS_TOTAL,
            m::IB_RX_ERRORS_TOTAL,
            m::IB_LINK_ERRORS_TOTAL,
        ]
        .into_iter()
        .enumerate()
        {
            if snap.errs[i].is_some() {
                out.push(Reading::new(metric, self.totals[i] as f64));
            }
        }
        // A window-mean rate needs the same ts as its window: keep the
        // newest snapshot, but only where `now_ms` moved forward.
        if self.last.is_none_or(|p| p.ts_ms < now_ms) {
            self.last = Some(snap);
        }
        (window_ms, out)
    }
}

impl DeviceReader for IbReader {
    fn name(&self) -> &'static str {
        "infiniband"
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn read(&mut self, now_ms: i64) -> Vec<DeviceReading> {
        self.ports
            .iter_mut()
            .enumerate()
            .map(|(device, p)| {
                let (window_ms, readings) = p.read(now_ms);
                DeviceReading {
                    device,
                    window_ms,
                    readings,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_count_through_a_32_bit_wrap_and_stop_at_a_reset() {
        assert_eq!(counter_delta(10, 25), Some(15));
        assert_eq!(counter_delta(U32_SPAN - 100, 50), Some(150));
        // A 64-bit counter going back is a reset.
        assert_eq!(counter_delta(U32_SPAN * 8, 1_000), None);
        // Far back within 32 bits is a reset too, not a near-full wrap.
        assert_eq!(counter_delta(1_000_000, 10), None);
    }
}
