//! `flopwatch tile M N K [--kernel NAME | --tile TMxTNxTK --cluster CMxCN] [--ofu X]`

use flopwatch_collector::{adjusted_ofu, quantize, TileShape};

/// Arguments of `tile`.
#[derive(clap::Args)]
pub(crate) struct TileArgs {
    /// Rows of A and C.
    m: u64,
    /// Columns of B and C.
    n: u64,
    /// Inner dimension.
    k: u64,
    /// An nvJet kernel name carrying its tile shape, e.g. nvjet_sm90_hsh_256x160_64x4_2x1.
    #[arg(long, conflicts_with_all = ["tile", "cluster"])]
    kernel: Option<String>,
    /// Tile shape TMxTNxTK.
    #[arg(long, required_unless_present = "kernel")]
    tile: Option<String>,
    /// Cluster shape CMxCN (default 1x1).
    #[arg(long, requires = "tile")]
    cluster: Option<String>,
    /// Measured OFU (fraction 0–1, or percent with %), to correct (eq. 8).
    #[arg(long)]
    ofu: Option<String>,
}

pub(crate) fn run(a: TileArgs) -> anyhow::Result<()> {
    let shape = match (&a.kernel, &a.tile) {
        (Some(k), _) => TileShape::from_kernel(k)?,
        (None, Some(t)) => TileShape::parse(t, a.cluster.as_deref())?,
        (None, None) => anyhow::bail!("give --kernel or --tile"),
    };
    let r = quantize(a.m, a.n, a.k, shape)?;
    println!(
        "tile {}x{}x{}, cluster {}x{}",
        shape.tm, shape.tn, shape.tk, shape.cm, shape.cn
    );
    println!("2MNK                  {:.6e} FLOPs", r.flops_theoretical);
    println!(
        "padded (eq. 3-4)      {:.6e} FLOPs  (M_eff {} N_eff {} K_eff {})",
        r.flops_padded, r.m_eff, r.n_eff, r.k_eff
    );
    println!("overhead (eq. 2)      {:.4} %", r.overhead * 100.0);
    if let Some(o) = &a.ofu {
        let v = match o.strip_suffix('%') {
            Some(p) => p.trim().parse::<f64>().map(|x| x / 100.0),
            None => o.parse::<f64>(),
        }
        .map_err(|_| {
            anyhow::anyhow!("--ofu `{o}`: expected a fraction like 0.55 or a percent like 55%")
        })?;
        if !(0.0..=1.0).contains(&v) {
            anyhow::bail!("--ofu `{o}`: must lie between 0 and 1 (0-100 %)");
        }
        println!(
            "adjusted OFU (eq. 8)  {:.4} %  (from {:.4} %)",
            adjusted_ofu(v, &r) * 100.0,
            v * 100.0
        );
    }
    Ok(())
}
