//! Buffers of whole huge pages (`device::HUGE_PAGE`) are mapped with room
//! to align them and trimmed: dropping them leaves nothing mapped, the
//! trimmed head and tail included. Alone in its process, so the mapped
//! size it reads is its own.

use foliofs::device::{AlignedBuf, HUGE_PAGE};

fn mapped_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap()
}

#[test]
fn dropped_huge_page_buffers_leave_nothing_mapped() {
    let before = mapped_kib();
    for len in [HUGE_PAGE, 3 * HUGE_PAGE] {
        for _ in 0..32 {
            let mut b = AlignedBuf::zeroed(len);
            assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
            b[len - 1] = 1;
        }
    }
    // 256 MiB were mapped in all, and up to 2 MiB more each time.
    let grown = mapped_kib().saturating_sub(before);
    assert!(grown < 8 << 10, "{grown} KiB still mapped");
}
