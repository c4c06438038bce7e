//! The store's format version: one `meta` key (`~format`, a u32,
//! big-endian) written when a RocksDB store is created, checked every time
//! one is opened.
//!
//! A collector opens only a store of the format it was built for. A store
//! holding data but no format key was written by a build from before
//! formats were versioned — layouts that were never released — and is
//! refused with the way out (move the data directory aside), as is a store
//! of another format: nothing is read under a layout this build does not
//! know, so no read path carries code for old layouts. A change to what is
//! on disk raises [`FORMAT`] and says in docs/STORAGE.md how a store of
//! the previous format is carried over.
//!
//! Format 2 moved remote write's journal and its register of open series
//! out of `meta` into families of their own (`journal`, `open_series`): a
//! format 1 store opened for writing has them moved ([`carry_over`]) before
//! anything else touches it; opened read-only it is read as it is (no
//! read-only path reads the journal).
//!
//! Format 3 leads the head's keys with their hour (`'g' · hour · tenant ·
//! gpu · last_ts · seq`, where format 2 had `'g' · tenant · gpu · last_ts
//! · seq`; docs/STORAGE.md, *Head*). A format 2 store opened for writing
//! has its head's and limbo's bundles rekeyed, and the keys limbo's
//! records name with them ([`rekey_head`]), before anything else touches
//! it. Opened read-only, a store of an earlier format is refused: its head
//! would be misread.
//!
//! Format 4 puts the GPU's seal phase between the hour and the GPU (`'g' ·
//! hour · phase · tenant · gpu · last_ts · seq`, [`keys::seal_phase`]), so
//! an hour's GPUs sort in the order they are sealed. A format 2 or 3 store
//! opened for writing is rekeyed the same way, straight to format 4.

use crate::journal::{END, OPEN_END, OPEN_PREFIX, PREFIX};
use crate::{keys, Cf, Engine, Op, StoreError};

/// The format this build reads and writes.
pub const FORMAT: u32 = 4;

/// Keys moved per write when a store is carried over: each write moves
/// its keys whole (put in the new family, delete from the old), so a
/// carry-over cut short by a crash goes on where it stopped at the next
/// open.
const MOVE_BATCH: usize = 10_000;

/// Checks the format of the store behind `engine`; a store that holds
/// nothing yet is stamped with [`FORMAT`] when `writable`.
pub(crate) fn settle(engine: &dyn Engine, writable: bool) -> Result<(), StoreError> {
    match engine.get(Cf::Meta, keys::FORMAT)? {
        Some(v) => {
            let found = <[u8; 4]>::try_from(v.as_slice())
                .map(u32::from_be_bytes)
                .map_err(|_| crate::corrupt(Cf::Meta, "format version"))?;
            if found == FORMAT {
                Ok(())
            } else if (1..FORMAT).contains(&found) && !writable {
                Err(StoreError::Format(format!(
                    "this store is format {found}; this build reads format {FORMAT}: \
                     open it once for writing (start the collector on it) to carry \
                     it over"
                )))
            } else if found == 1 {
                carry_over(engine)?;
                rekey_head(engine)
            } else if found == 2 || found == 3 {
                rekey_head(engine)
            } else {
                Err(StoreError::Format(format!(
                    "this store is format {found}; this build reads format {FORMAT}"
                )))
            }
        }
        None if holds_anything(engine)? => Err(StoreError::Format(format!(
            "this store holds data but no format version: it was written by a \
             development build from before formats were versioned (format {FORMAT} \
             is the first); move the data directory aside to start a new store"
        ))),
        None if writable => engine.write(
            vec![(
                Cf::Meta,
                keys::FORMAT.to_vec(),
                FORMAT.to_be_bytes().to_vec(),
            )],
            true,
        ),
        None => Ok(()),
    }
}

