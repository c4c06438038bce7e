//! The series remote write has sent and not yet ended, by GPU and name:
//! what their staleness markers need (labels, newest sample) and when each
//! goes stale.
//!
//! At fleet scale this is millions of series touched by every batch and
//! walked every second, so it is laid out for both: a batch's point that
//! continues its series with the same labels updates two numbers in place
//! (no label is copied), and the walk for stale series reads one dense
//! array of deadlines, touching a series only when it has expired. A
//! GPU's series share its labels ([`Base`], as they go on the wire, kept
//! once per GPU and label set), and every series of a name shares the
//! name.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A GPU's series' labels but their name, as on the wire
/// ([`super::wire::label_into`]): the fields sorted before `__name__`,
/// and those after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Base {
    pub before: Vec<u8>,
    pub after: Vec<u8>,
}

impl Base {
    /// The labels of its series named `name`, whole.
    pub(super) fn with_name(&self, name: &str) -> Vec<u8> {
        let mut l = Vec::with_capacity(self.before.len() + self.after.len() + name.len() + 14);
        l.extend_from_slice(&self.before);
        super::wire::label_into("__name__", name, &mut l);
        l.extend_from_slice(&self.after);
        l
    }
}

/// One open series.
#[derive(Debug, Clone)]
pub(super) struct Sent {
    pub gpu: Arc<str>,
    pub name: Arc<str>,
    /// Its labels but its name.
    pub base: Arc<Base>,
    /// Its newest sample's time.
    pub last_ts: i64,
    /// Whether `last_ts` is known: not for a series taken back after a
    /// restart until a batch continues it (the register keeps the time of
    /// the batch that opened it).
    pub exact: bool,
}

impl Sent {
    /// Its labels, whole.
    pub(super) fn labels(&self) -> Vec<u8> {
        self.base.with_name(&self.name)
    }

    /// Its staleness marker's time when it goes stale at `now_ms`
    /// (collector clock): just after its newest sample, so that points a
    /// late batch brings (a spool replayed after a disconnect) come after
    /// the marker rather than behind it, where a receiver refuses them as
    /// out of order; at `now_ms` (or after its newest known time) when its
    /// newest sample is not known.
    pub(super) fn end_ms(&self, now_ms: i64) -> i64 {
        if self.exact {
            self.last_ts.saturating_add(1)
        } else {
            now_ms.max(self.last_ts.saturating_add(1))
        }
    }
}

/// What a point did to its series.
#[derive(Debug, PartialEq)]
pub(super) enum Noted {
    /// Continued it under the same labels.
    Same,
    /// Started it.
    New,
    /// Continued it under other labels: the old ones and their newest
    /// sample's time, to end with a marker.
    Relabelled(Arc<Base>, i64),
}

/// Free slots' deadline: never expires.
const FREE: i64 = i64::MAX;

/// A GPU's open series.
#[derive(Debug, Default)]
struct Gpu {
    /// The labels its latest batch sent.
    base: Option<Arc<Base>>,
    /// Name → slot.
    names: HashMap<Arc<str>, usize>,
}

/// The open series.
#[derive(Debug, Default)]
pub(super) struct OpenSeries {
    index: HashMap<Arc<str>, Gpu>,
    /// Every name a series had (a few dozen).
    names: HashSet<Arc<str>>,
    slots: Vec<Option<Sent>>,
    /// Per slot, the collector time after which its series is stale.
    until: Vec<i64>,
    free: Vec<usize>,
}

impl OpenSeries {
    /// Series open.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// The series of `gpu` named `name`.
    pub(super) fn get(&self, gpu: &str, name: &str) -> Option<&Sent> {
        let i = *self.index.get(gpu)?.names.get(name)?;
        self.slots[i].as_ref()
    }

    /// `base` as `gpu`'s series keep it: the one they share when it is the
    /// same.
    pub(super) fn base(&self, gpu: &str, base: Base) -> Arc<Base> {
        match self.index.get(gpu).and_then(|g| g.base.as_ref()) {
            Some(b) if **b == base => b.clone(),
            _ => Arc::new(base),
        }
    }

    /// A point of `gpu`'s series `name` with the labels `base` (from
    /// [`OpenSeries::base`]) at `ts`, current until `until`.
    pub(super) fn note(
        &mut self,
        gpu: &str,
        name: &str,
        base: &Arc<Base>,
        ts: i64,
        until: i64,
    ) -> Noted {
        if let Some(g) = self.index.get_mut(gpu) {
            if !g.base.as_ref().is_some_and(|b| Arc::ptr_eq(b, base)) {
                g.base = Some(base.clone());
            }
            if let Some(&i) = g.names.get(name) {
                self.until[i] = until;
                if let Some(s) = self.slots[i].as_mut() {
                    if Arc::ptr_eq(&s.base, base) || *s.base == **base {
                        s.last_ts = if s.exact { s.last_ts.max(ts) } else { ts };
                        s.exact = true;
                        return Noted::Same;
                    }
                    let before = std::mem::replace(&mut s.base, base.clone());
                    let last = std::mem::replace(&mut s.last_ts, ts);
                    s.exact = true;
                    return Noted::Relabelled(before, last);
                }
            }
        }
        self.insert(gpu, name, base.clone(), (ts, true), until);
        Noted::New
    }

