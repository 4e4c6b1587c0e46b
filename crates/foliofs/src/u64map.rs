//! A map keyed by inode or block number, on the hot paths (the in-memory
//! inodes, the inode I/O locks, the metadata cache): FxHash, several times
//! cheaper than the default SipHash for one u64, whose flooding resistance
//! buys nothing for numbers the engine hands out or reads from its own
//! image.

pub(crate) type U64Map<V> =
    std::collections::HashMap<u64, V, std::hash::BuildHasherDefault<rustc_hash::FxHasher>>;
