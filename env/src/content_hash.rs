//! The stable hash that decides instance splits and seeds instance generation.
//!
//! Splits must never move under a task's version, so the hash is spelled out here (FNV-1a over
//! the bytes, then SplitMix64's finalizer to spread FNV's weak low bits) rather than taken from
//! `std`'s `DefaultHasher`, whose output may change between Rust releases.

use crate::Split;

/// One instance in `TEST_ONE_IN` goes to the test split.
pub const TEST_ONE_IN: u64 = 5;

/// A streaming content hash: numbers (little-endian) and bytes in, 64 bits out.
#[derive(Clone, Debug)]
pub struct ContentHash(u64);

impl ContentHash {
    /// A hash that has already taken `numbers`.
    pub fn new(numbers: &[u64]) -> ContentHash {
        let mut h = ContentHash(0xcbf2_9ce4_8422_2325);
        for n in numbers {
            h.write(&n.to_le_bytes());
        }
        h
    }

    /// Feeds bytes.
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// The hash of everything fed so far.
    pub fn finish(&self) -> u64 {
        let mut h = self.0;
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^ (h >> 31)
    }
}

/// The hash of `numbers` followed by `text`.
pub fn content_hash(numbers: &[u64], text: &str) -> u64 {
    let mut h = ContentHash::new(numbers);
    h.write(text.as_bytes());
    h.finish()
}

impl Split {
    /// The split of an instance whose canonical content hashes to `hash`: test for one in
    /// [`TEST_ONE_IN`], else train. Deciding from content makes the splits disjoint by
    /// construction.
    pub fn of_hash(hash: u64) -> Split {
        if hash.is_multiple_of(TEST_ONE_IN) {
            Split::Test
        } else {
            Split::Train
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pinned values: if these change, every task's splits and instances change.
    #[test]
    fn the_hash_is_stable() {
        assert_eq!(content_hash(&[], ""), ContentHash::new(&[]).finish());
        let h = content_hash(&[1, 2], "kg");
        let mut streamed = ContentHash::new(&[1]);
        streamed.write(&2u64.to_le_bytes());
        streamed.write(b"kg");
        assert_eq!(h, streamed.finish());
        assert_ne!(content_hash(&[1], "a"), content_hash(&[2], "a"));
        let tests = (0..10_000u64)
            .filter(|i| Split::of_hash(content_hash(&[*i], "x")) == Split::Test)
            .count();
        assert!((1800..2200).contains(&tests), "{tests}");
    }
}
