//! A flipped byte in any metadata structure is reported by name and
//! address by fsck, and never panics mount or fsck.

use foliofs::device::{Device, MemDevice};
use foliofs::format::inode::{DiskInode, INODE_SIZE};
use foliofs::fs::*;
use foliofs::geometry::Geometry;
use foliofs::{Error, Fs};
use std::sync::Arc;

struct Image {
    bytes: Vec<u8>,
    geo: Geometry,
    uuid: [u8; 16],
    dir: u64,
    big: u64,
}

fn build() -> Image {
    let dev = Arc::new(MemDevice::new(32 << 20));
    mkfs(
        &*dev,
        &MkfsOptions {
            block_size: 4096,
            ..Default::default()
        },
        |_, _| {},
    )
    .unwrap();
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"dir", 0o755, 0, 0).unwrap();
    for i in 0..300 {
        fs.create(d.ino, format!("entry-{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
    }
    // Every other block: an extent per block, so the map becomes a tree.
    let big = fs.create(root, b"big", 0o644, 0, 0).unwrap();
    for i in 0..100u64 {
        fs.write(big.ino, i * 8192, &[i as u8 + 1; 4096]).unwrap();
        fs.fsync(big.ino, false).unwrap();
        let filler = fs
            .create(root, format!("fill{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
        fs.write(filler.ino, 0, &[9; 4096]).unwrap();
        fs.fsync(filler.ino, false).unwrap();
    }
    fs.setxattr(big.ino, b"user.x", b"value", 0).unwrap();
    fs.unmount().unwrap();
    let sb = foliofs::meta::read_superblock(&*dev).unwrap();
    Image {
        bytes: dev.image(),
        geo: Geometry::new(&sb),
        uuid: sb.uuid,
        dir: d.ino,
        big: big.ino,
    }
}

fn inode(img: &Image, ino: u64) -> DiskInode {
    let (blk, off) = img.geo.inode_loc(ino);
    let at = (blk * 4096) as usize + off;
    DiskInode::decode(&img.bytes[at..at + INODE_SIZE], ino, blk, &img.uuid).unwrap()
}

/// Flip a byte at `blk`+`off`, then run mount and fsck; fsck must name
/// `structure`.
fn flip_and_check(img: &Image, what: &str, blk: u64, off: usize, structure: &str) {
    let mut bytes = img.bytes.clone();
    bytes[(blk * 4096) as usize + off] ^= 0x5a;
    let dev = Arc::new(MemDevice::from_image(bytes));
    // Mount may succeed (the structure is read lazily) or fail with a typed
    // error; it must not panic, and reads must not return wrong data.
    if let Ok(fs) = Fs::mount(
        dev.clone(),
        MountOptions {
            read_only: true,
            ..Default::default()
        },
    ) {
        let _ = fs.readdir(img.dir, 0, 1000);
        let mut buf = vec![0; 4096];
        match fs.read(img.big, 0, &mut buf) {
            Ok(_) => assert!(buf.iter().all(|&b| b == 1), "{what}: wrong data returned"),
            Err(Error::Corrupted { .. }) | Err(Error::DataChecksum { .. }) => {}
            Err(e) => panic!("{what}: unexpected error {e}"),
        }
    }
    let r = foliofs::fsck::fsck(dev, &Default::default(), |_, _| {});
    match r {
        Ok(r) => {
            assert!(
                r.problems
                    .iter()
                    .any(|p| p.structure == structure && p.addr == blk),
                "{what}: fsck did not name {structure} at {blk}: {:?}",
                r.problems
            );
        }
        Err(Error::Corrupted {
            structure: s, addr, ..
        }) => {
            assert_eq!((s, addr), (structure, blk), "{what}");
        }
        Err(e) => panic!("{what}: fsck failed with {e}"),
    }
}

#[test]
fn every_metadata_structure_is_detected() {
    let img = build();
    let g = &img.geo;
    flip_and_check(&img, "AG header", g.agh_blk(1), 64, "AG header");
    flip_and_check(&img, "block bitmap", g.bmap_start(0), 100, "block bitmap");
    flip_and_check(&img, "inode bitmap", g.imap_start(0), 64, "inode bitmap");
    flip_and_check(
        &img,
        "checksum block",
        g.csum_start(0),
        200,
        "checksum block",
    );
    let (iblk, ioff) = g.inode_loc(img.big);
    flip_and_check(&img, "inode", iblk, ioff + 50, "inode");
    let big = inode(&img, img.big);
    assert_ne!(big.fork_root, 0, "big file should have an extent tree");
    flip_and_check(&img, "extent tree", big.fork_root, 70, "extent tree node");
    let dir = inode(&img, img.dir);
    assert_ne!(dir.fork_root, 0, "directory should be a tree");
    flip_and_check(
        &img,
        "directory tree",
        dir.fork_root,
        70,
        "directory tree node",
    );
    flip_and_check(&img, "xattr tree", big.xattr_root, 70, "xattr tree node");
}

#[test]
fn superblock_slots_back_each_other_up() {
    let img = build();
    // One slot corrupt: mount uses the other.
    for slot in 0..2u64 {
        let mut bytes = img.bytes.clone();
        bytes[(slot * 4096) as usize + 60] ^= 1;
        let dev = Arc::new(MemDevice::from_image(bytes));
        let fs = Fs::mount(dev, MountOptions::default()).unwrap();
        assert!(fs.resolve("/big").is_ok());
        fs.unmount().unwrap();
    }
    // Both corrupt: a typed error naming the superblock.
    let mut bytes = img.bytes.clone();
    bytes[60] ^= 1;
    bytes[4096 + 60] ^= 1;
    let dev = Arc::new(MemDevice::from_image(bytes));
    assert!(matches!(
        Fs::mount(dev.clone(), MountOptions::default()),
        Err(Error::Corrupted {
            structure: "superblock",
            ..
        })
    ));
    // fsck finds mkfs's copy in AG 1; a repair writes both slots from it.
    let r = fsck_of(&dev, false);
    assert!(r.problems.iter().any(|p| p.structure == "superblock"
        && p.message.ends_with("the copy at block 4096 is good")
        && !p.repaired));
    let (r, dev) = repaired(&dev.image());
    assert!(r.problems.iter().any(|p| p.structure == "superblock"
        && p.message
            .contains("both slots rewritten from the copy at block 4096")));
    let fs = Fs::mount(dev, MountOptions::default()).unwrap();
    assert!(fs.resolve("/big").is_ok());
    fs.unmount().unwrap();
}

/// A slot that does not decode (a torn superblock write) is named, and a
/// repair rewrites it, whichever of the two it is.
#[test]
fn a_repair_rewrites_a_damaged_superblock_slot() {
    let img = build();
    for slot in 0..2u64 {
        let mut bytes = img.bytes.clone();
        bytes[(slot * 4096) as usize + 60] ^= 1;
        let (r, dev) = repaired(&bytes);
        assert!(
            r.problems
                .iter()
                .any(|p| p.structure == "superblock" && p.addr == slot),
            "{:?}",
            r.problems
        );
        let damaged = foliofs::meta::damaged_superblock_slots(&*dev, 4096).unwrap();
        assert!(damaged.is_empty(), "slot {slot}: {damaged:?}");
    }
}

#[test]
fn flipped_data_byte_is_eio_and_counted() {
    let img = build();
    let dev = Arc::new(MemDevice::from_image(img.bytes.clone()));
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let e = fs.extents(img.big).unwrap()[0];
    fs.unmount().unwrap();
    dev.poke(e.device_block * 4096 + 17, &[0xff]);
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let mut buf = vec![0; 4096];
    match fs.read(img.big, e.offset, &mut buf) {
        Err(Error::DataChecksum { ino, addr, .. }) => {
            assert_eq!((ino, addr), (img.big, e.device_block))
        }
        other => panic!("expected a checksum error, got {other:?}"),
    }
    assert_eq!(fs.counters().csum_failures, 1);
    let r = foliofs::fsck::fsck(
        dev.clone(),
        &foliofs::fsck::FsckOptions {
            repair: false,
            check_data: true,
        },
        |_, _| {},
    )
    .unwrap();
    assert!(r
        .problems
        .iter()
        .any(|p| p.structure == "data block" && p.addr == e.device_block));
    let _ = dev.len();
}

/// Superblock generations come from the disk: at u64::MAX the next write
/// wraps to 0, and the slot a step ahead still wins (before, the
/// addition overflowed, and the higher number would have won).
#[test]
fn superblock_generations_wrap() {
    let mut bytes = build().bytes;
    edit_superblocks(&mut bytes, |slot, sb| sb.generation = u64::MAX - 1 + slot);
    let dev = Arc::new(MemDevice::from_image(bytes));
    assert_eq!(
        foliofs::meta::read_superblock(&*dev).unwrap().generation,
        u64::MAX
    );
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    fs.create(fs.root_ino(), b"after", 0o644, 0, 0).unwrap();
    fs.unmount().unwrap();
    let sb = foliofs::meta::read_superblock(&*dev).unwrap();
    assert!(sb.generation < 16, "generation {}", sb.generation);
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    assert!(fs.resolve("/after").is_ok());
    fs.unmount().unwrap();
    assert!(fsck_of(&dev, false).is_clean());
}

/// `r` names a problem with exactly `message`, repaired or not as
/// `repaired` says.
fn assert_names(r: &foliofs::fsck::Report, message: &str, repaired: bool) {
    assert!(
        r.problems
            .iter()
            .any(|p| p.message == message && p.repaired == repaired),
        "{message}: {:?}",
        r.problems
    );
}

/// Rewrite both superblock slots of image `bytes` through `f`.
fn edit_superblocks(
    bytes: &mut [u8],
    f: impl Fn(u64, &mut foliofs::format::superblock::Superblock),
) {
    use foliofs::format::superblock::Superblock;
    for slot in 0..2u64 {
        let at = (slot * 4096) as usize;
        let mut sb = Superblock::decode(&bytes[at..at + 4096], slot).unwrap();
        f(slot, &mut sb);
        sb.encode(&mut bytes[at..at + 4096], slot);
    }
}

/// A fresh 32 MiB file system, mounted, and its free blocks and inodes.
fn fresh_fs() -> (Arc<MemDevice>, Fs, (u64, u64)) {
    let dev = Arc::new(MemDevice::new(32 << 20));
    mkfs(&*dev, &MkfsOptions::default(), |_, _| {}).unwrap();
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let st = fs.statfs().unwrap();
    (dev, fs, (st.blocks_free, st.files_free))
}

/// An image's bytes, its journal replayed home, so that structures can
/// be edited where they lie.
struct Raw {
    bytes: Vec<u8>,
    geo: Geometry,
    uuid: [u8; 16],
}

/// The image of a file system whose file `a` (4 KiB of 1s) was open and
/// unlinked when the power went: `a` is on the orphan list, flagged, with
/// no links. Also its free blocks and inodes before `a` was made.
fn orphaned() -> (Raw, u64, (u64, u64)) {
    let (dev, fs, free_before) = fresh_fs();
    let root = fs.root_ino();
    let a = fs.create(root, b"a", 0o644, 0, 0).unwrap().ino;
    fs.write(a, 0, &[1; 4096]).unwrap();
    fs.open(a).unwrap();
    fs.unlink(root, b"a").unwrap();
    fs.sync().unwrap();
    let image = dev.image();
    drop(fs);
    (Raw::of(image), a, free_before)
}

impl Raw {
    fn of(image: Vec<u8>) -> Raw {
        let dev = MemDevice::from_image(image);
        let mut sb = foliofs::meta::read_superblock(&dev).unwrap();
        foliofs::meta::replay(&dev, &mut sb).unwrap();
        Raw {
            bytes: dev.image(),
            geo: Geometry::new(&sb),
            uuid: sb.uuid,
        }
    }

    /// Inode `ino`'s record.
    fn inode(&self, ino: u64) -> DiskInode {
        let (iblk, ioff) = self.geo.inode_loc(ino);
        let at = (iblk * 4096) as usize + ioff;
        DiskInode::decode(&self.bytes[at..at + INODE_SIZE], ino, iblk, &self.uuid).unwrap()
    }

    /// Rewrite inode `ino` through `f`.
    fn edit(&mut self, ino: u64, f: impl FnOnce(&mut DiskInode)) {
        let mut d = self.inode(ino);
        f(&mut d);
        let (iblk, ioff) = self.geo.inode_loc(ino);
        let at = (iblk * 4096) as usize + ioff;
        d.encode(&mut self.bytes[at..at + INODE_SIZE], &self.uuid);
    }

    /// Blank inode `ino`'s slot, as if it had been freed.
    fn blank(&mut self, ino: u64) {
        let (iblk, ioff) = self.geo.inode_loc(ino);
        let at = (iblk * 4096) as usize + ioff;
        self.bytes[at..at + INODE_SIZE].fill(0);
    }

    /// Remove `name` from directory `dir`'s inline entries.
    fn drop_entry(&mut self, dir: u64, name: &[u8]) {
        self.edit_entries(dir, |entries| {
            let n = entries.len();
            entries
                .retain(|(k, v)| foliofs::format::dirent::decode(dir, *k, v).unwrap().name != name);
            assert_eq!(entries.len() + 1, n, "no entry {name:?}");
        });
    }

    /// Add entry `name` for directory `ino` to directory `dir` (inline).
    fn add_dir_entry(&mut self, dir: u64, name: &[u8], ino: u64) {
        use foliofs::format::dirent;
        self.edit_entries(dir, |entries| {
            entries.push((
                dirent::name_key(name),
                dirent::encode(ino, FileType::Dir, name),
            ));
            entries.sort_by_key(|(k, _)| *k);
        });
    }

    /// Give entry `name` of directory `dir` (inline) the type `kind`.
    fn set_entry_type(&mut self, dir: u64, name: &[u8], kind: FileType) {
        use foliofs::format::dirent;
        self.edit_entries(dir, |entries| {
            let (k, v) = entries
                .iter_mut()
                .find(|(k, v)| dirent::decode(dir, *k, v).unwrap().name == name)
                .expect("no such entry");
            let ino = dirent::decode(dir, *k, v).unwrap().ino;
            *v = dirent::encode(ino, kind, name);
        });
    }

    /// Rewrite directory `dir`'s inline entries through `f`.
    fn edit_entries(&mut self, dir: u64, f: impl FnOnce(&mut Vec<(u64, Vec<u8>)>)) {
        use foliofs::format::inode::Fork;
        let iblk = self.geo.inode_loc(dir).0;
        self.edit(dir, |d| {
            let Fork::Inline(mut entries) = d.decode_fork(iblk).unwrap() else {
                panic!("directory {dir} is not inline");
            };
            f(&mut entries);
            d.literal.fill(0);
            let mut at = 0;
            for (k, v) in &entries {
                d.literal[at..at + 8].copy_from_slice(&k.to_le_bytes());
                d.literal[at + 8..at + 10].copy_from_slice(&(v.len() as u16).to_le_bytes());
                d.literal[at + 10..at + 10 + v.len()].copy_from_slice(v);
                at += 10 + v.len();
            }
            d.fork_count = entries.len() as u16;
        });
    }

    /// Empty the orphan list under its inodes (its block leaks).
    fn empty_list(&mut self) {
        use foliofs::format::ag_header::AgHeader;
        let hblk = self.geo.agh_blk(0);
        let hat = (hblk * 4096) as usize;
        let mut h = AgHeader::decode(&self.bytes[hat..hat + 4096], hblk, 0).unwrap();
        assert_ne!(h.orphan_root, 0);
        h.orphan_root = 0;
        h.encode(&mut self.bytes[hat..hat + 4096], hblk, self.uuid);
        foliofs::format::header::stamp(&mut self.bytes[hat..hat + 4096]);
    }
}

fn fsck_of(dev: &Arc<MemDevice>, repair: bool) -> foliofs::fsck::Report {
    let o = foliofs::fsck::FsckOptions {
        repair,
        check_data: true,
    };
    foliofs::fsck::fsck(dev.clone(), &o, |_, _| {}).unwrap()
}

/// `fsck --repair` of `bytes` corrects every problem, and a check after
/// finds none. Returns the repair's report and the repaired device.
fn repaired(bytes: &[u8]) -> (foliofs::fsck::Report, Arc<MemDevice>) {
    let dev = Arc::new(MemDevice::from_image(bytes.to_vec()));
    let r = fsck_of(&dev, true);
    assert_eq!(r.exit_code(), 1, "{:?}", r.problems);
    let again = fsck_of(&dev, false);
    assert!(again.is_clean(), "after the repair: {:?}", again.problems);
    (r, dev)
}

/// Free blocks and inodes of the file system on `dev`, mounted.
fn free_counts(dev: &Arc<MemDevice>) -> (u64, u64) {
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let st = fs.statfs().unwrap();
    fs.unmount().unwrap();
    (st.blocks_free, st.files_free)
}

/// An inode with no links is freed at its last close, or by the next
/// mount, only through the orphan list: fsck names one off the list (it
/// would never be freed) and one flagged orphan that the list does not
/// hold.
#[test]
fn unlinked_inodes_off_the_orphan_list_are_named() {
    use foliofs::format::inode::FLAG_ORPHAN;
    let (mut img, a, _) = orphaned();
    let iblk = img.geo.inode_loc(a).0;
    img.edit(a, |d| {
        assert_eq!((d.nlink, d.flags & FLAG_ORPHAN), (0, FLAG_ORPHAN))
    });
    let problems =
        |bytes: &[u8]| fsck_of(&Arc::new(MemDevice::from_image(bytes.to_vec())), false).problems;
    let names_inode = |bytes: &[u8], what: &str| {
        let p = problems(bytes);
        assert!(
            p.iter()
                .any(|p| p.structure == "inode" && p.addr == iblk && p.message.contains(what)),
            "{what}: {p:?}"
        );
    };
    assert!(
        problems(&img.bytes).is_empty(),
        "{:?}",
        problems(&img.bytes)
    );
    img.empty_list();
    names_inode(&img.bytes, "flagged orphan but not on the orphan list");
    // And its flag cleared too: nothing would ever free it.
    img.edit(a, |d| d.flags &= !FLAG_ORPHAN);
    names_inode(&img.bytes, "has no links and no orphan flag");
}

/// fsck --repair frees an inode that nothing would free, flagged or not,
/// as the next mount frees an orphan: its blocks and its inode are back,
/// and the image checks clean.
#[test]
fn a_repair_frees_inodes_that_nothing_would_free() {
    use foliofs::format::inode::FLAG_ORPHAN;
    let (mut img, a, free_before) = orphaned();
    img.empty_list();
    let (r, dev) = repaired(&img.bytes);
    assert!(
        r.problems
            .iter()
            .any(|p| p.message.contains("flagged orphan")),
        "{:?}",
        r.problems
    );
    assert_eq!(free_counts(&dev), free_before);
    img.edit(a, |d| d.flags &= !FLAG_ORPHAN);
    let (_, dev) = repaired(&img.bytes);
    assert_eq!(free_counts(&dev), free_before);
    // A clean image with an orphan on its list is left for the mount.
    let (img, _, _) = orphaned();
    let dev = Arc::new(MemDevice::from_image(img.bytes.clone()));
    assert_eq!(fsck_of(&dev, true).exit_code(), 0);
    assert_eq!(dev.image(), img.bytes, "a repair of a clean image wrote");
    assert_eq!(free_counts(&dev), free_before);
}

/// An orphan list that names an inode with links is damaged: fsck says
/// so, and the mount takes the inode off the list instead of freeing the
/// file. A repair, of the image or of the mounted one, names the file in
/// /lost+found.
#[test]
fn an_orphan_list_naming_a_linked_inode_frees_nothing() {
    let (mut img, a, _) = orphaned();
    img.edit(a, |d| d.nlink = 1);
    let dev = Arc::new(MemDevice::from_image(img.bytes.clone()));
    let r = fsck_of(&dev, false);
    assert!(
        r.problems
            .iter()
            .any(|p| p.message == format!("lists inode {a}, which has 1 links")),
        "{:?}",
        r.problems
    );
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    assert_ones(&fs, a);
    fs.unmount().unwrap();
    // Off the list: only its missing name is left to report.
    let r = fsck_of(&dev, false);
    assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
    assert!(r.problems[0].message.contains("but 0 directory entries"));
    for bytes in [img.bytes, dev.image()] {
        let (r, dev) = repaired(&bytes);
        let name = format!("#{a}");
        assert!(
            r.problems
                .iter()
                .any(|p| p.message.ends_with(&format!("named /lost+found/{name}"))),
            "{:?}",
            r.problems
        );
        let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
        let lf = fs.lookup(fs.root_ino(), b"lost+found").unwrap();
        assert_eq!(
            (lf.kind, lf.perm & 0o7777, lf.nlink),
            (FileType::Dir, 0o700, 2)
        );
        let at = fs.lookup(lf.ino, name.as_bytes()).unwrap();
        assert_eq!((at.ino, at.nlink), (a, 1));
        assert_ones(&fs, a);
        fs.unlink(lf.ino, name.as_bytes()).unwrap();
        fs.unmount().unwrap();
        assert!(fsck_of(&dev, false).is_clean());
    }
}

/// An orphan list entry for an unlinked inode whose orphan flag is lost
/// (damage): fsck names it, and the mount frees the inode and empties
/// the list all the same (its second look finds the slot free).
#[test]
fn a_listed_inode_without_its_orphan_flag_is_freed_all_the_same() {
    use foliofs::format::inode::FLAG_ORPHAN;
    let (mut img, a, free_before) = orphaned();
    img.edit(a, |d| d.flags &= !FLAG_ORPHAN);
    let dev = Arc::new(MemDevice::from_image(img.bytes));
    let r = fsck_of(&dev, false);
    assert!(
        r.problems
            .iter()
            .any(|p| p.message == format!("lists inode {a}, which is not flagged orphan")),
        "{:?}",
        r.problems
    );
    assert_eq!(free_counts(&dev), free_before);
    assert!(fsck_of(&dev, false).is_clean());
}

/// File `a` of `orphaned` still holds its 4 KiB of 1s.
fn assert_ones(fs: &Fs, a: u64) {
    let mut buf = [0u8; 4096];
    assert_eq!(fs.read(a, 0, &mut buf).unwrap(), 4096);
    assert!(buf.iter().all(|&b| b == 1), "the file's data is gone");
}

/// A directory that lost its entry, and everything below it, is not
/// reachable from the root: a repair names it `#<ino>` in the parent its
/// record names, where the tree below it is whole again.
#[test]
fn a_repair_names_a_lost_directory_in_its_recorded_parent() {
    let (dev, fs, free_before) = fresh_fs();
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let e = fs.mkdir(d, b"e", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(e, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &[3; 8192]).unwrap();
    fs.unmount().unwrap();
    let mut img = Raw::of(dev.image());
    img.drop_entry(root, b"d");
    let r = fsck_of(&Arc::new(MemDevice::from_image(img.bytes.clone())), false);
    for ino in [d, e] {
        let message = format!("directory {ino} is not reachable from the root");
        assert_names(&r, &message, false);
    }
    let (r, dev) = repaired(&img.bytes);
    let home = format!("#{d} in directory {root}, its parent by its record");
    let named = format!("directory {d} is not reachable from the root; named {home}");
    let below = format!("directory {e} is not reachable from the root; now below {home}");
    for message in [named, below] {
        assert_names(&r, &message, true);
    }
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let lf = fs.lookup(root, b"lost+found").unwrap().ino;
    let name = format!("#{d}");
    assert_eq!(fs.lookup(root, name.as_bytes()).unwrap().ino, d);
    assert_eq!(fs.lookup(d, b"..").unwrap().ino, root);
    assert_eq!(fs.getattr(lf).unwrap().nlink, 2);
    assert_eq!(fs.getattr(root).unwrap().nlink, 4);
    assert_eq!(fs.lookup(e, b"f").unwrap().ino, f);
    let mut buf = [0u8; 8192];
    assert_eq!(fs.read(f, 0, &mut buf).unwrap(), 8192);
    assert!(buf.iter().all(|&b| b == 3));
    fs.unlink(e, b"f").unwrap();
    fs.rmdir(d, b"e").unwrap();
    fs.rmdir(root, name.as_bytes()).unwrap();
    fs.rmdir(root, b"lost+found").unwrap();
    fs.unmount().unwrap();
    assert_eq!(free_counts(&dev), free_before);
    assert!(fsck_of(&dev, false).is_clean());
}

/// fsck --repair sets a link count from the directory entries, for a
/// file and for a directory, and the files then unlink to nothing.
#[test]
fn a_repair_sets_link_counts_from_the_entries() {
    let (dev, fs, free_before) = fresh_fs();
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let b = fs.create(d, b"b", 0o644, 0, 0).unwrap().ino;
    fs.write(b, 0, &[2; 8192]).unwrap();
    fs.link(b, d, b"b2").unwrap();
    fs.unmount().unwrap();
    let mut img = Raw::of(dev.image());
    img.edit(b, |x| x.nlink = 5);
    img.edit(d, |x| x.nlink = 7);
    let (r, dev) = repaired(&img.bytes);
    assert_eq!(r.problems.len(), 2, "{:?}", r.problems);
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    assert_eq!(fs.getattr(b).unwrap().nlink, 2);
    assert_eq!(fs.getattr(d).unwrap().nlink, 2);
    fs.unlink(d, b"b").unwrap();
    fs.unlink(d, b"b2").unwrap();
    fs.rmdir(root, b"d").unwrap();
    fs.unmount().unwrap();
    assert_eq!(free_counts(&dev), free_before);
    assert!(fsck_of(&dev, false).is_clean());
}

/// Entries whose inodes are gone (a file's and a directory's): a repair
/// removes them, sets the directory's link count without them, and gives
/// back the inodes and the blocks that were left marked in use.
#[test]
fn a_repair_removes_entries_that_point_to_free_inodes() {
    let (dev, fs, _) = fresh_fs();
    let root = fs.root_ino();
    let a = fs.create(root, b"a", 0o644, 0, 0).unwrap().ino;
    fs.write(a, 0, &[1; 4096]).unwrap();
    fs.unmount().unwrap();
    let with_a = free_counts(&dev);
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let b = fs.create(root, b"b", 0o644, 0, 0).unwrap().ino;
    fs.write(b, 0, &[2; 8192]).unwrap();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    fs.unmount().unwrap();
    let mut img = Raw::of(dev.image());
    img.blank(b);
    img.blank(d);
    let (r, dev) = repaired(&img.bytes);
    for (name, ino) in [("b", b), ("d", d)] {
        let message = format!(
            "directory {root}: {name:?} points to free inode {ino}; {name:?} removed from {root}"
        );
        assert_names(&r, &message, true);
    }
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    for name in [b"b", b"d"] {
        assert!(matches!(fs.lookup(root, name), Err(Error::NotFound)));
    }
    assert_eq!(fs.getattr(root).unwrap().nlink, 2);
    assert_ones(&fs, a);
    fs.unmount().unwrap();
    assert_eq!(free_counts(&dev), with_a);
}

/// Entries whose type disagrees with their inode's (a file's entry says
/// directory, a directory's says file): a repair gives each the inode's
/// type and sets the parent's link count to match.
#[test]
fn a_repair_gives_entries_their_inodes_types() {
    let (dev, fs, _) = fresh_fs();
    let root = fs.root_ino();
    let a = fs.create(root, b"a", 0o644, 0, 0).unwrap().ino;
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    fs.unmount().unwrap();
    let mut img = Raw::of(dev.image());
    img.set_entry_type(root, b"a", FileType::Dir);
    img.set_entry_type(root, b"d", FileType::File);
    let (r, dev) = repaired(&img.bytes);
    for (name, was, ino, is) in [("a", "Dir", a, "File"), ("d", "File", d, "Dir")] {
        let message = format!(
            "directory {root}: {name:?} has type {was}, inode {ino} is {is}; given the inode's"
        );
        assert_names(&r, &message, true);
    }
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let mut kinds: Vec<_> = fs
        .readdir(root, 0, 10)
        .unwrap()
        .into_iter()
        .filter(|e| e.name != b"." && e.name != b"..")
        .map(|e| (e.name, e.kind))
        .collect();
    kinds.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        kinds,
        [
            (b"a".to_vec(), FileType::File),
            (b"d".to_vec(), FileType::Dir)
        ]
    );
    assert_eq!(fs.getattr(root).unwrap().nlink, 3);
    assert_eq!(fs.lookup(d, b"..").unwrap().ino, root);
    fs.unmount().unwrap();
}

/// A superblock whose root number names a subdirectory (damage): the
/// root can have no name, so a repair removes its entry, and the old root,
/// now nameless, goes to /lost+found below it with the rest of the tree.
/// Nothing is lost and no loop is made (naming the old root first would
/// have closed one through the entry left naming the root).
#[test]
fn a_repair_of_a_root_with_a_name_makes_no_loop() {
    let (img, root, d, e) = two_dirs();
    let mut bytes = img.bytes;
    edit_superblocks(&mut bytes, |_, sb| sb.root_ino = d);
    // The copies too (else a repair takes the root from them).
    let ag1 = img.geo.ag_start(1);
    for blk in [ag1, ag1 + 1] {
        use foliofs::format::superblock::Superblock;
        let at = (blk * 4096) as usize;
        let mut sb = Superblock::decode(&bytes[at..at + 4096], blk).unwrap();
        sb.root_ino = d;
        sb.encode(&mut bytes[at..at + 4096], blk);
    }
    let (r, dev) = repaired(&bytes);
    let message =
        format!("the root directory {d} has entries in {root}; \"d\" removed from {root}");
    assert_names(&r, &message, true);
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    assert_eq!(fs.root_ino(), d);
    let old = fs.resolve(&format!("/lost+found/#{root}")).unwrap();
    assert_eq!(old, root);
    assert_eq!(fs.lookup(old, b"e").unwrap().ino, e);
    assert!(matches!(fs.lookup(old, b"d"), Err(Error::NotFound)));
    fs.unmount().unwrap();
}

/// A fresh file system with directories d and e in its root, unmounted:
/// its image, the root, d and e.
fn two_dirs() -> (Raw, u64, u64, u64) {
    let (dev, fs, _) = fresh_fs();
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let e = fs.mkdir(root, b"e", 0o755, 0, 0).unwrap().ino;
    fs.unmount().unwrap();
    (Raw::of(dev.image()), root, d, e)
}

/// A directory named in two directories: a repair keeps the name in the
/// directory it records as its parent and removes the other.
#[test]
fn a_repair_leaves_a_directory_one_name() {
    let (mut img, root, d, e) = two_dirs();
    img.add_dir_entry(d, b"e2", e);
    let message = format!("directory {e} has entries in {root}, {d}");
    let r = fsck_of(&Arc::new(MemDevice::from_image(img.bytes.clone())), false);
    assert!(
        r.problems.iter().any(|p| p.message == message),
        "{:?}",
        r.problems
    );
    let (r, dev) = repaired(&img.bytes);
    let message = format!("{message}; \"e2\" removed from {d}");
    assert_names(&r, &message, true);
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    assert!(matches!(fs.lookup(d, b"e2"), Err(Error::NotFound)));
    assert_eq!(fs.lookup(root, b"e").unwrap().ino, e);
    assert_eq!(fs.getattr(d).unwrap().nlink, 2);
    assert_eq!(fs.getattr(root).unwrap().nlink, 4);
    fs.unmount().unwrap();
}

/// An entry of another type naming a directory that has a second name:
/// the directory keeps the entry in the parent it records, given its type
/// if it was the wrong one, and the other is removed, whichever type it
/// had.
#[test]
fn a_repair_of_a_mistyped_second_name_keeps_the_recorded_one() {
    for recorded_mistyped in [false, true] {
        let (mut img, root, d, e) = two_dirs();
        img.add_dir_entry(d, b"e2", e);
        let (dir, name) = match recorded_mistyped {
            false => (d, "e2"),
            true => (root, "e"),
        };
        img.set_entry_type(dir, name.as_bytes(), FileType::File);
        let mistyped = format!("directory {dir}: {name:?} has type File, inode {e} is Dir");
        let r = fsck_of(&Arc::new(MemDevice::from_image(img.bytes.clone())), false);
        assert_names(&r, &mistyped, false);
        let (r, dev) = repaired(&img.bytes);
        let removed = format!("; \"e2\" removed from {d}");
        match recorded_mistyped {
            false => assert_names(&r, &format!("{mistyped}{removed}"), true),
            true => {
                assert_names(&r, &format!("{mistyped}; given the inode's"), true);
                let two = format!("directory {e} has entries in {root}, {d}{removed}");
                assert_names(&r, &two, true);
            }
        }
        let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
        assert!(matches!(fs.lookup(d, b"e2"), Err(Error::NotFound)));
        let at = fs.lookup(root, b"e").unwrap();
        assert_eq!((at.ino, at.kind), (e, FileType::Dir));
        let kinds: Vec<_> = fs
            .readdir(root, 0, 10)
            .unwrap()
            .into_iter()
            .filter(|x| x.name == b"e")
            .map(|x| x.kind)
            .collect();
        assert_eq!(kinds, [FileType::Dir]);
        assert_eq!(fs.getattr(d).unwrap().nlink, 2);
        assert_eq!(fs.getattr(root).unwrap().nlink, 4);
        assert_eq!(fs.lookup(e, b"..").unwrap().ino, root);
        fs.unmount().unwrap();
    }
}

/// Two directories, each named only in the other, that the root does not
/// reach: a repair removes the entry of the lower-numbered one and names
/// it `#<ino>` in the parent its record names, the other below it.
#[test]
fn a_repair_cuts_a_loop_of_directories() {
    let (dev, fs, _) = fresh_fs();
    let root = fs.root_ino();
    let a = fs.mkdir(root, b"a", 0o755, 0, 0).unwrap().ino;
    let b = fs.mkdir(a, b"b", 0o755, 0, 0).unwrap().ino;
    fs.unmount().unwrap();
    let mut img = Raw::of(dev.image());
    img.drop_entry(root, b"a");
    img.add_dir_entry(b, b"a", a);
    let message = format!("directories {a}, {b} reach only each other (a loop)");
    let r = fsck_of(&Arc::new(MemDevice::from_image(img.bytes.clone())), false);
    assert_names(&r, &message, false);
    let (r, dev) = repaired(&img.bytes);
    let message = format!("{message}; \"a\" removed from {b}");
    assert_names(&r, &message, true);
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    assert_eq!(fs.lookup(root, format!("#{a}").as_bytes()).unwrap().ino, a);
    assert_eq!(fs.lookup(a, b"..").unwrap().ino, root);
    assert_eq!(fs.lookup(a, b"b").unwrap().ino, b);
    assert!(matches!(fs.lookup(b, b"a"), Err(Error::NotFound)));
    assert_eq!(fs.getattr(b).unwrap().nlink, 2);
    assert_eq!(fs.getattr(a).unwrap().nlink, 3);
    fs.unmount().unwrap();
}

/// A directory with no links that is named, or that has entries, is a
/// live directory with a wrong count, not a removed one (rmdir takes only
/// an empty directory): the mount does not free one from the orphan
/// list, and a repair sets its count and names it if nothing does, its
/// tree whole.
#[test]
fn a_directory_with_no_links_but_a_name_or_entries_is_kept() {
    use foliofs::format::inode::FLAG_ORPHAN;
    let (dev, fs, _) = fresh_fs();
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let e = fs.mkdir(root, b"e", 0o755, 0, 0).unwrap().ino;
    let y = fs.mkdir(e, b"y", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(y, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &[5; 4096]).unwrap();
    // x: removed while open, on the orphan list.
    let x = fs.mkdir(root, b"x", 0o755, 0, 0).unwrap().ino;
    fs.open(x).unwrap();
    fs.rmdir(root, b"x").unwrap();
    fs.sync().unwrap();
    let image = dev.image();
    drop(fs);
    let mut img = Raw::of(image);
    // d: named, empty, count 0. x: y moved into it from e.
    img.edit(d, |i| i.nlink = 0);
    img.drop_entry(e, b"y");
    img.edit(e, |i| i.nlink = 2);
    img.add_dir_entry(x, b"y", y);
    img.edit(y, |i| i.parent = x);
    img.edit(x, |i| i.nlink = 0);
    assert_ne!(img.inode(x).flags & FLAG_ORPHAN, 0);
    let r = fsck_of(&Arc::new(MemDevice::from_image(img.bytes.clone())), false);
    for message in [
        format!("directory {d}: link count 0, should be 2"),
        format!("directory {x}: link count 0, should be 3"),
    ] {
        assert_names(&r, &message, false);
    }
    // The mount leaves x (and y below it) alone: off the list, not freed.
    let dev = Arc::new(MemDevice::from_image(img.bytes.clone()));
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    assert_eq!(fs.lookup(x, b"y").unwrap().ino, y);
    fs.unmount().unwrap();
    for bytes in [img.bytes.clone(), dev.image()] {
        let (r, dev) = repaired(&bytes);
        let named = format!("directory {x} is not reachable from the root; named /lost+found/#{x}");
        assert_names(&r, &named, true);
        let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
        assert_eq!(fs.lookup(root, b"d").unwrap().ino, d);
        assert_eq!(fs.getattr(d).unwrap().nlink, 2);
        let lf = fs.lookup(root, b"lost+found").unwrap().ino;
        assert_eq!(fs.lookup(lf, format!("#{x}").as_bytes()).unwrap().ino, x);
        assert_eq!(fs.getattr(x).unwrap().nlink, 3);
        assert_eq!(fs.lookup(x, b"y").unwrap().ino, y);
        assert_eq!(fs.lookup(y, b"..").unwrap().ino, x);
        let mut buf = [0u8; 4096];
        assert_eq!(
            fs.read(fs.lookup(y, b"f").unwrap().ino, 0, &mut buf)
                .unwrap(),
            4096
        );
        assert!(buf.iter().all(|&b| b == 5));
        fs.rmdir(root, b"d").unwrap();
        fs.unmount().unwrap();
        assert!(fsck_of(&dev, false).is_clean());
    }
}

/// `img` with `damage` done to its bytes, repaired (every problem
/// corrected, a check after clean), and mounted.
fn repair_of(img: &Image, damage: impl FnOnce(&mut Vec<u8>)) -> (foliofs::fsck::Report, Fs) {
    let mut bytes = img.bytes.clone();
    damage(&mut bytes);
    let (r, dev) = repaired(&bytes);
    (r, Fs::mount(dev, MountOptions::default()).unwrap())
}

/// Zero block `blk` of `bytes`.
fn zero_block(bytes: &mut [u8], blk: u64) {
    bytes[(blk * 4096) as usize..((blk + 1) * 4096) as usize].fill(0);
}

/// The inode of `dir`'s entry `name` in the undamaged image.
fn ino_of(img: &Image, dir: u64, name: &[u8]) -> u64 {
    let dev = Arc::new(MemDevice::from_image(img.bytes.clone()));
    let fs = Fs::mount(dev, MountOptions::default()).unwrap();
    let ino = fs.lookup(dir, name).unwrap().ino;
    fs.unmount().unwrap();
    ino
}

/// An inode in use whose slot does not decode is cleared: its entry
/// goes, its blocks are given back; one in a free slot is zeroed.
#[test]
fn a_repair_clears_an_inode_slot_that_does_not_decode() {
    let img = build();
    let ino = ino_of(&img, img.dir, b"entry-7");
    let (blk, off) = img.geo.inode_loc(ino);
    let free = ino + 400;
    let (fblk, foff) = img.geo.inode_loc(free);
    let (r, fs) = repair_of(&img, |b| {
        b[(blk * 4096) as usize + off + 40] ^= 6;
        b[(fblk * 4096) as usize + foff + 300] = 9;
    });
    assert_names(
        &r,
        &format!("inode {ino}: checksum mismatch; cleared"),
        true,
    );
    assert_names(&r, &format!("inode {free}: bad magic; cleared"), true);
    assert!(matches!(
        fs.lookup(img.dir, b"entry-7"),
        Err(Error::NotFound)
    ));
    assert!(fs.lookup(img.dir, b"entry-8").is_ok());
    fs.unmount().unwrap();
}

/// One bit flipped in an inode's record, anywhere in it, its checksum
/// included: a repair sets it back (the only bit whose flip makes the
/// checksum hold), and the file is kept whole, where two bits flipped
/// clear it (above).
#[test]
fn a_repair_sets_back_one_flipped_bit_of_an_inode_record() {
    let img = build();
    let (blk, off) = img.geo.inode_loc(img.big);
    let file = ino_of(&img, img.dir, b"entry-7");
    let (fblk, foff) = img.geo.inode_loc(file);
    let (r, fs) = repair_of(&img, |b| {
        // Bit 3 of the big file's size; bit 0 of the other's checksum.
        b[(blk * 4096) as usize + off + 49] ^= 8;
        b[(fblk * 4096) as usize + foff + 4] ^= 1;
    });
    let big = img.big;
    assert_names(
        &r,
        &format!("inode {big}: checksum mismatch; bit 3 of byte 49 flipped: set back, the checksum holding with it"),
        true,
    );
    assert_names(
        &r,
        &format!("inode {file}: checksum mismatch; bit 0 of byte 4 flipped: set back, the checksum holding with it"),
        true,
    );
    assert_eq!(fs.lookup(img.dir, b"entry-7").unwrap().ino, file);
    let size = fs.getattr(big).unwrap().size;
    assert_eq!(size, 199 * 4096);
    let mut buf = vec![0; size as usize];
    assert_eq!(fs.read(big, 0, &mut buf).unwrap(), size as usize);
    for (i, data) in buf.chunks(4096).enumerate() {
        let want = if i % 2 == 0 { i as u8 / 2 + 1 } else { 0 };
        assert!(data.iter().all(|&b| b == want), "block {i}");
    }
    fs.unmount().unwrap();
}

/// A directory's slot whose checksum alone fails is kept (clearing it
/// would send all it names to /lost+found); a file's is cleared (above).
#[test]
fn a_repair_keeps_a_sound_directory_record_whose_checksum_fails() {
    let img = build();
    let (blk, off) = img.geo.inode_loc(img.dir);
    let (r, fs) = repair_of(&img, |b| b[(blk * 4096) as usize + off + 400] ^= 3);
    assert_names(
        &r,
        &format!(
            "inode {}: checksum mismatch; a directory's record otherwise sound: kept, \
             its checksum rewritten",
            img.dir
        ),
        true,
    );
    assert_eq!(names_in(&fs, img.dir).len(), 300);
    fs.unmount().unwrap();
}

/// The root's slot does not decode (not its checksum alone): a new,
/// empty root, and what it named back under its names, by the leaves of
/// its old tree (which name the root as their owner).
#[test]
fn a_repair_makes_a_damaged_root_anew() {
    let img = build();
    let (blk, off) = img.geo.inode_loc(1);
    let (r, fs) = repair_of(&img, |b| b[(blk * 4096) as usize + off] ^= 3);
    assert_names(
        &r,
        "inode 1: bad magic; the root directory made anew, empty; 102 entries found in \
         leaves of its old tree (named by the inodes they name, and put back under those names)",
        true,
    );
    let root = fs.root_ino();
    assert_eq!(fs.lookup(root, b"dir").unwrap().ino, img.dir);
    assert!(fs.lookup(img.dir, b"entry-299").is_ok());
    assert_eq!(fs.lookup(root, b"big").unwrap().ino, img.big);
    assert!(fs.lookup(root, b"fill99").is_ok());
    fs.unmount().unwrap();
}

/// An extent tree node that does not decode: the file is left empty
/// (never zeros passed off as its data), its blocks given back.
#[test]
fn a_repair_empties_a_file_whose_extent_tree_is_damaged() {
    let img = build();
    let root = inode(&img, img.big).fork_root;
    let (r, fs) = repair_of(&img, |b| zero_block(b, root));
    assert!(r.problems.iter().any(|p| p.addr == root
        && p.message.ends_with("its data removed, left empty")
        && p.repaired));
    assert_eq!(fs.getattr(img.big).unwrap().size, 0);
    fs.unmount().unwrap();
}

/// Names in directory `dir`, "." and ".." aside.
fn names_in(fs: &Fs, dir: u64) -> Vec<Vec<u8>> {
    let list = fs.readdir(dir, 0, 1000).unwrap();
    list.into_iter()
        .filter(|e| e.name != b"." && e.name != b"..")
        .map(|e| e.name)
        .collect()
}

/// A directory tree's root node that does not decode: the directory is
/// emptied and every file it named is named in /lost+found.
#[test]
fn a_repair_sends_a_damaged_directory_s_files_to_lost_found() {
    let img = build();
    let root = inode(&img, img.dir).fork_root;
    let (r, fs) = repair_of(&img, |b| b[(root * 4096) as usize + 100] ^= 1);
    assert!(r
        .problems
        .iter()
        .any(|p| p.addr == root && p.message.contains("(what they named goes to /lost+found")));
    assert_eq!(names_in(&fs, img.dir).len(), 0);
    let lf = fs.lookup(fs.root_ino(), b"lost+found").unwrap().ino;
    assert_eq!(names_in(&fs, lf).len(), 300);
    fs.unmount().unwrap();
}

/// A directory tree's leaf that does not decode: the entries the other
/// leaves hold are put back under their names, those of the damaged one
/// are named in /lost+found.
#[test]
fn a_repair_puts_back_the_entries_of_a_directory_tree_that_still_read() {
    use foliofs::format::btree_node::{Node, TreeType};
    let img = build();
    let root = inode(&img, img.dir).fork_root;
    let at = (root * 4096) as usize;
    let node = Node::decode(&img.bytes[at..at + 4096], root, img.dir, TreeType::Dir).unwrap();
    assert!(node.level > 0, "the directory's tree should have leaves");
    let leaf = u64::from_le_bytes(node.entries[0].1[..8].try_into().unwrap());
    let (r, fs) = repair_of(&img, |b| zero_block(b, leaf));
    let back = r
        .problems
        .iter()
        .filter(|p| p.message.contains("; put back as "))
        .count();
    let kept = names_in(&fs, img.dir);
    let lf = fs.lookup(fs.root_ino(), b"lost+found").unwrap().ino;
    let lost = names_in(&fs, lf);
    assert_eq!(back, kept.len());
    assert!(
        !lost.is_empty() && kept.len() > lost.len(),
        "{kept:?} {lost:?}"
    );
    assert_eq!(kept.len() + lost.len(), 300);
    for name in kept {
        assert!(name.starts_with(b"entry-"), "{name:?}");
    }
    fs.unmount().unwrap();
}

/// An xattr tree node that does not decode: the inode's xattrs go, the
/// inode and its data stay.
#[test]
fn a_repair_removes_xattrs_whose_tree_is_damaged() {
    let img = build();
    let root = inode(&img, img.big).xattr_root;
    let (r, fs) = repair_of(&img, |b| b[(root * 4096) as usize + 20] ^= 1);
    assert!(r
        .problems
        .iter()
        .any(|p| p.addr == root && p.message.ends_with("its xattrs removed")));
    assert!(matches!(
        fs.getxattr(img.big, b"user.x"),
        Err(Error::NoAttr)
    ));
    let mut buf = vec![0; 4096];
    fs.read(img.big, 0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 1));
    fs.unmount().unwrap();
}

/// Bitmaps, AG headers and checksum blocks that do not decode are
/// rebuilt: the bitmaps from the inodes and the trees, the header from
/// the counts, a checksum block with its entries as they stand (so every
/// file still reads, verified).
#[test]
fn a_repair_rebuilds_bitmaps_ag_headers_and_checksum_blocks() {
    let img = build();
    let g = &img.geo;
    let (r, fs) = repair_of(&img, |b| {
        zero_block(b, g.imap_start(0));
        zero_block(b, g.bmap_start(1));
        zero_block(b, g.agh_blk(0));
        b[(g.csum_start(0) * 4096) as usize + 20] ^= 1;
    });
    let rebuilt = |blk: u64, how: &str| {
        assert!(
            r.problems
                .iter()
                .any(|p| p.addr == blk && p.message.ends_with(how) && p.repaired),
            "{blk} {how}: {:?}",
            r.problems
        );
    };
    rebuilt(g.imap_start(0), "rebuilt from the inodes");
    rebuilt(g.bmap_start(1), "rebuilt from the trees");
    rebuilt(g.agh_blk(0), "rebuilt from the bitmaps and inodes");
    rebuilt(g.csum_start(0), "rebuilt, its entries kept");
    let mut buf = vec![0; 4096];
    fs.read(img.big, 99 * 8192, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 100));
    // The rebuilt bitmaps hand out only free blocks and inodes.
    let f = fs.create(fs.root_ino(), b"new", 0o644, 0, 0).unwrap();
    fs.write(f.ino, 0, &[7; 65536]).unwrap();
    fs.unmount().unwrap();
}

/// A journal damaged in its live part (a crash left transactions not yet
/// written home): replay stops at the damaged transaction, the repair
/// mends what the lost ones leave, and the log starts past every number
/// in it, so nothing stale replays later.
#[test]
fn a_repair_of_a_damaged_live_journal_leaves_a_clean_image() {
    let (dev, fs, _) = fresh_fs();
    let root = fs.root_ino();
    for i in 0..20u8 {
        let f = fs.create(root, &[b'f', b'a' + i], 0o644, 0, 0).unwrap();
        fs.write(f.ino, 0, &[i + 1; 5000]).unwrap();
        fs.fsync(f.ino, false).unwrap();
    }
    let image = dev.image();
    drop(fs);
    let sb = foliofs::meta::read_superblock(&MemDevice::from_image(image.clone())).unwrap();
    let geo = Geometry::new(&sb);
    // The second descriptor of the live log: its transaction and every
    // one after it are lost, the first is replayed.
    let descs: Vec<u64> = (0..geo.journal_blocks)
        .map(|p| geo.journal_start + p)
        .filter(|&b| {
            let at = (b * 4096) as usize;
            image[at..at + 4] == foliofs::format::magic::JOURNAL_DESC.to_le_bytes()
        })
        .collect();
    assert!(descs.len() > 2, "{descs:?}");
    let mut bytes = image;
    bytes[(descs[1] * 4096) as usize + 100] ^= 1;
    let dev = Arc::new(MemDevice::from_image(bytes));
    let r = fsck_of(&dev, true);
    assert_eq!(r.journal_replayed, 1);
    assert!(r.exit_code() <= 1, "{:?}", r.problems);
    let again = fsck_of(&dev, false);
    assert!(again.is_clean(), "after the repair: {:?}", again.problems);
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    fs.create(root, b"after", 0o644, 0, 0).unwrap();
    fs.unmount().unwrap();
    assert!(fsck_of(&dev, false).is_clean());
}

/// Flags no version of the engine sets are named, and a repair clears
/// them.
#[test]
fn a_repair_clears_unknown_inode_flags() {
    let (dev, fs, _) = fresh_fs();
    let a = fs.create(fs.root_ino(), b"a", 0o644, 0, 0).unwrap().ino;
    fs.unmount().unwrap();
    let mut raw = Raw::of(dev.image());
    raw.edit(a, |d| d.flags |= 1 << 30);
    let (r, dev) = repaired(&raw.bytes);
    assert_names(&r, &format!("inode {a}: unknown flags 0x40000000"), true);
    assert_eq!(Raw::of(dev.image()).inode(a).flags & (1 << 30), 0);
}

/// An extent tree leaf past the first that does not decode: every
/// extent before it is kept (more than fit in the inode: in a new tree)
/// and the file is cut where the damaged leaf's start, so what it still
/// reads is its own data and its own holes.
#[test]
fn a_repair_keeps_the_extents_before_a_damaged_leaf() {
    use foliofs::format::btree_node::{Node, TreeType};
    use foliofs::format::inode::ForkFormat;
    let img = build();
    let root = inode(&img, img.big).fork_root;
    let node_at = |blk: u64| {
        let at = (blk * 4096) as usize;
        Node::decode(&img.bytes[at..at + 4096], blk, img.big, TreeType::Extents).unwrap()
    };
    let node = node_at(root);
    assert!(node.level == 1 && node.entries.len() > 1);
    let child = |i: usize| u64::from_le_bytes(node.entries[i].1[..8].try_into().unwrap());
    let (first, leaf) = (child(0), child(1));
    let n = node_at(first).entries.len();
    assert!(n > 13, "{n} extents fit inline");
    let mut bytes = img.bytes.clone();
    bytes[(leaf * 4096) as usize + 300] ^= 1;
    let (r, dev) = repaired(&bytes);
    assert_eq!(
        Raw::of(dev.image()).inode(img.big).fork,
        ForkFormat::ExtentTree
    );
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let kept = format!("the {n} extents before the damage kept, the file cut at byte ");
    let p = r
        .problems
        .iter()
        .find(|p| p.addr == leaf && p.message.contains(&kept) && p.repaired)
        .unwrap_or_else(|| panic!("{:?}", r.problems));
    let cut: u64 = p.message.rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(cut, node.entries[1].0 * 4096);
    assert_eq!(fs.getattr(img.big).unwrap().size, cut);
    let mut buf = vec![0; cut as usize];
    assert_eq!(fs.read(img.big, 0, &mut buf).unwrap(), cut as usize);
    for (blk, data) in buf.chunks(4096).enumerate() {
        let want = if blk % 2 == 0 { blk as u8 / 2 + 1 } else { 0 };
        assert!(data.iter().all(|&b| b == want), "block {blk}");
    }
    // The new tree takes writes past the cut and reads them back.
    fs.write(img.big, cut + 4096, &[7; 8192]).unwrap();
    let mut buf = vec![0; 8192];
    fs.read(img.big, cut + 4096, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 7));
    fs.unmount().unwrap();
    assert!(fsck_of(&dev, false).is_clean());
}

/// Inode `ino`'s inline extents in `raw`: (file block, device block,
/// length) each.
fn inline_extents(raw: &Raw, ino: u64) -> Vec<(u64, u64, u64)> {
    use foliofs::format::inode::Fork;
    let Fork::Inline(entries) = raw.inode(ino).decode_fork(0).unwrap() else {
        panic!("inode {ino}'s extents are not inline");
    };
    entries
        .iter()
        .map(|(k, v)| {
            let pblk = u64::from_le_bytes(v[..8].try_into().unwrap());
            let len = u32::from_le_bytes(v[8..12].try_into().unwrap()) as u64;
            (*k, pblk, len)
        })
        .collect()
}

/// Point inode `ino`'s inline extent at file block `lblk` to device
/// block `pblk`, its checksum made good.
fn repoint(raw: &mut Raw, ino: u64, lblk: u64, pblk: u64) {
    raw.edit_entries(ino, |entries| {
        let (_, v) = entries.iter_mut().find(|(k, _)| *k == lblk).unwrap();
        v[..8].copy_from_slice(&pblk.to_le_bytes());
    });
}

/// Extents whose checksums hold but that cannot stand: one over another
/// file's block, one over AG metadata, one past the device's end. A
/// repair keeps the blocks with their first claimant and cuts each
/// later claimant's map (and the file) where the extent starts, so no
/// file reads another's bytes and nothing is passed off as data.
#[test]
fn a_repair_cuts_out_extents_that_claim_blocks_not_theirs() {
    let (dev, fs, _) = fresh_fs();
    let root = fs.root_ino();
    let mut inos = Vec::new();
    for name in [b"a", b"b", b"c", b"d"] {
        inos.push(fs.create(root, name, 0o644, 0, 0).unwrap().ino);
    }
    // Blocks 0 and 2 of each: more than one extent.
    for (i, &f) in inos.iter().enumerate() {
        fs.write(f, 0, &[i as u8 + 1; 4096]).unwrap();
        fs.write(f, 8192, &[i as u8 + 1; 4096]).unwrap();
        fs.fsync(f, false).unwrap();
    }
    fs.unmount().unwrap();
    let mut raw = Raw::of(dev.image());
    let (a, b, c, d) = (inos[0], inos[1], inos[2], inos[3]);
    let n = inline_extents(&raw, b).len() as u64;
    assert!(n > 1, "{:?}", inline_extents(&raw, b));
    let last = inline_extents(&raw, b)[n as usize - 1].0;
    let a_first = inline_extents(&raw, a)[0].1;
    let (total, agh) = (raw.geo.total_blocks, raw.geo.agh_blk(0));
    // b's last extent over a's first block: a (checked first) keeps it.
    repoint(&mut raw, b, last, a_first);
    // c's first over the AG header, d's last past the device.
    repoint(&mut raw, c, 0, agh);
    repoint(&mut raw, d, last, total + 3);
    let (r, dev) = repaired(&raw.bytes);
    let cut = |ino: u64, why: &str, rest: &str| {
        assert!(
            r.problems.iter().any(|p| p.repaired
                && p.message
                    .starts_with(&format!("inode {ino}: extent at file block "))
                && p.message.contains(why)
                && p.message.ends_with(rest)),
            "inode {ino}: {:?}",
            r.problems
        );
    };
    let at = last * 4096;
    let one = format!("; cut out with the extents after it (1 in all), the file cut at byte {at}");
    cut(b, &format!("block {a_first} is claimed by inode {a}"), &one);
    let all = format!("({n} in all), the file cut at byte 0");
    cut(c, "outside the data area", &all);
    cut(d, "outside the data area", &one);
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    for (i, &f) in inos.iter().enumerate() {
        let want = [12288, at, 0, at][i];
        assert_eq!(fs.getattr(f).unwrap().size, want, "file {i}");
        let mut buf = vec![0; want as usize];
        assert_eq!(fs.read(f, 0, &mut buf).unwrap(), want as usize);
        for (blk, data) in buf.chunks(4096).enumerate() {
            let v = if blk == 1 { 0 } else { i as u8 + 1 };
            assert!(data.iter().all(|&x| x == v), "file {i} block {blk}");
        }
    }
    // The blocks given back are free to use again, and a's are a's.
    let f = fs.create(root, b"new", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &[9; 1 << 20]).unwrap();
    fs.unmount().unwrap();
    assert!(fsck_of(&dev, false).is_clean());
}

/// A node of a file's extent tree moved (a valid copy, its checksum and
/// block number made good) into a block of an earlier file's extent: the
/// node keeps the block, whichever inode is checked first, for it
/// verifies as that tree's where the extent only points there. The
/// earlier file keeps its blocks before the node and is cut there.
#[test]
fn a_repair_gives_a_tree_node_its_block_over_an_earlier_file_s_extent() {
    use foliofs::format::btree_node::{Node, TreeType};
    let (dev, fs, _) = fresh_fs();
    let root = fs.root_ino();
    let a = fs.create(root, b"a", 0o644, 0, 0).unwrap().ino;
    fs.write(a, 0, &[1; 4 * 4096]).unwrap();
    fs.fsync(a, false).unwrap();
    // Every other block: an extent per block, so the map becomes a tree.
    let big = fs.create(root, b"big", 0o644, 0, 0).unwrap().ino;
    for i in 0..40u64 {
        fs.write(big, i * 8192, &[i as u8 + 2; 4096]).unwrap();
        fs.fsync(big, false).unwrap();
        let f = fs
            .create(root, format!("fill{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
        fs.write(f.ino, 0, &[9; 4096]).unwrap();
        fs.fsync(f.ino, false).unwrap();
    }
    fs.unmount().unwrap();
    let mut raw = Raw::of(dev.image());
    assert!(a < big);
    let [(0, a_first, 4)] = inline_extents(&raw, a)[..] else {
        panic!("{:?}", inline_extents(&raw, a));
    };
    let old = raw.inode(big).fork_root;
    let at = (old * 4096) as usize;
    let node = Node::decode(&raw.bytes[at..at + 4096], old, big, TreeType::Extents).unwrap();
    let moved = a_first + 2;
    let to = (moved * 4096) as usize;
    node.encode(
        &mut raw.bytes[to..to + 4096],
        moved,
        raw.uuid,
        big,
        TreeType::Extents,
    );
    foliofs::format::header::stamp(&mut raw.bytes[to..to + 4096]);
    raw.edit(big, |d| d.fork_root = moved);
    let (r, dev) = repaired(&raw.bytes);
    assert_names(
        &r,
        &format!(
            "inode {a}: extent at file block 0 (4 blocks at {a_first}): block {moved} is a \
             node of a tree of inode {big}; its 2 blocks before block {moved} kept, the rest \
             cut out, the file cut at byte 8192"
        ),
        true,
    );
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    assert_eq!(fs.getattr(a).unwrap().size, 8192);
    let mut buf = vec![0; 8192];
    assert_eq!(fs.read(a, 0, &mut buf).unwrap(), 8192);
    assert!(buf.iter().all(|&b| b == 1));
    let mut buf = vec![0; 80 * 4096];
    assert_eq!(fs.read(big, 0, &mut buf).unwrap(), 79 * 4096);
    for (i, data) in buf.chunks(4096).take(79).enumerate() {
        let want = if i % 2 == 0 { i as u8 / 2 + 2 } else { 0 };
        assert!(data.iter().all(|&b| b == want), "block {i}");
    }
    // The old root's block, which nothing owns now, is free to use.
    let f = fs.create(root, b"new", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &[7; 1 << 20]).unwrap();
    fs.unmount().unwrap();
    assert!(fsck_of(&dev, false).is_clean());
}

/// Two files' extents that share part of a range, behind valid
/// checksums: the earlier claimant keeps the shared blocks; the later
/// keeps its blocks before them, and the file is cut where they end (a
/// hole in place of the rest would pass zeros off as its data). An
/// unwritten extent over another file's blocks goes alone: the hole
/// left reads as zeros, as it did.
#[test]
fn a_repair_cuts_a_partly_overlapping_extent_after_its_own_blocks() {
    let (dev, fs, _) = fresh_fs();
    let root = fs.root_ino();
    let a = fs.create(root, b"a", 0o644, 0, 0).unwrap().ino;
    let b = fs.create(root, b"b", 0o644, 0, 0).unwrap().ino;
    let c = fs.create(root, b"c", 0o644, 0, 0).unwrap().ino;
    fs.write(b, 0, &[2; 16 * 4096]).unwrap();
    fs.fsync(b, false).unwrap();
    fs.write(a, 0, &[1; 4 * 4096]).unwrap();
    fs.fsync(a, false).unwrap();
    // c: a written block, 4 unwritten ones, a written block.
    fs.write(c, 0, &[3; 4096]).unwrap();
    fs.fsync(c, false).unwrap();
    let keep = Falloc::Allocate { keep_size: false };
    fs.fallocate(c, keep, 4096, 4 * 4096).unwrap();
    fs.fsync(c, false).unwrap();
    fs.write(c, 5 * 4096, &[3; 4096]).unwrap();
    fs.fsync(c, false).unwrap();
    fs.unmount().unwrap();
    let mut raw = Raw::of(dev.image());
    let [(0, a_first, 4)] = inline_extents(&raw, a)[..] else {
        panic!("{:?}", inline_extents(&raw, a));
    };
    let [(0, b_first, 16)] = inline_extents(&raw, b)[..] else {
        panic!("{:?}", inline_extents(&raw, b));
    };
    // b's blocks, then a's: b's extent, and its size, 2 blocks longer.
    assert_eq!(b_first + 16, a_first);
    raw.edit(b, |d| d.size = 18 * 4096);
    raw.edit_entries(b, |e| e[0].1[8..12].copy_from_slice(&18u32.to_le_bytes()));
    // c's unwritten extent over a's blocks.
    let (lblk, _, n) = inline_extents(&raw, c)[1];
    assert_eq!((lblk, n), (1, 4), "{:?}", inline_extents(&raw, c));
    repoint(&mut raw, c, 1, a_first);
    let (r, dev) = repaired(&raw.bytes);
    assert_names(
        &r,
        &format!(
            "inode {b}: extent at file block 0 (18 blocks at {b_first}): block {a_first} \
             is claimed by inode {a}; its 16 blocks before block {a_first} kept, the rest \
             cut out, the file cut at byte 65536"
        ),
        true,
    );
    assert_names(
        &r,
        &format!(
            "inode {c}: extent at file block 1 (4 blocks at {a_first}): block {a_first} is \
             claimed by inode {a}; an unwritten extent: dropped (its range reads as zeros, \
             as it did)"
        ),
        true,
    );
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    for (f, size, byte) in [(a, 4 * 4096, 1), (b, 16 * 4096, 2)] {
        assert_eq!(fs.getattr(f).unwrap().size, size);
        let mut buf = vec![0; size as usize];
        assert_eq!(fs.read(f, 0, &mut buf).unwrap(), size as usize);
        assert!(buf.iter().all(|&x| x == byte), "inode {f}");
    }
    let mut buf = vec![0; 6 * 4096];
    assert_eq!(fs.read(c, 0, &mut buf).unwrap(), 6 * 4096);
    for (i, data) in buf.chunks(4096).enumerate() {
        let want = if i == 0 || i == 5 { 3 } else { 0 };
        assert!(data.iter().all(|&x| x == want), "c block {i}");
    }
    fs.unmount().unwrap();
    assert!(fsck_of(&dev, false).is_clean());
}

/// An extent in a tree leaf whose checksum holds, pointed at a block
/// of the file's own earlier extent: a repair cuts the map there and
/// writes what is before it (more than fits inline) as a new tree.
#[test]
fn a_repair_cuts_a_tree_map_at_an_extent_over_its_own_blocks() {
    use foliofs::format::btree_node::{Node, TreeType};
    use foliofs::format::inode::ForkFormat;
    let img = build();
    let root = inode(&img, img.big).fork_root;
    let mut bytes = img.bytes.clone();
    let node_at = |bytes: &[u8], blk: u64| {
        let at = (blk * 4096) as usize;
        Node::decode(&bytes[at..at + 4096], blk, img.big, TreeType::Extents).unwrap()
    };
    let top = node_at(&bytes, root);
    let leaf = u64::from_le_bytes(top.entries[1].1[..8].try_into().unwrap());
    let mut node = node_at(&bytes, leaf);
    let first = node_at(
        &bytes,
        u64::from_le_bytes(top.entries[0].1[..8].try_into().unwrap()),
    );
    // The second leaf's third extent over the first extent's block.
    let (lblk, v) = &mut node.entries[2];
    let lblk = *lblk;
    v[..8].copy_from_slice(&first.entries[0].1[..8]);
    let at = (leaf * 4096) as usize;
    node.encode(
        &mut bytes[at..at + 4096],
        leaf,
        img.uuid,
        img.big,
        TreeType::Extents,
    );
    foliofs::format::header::stamp(&mut bytes[at..at + 4096]);
    let (r, dev) = repaired(&bytes);
    let cut = lblk * 4096;
    assert!(
        r.problems.iter().any(|p| p.repaired
            && p.message
                .starts_with(&format!("inode {}: extent at file block {lblk} ", img.big))
            && p.message.ends_with(&format!("the file cut at byte {cut}"))),
        "{:?}",
        r.problems
    );
    assert_eq!(
        Raw::of(dev.image()).inode(img.big).fork,
        ForkFormat::ExtentTree
    );
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    assert_eq!(fs.getattr(img.big).unwrap().size, cut);
    let mut buf = vec![0; cut as usize];
    assert_eq!(fs.read(img.big, 0, &mut buf).unwrap(), cut as usize);
    for (blk, data) in buf.chunks(4096).enumerate() {
        let want = if blk % 2 == 0 { blk as u8 / 2 + 1 } else { 0 };
        assert!(data.iter().all(|&b| b == want), "block {blk}");
    }
    fs.unmount().unwrap();
}

/// A directory's slot that does not decode, though directories below
/// it name it as their parent: a repair makes it anew, empty, under the
/// name its parent's entry still gives it; the directories below it go
/// back into it as `#<ino>` (their records name it), its files to
/// /lost+found.
#[test]
fn a_repair_makes_a_directory_anew_from_its_subdirectories_records() {
    let (dev, fs, _) = fresh_fs();
    let root = fs.root_ino();
    let top = fs.mkdir(root, b"top", 0o755, 0, 0).unwrap().ino;
    let mid = fs.mkdir(top, b"mid", 0o755, 0, 0).unwrap().ino;
    let leaf = fs.mkdir(mid, b"leaf", 0o755, 0, 0).unwrap().ino;
    let deep = fs.create(leaf, b"deep", 0o644, 0, 0).unwrap().ino;
    fs.write(deep, 0, &[5; 5000]).unwrap();
    let file = fs.create(mid, b"file", 0o644, 0, 0).unwrap().ino;
    fs.write(file, 0, &[6; 3000]).unwrap();
    fs.unmount().unwrap();
    let mut raw = Raw::of(dev.image());
    let (blk, off) = raw.geo.inode_loc(mid);
    raw.bytes[(blk * 4096) as usize + off] ^= 3;
    let (r, dev) = repaired(&raw.bytes);
    assert_names(
        &r,
        &format!(
            "inode {mid}: bad magic; cleared, and made anew, an empty directory \
             (directories name it as their parent, or leaves of its tree name it as their \
             owner)"
        ),
        true,
    );
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    assert_eq!(fs.lookup(top, b"mid").unwrap().ino, mid);
    let back = fs.lookup(mid, format!("#{leaf}").as_bytes()).unwrap().ino;
    assert_eq!(back, leaf);
    assert_eq!(fs.lookup(leaf, b"deep").unwrap().ino, deep);
    let mut buf = vec![0; 5000];
    assert_eq!(fs.read(deep, 0, &mut buf).unwrap(), 5000);
    assert!(buf.iter().all(|&b| b == 5));
    let lf = fs.lookup(root, b"lost+found").unwrap().ino;
    assert_eq!(
        fs.lookup(lf, format!("#{file}").as_bytes()).unwrap().ino,
        file
    );
    assert_eq!(fs.getattr(mid).unwrap().nlink, 3);
    fs.unmount().unwrap();
    assert!(fsck_of(&dev, false).is_clean());
}

/// mkfs writes the superblock copies and nothing rewrites them, so a
/// repair takes from a copy only what cannot change after mkfs (the
/// geometry, UUID, label, root); the journal position and clean flag are
/// set anew, the version raised as a read-write mount raises it, and the
/// counters live in the AG headers, which the check counts from the
/// trees. After a life of mounts and journal wraps, with a version 1
/// copy, a repair from it leaves the image as the primary described it.
#[test]
fn a_repair_from_a_superblock_copy_takes_only_what_mkfs_fixed() {
    use foliofs::format::superblock::Superblock;
    let img = build();
    let mut bytes = img.bytes.clone();
    let primary = foliofs::meta::read_superblock(&MemDevice::from_image(bytes.clone())).unwrap();
    let copy_at = primary.ag_blocks;
    for blk in [copy_at, copy_at + 1] {
        let at = (blk * 4096) as usize;
        let mut copy = Superblock::decode(&bytes[at..at + 4096], blk).unwrap();
        let fixed = |s: &Superblock| {
            let mut s = s.clone();
            (s.flags, s.tail_pos, s.tail_seq, s.generation) = (0, 0, 0, 0);
            s
        };
        assert_eq!(fixed(&copy), fixed(&primary), "the copy at {blk}");
        // As an older mkfs wrote it.
        copy.version = 1;
        copy.encode(&mut bytes[at..at + 4096], blk);
    }
    bytes[60] ^= 1;
    bytes[4096 + 60] ^= 1;
    let (_, dev) = repaired(&bytes);
    let sb = foliofs::meta::read_superblock(&*dev).unwrap();
    assert_eq!(sb.version, foliofs::format::FORMAT_VERSION);
    assert_eq!(
        (sb.uuid, sb.total_blocks, sb.ag_count, sb.root_ino, sb.label),
        (
            primary.uuid,
            primary.total_blocks,
            primary.ag_count,
            primary.root_ino,
            primary.label
        )
    );
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let mut buf = vec![0; 4096];
    fs.read(img.big, 99 * 8192, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 100));
    assert_eq!(names_in(&fs, img.dir).len(), 300);
    fs.create(fs.root_ino(), b"after", 0o644, 0, 0).unwrap();
    fs.unmount().unwrap();
    assert!(fsck_of(&dev, false).is_clean());
}

/// A directory held as a tree whose slot does not decode: its tree's
/// leaves still name it as their owner, so a repair makes it anew under
/// its name and puts back every file its leaves name, by name.
#[test]
fn a_repair_makes_a_tree_directory_anew_from_its_leaves() {
    let img = build();
    let (blk, off) = img.geo.inode_loc(img.dir);
    let (r, fs) = repair_of(&img, |b| b[(blk * 4096) as usize + off] ^= 3);
    assert!(
        r.problems.iter().any(|p| p.repaired
            && p.message.starts_with(&format!(
                "inode {}: bad magic; cleared, and made anew",
                img.dir
            ))
            && p.message
                .contains("; 300 entries found in leaves of its old tree")),
        "{:?}",
        r.problems
    );
    assert_eq!(fs.lookup(fs.root_ino(), b"dir").unwrap().ino, img.dir);
    let mut names = names_in(&fs, img.dir);
    names.sort();
    let mut want: Vec<Vec<u8>> = (0..300)
        .map(|i| format!("entry-{i}").into_bytes())
        .collect();
    want.sort();
    assert_eq!(names, want);
    if let Ok(lf) = fs.lookup(fs.root_ino(), b"lost+found") {
        assert!(names_in(&fs, lf.ino).is_empty());
    }
    fs.unmount().unwrap();
}

/// A field mkfs fixed, changed in both slots behind valid checksums
/// (the root inode made a file's): the two copies in AG 1 agree with
/// each other and not with the slots, so a repair takes the fixed fields
/// from them, and the image mounts with its own root.
#[test]
fn a_repair_takes_fields_mkfs_fixed_from_copies_that_agree() {
    let img = build();
    let mut bytes = img.bytes.clone();
    edit_superblocks(&mut bytes, |_, sb| sb.root_ino = img.big);
    let dev = Arc::new(MemDevice::from_image(bytes.clone()));
    let message = format!(
        "fields fixed at mkfs differ from the copies at blocks 4096 and 4097 (root_ino {}, \
         the copies 1)",
        img.big
    );
    assert_names(&fsck_of(&dev, false), &message, false);
    let (r, dev) = repaired(&bytes);
    assert_names(
        &r,
        &format!("{message}; taken from the copies, both slots rewritten"),
        true,
    );
    assert_eq!(foliofs::meta::read_superblock(&*dev).unwrap().root_ino, 1);
    let fs = Fs::mount(dev, MountOptions::default()).unwrap();
    assert_eq!(names_in(&fs, img.dir).len(), 300);
    fs.unmount().unwrap();
}

/// A free slot holding garbage, whose number was a directory's before it
/// was removed: the leaves of its old tree still verify, but a free slot
/// is only zeroed, never made a directory again.
#[test]
fn a_repair_does_not_bring_back_a_removed_directory_from_its_old_leaves() {
    let img = build();
    let dev = Arc::new(MemDevice::from_image(img.bytes.clone()));
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    for i in 0..300 {
        fs.unlink(img.dir, format!("entry-{i}").as_bytes()).unwrap();
    }
    fs.rmdir(fs.root_ino(), b"dir").unwrap();
    fs.unmount().unwrap();
    let mut raw = Raw::of(dev.image());
    let (blk, off) = raw.geo.inode_loc(img.dir);
    raw.bytes[(blk * 4096) as usize + off + 300] = 9;
    let (r, dev) = repaired(&raw.bytes);
    assert_names(
        &r,
        &format!("inode {}: checksum mismatch; cleared", img.dir),
        true,
    );
    let fs = Fs::mount(dev, MountOptions::default()).unwrap();
    assert!(fs.lookup(fs.root_ino(), b"lost+found").is_err());
    assert!(matches!(fs.getattr(img.dir), Err(Error::NotFound)));
    fs.unmount().unwrap();
}
