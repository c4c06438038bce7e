//! A tiny scoped work pool: workloads are independent, so the per-workload
//! alignment and Gram products run on all cores without a dependency.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// `(0..n).map(f)` on up to `available_parallelism` threads, in order.
pub(crate) fn par_map<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |p| p.get())
        .min(n);
    if threads <= 1 {
        return (0..n).map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<T>>> = Mutex::new((0..n).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let v = f(i);
                out.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(v);
            });
        }
    });
    out.into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|v| v.expect("every index was computed"))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn keeps_order() {
        assert_eq!(
            super::par_map(100, |i| i * 2),
            (0..100).map(|i| i * 2).collect::<Vec<_>>()
        );
        assert!(super::par_map(0, |i| i).is_empty());
    }
}
