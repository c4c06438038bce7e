//! Grouping redundant metrics with linfa-hierarchical, and picking one
//! representative per group.
//!
//! linfa-hierarchical clusters a similarity *kernel* and turns each entry
//! back into a distance with `−ln(k)`. We hand it `k = exp(−d)` built from
//! our precomputed distances (`d` = max over workloads of the RMS eq. 1
//! distance), so it sees exactly `d` (entries below 1e-6, i.e. `d > 13.8`,
//! are clamped there; RMS distances never exceed 1, pairs that never share
//! a workload are `∞` and stay far apart).
//!
//! Complete linkage merges two clusters at the *largest* distance between
//! their members and linfa stops before the first merge at or above the
//! cutoff, so every pair inside a group is strictly under the threshold:
//! "redundant" is transitive only where it is true pairwise.

use linfa::traits::Transformer;
use linfa_hierarchical::{HierarchicalCluster, Method};
use linfa_kernel::{Kernel, KernelInner, KernelMethod};
use ndarray::Array2;

use crate::SelectError;

/// Groups of indices into `dist` whose pairwise distances are all below
/// `threshold`. Members ascend; groups are ordered by their first member.
pub(crate) fn complete_linkage(
    dist: &Array2<f64>,
    threshold: f64,
) -> Result<Vec<Vec<usize>>, SelectError> {
    let n = dist.nrows();
    if n < 2 {
        return Ok((0..n).map(|i| vec![i]).collect());
    }
    let similarity = dist.mapv(|d| if d.is_nan() { 0.0 } else { (-d).exp() });
    let kernel = Kernel {
        inner: KernelInner::Dense(similarity),
        method: KernelMethod::Linear,
    };
    let labels = HierarchicalCluster::default()
        .with_method(Method::Complete)
        .max_distance(threshold)
        .transform(kernel)
        .map_err(|e| SelectError::Cluster(e.to_string()))?
        .targets;

    // linfa numbers clusters in hash-map order; renumber deterministically.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut slot = std::collections::HashMap::new();
    for (i, label) in labels.into_iter().enumerate() {
        let g = *slot.entry(label).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(i);
    }
    debug_assert!(groups.iter().all(|g| g
        .iter()
        .all(|&a| g.iter().all(|&b| a == b || dist[[a, b]] < threshold))));
    Ok(groups)
}

/// Relative difference under which two variance scores are a tie.
pub const SCORE_TIE: f64 = 1e-9;

/// The representative of a group: the first metric of `prefer` that is a
/// member, else the member with the highest `score` (its relative
/// variance), ties (within a relative [`SCORE_TIE`]) broken by the smaller name.
pub(crate) fn representative(
    members: &[usize],
    names: &[String],
    score: &[f64],
    prefer: &[String],
) -> usize {
    if let Some(&m) = prefer
        .iter()
        .find_map(|p| members.iter().find(|&&m| &names[m] == p))
    {
        return m;
    }
    // Scores equal up to rounding (a ×1000 copy of a series) count as ties.
    let best = members
        .iter()
        .map(|&m| score[m])
        .fold(f64::NEG_INFINITY, f64::max);
    let tolerance = best.abs() * SCORE_TIE;
    *members
        .iter()
        .filter(|&&m| score[m] >= best - tolerance)
        .min_by(|&&a, &&b| names[a].cmp(&names[b]))
        .expect("groups are never empty")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn complete_linkage_keeps_every_pair_under_the_cutoff() {
        // a-b and b-c are close, a-c is not: a chain must not become one group.
        let d = array![
            [0.0, 0.04, 0.07, 0.9],
            [0.04, 0.0, 0.04, 0.9],
            [0.07, 0.04, 0.0, 0.9],
            [0.9, 0.9, 0.9, 0.0],
        ];
        let groups = complete_linkage(&d, 0.05).unwrap();
        assert_eq!(groups.len(), 3);
        assert!(groups.contains(&vec![3]));
        let all = complete_linkage(&d, 0.08).unwrap();
        assert!(all.contains(&vec![0, 1, 2]));
    }

    #[test]
    fn never_together_stays_apart() {
        let d = array![[0.0, f64::INFINITY], [f64::INFINITY, 0.0]];
        assert_eq!(complete_linkage(&d, 1.0).unwrap().len(), 2);
    }

    #[test]
    fn preference_then_variance_then_name() {
        let names: Vec<String> = ["b", "a", "c"].iter().map(|s| s.to_string()).collect();
        let members = [0, 1, 2];
        let prefer = vec!["zz".to_owned(), "c".to_owned()];
        assert_eq!(
            representative(&members, &names, &[0.1, 0.1, 0.0], &prefer),
            2
        );
        assert_eq!(representative(&members, &names, &[0.1, 0.1, 0.0], &[]), 1);
        assert_eq!(representative(&members, &names, &[0.2, 0.1, 0.0], &[]), 0);
    }
}
