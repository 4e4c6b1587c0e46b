//! POSIX ACLs, stored as the xattrs `system.posix_acl_access` and
//! `system.posix_acl_default` in Linux's own encoding, so the FUSE kernel
//! can read and enforce them (FUSE_POSIX_ACL) and backup tools see what
//! they expect.
//!
//! The kernel checks access; the file system keeps the rest true, as the
//! kernel's posix_acl helpers do for ext4 and XFS:
//! - setting an access ACL sets the mode bits it implies (and an ACL that
//!   says no more than the mode is not stored, like posix_acl_equiv_mode);
//! - chmod rewrites the ACL's owner, mask (or group) and other entries
//!   (posix_acl_chmod);
//! - a new node under a directory with a default ACL takes it, intersected
//!   with the mode it was created with, and no umask (posix_acl_create);
//!   a new directory also inherits the default ACL itself.
//!
//! Encoding: u32 version (2), then entries of u16 tag, u16 perm, u32 id
//! (the id only for named users and groups), all little-endian, sorted by
//! tag and then id.

use crate::error::{Error, Result};

pub const ACCESS: &[u8] = b"system.posix_acl_access";
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
const UNDEFINED_ID: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    tag: u16,
    perm: u16,
    id: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

fn invalid(why: &str) -> Error {
    Error::Invalid(format!("POSIX ACL: {why}"))
}

impl Acl {
    /// Decode and validate (as posix_acl_valid does).
    pub fn decode(v: &[u8]) -> Result<Acl> {
        if v.len() < 4 || (v.len() - 4) % 8 != 0 {
            return Err(invalid("bad length"));
        }
        if u32::from_le_bytes(v[..4].try_into().unwrap()) != VERSION {
            return Err(invalid("unknown version"));
        }
        let entries: Vec<Entry> = v[4..]
            .chunks_exact(8)
            .map(|e| Entry {
                tag: u16::from_le_bytes([e[0], e[1]]),
                perm: u16::from_le_bytes([e[2], e[3]]),
                id: u32::from_le_bytes(e[4..8].try_into().unwrap()),
            })
            .collect();
        let count = |t: u16| entries.iter().filter(|e| e.tag == t).count();
        if count(USER_OBJ) != 1 || count(GROUP_OBJ) != 1 || count(OTHER) != 1 {
            return Err(invalid("needs one owner, one group and one other entry"));
        }
        let named = count(USER) + count(GROUP);
        if count(MASK) > 1 || (named > 0 && count(MASK) == 0) {
            return Err(invalid("named entries need exactly one mask entry"));
        }
        for w in entries.windows(2) {
            let (a, b) = (w[0], w[1]);
            let ordered = a.tag < b.tag || (a.tag == b.tag && a.id < b.id);
            if !ordered {
                return Err(invalid("entries out of order or repeated"));
            }
        }
        for e in &entries {
            if ![USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER].contains(&e.tag) {
                return Err(invalid("unknown entry tag"));
            }
            if e.perm & !7 != 0 {
                return Err(invalid("permission bits beyond rwx"));
            }
        }
        Ok(Acl { entries })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = VERSION.to_le_bytes().to_vec();
        for e in &self.entries {
            v.extend_from_slice(&e.tag.to_le_bytes());
            v.extend_from_slice(&e.perm.to_le_bytes());
            let id = if matches!(e.tag, USER | GROUP) {
                e.id
            } else {
                UNDEFINED_ID
            };
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    fn perm(&self, tag: u16) -> Option<u32> {
        self.entries
            .iter()
            .find(|e| e.tag == tag)
            .map(|e| e.perm as u32)
    }

    /// The rwx mode bits the ACL implies: the group bits are the mask's
    /// when there is one.
    pub fn mode(&self) -> u32 {
        let group = self.perm(MASK).or(self.perm(GROUP_OBJ)).unwrap_or(0);
        (self.perm(USER_OBJ).unwrap_or(0) << 6) | (group << 3) | self.perm(OTHER).unwrap_or(0)
    }

    /// Whether the mode bits say all the ACL says (owner, group, other only).
    pub fn is_minimal(&self) -> bool {
        self.entries.len() == 3
    }

    fn set(&mut self, tag: u16, perm: u32) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.tag == tag) {
            e.perm = (perm & 7) as u16;
        }
    }

