//! The fake driver's configuration: `key=value` pairs separated by commas.
//!
//! The same syntax comes from the `FLOPWATCH_FAKE_NVML` environment variable
//! (read when the state is first built, at `nvmlInit`) and from
//! `flopwatchFakeNvmlConfigure` (in-process tests), e.g.
//! `gpus=4,nodes=1,node=0,seed=3,start_ms=1700000000000,gpm=0`.
//!
//! XID errors are scheduled with `xid=GPU:CODE@MS` (an XID `CODE` on GPU
//! `GPU`, `MS` milliseconds after the fleet start); several are separated by
//! `;` or given by repeating the key: `xid=2:79@1500;0:13@2000,xid=1:48@0`.
//!
//! `schedule=PATH` makes GPU 0 follow a load generator instead of its
//! simulated job: PATH holds lines `UNIX_MS TENSOR_ACTIVE` (tensor activity,
//! 0..=1, from that time on; idle before the first line), appended as the
//! load runs and re-read when the file grows (the `schedule` module).
//! `deploy/gpu/validate.sh --dry-run` drives it. The path cannot contain a
//! comma.
//!
//! `cpu_report=PATH` makes the library write, at most once a second, the
//! CPU time its own calls have taken so far (nanoseconds, one line) to PATH:
//! what the simulated hardware costs the process that loads it.
//!
//! `hang_after=N` makes every device query after the first `N` block, as a
//! wedged driver does, until the fake is configured again without it (the
//! `hang` module): what the agent's liveness check must catch.
//!
//! `gpm_permission=denied` makes `nvmlGpmSampleGet` and `nvmlGpmMetricsGet`
//! answer `NVML_ERROR_NO_PERMISSION`, as the driver does for a process in a
//! container without `CAP_SYS_ADMIN`; `nvmlGpmQueryDeviceSupport` still
//! says the GPU supports GPM (support is the hardware's, permission the
//! process's). `granted` (the default) lifts it.
//!
//! MIG (the [`crate::mig`] module): `mig_layout=GPU:LAYOUT` puts card `GPU`
//! in MIG mode with the GPU instances of `LAYOUT`, profiles joined by `+`,
//! `*N` for N of one (`mig_layout=0:3g.40gb+4g.40gb;1:1g.10gb*7`); `none`
//! is MIG mode without instances, `off` MIG mode disabled.
//! `mig_reconfig=GPU:LAYOUT@MS` changes card `GPU` to `LAYOUT` `MS` ms after
//! the fleet start (`mig_reconfig=1:2g.20gb+2g.20gb@5000;0:off@9000`). Both
//! keys take several entries separated by `;` and may be repeated. `mig=1`
//! alone enables MIG mode on every card, without instances. A layout the
//! card cannot hold (an unknown profile, more than 7 compute slices, 8
//! memory slices or 7 instances) is an error naming the key.
//!
//! The counters beyond the simulator's state: `memory_temp=0` makes the
//! GPUs answer `NVML_FI_DEV_MEMORY_TEMP` with `NOT_SUPPORTED`, as a GDDR
//! card does (default 1: HBM, whose sensor reads); `enc_util=PCT` and
//! `dec_util=PCT` are the video encoder's and decoder's utilization, 0..=100
//! (default 0: idle, as the simulator's GPUs run no video);
//! `remapped_rows=GPU:CORR:UNC[:pending][:failed]` gives GPU `GPU` `CORR`
//! rows remapped after correctable and `UNC` after uncorrectable errors, a
//! remapping pending until reset, and a failed remapping
//! (`remapped_rows=1:3:1;2:0:2:pending:failed`; default: none anywhere).
//!
//! Shared GPUs (the [`crate::share`] module): `share=GPU:PID/PCT+PID/PCT`
//! time-slices GPU `GPU` between processes `PID`, each getting `PCT` % of
//! its SM time (whole percents, together at most 100):
//! `share=2:4242/70+4343/30;5:7/50+8/25+9/25`. The GPU lists those
//! processes and `nvmlDeviceGetProcessUtilization` reports each one's SM
//! utilisation; a bad entry (a missing `/PCT`, a PID given twice, percents
//! over 100, a GPU not below `gpus`) is an error naming the key. Several
//! entries are separated by `;` or given by repeating the key; the last one
//! for a GPU wins. Default: no GPU is shared.

