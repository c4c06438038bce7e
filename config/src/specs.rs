//! The GPU spec table: SM count, tensor FLOPs per clock per SM for each
//! precision, and the tensor-core peak clock (OFU paper §IV-D, eq. 5).

use crate::ConfigError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// The table shipped with flopwatch (`config/gpus.toml`).
pub const DEFAULT_SPEC_TABLE: &str = include_str!("../gpus.toml");

/// Numeric formats with a tensor-core peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// FP16 with FP32 accumulate: the reference precision of OFU.
    Fp16,
    /// BF16.
    Bf16,
    /// TF32.
    Tf32,
    /// FP8 (E4M3/E5M2).
    Fp8,
    /// INT8.
    Int8,
    /// FP4 (NVFP4).
    Fp4,
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "fp16" => Precision::Fp16,
            "bf16" => Precision::Bf16,
            "tf32" => Precision::Tf32,
            "fp8" => Precision::Fp8,
            "int8" => Precision::Int8,
            "fp4" | "nvfp4" => Precision::Fp4,
            other => return Err(format!("unknown precision `{other}`")),
        })
    }
}

/// One GPU model.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    /// Short stable key, e.g. "h100-sxm".
    pub key: String,
    /// Display name.
    pub name: String,
    /// Name patterns that select this entry: each pattern's tokens must
    /// all be tokens of the NVML product name (see [`SpecTable::lookup`]).
    #[serde(rename = "match")]
    pub matches: Vec<String>,
    /// Where the figures come from (datasheet, whitepaper); informational.
    #[serde(default)]
    pub source: String,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// SM boost clock, MHz.
    pub boost_clock_mhz: u32,
    /// Tensor-core peak clock f_max, MHz (OFU eq. 1 denominator).
    pub tensor_clock_mhz: u32,
    /// Dense tensor FLOPs per clock per SM, by precision.
    pub flops_per_clock_per_sm: BTreeMap<Precision, u64>,
    /// Dense peaks the vendor publishes, TFLOP/s by precision: what the
    /// factors above must reproduce (the built-in table is tested to 1 %).
    #[serde(default)]
    pub published_dense_tflops: BTreeMap<Precision, f64>,
    /// SMs of each MIG GPU instance profile (`"3g.40gb" = 60`), as
    /// `nvidia-smi mig -lgip` lists them; empty for GPUs without MIG.
    #[serde(default)]
    pub mig_sms: BTreeMap<String, u32>,
}

impl GpuSpec {
    /// Peak dense tensor TFLOP/s at `precision` (OFU eq. 5), `None` if the
    /// GPU has no tensor path for it.
    pub fn peak_tflops(&self, precision: Precision) -> Option<f64> {
        let per = *self.flops_per_clock_per_sm.get(&precision)?;
        Some(self.sm_count as f64 * per as f64 * self.tensor_clock_mhz as f64 * 1e6 / 1e12)
    }

    /// The share of the card's compute capacity (its SMs) a MIG instance
    /// of `profile` holds, given `instance_sms` when the driver told them
    /// (NVML's device attributes; 0 when not). The rule: SMs of the
    /// instance ÷ SMs of the card, the SMs taken from the driver, else
    /// [`GpuSpec::mig_sms`] (`nvidia-smi mig -lgip`), else the profile's
    /// `<n>g` compute slices ÷ the card's largest profile's slices (7
    /// unless the table says otherwise, 4 on A30) × the card's SMs. A
    /// 7g instance of an A100 holds 98 of 108 SMs: 0.907 of the card.
    /// `None` when nothing tells (no SMs, no `<n>g` profile).
    pub fn mig_share(&self, profile: &str, instance_sms: u32) -> Option<f64> {
        if self.sm_count == 0 {
            return None;
        }
        let card = f64::from(self.sm_count);
        if instance_sms > 0 {
            return Some((f64::from(instance_sms) / card).min(1.0));
        }
        let base = mig_base_profile(profile);
        if let Some(&sms) = self.mig_sms.get(base) {
            return Some((f64::from(sms) / card).min(1.0));
        }
        let slices = mig_slices(base)?;
        let most = self
            .mig_sms
            .keys()
            .filter_map(|k| mig_slices(k))
            .max()
            .unwrap_or(7);
        Some((f64::from(slices) / f64::from(most.max(slices))).min(1.0))
    }
}

/// A GPU instance profile without its options (`1g.10gb+me` → `1g.10gb`)
/// or a compute instance prefix (`1c.3g.40gb` → `3g.40gb`).
fn mig_base_profile(profile: &str) -> &str {
    let p = profile.trim();
    let p = p.split('+').next().unwrap_or(p);
    match p.split_once('.') {
        Some((first, rest)) if first.ends_with('c') && rest.contains('g') => rest,
        _ => p,
    }
}

