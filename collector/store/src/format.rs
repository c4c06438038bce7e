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

use crate::journal::{END, OPEN_END, OPEN_PREFIX, PREFIX};
use crate::{keys, Cf, Engine, Op, StoreError};

/// The format this build reads and writes.
pub const FORMAT: u32 = 2;

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
            // A format 1 store read-only is read as it is.
            if found == FORMAT || (found == 1 && !writable) {
                Ok(())
            } else if found == 1 {
                carry_over(engine)
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
/// the store is stamped.
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
        vec![(
            Cf::Meta,
            keys::FORMAT.to_vec(),
            FORMAT.to_be_bytes().to_vec(),
        )],
        true,
    )
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
        // Read-only: read as it is, nothing moved.
        settle(&*e, false).unwrap();
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