use crate::layout::{parse_card, Layout, MigChange};
use crate::share::ShareSpec;

/// Name of the environment variable read at `nvmlInit`.
pub const ENV_VAR: &str = "FLOPWATCH_FAKE_NVML";

/// What the fake node looks like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeConfig {
    /// GPUs on the node (`gpus`, 1..=64; default 8).
    pub gpus: usize,
    /// Nodes in the simulated fleet (`nodes`, default 1).
    pub nodes: usize,
    /// Which node of the fleet this fake driver is (`node`, default 0).
    pub node: usize,
    /// Simulator seed (`seed`, default 1).
    pub seed: u64,
    /// Fleet start, unix ms (`start_ms`); `None` means "when the state is
    /// built" (at `nvmlInit` or configure time, on the fake clock).
    pub start_ms: Option<i64>,
    /// When the regressing job slows down, ms after the start
    /// (`regress_after_ms`, default 30 000).
    pub regress_after_ms: i64,
    /// Whether GPM is supported (`gpm`, default 1): 0 models a pre-Hopper
    /// GPU without the tensor counter.
    pub gpm: bool,
    /// Driver version string (`driver`, default `550.54.15`).
    pub driver: String,
    /// Processor-clock sample ring size per GPU (`ring`, default 100
    /// samples of 10 ms each: one second of history, like a driver buffer).
    pub ring: usize,
    /// Whether the GPUs support NVML events (`events`, default 1): 0 makes
    /// `nvmlDeviceGetSupportedEventTypes` answer `NOT_SUPPORTED`.
    pub events: bool,
    /// Whether MIG mode is enabled (`mig`, default 0, which answers
    /// `nvmlDeviceGetMigMode` with `NOT_SUPPORTED` like a non-MIG GPU).
    pub mig: bool,
    /// Initial MIG layouts by card (`mig_layout=GPU:LAYOUT;…`, repeatable;
    /// the last one for a card wins).
    pub mig_layout: Vec<(usize, Layout)>,
    /// Scheduled MIG reconfigurations (`mig_reconfig=GPU:LAYOUT@MS;…`,
    /// repeatable).
    pub mig_reconfig: Vec<MigChange>,
    /// Scheduled XID errors (`xid=GPU:CODE@MS`, repeatable, `;`-separated).
    pub xids: Vec<XidSpec>,
    /// NVLink links up per GPU (`nvlinks`, 0..=18, default 18 as on an
    /// H100 SXM): links `0..nvlinks` are active, the rest inactive.
    pub nvlinks: u32,
    /// Replay errors counted on each active NVLink link (`nvlink_replays`,
    /// default 0).
    pub nvlink_replays: u64,
    /// A load schedule GPU 0 follows (`schedule`, a file path; default
    /// none: GPU 0 runs its simulated job).
    pub schedule: Option<std::path::PathBuf>,
    /// Where the library reports the CPU time spent inside its own calls
    /// (`cpu_report`, a file path; default none): the simulated hardware's
    /// cost, so that a benchmark can tell the agent's share apart (the
    /// `cpu` module).
    pub cpu_report: Option<std::path::PathBuf>,
    /// Device queries answered before every later one blocks
    /// (`hang_after`, default none: never).
    pub hang_after: Option<u64>,
    /// Whether GPM samples are refused with `NVML_ERROR_NO_PERMISSION`
    /// (`gpm_permission=denied`; default `granted`).
    pub gpm_denied: bool,
    /// Whether the GPUs have a memory temperature sensor (`memory_temp`,
    /// default 1): 0 models a GDDR card, whose `NVML_FI_DEV_MEMORY_TEMP`
    /// is `NOT_SUPPORTED`.
    pub memory_temp: bool,
    /// Video encoder utilization of every GPU, percent (`enc_util`,
    /// default 0).
    pub enc_util: u32,
    /// Video decoder utilization of every GPU, percent (`dec_util`,
    /// default 0).
    pub dec_util: u32,
    /// Remapped memory rows by GPU (`remapped_rows`, repeatable,
    /// `;`-separated; the last one for a GPU wins; default none).
    pub remapped_rows: Vec<RemapSpec>,
    /// GPUs time-sliced between several processes (`share`, repeatable,
    /// `;`-separated; the last one for a GPU wins; default none).
    pub share: Vec<ShareSpec>,
}