    /// chmod: the owner, mask (or group) and other entries follow `mode`.
    pub fn chmod(&mut self, mode: u32) {
        self.set(USER_OBJ, mode >> 6);
        let group_tag = if self.perm(MASK).is_some() {
            MASK
        } else {
            GROUP_OBJ
        };
        self.set(group_tag, mode >> 3);
        self.set(OTHER, mode);
    }

    /// A default ACL applied to a new node created with `mode`: each of the
    /// owner, mask (or group) and other entries keeps only what `mode`
    /// grants, and the mode keeps only what they grant. Returns the new
    /// node's mode (bits above rwx unchanged).
    pub fn create_masq(&mut self, mode: u32) -> u32 {
        let group_tag = if self.perm(MASK).is_some() {
            MASK
        } else {
            GROUP_OBJ
        };
        let mut rwx = 0;
        for (tag, shift) in [(USER_OBJ, 6), (group_tag, 3), (OTHER, 0)] {
            let p = self.perm(tag).unwrap_or(0) & (mode >> shift) & 7;
            self.set(tag, p);
            rwx |= p << shift;
        }
        (mode & !0o777) | rwx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in entries {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    const U: u32 = UNDEFINED_ID;

    #[test]
    fn mode_and_equivalence() {
        let a = Acl::decode(&acl(&[(1, 7, U), (4, 5, U), (0x20, 1, U)])).unwrap();
        assert_eq!((a.mode(), a.is_minimal()), (0o751, true));
        let a = Acl::decode(&acl(&[
            (1, 6, U),
            (2, 4, 1000),
            (4, 4, U),
            (0x10, 6, U),
            (0x20, 0, U),
        ]))
        .unwrap();
        assert_eq!((a.mode(), a.is_minimal()), (0o660, false));
        assert_eq!(Acl::decode(&a.encode()).unwrap(), a);
    }

    #[test]
    fn malformed_acls_are_refused() {
        assert!(Acl::decode(&[1, 0, 0, 0]).is_err());
        assert!(Acl::decode(&acl(&[(0x99, 1, U)])).is_err());
        // Named user without a mask.
        assert!(Acl::decode(&acl(&[(1, 7, U), (2, 4, 5), (4, 5, U), (0x20, 1, U)])).is_err());
        // Out of order.
        assert!(Acl::decode(&acl(&[(4, 5, U), (1, 7, U), (0x20, 1, U)])).is_err());
        // Two named entries for one user.
        assert!(Acl::decode(&acl(&[
            (1, 7, U),
            (2, 4, 5),
            (2, 6, 5),
            (4, 5, U),
            (0x10, 7, U),
            (0x20, 1, U)
        ]))
        .is_err());
    }

    /// rwx owner, rwx for user 1000, r-x group and other, rwx mask.
    fn named_user_1000() -> Acl {
        Acl::decode(&acl(&[
            (1, 7, U),
            (2, 7, 1000),
            (4, 5, U),
            (0x10, 7, U),
            (0x20, 5, U),
        ]))
        .unwrap()
    }

    #[test]
    fn chmod_moves_the_mask_not_the_group() {
        let mut a = named_user_1000();
        a.chmod(0o640);
        assert_eq!(a.mode(), 0o640);
        assert_eq!(a.perm(GROUP_OBJ), Some(5), "the group entry itself stays");
        assert_eq!(a.perm(MASK), Some(4));
    }

    #[test]
    fn inheritance_intersects_with_the_create_mode() {
        let mut d = named_user_1000();
        // open(O_CREAT, 0666): no execute anywhere, the mask loses it.
        assert_eq!(d.create_masq(0o100666), 0o100664);
        assert_eq!(d.perm(MASK), Some(6));
        assert_eq!(d.perm(USER), Some(7), "named entries are kept, masked");
    }
}
