//! Which collector a node sends to: rendezvous (highest random weight)
//! hashing of the node id with each collector's address.
//!
//! Every agent ranks the collectors by `hash(node_id, address)`; the first
//! is the node's home, the rest the order it fails over in. Nodes spread
//! evenly over the collectors, and when one collector is removed only its
//! nodes move (each to its own next choice), the others keep their home.

/// FNV-1a over the bytes, then a splitmix64 finalizer: stable across
/// versions, platforms and processes (unlike std's `DefaultHasher`).
pub(crate) fn weight(node_id: &str, collector: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node_id
        .as_bytes()
        .iter()
        .chain(std::iter::once(&0u8))
        .chain(collector.as_bytes())
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Indices of `collectors` from the node's home to its last choice.
pub fn order(node_id: &str, collectors: &[String]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..collectors.len()).collect();
    // Ties (only for duplicate addresses) keep the configured order.
    idx.sort_by(|&a, &b| {
        weight(node_id, &collectors[b])
            .cmp(&weight(node_id, &collectors[a]))
            .then(a.cmp(&b))
    });
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("http://10.0.0.{i}:7070")).collect()
    }

    #[test]
    fn order_is_a_permutation_and_stable() {
        let c = urls(5);
        let o = order("node-1", &c);
        let mut sorted = o.clone();
        sorted.sort();
        assert_eq!(sorted, vec![0, 1, 2, 3, 4]);
        assert_eq!(o, order("node-1", &c));
        // The configured order of the list does not matter.
        let mut rev = c.clone();
        rev.reverse();
        let o2: Vec<&String> = order("node-1", &rev).iter().map(|&i| &rev[i]).collect();
        let o1: Vec<&String> = o.iter().map(|&i| &c[i]).collect();
        assert_eq!(o1, o2);
    }

    #[test]
    fn nodes_spread_and_removal_moves_only_that_collectors_nodes() {
        let c = urls(3);
        let mut homes = [0usize; 3];
        let mut moved_wrongly = 0;
        for n in 0..3000 {
            let node = format!("node-{n}");
            let home = order(&node, &c)[0];
            homes[home] += 1;
            // Remove collector 2: nodes homed elsewhere stay put.
            let rest = vec![c[0].clone(), c[1].clone()];
            let new_home = &rest[order(&node, &rest)[0]];
            if home != 2 && *new_home != c[home] {
                moved_wrongly += 1;
            }
            if home == 2 {
                assert_eq!(
                    *new_home,
                    c[order(&node, &c)[1]],
                    "fails over to its second choice"
                );
            }
        }
        assert_eq!(moved_wrongly, 0);
        for h in homes {
            assert!((800..1200).contains(&h), "{homes:?}");
        }
    }
}
