//! The fake driver's configuration: `key=value` pairs separated by commas.
//!
//! The same syntax comes from the `FLOPWATCH_FAKE_NVML` environment variable
//! (read when the state is first built, at `nvmlInit`) and from
//! `flopwatchFakeNvmlConfigure` (in-process tests), e.g.
//! `gpus=4,nodes=1,node=0,seed=3,start_ms=1700000000000,gpm=0`.

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
    #[error("unknown key `{0}` (known: gpus, nodes, node, seed, start_ms, regress_after_ms, gpm, driver, ring)")]
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
            match key {
                "gpus" => c.gpus = count(1, 64)?,
                "nodes" => c.nodes = count(1, 100_000)?,
                "node" => c.node = count(0, 100_000)?,
                "seed" => c.seed = value.parse().map_err(|_| bad("not an unsigned integer"))?,
                "start_ms" => c.start_ms = Some(int()?),
                "regress_after_ms" => c.regress_after_ms = int()?,
                "gpm" => {
                    c.gpm = match value {
                        "1" | "true" | "on" => true,
                        "0" | "false" | "off" => false,
                        _ => return Err(bad("expected 0 or 1")),
                    }
                }
                "driver" if !value.is_empty() && value.len() < 80 => c.driver = value.to_string(),
                "driver" => return Err(bad("empty or longer than 79 bytes")),
                "ring" => c.ring = count(1, 100_000)?,
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
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_key_and_defaults_the_rest() {
        let c = FakeConfig::parse(
            " gpus=4, nodes=2,node=1,seed=3,start_ms=-5,gpm=0,driver=535.1,ring=7 ",
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
                ..FakeConfig::default()
            }
        );
        assert_eq!(FakeConfig::parse("").unwrap(), FakeConfig::default());
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
            FakeConfig::parse("node=1"),
            Err(ConfigError::BadValue { .. })
        ));
    }
}