/// The compute slices of a GPU instance profile: `3g.40gb` → 3.
fn mig_slices(profile: &str) -> Option<u32> {
    let head = profile.split('.').next()?;
    head.strip_suffix('g')?.parse().ok().filter(|&n| n > 0)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TableFile {
    gpu: Vec<GpuSpec>,
}

/// Name tokens that tell a form factor apart: a product name carrying one
/// matches only patterns that name it, so "H100" (SXM) can never take
/// "H100 PCIe" or "H100 NVL" in any spelling.
const FORM_FACTOR_TOKENS: [&str; 2] = ["pcie", "nvl"];

/// A product name or `match` pattern as tokens: lower-cased, split at
/// blanks, `-` and `_` (dcgm-exporter's `--replace-blanks-in-model-name`
/// turns "NVIDIA H100 PCIe" into "NVIDIA-H100-PCIe"), with a leading
/// "nvidia" dropped.
fn tokens(s: &str) -> Vec<String> {
    let mut t: Vec<String> = s
        .split(|c: char| c.is_whitespace() || c == '-' || c == '_')
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    if t.first().is_some_and(|w| w == "nvidia") {
        t.remove(0);
    }
    t
}

/// Whether pattern token `p` matches name token `n`: equal, or (for a
/// pattern token ending in a letter) `n` is `p` followed by digits, so
/// "sxm" matches "sxm4" while "a10" never matches "a100", "l4" never
/// "l40", "h20" never "h200".
fn token_matches(p: &str, n: &str) -> bool {
    n == p
        || (p.ends_with(|c: char| c.is_ascii_alphabetic())
            && n.strip_prefix(p)
                .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit())))
}

/// How specifically `pattern` matches `name` (its token count), or `None`
/// when some pattern token is not in the name, or the name carries a
/// form-factor token the pattern does not name.
fn specificity(pattern: &[String], name: &[String]) -> Option<usize> {
    let all_found = pattern
        .iter()
        .all(|p| name.iter().any(|n| token_matches(p, n)));
    let form_factor_named = name
        .iter()
        .filter(|n| FORM_FACTOR_TOKENS.contains(&n.as_str()))
        .all(|n| pattern.contains(n));
    (all_found && form_factor_named).then_some(pattern.len())
}

/// All known GPU models, looked up by NVML product name.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecTable {
    specs: Vec<GpuSpec>,
    /// `specs[i].matches`, tokenized once.
    patterns: Vec<Vec<Vec<String>>>,
}

impl SpecTable {
    /// The table shipped with flopwatch.
    pub fn builtin() -> Self {
        // The shipped table is checked by tests; failing here is a build bug.
        Self::parse(DEFAULT_SPEC_TABLE, Path::new("config/gpus.toml"))
            .expect("the built-in GPU spec table parses")
    }

    /// Parses a table file's text.
    pub fn parse(text: &str, file: &Path) -> Result<Self, ConfigError> {
        let t: TableFile = toml::from_str(text).map_err(|e| ConfigError::Parse {
            file: file.to_path_buf(),
            message: e.to_string(),
        })?;
        for (i, s) in t.gpu.iter().enumerate() {
            let key = |k: &str| format!("gpu[{i}].{k}");
            let bad = |k: &str, m: &str| ConfigError::Invalid {
                file: file.to_path_buf(),
                key: key(k),
                message: m.to_string(),
            };
            if s.sm_count == 0 {
                return Err(bad("sm_count", "must be positive"));
            }
            if s.tensor_clock_mhz == 0 {
                return Err(bad("tensor_clock_mhz", "must be positive"));
            }
            if s.matches.is_empty() {
                return Err(bad("match", "needs at least one name pattern"));
            }
            if s.matches.iter().any(|p| tokens(p).is_empty()) {
                return Err(bad(
                    "match",
                    "a pattern has no name tokens (blank, or only \"NVIDIA\")",
                ));
            }
            if !s.flops_per_clock_per_sm.contains_key(&Precision::Fp16) {
                return Err(bad("flops_per_clock_per_sm", "needs an fp16 entry"));
            }
            if s.published_dense_tflops
                .values()
                .any(|v| !(v.is_finite() && *v > 0.0))
            {
                return Err(bad(
                    "published_dense_tflops",
                    "values must be positive TFLOP/s",
                ));
            }
        }
        let patterns = t
            .gpu
            .iter()
            .map(|s| s.matches.iter().map(|p| tokens(p)).collect())
            .collect();
        Ok(Self {
            specs: t.gpu,
            patterns,
        })
    }

