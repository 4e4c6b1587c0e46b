//! Every on-disk decoder on arbitrary bytes, with the checksum re-stamped
//! so the structure checks behind it are reached: typed errors, never a
//! panic.
#![no_main]

use foliofs::format::btree_node::{Node, TreeType};
use foliofs::format::header::{stamp, BlockHeader};
use foliofs::format::{ag_header::AgHeader, inode::DiskInode, journal, superblock::Superblock};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let size = if which & 0x80 != 0 { 4096 } else { 512 };
    let mut buf = vec![0u8; size];
    let n = rest.len().min(size);
    buf[..n].copy_from_slice(&rest[..n]);
    if which & 0x40 == 0 {
        stamp(&mut buf);
    }
    let h = BlockHeader::decode(&buf);
    match which % 8 {
        0 => {
            if let Ok(sb) = Superblock::decode(&buf, h.blkno) {
                let _ = foliofs::geometry::Geometry::new(&sb);
            }
        }
        1 => {
            let _ = AgHeader::decode(&buf, h.blkno, (h.owner & 0xffff) as u32);
        }
        2 => {
            let _ = DiskInode::decode(&buf[..512], h.owner, h.blkno, &h.uuid);
        }
        3..=6 => {
            let tt = [TreeType::Extents, TreeType::Dir, TreeType::Xattr, TreeType::Orphans]
                [(which % 8 - 3) as usize];
            let _ = Node::decode(&buf, h.blkno, h.owner, tt);
        }
        _ => {
            let _ = journal::decode_desc(&buf);
            let _ = journal::decode_commit(&buf);
        }
    }
});
