//! Independent work spread over the cores: a fleet-wide PromQL
//! selector's series, a ledger's GPUs, the series of a GPU-hour being
//! sealed.

/// `f` of each of `items`, in order, the items split into contiguous
/// parts read on up to one thread per core, each thread taking at least
/// `per_thread` items (below twice that, this thread reads them all).
/// Each part's results, or its first error. Where no thread can be had,
/// this one reads every part. The threads started inherit this one's CPU
/// priority (the compactor's stays low).
pub fn in_parallel<T: Send, R: Send, E: Send>(
    items: Vec<T>,
    per_thread: usize,
    f: &(dyn Fn(T) -> Result<R, E> + Sync),
) -> Vec<Result<Vec<R>, E>> {
    parts_in_parallel(items, per_thread, &|part| part.into_iter().map(f).collect())
}

/// [`in_parallel`], with `f` taking a whole part (what it sets up once
/// for a part, such as a view of the store, serves all its items).
pub fn parts_in_parallel<T: Send, R: Send, E: Send>(
    items: Vec<T>,
    per_thread: usize,
    f: &(dyn Fn(Vec<T>) -> Result<Vec<R>, E> + Sync),
) -> Vec<Result<Vec<R>, E>> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cores.min(items.len() / per_thread.max(1)).max(1);
    if threads == 1 {
        return vec![f(items)];
    }
    let per = items.len().div_ceil(threads);
    let mut parts: Vec<Vec<T>> = Vec::with_capacity(threads);
    let mut items = items.into_iter();
    loop {
        let part: Vec<T> = items.by_ref().take(per).collect();
        if part.is_empty() {
            break;
        }
        parts.push(part);
    }
    in_parts(parts, threads, f)
}

/// `f` of each of `items`, each item a part of its own taken by the next
/// free thread of up to one per core, in order: items of uneven cost
/// spread evenly when the costliest come first. Each item's result.
pub fn each_in_parallel<T: Send, R: Send, E: Send>(
    items: Vec<T>,
    f: &(dyn Fn(T) -> Result<R, E> + Sync),
) -> Vec<Result<R, E>> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cores.min(items.len()).max(1);
    if threads == 1 {
        return items.into_iter().map(f).collect();
    }
    let parts = items.into_iter().map(|i| vec![i]).collect();
    let run = |part: Vec<T>| part.into_iter().map(f).collect();
    in_parts(parts, threads, &run)
        .into_iter()
        .map(|r| r.map(|mut v| v.remove(0)))
        .collect()
}

/// Each of `parts` read by `run` on `threads` threads (this one among
/// them), each thread taking the next part not yet taken.
fn in_parts<T: Send, R: Send, E: Send>(
    parts: Vec<Vec<T>>,
    threads: usize,
    run: &(dyn Fn(Vec<T>) -> Result<Vec<R>, E> + Sync),
) -> Vec<Result<Vec<R>, E>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let parts: Vec<Mutex<Option<Vec<T>>>> =
        parts.into_iter().map(|p| Mutex::new(Some(p))).collect();
    type Slot<R, E> = Mutex<Option<Result<Vec<R>, E>>>;
    let results: Vec<Slot<R, E>> = parts.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(slot) = parts.get(i) else { return };
        let part = slot.lock().ok().and_then(|mut p| p.take());
        if let (Some(part), Ok(mut r)) = (part, results[i].lock()) {
            *r = Some(run(part));
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..threads {
            let _ = std::thread::Builder::new()
                .name("flopwatch-read".into())
                .spawn_scoped(scope, work);
        }
        work();
    });
    results
        .into_iter()
        .filter_map(|r| r.into_inner().ok().flatten())
        .collect()
}
