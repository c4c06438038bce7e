//! MIG layouts of the fake card as `agent.toml`-style text gives them: the
//! modelled card's GPU instance profiles (the H100 80GB's, `nvidia-smi mig
//! -lgip`) and the `mig_layout` / `mig_reconfig` values of the fake's
//! configuration ([`crate::config`]); [`crate::mig`] plays them over time.

/// A GPU instance profile of the modelled card.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// `nvidia-smi` name, e.g. `3g.40gb`.
    pub name: &'static str,
    /// Compute slices (of [`COMPUTE_SLICES`]): the `g` of the name.
    pub slices: u32,
    /// Memory slices (of [`MEMORY_SLICES`]).
    pub memory_slices: u32,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Instance memory, MiB, as `nvmlDeviceGetAttributes_v2` reports it.
    pub memory_mb: u64,
}

/// H100 80GB HBM3 GPU instance profiles (`nvidia-smi mig -lgip`).
pub const PROFILES: [Profile; 6] = [
    profile("1g.10gb", 1, 1, 16, 9_984),
    profile("1g.20gb", 1, 2, 26, 20_096),
    profile("2g.20gb", 2, 2, 32, 20_096),
    profile("3g.40gb", 3, 4, 60, 40_320),
    profile("4g.40gb", 4, 4, 64, 40_320),
    profile("7g.80gb", 7, 8, 132, 81_152),
];

const fn profile(
    name: &'static str,
    slices: u32,
    memory_slices: u32,
    sm_count: u32,
    memory_mb: u64,
) -> Profile {
    Profile {
        name,
        slices,
        memory_slices,
        sm_count,
        memory_mb,
    }
}

/// Compute slices of the card.
pub const COMPUTE_SLICES: u32 = 7;
/// Memory slices of the card.
pub const MEMORY_SLICES: u32 = 8;
/// Most MIG devices on one card (`nvmlDeviceGetMaxMigDeviceCount`).
pub const MAX_INSTANCES: u32 = 7;

/// The profile named `name`.
pub fn profile_named(name: &str) -> Option<Profile> {
    PROFILES.iter().find(|p| p.name == name).copied()
}

/// One card's MIG configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// MIG mode disabled: a whole GPU.
    Off,
    /// MIG mode enabled with these GPU instances (id = position + 1).
    On(Vec<Profile>),
}

impl Layout {
    /// Parses `off`, `none` (or nothing), or `PROFILE[*N]+…`.
    pub fn parse(s: &str) -> Result<Self, &'static str> {
        let s = s.trim();
        match s {
            "off" => return Ok(Self::Off),
            "" | "none" => return Ok(Self::On(Vec::new())),
            _ => {}
        }
        let mut out = Vec::new();
        for term in s.split('+').map(str::trim) {
            let (name, n) = match term.split_once('*') {
                Some((name, n)) => (
                    name.trim(),
                    n.trim()
                        .parse::<u32>()
                        .map_err(|_| "a count after `*` must be a whole number")?,
                ),
                None => (term, 1),
            };
            let p = profile_named(name).ok_or(
                "unknown profile (H100 80GB: 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)",
            )?;
            if n == 0 || out.len() + n as usize > MAX_INSTANCES as usize {
                return Err("a card holds 1 to 7 instances");
            }
            out.extend(std::iter::repeat_n(p, n as usize));
        }
        if out.iter().map(|p| p.slices).sum::<u32>() > COMPUTE_SLICES {
            return Err("more than the card's 7 compute slices");
        }
        if out.iter().map(|p| p.memory_slices).sum::<u32>() > MEMORY_SLICES {
            return Err("more than the card's 8 memory slices");
        }
        Ok(Self::On(out))
    }

    /// The GPU instances (none when MIG is off).
    pub fn instances(&self) -> &[Profile] {
        match self {
            Self::Off => &[],
            Self::On(v) => v,
        }
    }

    /// Whether MIG mode is enabled.
    pub fn is_on(&self) -> bool {
        matches!(self, Self::On(_))
    }
}

/// A scheduled layout change (`mig_reconfig=GPU:LAYOUT@MS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigChange {
    /// Card index on the node.
    pub gpu: usize,
    /// The layout from then on.
    pub layout: Layout,
    /// When, ms after the fleet start.
    pub at_ms: i64,
}

impl MigChange {
    /// Parses `GPU:LAYOUT@MS`.
    pub fn parse(s: &str) -> Result<Self, &'static str> {
        let (spec, at) = s
            .rsplit_once('@')
            .ok_or("expected GPU:LAYOUT@MS (ms after the start)")?;
        let (gpu, layout) = parse_card(spec)?;
        Ok(Self {
            gpu,
            layout,
            at_ms: at.trim().parse().map_err(|_| "MS must be an integer")?,
        })
    }
}

/// Parses `GPU:LAYOUT`.
pub fn parse_card(s: &str) -> Result<(usize, Layout), &'static str> {
    let (gpu, layout) = s.split_once(':').ok_or("expected GPU:LAYOUT")?;
    let gpu = gpu.trim().parse().map_err(|_| "GPU must be a card index")?;
    Ok((gpu, Layout::parse(layout)?))
}
