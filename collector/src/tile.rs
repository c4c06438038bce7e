//! Tile quantization (OFU paper §IV-A, eq. 2–4 and 8).
//!
//! GEMM kernels compute whole output tiles of `T_M × T_N` (and step K by
//! `T_K`), zero-padding the last ones (eq. 3); kernels that group thread
//! blocks into `C_M × C_N` clusters round the tile count up once more
//! (eq. 4). The hardware therefore executes `2·M_eff·N_eff·K_eff` FLOPs for a
//! `2·M·N·K` problem: OFU, which counts what the tensor pipes did, reads
//! higher than application MFU by the overhead of eq. 2, and eq. 8 corrects
//! it.

/// Tile and cluster shape of a GEMM kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileShape {
    /// Tile rows (T_M).
    pub tm: u64,
    /// Tile columns (T_N).
    pub tn: u64,
    /// K step (T_K).
    pub tk: u64,
    /// Cluster rows (C_M).
    pub cm: u64,
    /// Cluster columns (C_N).
    pub cn: u64,
}

/// What the padding costs for one GEMM.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TileReport {
    /// 2·M·N·K.
    pub flops_theoretical: f64,
    /// Effective dimensions (eq. 3–4).
    pub m_eff: u64,
    /// Effective N.
    pub n_eff: u64,
    /// Effective K.
    pub k_eff: u64,
    /// 2·M_eff·N_eff·K_eff.
    pub flops_padded: f64,
    /// (padded − theoretical) / theoretical (eq. 2), a fraction.
    pub overhead: f64,
}