/// Carries a format 1 store over to format 2: the journal's entries and
/// the register of open series move from `meta` to their families, then
/// the store is stamped format 2 (and carried on to 3 by the caller).
fn carry_over(engine: &dyn Engine) -> Result<(), StoreError> {
    for (from, to, cf) in [
        (PREFIX, END, Cf::Journal),
        (OPEN_PREFIX, OPEN_END, Cf::OpenSeries),
    ] {
        // Each scan starts past the last key moved, not over the
        // tombstones of those before it.
        let mut start = from.to_vec();
        loop {
            let mut ops = Vec::new();
            engine.scan(Cf::Meta, &start, to, &mut |k, v| {
                ops.push(Op::Put(cf, k.to_vec(), v.to_vec()));
                ops.push(Op::Delete(Cf::Meta, k.to_vec()));
                ops.len() < 2 * MOVE_BATCH
            })?;
            let Some(Op::Delete(_, last)) = ops.last() else {
                break;
            };
            start = last.clone();
            start.push(0);
            engine.apply(ops, true)?;
        }
    }
    engine.write(
        vec![(Cf::Meta, keys::FORMAT.to_vec(), 2u32.to_be_bytes().to_vec())],
        true,
    )
}

/// Carries a format 2 or 3 store over to format 4: every bundle of the
/// head and limbo is put under its hour- and phase-led key and deleted under its old one
/// (a batch per write), the keys limbo's records name likewise, then the
/// store is stamped. Cut short by a crash, it goes on at the next open:
/// keys already moved are recognised ([`rekeyed`]) and left.
fn rekey_head(engine: &dyn Engine) -> Result<(), StoreError> {
    for cf in [Cf::Head, Cf::Limbo] {
        let mut start = vec![keys::KIND_GPU];
        loop {
            let mut ops = Vec::new();
            let mut last = None;
            engine.scan(cf, &start, &[keys::KIND_GPU + 1], &mut |k, v| {
                last = Some(k.to_vec());
                if let Some(new) = rekeyed(k) {
                    ops.push(Op::Put(cf, new, v.to_vec()));
                    ops.push(Op::Delete(cf, k.to_vec()));
                }
                ops.len() < 2 * MOVE_BATCH
            })?;
            let Some(mut next) = last else {
                break;
            };
            if !ops.is_empty() {
                engine.apply(ops, true)?;
            }
            next.push(0);
            start = next;
        }
    }
    crate::limbo::rekey_records(engine, &rekeyed, MOVE_BATCH)?;
    engine.write(
        vec![(
            Cf::Meta,
            keys::FORMAT.to_vec(),
            FORMAT.to_be_bytes().to_vec(),
        )],
        true,
    )
}

/// The format 4 key of a format 2 head key (`'g' · tenant · gpu · last_ts
/// · seq`) or a format 3 one (`'g' · hour · tenant · gpu · last_ts ·
/// seq`); `None` for a key already in format 4 (its hour is the hour of
/// its time, its phase the GPU's, and its length is exact) or not a head
/// bundle's key at all.
fn rekeyed(k: &[u8]) -> Option<Vec<u8>> {
    use crate::hours::window_of;
    if k.first() != Some(&keys::KIND_GPU) {
        return None;
    }
    let current = keys::series_prefix(Cf::Head, k).is_some_and(|(plen, _)| {
        k.len() == plen + 16
            && keys::key_ts(k, plen).map(window_of) == keys::get_ts(&k[1..])
            && keys::head_key_phase(k) == Some(keys::seal_phase(&k[keys::HEAD_GPU_AT..plen]))
    });
    if current {
        return None;
    }
    // The GPU starts after the hour (format 3, whose hour is its time's)
    // or after the kind byte (format 2).
    [9, 1].into_iter().find_map(|at| {
        let mut pos = at;
        keys::get_str(k, &mut pos)?;
        keys::get_str(k, &mut pos)?;
        let rest = k.get(pos..).filter(|r| r.len() == 16)?;
        let last = keys::get_ts(rest)?;
        if at == 9 && keys::get_ts(&k[1..]) != Some(window_of(last)) {
            return None;
        }
        let seq = u64::from_be_bytes(rest[8..].try_into().ok()?);
        Some(keys::head_key(&k[at..pos], last, seq))
    })
}

