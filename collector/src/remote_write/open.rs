//! The series remote write has sent and not yet ended, by GPU and name:
//! what their staleness markers need (labels, newest sample) and when each
//! goes stale.
//!
//! At fleet scale this is millions of series touched by every batch and
//! walked every second, so it is laid out for both: a batch's point that
//! continues its series with the same labels updates two numbers in place
//! (no label is copied), and the walk for stale series reads one dense
//! array of deadlines, touching a series only when it has expired. A
//! series keeps its labels as one run of bytes, as they go on the wire
//! ([`super::wire`]); its GPU and name are shared with the GPU's other
//! series and every series of that name.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// One open series.
#[derive(Debug, Clone)]
pub(super) struct Sent {
    pub gpu: Arc<str>,
    pub name: Arc<str>,
    /// Its labels' fields, as on the wire.
    pub labels: Box<[u8]>,
    /// Its newest sample's time.
    pub last_ts: i64,
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
    Relabelled(Box<[u8]>, i64),
}

/// Free slots' deadline: never expires.
const FREE: i64 = i64::MAX;

/// The open series.
#[derive(Debug, Default)]
pub(super) struct OpenSeries {
    /// GPU → name → slot.
    index: HashMap<Arc<str>, HashMap<Arc<str>, usize>>,
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
        let i = *self.index.get(gpu)?.get(name)?;
        self.slots[i].as_ref()
    }

    /// A point of `gpu`'s series `name` with `labels` at `ts`, current
    /// until `until`.
    pub(super) fn note(
        &mut self,
        gpu: &str,
        name: &str,
        labels: &[u8],
        ts: i64,
        until: i64,
    ) -> Noted {
        if let Some(&i) = self.index.get(gpu).and_then(|m| m.get(name)) {
            self.until[i] = until;
            if let Some(s) = self.slots[i].as_mut() {
                if *s.labels == *labels {
                    s.last_ts = ts;
                    return Noted::Same;
                }
                let before = std::mem::replace(&mut s.labels, labels.into());
                let last = std::mem::replace(&mut s.last_ts, ts);
                return Noted::Relabelled(before, last);
            }
        }
        self.insert(gpu, name, labels.into(), ts, until);
        Noted::New
    }

    /// Adds the series of `gpu` named `name` (not open) with `labels`,
    /// its newest sample at `last_ts`, current until `until`.
    pub(super) fn insert(
        &mut self,
        gpu: &str,
        name: &str,
        labels: Box<[u8]>,
        last_ts: i64,
        until: i64,
    ) {
        let gpu = match self.index.get_key_value(gpu) {
            Some((k, _)) => k.clone(),
            None => Arc::from(gpu),
        };
        let name = match self.names.get(name) {
            Some(n) => n.clone(),
            None => {
                let n: Arc<str> = Arc::from(name);
                self.names.insert(n.clone());
                n
            }
        };
        let s = Sent {
            gpu,
            name,
            labels,
            last_ts,
        };
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.until.push(FREE);
                self.slots.len() - 1
            }
        };
        self.index
            .entry(s.gpu.clone())
            .or_default()
            .insert(s.name.clone(), i);
        self.slots[i] = Some(s);
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
            if let Some(m) = self.index.get_mut(&s.gpu) {
                m.remove(&s.name);
                if m.is_empty() {
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

    fn l(v: &str) -> Box<[u8]> {
        let mut b = Vec::new();
        super::super::wire::label_into("job_id", v, &mut b);
        b.into()
    }

    #[test]
    fn series_continue_relabel_expire_and_reuse_their_slots() {
        let mut o = OpenSeries::default();
        assert_eq!(o.note("g1", "ofu", &l("a"), 10, 100), Noted::New);
        assert_eq!(o.note("g1", "power", &l("a"), 10, 100), Noted::New);
        assert_eq!(o.note("g1", "ofu", &l("a"), 20, 200), Noted::Same);
        assert_eq!(o.get("g1", "ofu").unwrap().last_ts, 20);
        assert_eq!(
            o.note("g1", "ofu", &l("b"), 30, 300),
            Noted::Relabelled(l("a"), 20)
        );
        assert_eq!(o.len(), 2);
        // power's deadline (100) passed at 150; ofu's (300) not.
        let gone = o.expire(150);
        assert_eq!(gone.len(), 1);
        assert_eq!((&*gone[0].name, gone[0].last_ts), ("power", 10));
        assert!(o.get("g1", "power").is_none());
        assert_eq!(o.len(), 1);
        // Its slot is reused; nothing expires twice.
        assert_eq!(o.note("g2", "ofu", &l("c"), 5, 50), Noted::New);
        assert_eq!(o.slots.len(), 2);
        assert!(o.expire(150).iter().all(|s| &*s.gpu == "g2"));
        assert!(o.expire(10_000).iter().all(|s| &*s.gpu == "g1"));
        assert_eq!(o.len(), 0);
        assert!(o.index.is_empty());
    }
}