    /// Reads a table from a file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// The entry for an NVML product name, or by key.
    ///
    /// An exact `key` wins. Otherwise the name and every `match` pattern
    /// are compared as tokens (lower-cased, split at blanks, `-` and `_`, a
    /// leading "NVIDIA" dropped): a pattern matches when each of its tokens
    /// is a whole token of the name, where a pattern token ending in a
    /// letter also matches that token followed by digits ("SXM" matches
    /// "SXM4"); a name carrying a form-factor token ("PCIe", "NVL") matches
    /// only patterns that name it. The matching pattern with the most
    /// tokens wins; a tie goes to the earlier entry.
    pub fn lookup(&self, model: &str) -> Option<&GpuSpec> {
        let m = model.to_ascii_lowercase();
        if let Some(s) = self.specs.iter().find(|s| s.key == m) {
            return Some(s);
        }
        let name = tokens(model);
        let mut best: Option<(usize, &GpuSpec)> = None;
        for (spec, patterns) in self.specs.iter().zip(&self.patterns) {
            let Some(score) = patterns.iter().filter_map(|p| specificity(p, &name)).max() else {
                continue;
            };
            if best.is_none_or(|(b, _)| score > b) {
                best = Some((score, spec));
            }
        }
        best.map(|(_, s)| s)
    }