/// Whether any family holds a key.
fn holds_anything(engine: &dyn Engine) -> Result<bool, StoreError> {
    // No key starts with two 0xff bytes: the first byte of a key is a
    // kind byte or a length, and a length of 255 is followed by UTF-8.
    for cf in Cf::ALL {
        let mut any = false;
        engine.scan(cf, &[], &[0xff, 0xff], &mut |_, _| {
            any = true;
            false
        })?;
        if any {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemEngine;
    use crate::rocks::RocksEngine;

    #[test]
    fn a_new_store_is_stamped_and_opens_again() {
        let e = MemEngine::new();
        settle(&e, true).unwrap();
        assert_eq!(
            e.get(Cf::Meta, keys::FORMAT).unwrap(),
            Some(FORMAT.to_be_bytes().to_vec())
        );
        settle(&e, true).unwrap();
    }

    #[test]
    fn a_store_of_another_format_or_none_is_refused() {
        let e = MemEngine::new();
        e.write(
            vec![(Cf::Meta, keys::FORMAT.to_vec(), 7u32.to_be_bytes().to_vec())],
            true,
        )
        .unwrap();
        let err = settle(&e, true).unwrap_err().to_string();
        assert!(
            err.contains("format 7") && err.contains(&format!("format {FORMAT}")),
            "{err}"
        );

        let e = MemEngine::new();
        e.write(vec![(Cf::Head, b"gx".to_vec(), vec![1])], true)
            .unwrap();
        let err = settle(&e, true).unwrap_err().to_string();
        assert!(err.contains("no format version"), "{err}");
        assert_eq!(
            e.get(Cf::Meta, keys::FORMAT).unwrap(),
            None,
            "nothing written"
        );
    }

    #[test]
    fn a_format_1_store_has_its_journal_moved_out_of_meta() {
        use crate::journal::{key, open_key, value};
        let e = std::sync::Arc::new(MemEngine::new());
        let register = open_key("GPU-1", "flopwatch_ofu_ratio");
        let mut puts = vec![
            (Cf::Meta, keys::FORMAT.to_vec(), 1u32.to_be_bytes().to_vec()),
            (Cf::Meta, b"gother".to_vec(), b"kept".to_vec()),
            (Cf::Meta, register.clone(), b"labels".to_vec()),
        ];
        // More entries than one write moves.
        let n = MOVE_BATCH as u64 + 5;
        for seq in 0..n {
            puts.push((Cf::Meta, key(seq), value(1, seq as i64, &[7])));
        }
        e.write(puts, true).unwrap();
        // Read-only: refused (its head would be misread), nothing moved.
        let err = settle(&*e, false).unwrap_err().to_string();
        assert!(
            err.contains("format 1") && err.contains("for writing"),
            "{err}"
        );
        assert_eq!(e.get(Cf::Meta, &key(0)).unwrap(), Some(value(1, 0, &[7])));

        settle(&*e, true).unwrap();
        assert_eq!(
            e.get(Cf::Meta, keys::FORMAT).unwrap(),
            Some(FORMAT.to_be_bytes().to_vec())
        );
        let mut left = Vec::new();
        e.scan(Cf::Meta, &[], &[0xff, 0xff], &mut |k, _| {
            left.push(k.to_vec());
            true
        })
        .unwrap();
        assert_eq!(left, [b"gother".to_vec(), keys::FORMAT.to_vec()]);
        assert_eq!(
            e.get(Cf::OpenSeries, &register).unwrap(),
            Some(b"labels".to_vec())
        );
        // The store reads the whole journal back, in order, and numbers on.
        let store = crate::Store::new(e.clone(), false);
        let (got, _) = store.journal_read(0, u64::MAX).unwrap();
        assert_eq!(got.len() as u64, n);
        assert!(got.windows(2).all(|w| w[0].oldest_ms < w[1].oldest_ms));
        store.journal_append(value(1, -1, &[8])).unwrap();
        assert_eq!(
            e.get(Cf::Journal, &key(n)).unwrap(),
            Some(value(1, -1, &[8]))
        );
        assert_eq!(store.journal_open_series().unwrap().len(), 1);
    }

    #[test]
    fn rocksdb_stores_carry_the_format_from_their_first_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let e = RocksEngine::open(dir.path()).unwrap();
            assert_eq!(
                e.get(Cf::Meta, keys::FORMAT).unwrap(),
                Some(FORMAT.to_be_bytes().to_vec())
            );
            e.write(
                vec![(Cf::Meta, keys::FORMAT.to_vec(), 9u32.to_be_bytes().to_vec())],
                true,
            )
            .unwrap();
        }
        let Err(err) = RocksEngine::open(dir.path()) else {
            panic!("a store of format 9 opened");
        };
        assert!(err.to_string().contains("format 9"), "{err}");
    }
}
