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

use crate::{keys, Cf, Engine, StoreError};

/// The format this build reads and writes.
pub const FORMAT: u32 = 1;

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
            err.contains("format 7") && err.contains("format 1"),
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
    fn rocksdb_stores_carry_the_format_from_their_first_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let e = RocksEngine::open(dir.path()).unwrap();
            assert_eq!(
                e.get(Cf::Meta, keys::FORMAT).unwrap(),
                Some(FORMAT.to_be_bytes().to_vec())
            );
            e.write(
                vec![(Cf::Meta, keys::FORMAT.to_vec(), 2u32.to_be_bytes().to_vec())],
                true,
            )
            .unwrap();
        }
        let Err(err) = RocksEngine::open(dir.path()) else {
            panic!("a store of format 2 opened");
        };
        assert!(err.to_string().contains("format 2"), "{err}");
    }
}
