//! Runs of consecutive items, the grouping behind every merged device
//! request: sorted block numbers into extents, dirty blocks into writes,
//! checksums into checksum-block updates, checkpoint blocks into writes.

use std::ops::Range;

/// Index ranges of `v` where each item `follows` the one before it, each
/// at most `cap` long (`cap` >= 1).
pub(crate) fn runs_by<'a, T>(
    v: &'a [T],
    cap: usize,
    follows: impl Fn(&T, &T) -> bool + 'a,
) -> impl Iterator<Item = Range<usize>> + 'a {
    debug_assert!(cap >= 1, "a run holds at least one item");
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= v.len() {
            return None;
        }
        let mut j = i + 1;
        while j < v.len() && j - i < cap && follows(&v[j - 1], &v[j]) {
            j += 1;
        }
        let r = i..j;
        i = j;
        Some(r)
    })
}

/// Sorted values -> runs of consecutive values (start, count).
pub(crate) fn runs(v: &[u64]) -> Vec<(u64, u64)> {
    runs_by(v, usize::MAX, |a, b| *b == a + 1)
        .map(|r| (v[r.start], r.len() as u64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_values_group_and_caps_split() {
        assert_eq!(runs(&[3, 4, 5, 9, 10, 20]), vec![(3, 3), (9, 2), (20, 1)]);
        assert_eq!(runs(&[]), vec![]);
        let v = [1u64, 2, 3, 4, 5];
        let r: Vec<_> = runs_by(&v, 2, |a, b| *b == a + 1).collect();
        assert_eq!(r, vec![0..2, 2..4, 4..5]);
        let pairs = [(1u64, 10u64), (2, 11), (3, 13)];
        let r: Vec<_> = runs_by(&pairs, 8, |a, b| b.0 == a.0 + 1 && b.1 == a.1 + 1).collect();
        assert_eq!(r, vec![0..2, 2..3]);
    }
}