/// NVLink links an NVML device exposes (`NVML_NVLINK_MAX_LINKS`).
pub const MAX_NVLINKS: u32 = 18;

/// One scheduled XID error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidSpec {
    /// GPU index on the node.
    pub gpu: usize,
    /// The XID (e.g. 79, "GPU has fallen off the bus").
    pub code: u64,
    /// When it happens, ms after the fleet start.
    pub at_ms: i64,
}

/// One GPU's row remapper state (`nvmlDeviceGetRemappedRows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemapSpec {
    /// GPU index on the node.
    pub gpu: usize,
    /// Rows remapped after correctable errors (`corrRows`).
    pub correctable: u32,
    /// Rows remapped after uncorrectable errors (`uncRows`).
    pub uncorrectable: u32,
    /// A remapping waits for the next GPU reset (`isPending`).
    pub pending: bool,
    /// A row could not be remapped (`failureOccurred`).
    pub failure: bool,
}

impl RemapSpec {
    /// Parses `GPU:CORR:UNC[:pending][:failed]`.
    fn parse(s: &str) -> Option<Self> {
        let mut parts = s.split(':').map(str::trim);
        let mut r = Self {
            gpu: parts.next()?.parse().ok()?,
            correctable: parts.next()?.parse().ok()?,
            uncorrectable: parts.next()?.parse().ok()?,
            ..Self::default()
        };
        for flag in parts {
            match flag {
                "pending" => r.pending = true,
                "failed" => r.failure = true,
                _ => return None,
            }
        }
        Some(r)
    }
}

impl XidSpec {
    /// Parses `GPU:CODE@MS`.
    fn parse(s: &str) -> Option<Self> {
        let (gpu, rest) = s.trim().split_once(':')?;
        let (code, at) = rest.split_once('@')?;
        Some(Self {
            gpu: gpu.trim().parse().ok()?,
            code: code.trim().parse().ok()?,
            at_ms: at.trim().parse().ok()?,
        })
    }
}

impl Default for FakeConfig {
    fn default() -> Self {
        Self {
            gpus: 8,
            nodes: 1,
            node: 0,
            seed: 1,
            start_ms: None,
            regress_after_ms: 30_000,
            gpm: true,
            driver: "550.54.15".to_string(),
            ring: 100,
            events: true,
            mig: false,
            mig_layout: Vec::new(),
            mig_reconfig: Vec::new(),
            xids: Vec::new(),
            nvlinks: MAX_NVLINKS,
            nvlink_replays: 0,
            schedule: None,
            cpu_report: None,
            hang_after: None,
            gpm_denied: false,
            memory_temp: true,
            enc_util: 0,
            dec_util: 0,
            remapped_rows: Vec::new(),
            share: Vec::new(),
        }
    }
}

/// A spec the fake cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A pair is not `key=value`.
    #[error("`{0}` is not key=value")]
    NotAPair(String),
    /// A key the fake does not know.
    #[error("unknown key `{0}` (known: gpus, nodes, node, seed, start_ms, regress_after_ms, gpm, driver, ring, events, mig, mig_layout, mig_reconfig, xid, nvlinks, nvlink_replays, schedule, cpu_report, hang_after, gpm_permission, memory_temp, enc_util, dec_util, remapped_rows, share)")]
    UnknownKey(String),
    /// A value that does not parse or is out of range.
    #[error("bad value for `{key}`: `{value}` ({why})")]
    BadValue {
        /// The key.
        key: String,
        /// The value as given.
        value: String,
        /// What is wrong.
        why: &'static str,
    },
}