/// A shape or dimension that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TileError {
    /// A zero dimension or tile size.
    #[error("{0} must be positive")]
    Zero(&'static str),
    /// A kernel name without a recognisable tile shape.
    #[error("cannot read a tile shape from kernel name `{0}` (expected e.g. nvjet_sm90_hsh_256x160_64x4_2x1)")]
    Kernel(String),
    /// A `AxBxC` / `AxB` argument that does not parse.
    #[error("`{0}`: expected {1}")]
    Shape(String, &'static str),
}

fn dims(s: &str, n: usize, what: &'static str) -> Result<Vec<u64>, TileError> {
    let v: Vec<u64> = s
        .split(['x', 'X'])
        .map(|p| p.parse::<u64>())
        .collect::<Result<_, _>>()
        .map_err(|_| TileError::Shape(s.to_string(), what))?;
    if v.len() != n || v.contains(&0) {
        return Err(TileError::Shape(s.to_string(), what));
    }
    Ok(v)
}

impl TileShape {
    /// From `--tile TMxTNxTK` and `--cluster CMxCN`.
    pub fn parse(tile: &str, cluster: Option<&str>) -> Result<Self, TileError> {
        let t = dims(tile, 3, "TMxTNxTK, e.g. 256x128x64")?;
        let c = match cluster {
            Some(c) => dims(c, 2, "CMxCN, e.g. 2x1")?,
            None => vec![1, 1],
        };
        Ok(Self {
            tm: t[0],
            tn: t[1],
            tk: t[2],
            cm: c[0],
            cn: c[1],
        })
    }

    /// From an nvJet kernel name: `…_<TM>x<TN>_<TK>x<stages>_<CM>x<CN>`,
    /// the encoding §IV-A describes (e.g. `nvjet_sm90_hsh_256x160_64x4_2x1`:
    /// 256×160 tiles, K step 64 with 4 stages, 2×1 clusters).
    pub fn from_kernel(name: &str) -> Result<Self, TileError> {
        let bad = || TileError::Kernel(name.to_string());
        let parts: Vec<&str> = name.split('_').collect();
        let pairs: Vec<(u64, u64)> = parts
            .iter()
            .filter_map(|p| {
                let (a, b) = p.split_once('x')?;
                Some((a.parse().ok()?, b.parse().ok()?))
            })
            .collect();
        let [(tm, tn), (tk, _stages), (cm, cn)] = pairs[..] else {
            return Err(bad());
        };
        if [tm, tn, tk, cm, cn].contains(&0) {
            return Err(bad());
        }
        Ok(Self { tm, tn, tk, cm, cn })
    }
}

fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// Eq. 2–4 for an `M × N × K` GEMM on `shape`.
pub fn quantize(m: u64, n: u64, k: u64, s: TileShape) -> Result<TileReport, TileError> {
    for (v, name) in [(m, "M"), (n, "N"), (k, "K")] {
        if v == 0 {
            return Err(TileError::Zero(name));
        }
    }
    // Eq. 4: tiles, rounded up to whole clusters; eq. 3 when C = 1.
    let m_eff = ceil_div(ceil_div(m, s.tm), s.cm) * s.cm * s.tm;
    let n_eff = ceil_div(ceil_div(n, s.tn), s.cn) * s.cn * s.tn;
    let k_eff = ceil_div(k, s.tk) * s.tk;
    let theo = 2.0 * m as f64 * n as f64 * k as f64;
    let padded = 2.0 * m_eff as f64 * n_eff as f64 * k_eff as f64;
    Ok(TileReport {
        flops_theoretical: theo,
        m_eff,
        n_eff,
        k_eff,
        flops_padded: padded,
        overhead: (padded - theo) / theo,
    })
}

/// Eq. 8: OFU corrected for the padding.
pub fn adjusted_ofu(ofu: f64, r: &TileReport) -> f64 {
    ofu * r.flops_theoretical / r.flops_padded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvjet_name_and_worked_example() {
        let s = TileShape::from_kernel("nvjet_sm90_hsh_256x160_64x4_2x1").unwrap();
        assert_eq!(
            s,
            TileShape {
                tm: 256,
                tn: 160,
                tk: 64,
                cm: 2,
                cn: 1
            }
        );
        // By hand: M = 4096 → 16 tiles → 8 clusters of 2 → 4096;
        // N = 4096 → 25.6 → 26 tiles → 4160; K = 4096 → 64 steps → 4096.
        let r = quantize(4096, 4096, 4096, s).unwrap();
        assert_eq!((r.m_eff, r.n_eff, r.k_eff), (4096, 4160, 4096));
        assert!((r.overhead - 0.015_625).abs() < 1e-12);
        // Eq. 8: 50 % OFU → 50 % × 4096/4160.
        assert!((adjusted_ofu(0.5, &r) - 0.492_307_692_3).abs() < 1e-9);
    }

    #[test]
    fn unaligned_and_cluster_padding() {
        // 1000³ on 128×128×64 tiles: every dimension pads to 1024 (eq. 3).
        let s = TileShape::parse("128x128x64", None).unwrap();
        let r = quantize(1000, 1000, 1000, s).unwrap();
        assert_eq!((r.m_eff, r.n_eff, r.k_eff), (1024, 1024, 1024));
        assert!((r.overhead - 0.073_741_824).abs() < 1e-12);
        // Eq. 4: 4097 rows → 17 tiles of 256 → 9 clusters of 2 → 4608,
        // one whole extra cluster beyond eq. 3's 4352.
        let s = TileShape::parse("256x128x64", Some("2x1")).unwrap();
        assert_eq!(quantize(4097, 128, 64, s).unwrap().m_eff, 4608);
        assert_eq!(quantize(4096, 128, 64, s).unwrap().overhead, 0.0);
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(TileShape::from_kernel("ampere_sgemm_128x64_nn").is_err());
        assert!(TileShape::parse("128x128", None).is_err());
        assert!(TileShape::parse("128x0x64", None).is_err());
        assert!(TileShape::parse("128x128x64", Some("2")).is_err());
        let s = TileShape::parse("128x128x64", None).unwrap();
        assert_eq!(quantize(0, 1, 1, s), Err(TileError::Zero("M")));
    }
}