    /// Adds the series of `gpu` named `name` (not open) with the labels
    /// `base`, its newest sample at `last_ts` (and whether that is known,
    /// [`Sent::exact`]), current until `until`.
    pub(super) fn insert(
        &mut self,
        gpu: &str,
        name: &str,
        base: Arc<Base>,
        (last_ts, exact): (i64, bool),
        until: i64,
    ) {
        let name = match self.names.get(name) {
            Some(n) => n.clone(),
            None => {
                let n: Arc<str> = Arc::from(name);
                self.names.insert(n.clone());
                n
            }
        };
        let gpu = match self.index.get_key_value(gpu) {
            Some((k, _)) => k.clone(),
            None => {
                let k: Arc<str> = Arc::from(gpu);
                self.index.insert(k.clone(), Gpu::default());
                k
            }
        };
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.until.push(FREE);
                self.slots.len() - 1
            }
        };
        if let Some(g) = self.index.get_mut(&gpu) {
            g.base.get_or_insert_with(|| base.clone());
            g.names.insert(name.clone(), i);
        }
        self.slots[i] = Some(Sent {
            gpu,
            name,
            base,
            last_ts,
            exact,
        });
        self.until[i] = until;
    }

    /// Removes and returns every series stale at `now_ms` (its deadline
    /// before it).
    pub(super) fn expire(&mut self, now_ms: i64) -> Vec<Sent> {
        let mut out = Vec::new();
        for i in 0..self.until.len() {
            if self.until[i] >= now_ms {
                continue;
            }
            self.until[i] = FREE;
            let Some(s) = self.slots[i].take() else {
                continue;
            };
            if let Some(g) = self.index.get_mut(&s.gpu) {
                g.names.remove(&s.name);
                if g.names.is_empty() {
                    self.index.remove(&s.gpu);
                }
            }
            self.free.push(i);
            out.push(s);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(v: &str) -> Base {
        let mut before = Vec::new();
        super::super::wire::label_into("UUID", "G", &mut before);
        let mut after = Vec::new();
        super::super::wire::label_into("job_id", v, &mut after);
        Base { before, after }
    }

    #[test]
    fn series_continue_relabel_expire_and_reuse_their_slots() {
        let mut o = OpenSeries::default();
        let a = o.base("g1", l("a"));
        assert_eq!(o.note("g1", "ofu", &a, 10, 100), Noted::New);
        assert_eq!(o.note("g1", "power", &a, 10, 100), Noted::New);
        // The next batch's labels, equal: the ones kept, shared.
        let a2 = o.base("g1", l("a"));
        assert!(Arc::ptr_eq(&a, &a2));
        assert_eq!(o.note("g1", "ofu", &a2, 20, 200), Noted::Same);
        assert_eq!(o.get("g1", "ofu").unwrap().last_ts, 20);
        let b = o.base("g1", l("b"));
        assert!(!Arc::ptr_eq(&a, &b));
        match o.note("g1", "ofu", &b, 30, 300) {
            Noted::Relabelled(old, 20) => assert_eq!(*old, l("a")),
            n => panic!("{n:?}"),
        }
        // A series whose labels equal the GPU's but not by identity is
        // the same series.
        assert_eq!(o.note("g1", "ofu", &Arc::new(l("b")), 31, 300), Noted::Same);
        let labels = o.get("g1", "ofu").unwrap().labels();
        assert_eq!(labels, l("b").with_name("ofu"));
        assert_eq!(o.len(), 2);
        // power's deadline (100) passed at 150; ofu's (300) not.
        let gone = o.expire(150);
        assert_eq!(gone.len(), 1);
        assert_eq!((&*gone[0].name, gone[0].last_ts), ("power", 10));
        assert_eq!(
            *gone[0].base,
            l("a"),
            "power kept the labels it was sent with"
        );
        assert!(o.get("g1", "power").is_none());
        assert_eq!(o.len(), 1);
        // Its slot is reused; nothing expires twice.
        let c = o.base("g2", l("c"));
        assert_eq!(o.note("g2", "ofu", &c, 5, 50), Noted::New);
        assert_eq!(o.slots.len(), 2);
        assert!(o.expire(150).iter().all(|s| &*s.gpu == "g2"));
        assert!(o.expire(10_000).iter().all(|s| &*s.gpu == "g1"));
        assert_eq!(o.len(), 0);
        assert!(o.index.is_empty());
    }
}