impl FakeConfig {
    /// Parses a spec; an empty spec yields the defaults.
    pub fn parse(spec: &str) -> Result<Self, ConfigError> {
        let mut c = Self::default();
        for pair in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| ConfigError::NotAPair(pair.to_string()))?;
            let bad = |why| ConfigError::BadValue {
                key: key.to_string(),
                value: value.to_string(),
                why,
            };
            let int = || value.parse::<i64>().map_err(|_| bad("not an integer"));
            let count = |lo: i64, hi: i64| match int()? {
                v if (lo..=hi).contains(&v) => Ok(v as usize),
                _ => Err(bad("out of range")),
            };
            let flag = || match value {
                "1" | "true" | "on" => Ok(true),
                "0" | "false" | "off" => Ok(false),
                _ => Err(bad("expected 0 or 1")),
            };
            match key {
                "gpus" => c.gpus = count(1, 64)?,
                "nodes" => c.nodes = count(1, 100_000)?,
                "node" => c.node = count(0, 100_000)?,
                "seed" => c.seed = value.parse().map_err(|_| bad("not an unsigned integer"))?,
                "start_ms" => c.start_ms = Some(int()?),
                "regress_after_ms" => c.regress_after_ms = int()?,
                "gpm" => c.gpm = flag()?,
                "events" => c.events = flag()?,
                "mig" => c.mig = flag()?,
                "mig_layout" => {
                    for one in value.split(';').map(str::trim).filter(|x| !x.is_empty()) {
                        c.mig_layout.push(parse_card(one).map_err(&bad)?);
                    }
                }
                "mig_reconfig" => {
                    for one in value.split(';').map(str::trim).filter(|x| !x.is_empty()) {
                        c.mig_reconfig.push(MigChange::parse(one).map_err(&bad)?);
                    }
                }
                "xid" => {
                    for one in value.split(';').map(str::trim).filter(|x| !x.is_empty()) {
                        let xid = XidSpec::parse(one).ok_or_else(|| bad("expected GPU:CODE@MS"))?;
                        c.xids.push(xid);
                    }
                }
                "driver" if !value.is_empty() && value.len() < 80 => c.driver = value.to_string(),
                "driver" => return Err(bad("empty or longer than 79 bytes")),
                "ring" => c.ring = count(1, 100_000)?,
                "nvlinks" => c.nvlinks = count(0, i64::from(MAX_NVLINKS))? as u32,
                "nvlink_replays" => {
                    c.nvlink_replays = value.parse().map_err(|_| bad("not an unsigned integer"))?
                }
                "schedule" if !value.is_empty() => c.schedule = Some(value.into()),
                "schedule" => return Err(bad("empty path")),
                "cpu_report" if !value.is_empty() => c.cpu_report = Some(value.into()),
                "cpu_report" => return Err(bad("empty path")),
                "hang_after" => {
                    c.hang_after = Some(value.parse().map_err(|_| bad("not an unsigned integer"))?)
                }
                "gpm_permission" => {
                    c.gpm_denied = match value {
                        "denied" => true,
                        "granted" => false,
                        _ => return Err(bad("expected denied or granted")),
                    }
                }
                "memory_temp" => c.memory_temp = flag()?,
                "enc_util" => c.enc_util = count(0, 100)? as u32,
                "dec_util" => c.dec_util = count(0, 100)? as u32,
                "remapped_rows" => {
                    for one in value.split(';').map(str::trim).filter(|x| !x.is_empty()) {
                        let r = RemapSpec::parse(one)
                            .ok_or_else(|| bad("expected GPU:CORR:UNC[:pending][:failed]"))?;
                        c.remapped_rows.push(r);
                    }
                }
                "share" => {
                    for one in value.split(';').map(str::trim).filter(|x| !x.is_empty()) {
                        c.share.push(ShareSpec::parse(one).map_err(&bad)?);
                    }
                }
                _ => return Err(ConfigError::UnknownKey(key.to_string())),
            }
        }
        if c.node >= c.nodes {
            return Err(ConfigError::BadValue {
                key: "node".to_string(),
                value: c.node.to_string(),
                why: "must be below `nodes`",
            });
        }
        if let Some(x) = c.xids.iter().find(|x| x.gpu >= c.gpus) {
            return Err(ConfigError::BadValue {
                key: "xid".to_string(),
                value: format!("{}:{}@{}", x.gpu, x.code, x.at_ms),
                why: "GPU must be below `gpus`",
            });
        }
        if let Some(r) = c.remapped_rows.iter().find(|r| r.gpu >= c.gpus) {
            return Err(ConfigError::BadValue {
                key: "remapped_rows".to_string(),
                value: r.gpu.to_string(),
                why: "GPU must be below `gpus`",
            });
        }
        if let Some(sh) = c.share.iter().find(|sh| sh.gpu >= c.gpus) {
            return Err(ConfigError::BadValue {
                key: "share".to_string(),
                value: sh.gpu.to_string(),
                why: "GPU must be below `gpus`",
            });
        }
        let cards = c
            .mig_layout
            .iter()
            .map(|(g, _)| ("mig_layout", *g))
            .chain(c.mig_reconfig.iter().map(|m| ("mig_reconfig", m.gpu)));
        for (key, gpu) in cards {
            if gpu >= c.gpus {
                return Err(ConfigError::BadValue {
                    key: key.to_string(),
                    value: gpu.to_string(),
                    why: "GPU must be below `gpus`",
                });
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_key_and_defaults_the_rest() {
        let c = FakeConfig::parse(
            " gpus=4, nodes=2,node=1,seed=3,start_ms=-5,gpm=0,driver=535.1,ring=7,nvlinks=12,nvlink_replays=3,schedule=/tmp/load.txt,cpu_report=/tmp/cpu,hang_after=7,gpm_permission=denied ",
        )
        .unwrap();
        assert_eq!(
            c,
            FakeConfig {
                gpus: 4,
                nodes: 2,
                node: 1,
                seed: 3,
                start_ms: Some(-5),
                gpm: false,
                driver: "535.1".to_string(),
                ring: 7,
                nvlinks: 12,
                nvlink_replays: 3,
                schedule: Some("/tmp/load.txt".into()),
                cpu_report: Some("/tmp/cpu".into()),
                hang_after: Some(7),
                gpm_denied: true,
                ..FakeConfig::default()
            }
        );
        assert_eq!(FakeConfig::parse("").unwrap(), FakeConfig::default());
    }

    #[test]
    fn parses_xids_and_events() {
        let c = FakeConfig::parse("xid=2:79@1500;0:13@-5,events=0,xid=1:48@0,mig=1").unwrap();
        assert!(!c.events);
        assert!(c.mig);
        assert_eq!(
            c.xids,
            vec![
                XidSpec {
                    gpu: 2,
                    code: 79,
                    at_ms: 1500
                },
                XidSpec {
                    gpu: 0,
                    code: 13,
                    at_ms: -5
                },
                XidSpec {
                    gpu: 1,
                    code: 48,
                    at_ms: 0
                },
            ]
        );
        for bad in ["xid=2:79", "xid=a:1@2", "xid=8:79@1", "events=2"] {
            assert!(
                matches!(FakeConfig::parse(bad), Err(ConfigError::BadValue { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn parses_the_counters_beyond_the_simulator() {
        let c = FakeConfig::parse(
            "gpus=3,memory_temp=0,enc_util=37,dec_util=100,remapped_rows=1:3:1;2:0:2:pending:failed,remapped_rows=0:5:0:failed",
        )
        .unwrap();
        assert!(!c.memory_temp);
        assert_eq!((c.enc_util, c.dec_util), (37, 100));
        assert_eq!(
            c.remapped_rows,
            vec![
                RemapSpec {
                    gpu: 1,
                    correctable: 3,
                    uncorrectable: 1,
                    ..RemapSpec::default()
                },
                RemapSpec {
                    gpu: 2,
                    correctable: 0,
                    uncorrectable: 2,
                    pending: true,
                    failure: true,
                },
                RemapSpec {
                    gpu: 0,
                    correctable: 5,
                    uncorrectable: 0,
                    pending: false,
                    failure: true,
                },
            ]
        );
        let d = FakeConfig::default();
        assert!(d.memory_temp && d.remapped_rows.is_empty());
        for bad in [
            "enc_util=101",
            "dec_util=-1",
            "memory_temp=2",
            "remapped_rows=0:1",
            "remapped_rows=0:1:2:broken",
            "gpus=2,remapped_rows=2:1:1",
        ] {
            assert!(
                matches!(FakeConfig::parse(bad), Err(ConfigError::BadValue { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn parses_mig_layouts_and_reconfigurations() {
        let c = FakeConfig::parse(
            "gpus=3,mig_layout=0:3g.40gb+4g.40gb;1:1g.10gb*7,mig_layout=2:none,mig_reconfig=1:2g.20gb+2g.20gb@5000;0:off@9000",
        )
        .unwrap();
        assert_eq!(c.mig_layout.len(), 3);
        assert_eq!(c.mig_layout[1].0, 1);
        assert_eq!(c.mig_layout[1].1.instances().len(), 7);
        assert_eq!(c.mig_layout[2], (2, Layout::On(Vec::new())));
        assert_eq!(
            c.mig_reconfig,
            vec![
                MigChange {
                    gpu: 1,
                    layout: Layout::parse("2g.20gb*2").unwrap(),
                    at_ms: 5000
                },
                MigChange {
                    gpu: 0,
                    layout: Layout::Off,
                    at_ms: 9000
                },
            ]
        );
    }

    #[test]
    fn bad_mig_specs_name_their_key() {
        for (spec, key) in [
            ("mig_layout=0:5g.50gb", "mig_layout"),
            ("mig_layout=0:4g.40gb*2", "mig_layout"),
            ("mig_layout=3g.40gb", "mig_layout"),
            ("gpus=2,mig_layout=2:none", "mig_layout"),
            ("mig_reconfig=0:none", "mig_reconfig"),
            ("mig_reconfig=0:1g.10gb*8@100", "mig_reconfig"),
            ("gpus=1,mig_reconfig=1:none@100", "mig_reconfig"),
        ] {
            match FakeConfig::parse(spec) {
                Err(e @ ConfigError::BadValue { .. }) => {
                    assert!(e.to_string().contains(&format!("`{key}`")), "{spec}: {e}")
                }
                other => panic!("{spec}: {other:?}"),
            }
        }
    }

    #[test]
    fn parses_shared_gpus() {
        let c = FakeConfig::parse("gpus=6,share=2:4242/70+4343/30;5:7/50+8/25+9/25,share=0:11/100")
            .unwrap();
        assert_eq!(
            c.share,
            vec![
                ShareSpec {
                    gpu: 2,
                    processes: vec![(4242, 70), (4343, 30)],
                },
                ShareSpec {
                    gpu: 5,
                    processes: vec![(7, 50), (8, 25), (9, 25)],
                },
                ShareSpec {
                    gpu: 0,
                    processes: vec![(11, 100)],
                },
            ]
        );
        assert!(FakeConfig::default().share.is_empty());
    }

    #[test]
    fn bad_shares_name_their_key() {
        for spec in [
            "share=2",
            "share=2:4242",
            "share=2:4242/70+4343",
            "share=2:4242/70+4242/30",
            "share=2:4242/70+4343/31",
            "share=2:4242/0",
            "share=2:0/50",
            "share=x:1/50",
            "gpus=2,share=2:1/50",
            "share=1:1/50;2:1/50%",
        ] {
            match FakeConfig::parse(spec) {
                Err(e @ ConfigError::BadValue { .. }) => {
                    assert!(e.to_string().contains("`share`"), "{spec}: {e}")
                }
                other => panic!("{spec}: {other:?}"),
            }
        }
    }

    #[test]
    fn rejects_bad_specs() {
        assert!(matches!(
            FakeConfig::parse("gpus"),
            Err(ConfigError::NotAPair(_))
        ));
        assert!(matches!(
            FakeConfig::parse("cpus=1"),
            Err(ConfigError::UnknownKey(_))
        ));
        assert!(matches!(
            FakeConfig::parse("gpus=0"),
            Err(ConfigError::BadValue { .. })
        ));
        assert!(matches!(
            FakeConfig::parse("gpm=maybe"),
            Err(ConfigError::BadValue { .. })
        ));
        assert!(matches!(
            FakeConfig::parse("schedule="),
            Err(ConfigError::BadValue { .. })
        ));
        assert!(matches!(
            FakeConfig::parse("hang_after=-1"),
            Err(ConfigError::BadValue { .. })
        ));
        assert!(matches!(
            FakeConfig::parse("gpm_permission=root"),
            Err(ConfigError::BadValue { .. })
        ));
        assert!(
            !FakeConfig::parse("gpm_permission=granted")
                .unwrap()
                .gpm_denied
        );
        assert!(matches!(
            FakeConfig::parse("node=1"),
            Err(ConfigError::BadValue { .. })
        ));
    }
}