    /// Every entry.
    pub fn all(&self) -> &[GpuSpec] {
        &self.specs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_shares_follow_the_sms_of_each_profile() {
        let t = SpecTable::builtin();
        let a100 = t.lookup("NVIDIA A100-SXM4-80GB").unwrap();
        let share = |spec: &GpuSpec, p: &str| spec.mig_share(p, 0).unwrap();
        assert!((share(a100, "3g.40gb") - 42.0 / 108.0).abs() < 1e-12);
        assert!((share(a100, "7g.80gb") - 98.0 / 108.0).abs() < 1e-12);
        assert!((share(a100, "1g.10gb+me") - 14.0 / 108.0).abs() < 1e-12);
        assert!((share(a100, "1c.3g.40gb") - 42.0 / 108.0).abs() < 1e-12);
        // The driver's own count wins over the table.
        assert!((a100.mig_share("3g.40gb", 54).unwrap() - 0.5).abs() < 1e-12);
        let h100 = t.lookup("NVIDIA H100 80GB HBM3").unwrap();
        assert!((share(h100, "3g.40gb") - 60.0 / 132.0).abs() < 1e-12);
        assert_eq!(share(h100, "7g.80gb"), 1.0);
        // Not in the table: slices of the card's largest profile.
        assert!((share(h100, "2g.24gb") - 2.0 / 7.0).abs() < 1e-12);
        let a30 = t.lookup("NVIDIA A30").unwrap();
        assert!((share(a30, "2g.24gb") - 2.0 / 4.0).abs() < 1e-12);
        assert_eq!(share(a30, "4g.24gb"), 1.0);
        // Nothing to go by.
        assert_eq!(a100.mig_share("", 0), None);
        assert_eq!(a100.mig_share("big", 0), None);
        // Every listed profile is a share of at most the whole card.
        for spec in t.all() {
            for (p, sms) in &spec.mig_sms {
                assert!(*sms <= spec.sm_count, "{} {p}", spec.key);
                assert!(mig_slices(p).is_some(), "{} {p}", spec.key);
            }
        }
    }

    fn round1(x: f64) -> f64 {
        (x * 10.0).round() / 10.0
    }

    #[test]
    fn h100_sxm_is_989_4_dense_fp16() {
        // OFU eq. 6.
        let t = SpecTable::builtin();
        let h = t.lookup("NVIDIA H100 80GB HBM3").unwrap();
        assert_eq!(h.key, "h100-sxm");
        assert_eq!(round1(h.peak_tflops(Precision::Fp16).unwrap()), 989.4);
        // §IV-D: FP8 doubles, TF32 halves.
        assert_eq!(round1(h.peak_tflops(Precision::Fp8).unwrap()), 1978.9);
        assert_eq!(round1(h.peak_tflops(Precision::Tf32).unwrap()), 494.7);
    }

    #[test]
    fn gb200_is_2499_9_dense_fp16() {
        // OFU eq. 7 prints 2,499.9 TFLOP/s, but its own factors give
        // 148 × 8192 × 2062 MHz = 2,500.0018 TFLOP/s: we keep the paper's
        // factors (the table is what users audit) and check the product is
        // within 0.11 TFLOP/s of the printed figure.
        let t = SpecTable::builtin();
        let g = t.lookup("NVIDIA GB200").unwrap();
        assert_eq!(g.key, "gb200");
        let p = g.peak_tflops(Precision::Fp16).unwrap();
        assert!((p - 2_500.001_792).abs() < 1e-6, "{p}");
        assert!((p - 2499.9).abs() < 0.11, "{p}");
    }

    #[test]
    fn specific_names_win_over_generic_ones() {
        let t = SpecTable::builtin();
        assert_eq!(t.lookup("NVIDIA H100 PCIe").unwrap().key, "h100-pcie");
        assert_eq!(t.lookup("NVIDIA H100 NVL").unwrap().key, "h100-nvl");
        assert_eq!(t.lookup("NVIDIA B200").unwrap().key, "b200");
        assert_eq!(t.lookup("NVIDIA A100-SXM4-80GB").unwrap().key, "a100-sxm");
        assert_eq!(t.lookup("NVIDIA A100-PCIE-40GB").unwrap().key, "a100-pcie");
        assert_eq!(t.lookup("NVIDIA H200").unwrap().key, "h200");
        assert_eq!(t.lookup("NVIDIA L40S").unwrap().key, "l40s");
        assert!(t.lookup("Tesla K80").is_none());
        // Published dense FP16 peaks reproduced within 1 %.
        for (name, published) in [
            ("NVIDIA A100-SXM4-80GB", 312.0),
            ("NVIDIA H100 PCIe", 756.0),
            ("NVIDIA B200", 2250.0),
            ("NVIDIA L40S", 362.05),
        ] {
            let p = t
                .lookup(name)
                .unwrap()
                .peak_tflops(Precision::Fp16)
                .unwrap();
            assert!((p / published - 1.0).abs() < 0.01, "{name}: {p}");
        }
    }

    #[test]
    fn names_and_patterns_tokenize_alike() {
        assert_eq!(tokens("NVIDIA H100 PCIe"), ["h100", "pcie"]);
        assert_eq!(tokens("NVIDIA-H100-PCIe"), ["h100", "pcie"]);
        assert_eq!(tokens("nvidia_a100-SXM4-80GB"), ["a100", "sxm4", "80gb"]);
        assert_eq!(tokens("  NVIDIA   L40S "), ["l40s"]);
        // Only a leading "NVIDIA" is dropped.
        assert_eq!(tokens("Tesla NVIDIA X"), ["tesla", "nvidia", "x"]);
        assert!(tokens("NVIDIA").is_empty());
    }

    #[test]
    fn tokens_match_whole_or_with_a_digit_suffix_after_a_letter() {
        assert!(token_matches("sxm", "sxm4"));
        assert!(token_matches("sxm", "sxm"));
        assert!(!token_matches("a10", "a100"));
        assert!(!token_matches("l4", "l40"));
        assert!(!token_matches("l40", "l40s"));
        assert!(!token_matches("h20", "h200"));
        assert!(!token_matches("b200", "gb200"));
        assert!(!token_matches("sxm", "sxm4x"));
    }

    #[test]
    fn most_tokens_win_and_ties_go_to_the_earlier_row() {
        let row = |key: &str, pats: &str| {
            format!("[[gpu]]\nkey='{key}'\nname='{key}'\nmatch=[{pats}]\nsm_count=1\nboost_clock_mhz=1\ntensor_clock_mhz=1\nflops_per_clock_per_sm={{fp16=1}}\n")
        };
        let text = [
            row("generic", "'X1'"),
            row("first", "'X1 Foo'"),
            row("second", "'X1 Foo'"),
            row("pcie", "'X1 PCIe'"),
        ]
        .concat();
        let t = SpecTable::parse(&text, Path::new("t.toml")).unwrap();
        assert_eq!(t.lookup("NVIDIA X1").unwrap().key, "generic");
        assert_eq!(t.lookup("NVIDIA X1 Foo").unwrap().key, "first");
        assert_eq!(t.lookup("nvidia-x1-pcie").unwrap().key, "pcie");
        // A form factor no row names is unknown, not the generic row.
        assert!(t.lookup("NVIDIA X1 NVL").is_none());
        assert_eq!(t.lookup("second").unwrap().key, "second");
    }

    #[test]
    fn a_pattern_without_tokens_is_rejected() {
        let text = "[[gpu]]\nkey='x'\nname='x'\nmatch=['NVIDIA']\nsm_count=1\nboost_clock_mhz=1\ntensor_clock_mhz=1\nflops_per_clock_per_sm={fp16=1}\n";
        let e = SpecTable::parse(text, Path::new("t.toml")).unwrap_err();
        assert!(e.to_string().contains("gpu[0].match"), "{e}");
    }

    #[test]
    fn bad_table_names_the_key() {
        let text = "[[gpu]]\nkey='x'\nname='x'\nmatch=['x']\nsm_count=0\nboost_clock_mhz=1\ntensor_clock_mhz=1\nflops_per_clock_per_sm={fp16=1}\n";
        let e = SpecTable::parse(text, Path::new("t.toml")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.toml: key `gpu[0].sm_count`: must be positive"
        );
    }
}
