//! Runs of consecutive items, the grouping behind every merged device
//! request: sorted block numbers into extents, dirty blocks into writes,
//! checksums into checksum-block updates, checkpoint blocks into writes;
//! and the gaps a set of ranges leaves (fallocate's holes).

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

/// The runs of [from, to) that no range of `covered` covers, as (start,
/// count) in order; `covered` may come in any order and overlap.
pub(crate) fn gaps(
    from: u64,
    to: u64,
    covered: impl IntoIterator<Item = Range<u64>>,
) -> Vec<(u64, u64)> {
    let mut c: Vec<Range<u64>> = covered.into_iter().filter(|r| r.start < r.end).collect();
    c.sort_unstable_by_key(|r| r.start);
    let mut out = Vec::new();
    let mut at = from;
    for r in c.into_iter().take_while(|r| r.start < to) {
        if r.start > at {
            out.push((at, r.start - at));
        }
        at = at.max(r.end);
    }
    if at < to {
        out.push((at, to - at));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_are_what_no_range_covers() {
        assert_eq!(gaps(0, 10, []), vec![(0, 10)]);
        assert_eq!(gaps(5, 5, std::iter::once(0..3)), vec![]);
        // Out of order, overlapping, touching, and past either end.
        assert_eq!(
            gaps(2, 20, [8..10, 0..3, 9..12, 12..13, 15..16, 18..30]),
            vec![(3, 5), (13, 2), (16, 2)]
        );
        assert_eq!(gaps(0, 10, std::iter::once(0..10)), vec![]);
        assert_eq!(gaps(0, 10, [4..4, 11..12]), vec![(0, 10)]);
    }

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
