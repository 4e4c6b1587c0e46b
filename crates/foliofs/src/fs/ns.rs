//! Namespace operations.

use super::acl;
use super::dir::Dirent;
use super::dir::{check_name, cookie_of, COOKIE_DOT, COOKIE_DOTDOT, LOST_FOUND};
use super::inode::{Fork, Inode};
use super::types::*;
use super::xattr::XATTR_CREATE;
use crate::error::{Error, Result};
use crate::format::inode::{FLAG_ORPHAN, LITERAL_SIZE};
use crate::fs::ctx::Ctx;
use crate::fs::state::Inner;

const LINK_MAX: u32 = 65000;

impl Inner {
    pub fn getattr(&mut self, ino: u64) -> Result<Attr> {
        let bs = self.meta.geo.block_size;
        let (ip, _) = self.with(ino)?;
        let reserved = ip.delalloc;
        let t = |t: crate::format::inode::Timespec| (t.sec, t.nsec);
        Ok(Attr {
            ino,
            size: ip.size,
            allocated: (ip.d.nblocks + reserved) * bs,
            kind: ip.kind(),
            perm: ip.d.mode & 0o7777,
            nlink: ip.d.nlink,
            uid: ip.d.uid,
            gid: ip.d.gid,
            rdev: ip.d.rdev,
            atime: t(ip.d.atime),
            mtime: t(ip.d.mtime),
            ctime: t(ip.d.ctime),
            crtime: t(ip.d.crtime),
            blksize: bs as u32,
            generation: ip.d.generation,
            flags: ip.user_flags(),
        })
    }

    fn dir_of(&mut self, ino: u64) -> Result<()> {
        let (ip, _) = self.with(ino)?;
        if !ip.is_dir() {
            return Err(Error::NotDir);
        }
        Ok(())
    }

    pub fn lookup(&mut self, parent: u64, name: &[u8]) -> Result<Attr> {
        self.dir_of(parent)?;
        if name == b"." {
            return self.getattr(parent);
        }
        if name == b".." {
            let p = self.with(parent)?.0.d.parent;
            return self.getattr(p);
        }
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        let (ip, mut cx) = self.with(parent)?;
        let d = ip.dir_lookup(&mut cx, name)?.ok_or(Error::NotFound)?;
        match self.getattr(d.ino) {
            Err(Error::NotFound) => Err(Error::corrupted(
                "directory entry",
                parent,
                format!(
                    "directory {parent}: entry {:?} points to free inode {}",
                    String::from_utf8_lossy(name),
                    d.ino
                ),
            )),
            r => r,
        }
    }

    pub fn setattr(&mut self, ino: u64, set: &SetAttr) -> Result<Attr> {
        // chattr +a lets appends move the times: "now", or the times a
        // cache in front of the engine owns and hands over (`ctime` set,
        // no atime: the FUSE kernel's flush after cached writes); not
        // times a caller picks (utimes), as Linux's notify_change has it.
        let owner = set.mode.is_some() || set.uid.is_some() || set.gid.is_some();
        let at = |t: Option<TimeSet>| matches!(t, Some(TimeSet::At(_)));
        let picked = at(set.atime) || (at(set.mtime) && set.ctime.is_none());
        let append_ok = !(owner || picked || set.size.is_some() || set.kill_priv);
        self.check_unfrozen(ino, append_ok)?;
        if let Some(size) = set.size {
            let (ip, _) = self.with(ino)?;
            if ip.is_dir() {
                return Err(Error::IsDir);
            }
            self.set_size(ino, size)?;
        }
        let (ip, mut cx) = self.with(ino)?;
        let ts = |t: TimeSet| match t {
            TimeSet::Now => crate::fs::clock::now(),
            TimeSet::At(t) => t,
        };
        if let Some(m) = set.mode {
            ip.d.mode = (ip.d.mode & S_IFMT) | (m & 0o7777);
        }
        if let Some(u) = set.uid {
            ip.d.uid = u;
        }
        if let Some(g) = set.gid {
            ip.d.gid = g;
        }
        if let Some(t) = set.atime {
            ip.d.atime = ts(t);
        }
        if let Some(t) = set.mtime {
            ip.d.mtime = ts(t);
        }
        match set.ctime {
            Some(t) => ip.d.ctime = ts(t),
            None => ip.touch_ctime(),
        }
        ip.store(&mut cx)?;
        if let Some(m) = set.mode {
            self.acl_chmod(ino, m)?;
        } else if set.kill_priv {
            self.kill_priv(ino, |_| true)?;
        }
        self.getattr(ino)
    }

    /// Take from a file what a write, truncate or chown takes on Linux:
    /// set-user-ID, set-group-ID when group-executable, and the file
    /// capability (`security.capability`); from any file but a directory,
    /// as chown takes them from a FIFO or a device node too. With nothing
    /// to take, nothing changes. True when the mode changed. Set-group-ID
    /// also goes when the caller is not in the file's group (`in_group`,
    /// asked only then), as Linux's setattr_should_drop_sgid has it.
    pub fn kill_priv(&mut self, ino: u64, in_group: impl FnOnce(u32) -> bool) -> Result<bool> {
        let (ip, mut cx) = self.with(ino)?;
        if matches!(ip.kind(), FileType::Dir | FileType::Symlink) {
            return Ok(false);
        }
        let m = ip.d.mode;
        let mut new = m & !S_ISUID;
        if m & S_ISGID != 0 && (m & 0o010 != 0 || !in_group(ip.d.gid)) {
            new &= !S_ISGID;
        }
        if new != m {
            ip.d.mode = new;
            ip.touch_ctime();
            ip.store(&mut cx)?;
        }
        match self.removexattr(ino, b"security.capability") {
            Ok(()) | Err(Error::NoAttr) => Ok(new != m),
            Err(e) => Err(e),
        }
    }

    /// Create a node. Its mode is `perm` less `umask`, unless the parent
    /// has a default ACL: then the ACL, intersected with `perm`, decides
    /// (no umask), the node gets it as its access ACL and a directory also
    /// as its default ACL. Under a set-group-ID directory the node takes
    /// the directory's group, and a directory the set-group-ID bit too.
    #[allow(clippy::too_many_arguments)]
    pub fn create(&mut self, parent: u64, name: &[u8], node: &NewNode) -> Result<Attr> {
        let (kind, target) = (node.kind, node.target);
        check_name(name)?;
        self.dir_of(parent)?;
        self.check_unfrozen(parent, true)?;
        if let Some(t) = target {
            if t.is_empty() || t.len() > SYMLINK_MAX {
                return Err(if t.is_empty() {
                    Error::NotFound
                } else {
                    Error::NameTooLong
                });
            }
        }
        {
            let (pp, mut cx) = self.with(parent)?;
            if pp.d.nlink == 0 {
                return Err(Error::NotFound);
            }
            if pp.dir_lookup(&mut cx, name)?.is_some() {
                return Err(Error::Exists);
            }
            if kind == FileType::Dir && pp.d.nlink >= LINK_MAX {
                return Err(Error::TooManyLinks);
            }
        }
        let ino = self.new_node(parent, node)?;
        self.enter(parent, name, ino, kind)?;
        self.getattr(ino)
    }

    /// An unnamed regular file as `create` would make it in `parent`
    /// (O_TMPFILE): no links, on the orphan list, so it goes with its
    /// last close, or with the next mount after a crash, unless `link`
    /// gives it a name first.
    pub fn tmpfile(
        &mut self,
        parent: u64,
        perm: u32,
        umask: u32,
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        self.dir_of(parent)?;
        self.check_unfrozen(parent, true)?;
        if self.with(parent)?.0.d.nlink == 0 {
            return Err(Error::NotFound);
        }
        let node = NewNode {
            umask,
            ..NewNode::new(FileType::File, perm, uid, gid)
        };
        let ino = self.new_node(parent, &node)?;
        {
            let (ip, mut cx) = self.with(ino)?;
            ip.d.nlink = 0;
            ip.linkable = true;
            ip.store(&mut cx)?;
        }
        self.orphan_add(ino)?;
        self.getattr(ino)
    }

    /// The inode of a new node under `parent` (see `create`), not yet
    /// named.
    fn new_node(&mut self, parent: u64, node: &NewNode) -> Result<u64> {
        let NewNode {
            kind,
            umask,
            uid,
            rdev,
            target,
            ..
        } = *node;
        let (mut perm, mut gid) = (node.perm & 0o7777, node.gid);
        let inherited = {
            let (pp, _) = self.with(parent)?;
            if pp.d.mode & S_ISGID != 0 {
                gid = pp.d.gid;
                if kind == FileType::Dir {
                    perm |= S_ISGID;
                }
            }
            // chattr's sync, no-atime and no-dump pass to what is made
            // inside, dirsync to new directories (as in XFS and ext4).
            let pass = match kind {
                FileType::Dir => FL_INHERITED | FL_DIRSYNC,
                FileType::File => FL_INHERITED,
                _ => FL_NODUMP | FL_NOATIME,
            };
            pp.user_flags() & pass
        };
        let mut acls = Vec::new();
        match self.default_acl(parent)? {
            Some(default) if kind != FileType::Symlink => {
                let mut access = default.clone();
                perm = access.create_masq(perm);
                if !access.is_minimal() {
                    acls.push((acl::ACCESS, access.encode()));
                }
                if kind == FileType::Dir {
                    acls.push((acl::DEFAULT, default.encode()));
                }
            }
            _ => perm &= !umask,
        }
        // New directories spread across AGs; files stay with their parent.
        let ag = if kind == FileType::Dir {
            self.alloc.next_dir_ag(self.meta.geo.ag_count)
        } else {
            self.meta.geo.inode_ag(parent)
        };
        let ino = self.new_inode(ag, kind.mode_bits() | (perm & 0o7777), uid, gid)?;
        {
            let (ip, mut cx) = self.with(ino)?;
            ip.d.rdev = rdev;
            ip.set_user_flags(inherited);
            if kind == FileType::Dir {
                ip.d.nlink = 2;
                ip.d.parent = parent;
            }
            if let Some(t) = target {
                if t.len() <= LITERAL_SIZE {
                    ip.fork = Fork::Symlink(t.to_vec());
                    ip.size = t.len() as u64;
                    ip.d.size = ip.size;
                }
            }
            ip.store(&mut cx)?;
        }
        if let Some(t) = target.filter(|t| t.len() > LITERAL_SIZE) {
            self.write(ino, 0, t)?;
        }
        for (name, v) in acls {
            self.xattr_put(ino, name, &v, XATTR_CREATE)?;
        }
        Ok(ino)
    }

    pub fn readlink(&mut self, ino: u64) -> Result<Vec<u8>> {
        let (ip, _) = self.with(ino)?;
        if ip.kind() != FileType::Symlink {
            return Err(Error::Invalid("not a symbolic link".into()));
        }
        if let Fork::Symlink(t) = &ip.fork {
            return Ok(t.clone());
        }
        let mut buf = vec![0; ip.size as usize];
        let n = self.read(ino, 0, &mut buf)?;
        buf.truncate(n);
        Ok(buf)
    }

    pub fn link(&mut self, ino: u64, parent: u64, name: &[u8]) -> Result<Attr> {
        check_name(name)?;
        self.dir_of(parent)?;
        self.check_unfrozen(ino, false)?;
        self.check_unfrozen(parent, true)?;
        let kind = {
            let (ip, _) = self.with(ino)?;
            if ip.is_dir() {
                return Err(Error::Invalid("hard link to a directory".into()));
            }
            if ip.d.nlink >= LINK_MAX {
                return Err(Error::TooManyLinks);
            }
            if ip.d.nlink == 0 && !ip.linkable {
                return Err(Error::NotFound);
            }
            ip.kind()
        };
        if self.with(parent)?.0.d.nlink == 0 {
            return Err(Error::NotFound);
        }
        self.enter(parent, name, ino, kind)?;
        if self.with(ino)?.0.d.nlink == 0 {
            // A tmpfile's first name: off the orphan list, once only.
            self.orphan_remove(ino)?;
            let (ip, _) = self.with(ino)?;
            ip.linkable = false;
            ip.d.flags &= !FLAG_ORPHAN;
        }
        let (ip, mut cx) = self.with(ino)?;
        ip.d.nlink += 1;
        ip.touch_ctime();
        ip.store(&mut cx)?;
        self.getattr(ino)
    }

    /// Name `ino`, which no directory entry names, `#<ino>` in
    /// /lost+found, made (root's, mode 0700, as e2fsck makes it) if
    /// missing: fsck's repair of a file or directory that lost its name.
    /// A file's link count becomes 1; a directory keeps its own and takes
    /// lost+found as its parent.
    pub fn reconnect(&mut self, ino: u64) -> Result<Vec<u8>> {
        let root = self.meta.sb.root_ino;
        let lf = match self.lookup(root, LOST_FOUND) {
            Ok(a) if a.kind == FileType::Dir => a.ino,
            Ok(_) => return Err(Error::Invalid("/lost+found is not a directory".into())),
            Err(Error::NotFound) => {
                self.create(root, LOST_FOUND, &NewNode::new(FileType::Dir, 0o700, 0, 0))?
                    .ino
            }
            Err(e) => return Err(e),
        };
        let name = format!("#{ino}").into_bytes();
        let kind = self.with(ino)?.0.kind();
        let is_dir = kind == FileType::Dir;
        if is_dir && self.with(lf)?.0.d.nlink >= LINK_MAX {
            return Err(Error::TooManyLinks);
        }
        self.enter(lf, &name, ino, kind)?;
        if !is_dir {
            self.with(ino)?.0.d.nlink = 1;
        }
        self.set_parent(ino, lf, is_dir)?;
        Ok(name)
    }

    /// Remove entry `name` of `dir`, which names `ino` (fsck's repair: an
    /// entry for a free inode, a directory's second name, the entry that
    /// closes a loop). Nothing else changes: fsck has set the link counts
    /// as they are without it.
    pub fn drop_entry(&mut self, dir: u64, name: &[u8], ino: u64) -> Result<()> {
        let de = self.entry(dir, name)?;
        if de.ino != ino {
            return Err(Error::Invalid(format!(
                "the entry names inode {}, not {ino}",
                de.ino
            )));
        }
        self.edit_entries(dir, |dp, cx| dp.dir_remove(cx, name).map(drop))
    }

    /// Give entry `name` of `dir` the type of the inode it names (fsck's
    /// repair; fsck has set the link counts and parents as the types
    /// will be).
    pub fn retype_entry(&mut self, dir: u64, name: &[u8]) -> Result<()> {
        let de = self.entry(dir, name)?;
        let kind = self.with(de.ino)?.0.kind();
        self.edit_entries(dir, |dp, cx| dp.dir_replace(cx, name, de.ino, kind))
    }

    /// Entry `name` of directory `dir`.
    fn entry(&mut self, dir: u64, name: &[u8]) -> Result<Dirent> {
        self.dir_of(dir)?;
        let (dp, mut cx) = self.with(dir)?;
        dp.dir_lookup(&mut cx, name)?.ok_or(Error::NotFound)
    }

    /// Change directory `dir`'s entries through `f`, and stamp its mtime.
    fn edit_entries(
        &mut self,
        dir: u64,
        f: impl FnOnce(&mut Inode, &mut Ctx) -> Result<()>,
    ) -> Result<()> {
        let (dp, mut cx) = self.with(dir)?;
        f(dp, &mut cx)?;
        dp.touch_mtime();
        dp.store(&mut cx)
    }

    /// Add entry `name` for `ino`, a `kind`, to directory `parent`, which
    /// gains a link for a subdirectory.
    fn enter(&mut self, parent: u64, name: &[u8], ino: u64, kind: FileType) -> Result<()> {
        self.edit_entries(parent, |pp, cx| {
            pp.dir_add(cx, name, ino, kind)?;
            if kind == FileType::Dir {
                pp.d.nlink += 1;
            }
            Ok(())
        })
    }

    /// Drop one link to `ino` (a directory loses both of its own). At zero
    /// links the inode is freed now, or if open or held it goes on the
    /// orphan list until its last close.
    fn drop_link(&mut self, ino: u64) -> Result<()> {
        let (ip, mut cx) = self.with(ino)?;
        if ip.is_dir() {
            ip.d.nlink = 0;
        } else {
            ip.d.nlink = ip.d.nlink.saturating_sub(1);
        }
        ip.touch_ctime();
        ip.store(&mut cx)?;
        if ip.d.nlink == 0 {
            let open = ip.open;
            if self.unused(ino, open) {
                self.destroy_inode(ino)?;
            } else {
                self.orphan_add(ino)?;
            }
        }
        Ok(())
    }

    pub fn unlink(&mut self, parent: u64, name: &[u8], rmdir: bool) -> Result<()> {
        self.dir_of(parent)?;
        if rmdir && (name == b"." || name == b"..") {
            return Err(Error::Invalid("cannot remove . or ..".into()));
        }
        let (pp, mut cx) = self.with(parent)?;
        let d = pp.dir_lookup(&mut cx, name)?.ok_or(Error::NotFound)?;
        self.check_unfrozen(parent, false)?;
        self.check_unfrozen(d.ino, false)?;
        {
            let (ip, mut cx) = self.with(d.ino)?;
            match (rmdir, ip.is_dir()) {
                (true, false) => return Err(Error::NotDir),
                (false, true) => return Err(Error::IsDir),
                (true, true) if !ip.dir_is_empty(&mut cx)? => return Err(Error::NotEmpty),
                _ => {}
            }
        }
        self.edit_entries(parent, |pp, cx| {
            pp.dir_remove(cx, name)?;
            if rmdir {
                pp.d.nlink -= 1;
            }
            Ok(())
        })?;
        self.drop_link(d.ino)
    }

    /// True if `dir` is `anc` or below it.
    fn is_below(&mut self, mut dir: u64, anc: u64) -> Result<bool> {
        let root = self.meta.sb.root_ino;
        for _ in 0..self.meta.geo.max_ino() {
            if dir == anc {
                return Ok(true);
            }
            if dir == root {
                return Ok(false);
            }
            dir = self.with(dir)?.0.d.parent;
        }
        Err(Error::corrupted(
            "inode",
            dir,
            "directory parent chain has a cycle",
        ))
    }

    /// rename(2). With `whiteout` (RENAME_WHITEOUT: the owner's uid and
    /// gid) the old name is then given a whiteout, a character device 0:0
    /// with no permissions, as `create` makes one, in the same
    /// transaction; not with RENAME_EXCHANGE.
    pub fn rename(
        &mut self,
        p: u64,
        name: &[u8],
        np: u64,
        nname: &[u8],
        flags: u32,
        whiteout: Option<(u32, u32)>,
    ) -> Result<()> {
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || flags == RENAME_NOREPLACE | RENAME_EXCHANGE
            || (whiteout.is_some() && flags & RENAME_EXCHANGE != 0)
        {
            return Err(Error::Invalid(format!("rename flags {flags:#x}")));
        }
        check_name(nname)?;
        self.dir_of(p)?;
        self.dir_of(np)?;
        let src = {
            let (pp, mut cx) = self.with(p)?;
            pp.dir_lookup(&mut cx, name)?.ok_or(Error::NotFound)?
        };
        let dst = {
            let (pp, mut cx) = self.with(np)?;
            pp.dir_lookup(&mut cx, nname)?
        };
        if let Some(d) = &dst {
            if flags & RENAME_NOREPLACE != 0 {
                return Err(Error::Exists);
            }
            if d.ino == src.ino {
                return Ok(());
            }
        } else if flags & RENAME_EXCHANGE != 0 {
            return Err(Error::NotFound);
        }
        // Both names move or go: neither they nor the directories they
        // leave may be frozen; a new name may go into an append-only one.
        self.check_unfrozen(p, false)?;
        self.check_unfrozen(np, dst.is_none())?;
        self.check_unfrozen(src.ino, false)?;
        if let Some(d) = &dst {
            self.check_unfrozen(d.ino, false)?;
        }
        let src_dir = src.kind == FileType::Dir;
        if src_dir && self.is_below(np, src.ino)? {
            return Err(Error::Invalid(
                "cannot move a directory below itself".into(),
            ));
        }
        if flags & RENAME_EXCHANGE != 0 {
            let d = dst.unwrap();
            let dst_dir = d.kind == FileType::Dir;
            if dst_dir && self.is_below(p, d.ino)? {
                return Err(Error::Invalid(
                    "cannot move a directory below itself".into(),
                ));
            }
            self.edit_entries(p, |pp, cx| pp.dir_replace(cx, name, d.ino, d.kind))?;
            self.edit_entries(np, |pp, cx| pp.dir_replace(cx, nname, src.ino, src.kind))?;
            if p != np && src_dir != dst_dir {
                let (into_np, into_p) = if src_dir { (1i64, -1i64) } else { (-1, 1) };
                self.adjust_nlink(np, into_np)?;
                self.adjust_nlink(p, into_p)?;
            }
            self.set_parent(src.ino, np, src_dir)?;
            self.set_parent(d.ino, p, dst_dir)?;
            return Ok(());
        }
        if let Some(d) = &dst {
            let (ip, mut cx) = self.with(d.ino)?;
            match (src_dir, ip.is_dir()) {
                (false, true) => return Err(Error::IsDir),
                (true, false) => return Err(Error::NotDir),
                (true, true) if !ip.dir_is_empty(&mut cx)? => return Err(Error::NotEmpty),
                _ => {}
            }
        }
        // The new name first: adding one is what may fail (a directory
        // that must grow, a full hash bucket), and it then fails before
        // anything changed.
        self.edit_entries(np, |pp, cx| match dst {
            Some(_) => pp.dir_replace(cx, nname, src.ino, src.kind),
            None => pp.dir_add(cx, nname, src.ino, src.kind),
        })?;
        self.edit_entries(p, |pp, cx| pp.dir_remove(cx, name).map(drop))?;
        if src_dir && p != np {
            self.adjust_nlink(p, -1)?;
            self.adjust_nlink(np, 1)?;
        }
        self.set_parent(src.ino, np, src_dir)?;
        if let Some(d) = dst {
            if d.kind == FileType::Dir {
                self.adjust_nlink(np, -1)?;
            }
            self.drop_link(d.ino)?;
        }
        if let Some((uid, gid)) = whiteout {
            self.create(p, name, &NewNode::new(FileType::CharDev, 0, uid, gid))?;
        }
        Ok(())
    }

    fn adjust_nlink(&mut self, ino: u64, by: i64) -> Result<()> {
        let (ip, mut cx) = self.with(ino)?;
        ip.d.nlink = (ip.d.nlink as i64 + by).max(0) as u32;
        ip.store(&mut cx)
    }

    fn set_parent(&mut self, ino: u64, parent: u64, is_dir: bool) -> Result<()> {
        let (ip, mut cx) = self.with(ino)?;
        if is_dir {
            ip.d.parent = parent;
        }
        ip.touch_ctime();
        ip.store(&mut cx)
    }

    pub fn readdir(&mut self, ino: u64, cookie: u64, max: usize) -> Result<Vec<DirEntry>> {
        self.dir_of(ino)?;
        let mut out = Vec::new();
        let parent = self.with(ino)?.0.d.parent;
        if cookie < COOKIE_DOT {
            out.push(DirEntry {
                ino,
                kind: FileType::Dir,
                name: b".".to_vec(),
                cookie: COOKIE_DOT,
            });
        }
        if cookie < COOKIE_DOTDOT {
            out.push(DirEntry {
                ino: parent,
                kind: FileType::Dir,
                name: b"..".to_vec(),
                cookie: COOKIE_DOTDOT,
            });
        }
        let (ip, mut cx) = self.with(ino)?;
        for d in ip.dir_list(&mut cx, cookie.max(COOKIE_DOTDOT), max)? {
            if out.len() >= max {
                break;
            }
            out.push(DirEntry {
                ino: d.ino,
                kind: d.kind,
                name: d.name,
                cookie: cookie_of(d.key),
            });
        }
        Ok(out)
    }

    pub fn statfs(&self) -> StatFs {
        let geo = &self.meta.geo;
        let data_blocks: u64 = (0..geo.ag_count)
            .map(|a| geo.ag_len(a) - geo.data_start_agbno(a))
            .sum();
        let pending: u64 = self
            .meta
            .freed_running
            .iter()
            .chain(&self.meta.freed_committed)
            .chain(&self.meta.freed_reusable)
            .map(|(_, l)| l)
            .sum();
        let free = self.alloc.free_blocks() + pending;
        let files_free: u64 = self.alloc.ags.iter().map(|a| a.lock().free_inodes).sum();
        StatFs {
            block_size: geo.block_size as u32,
            blocks: data_blocks,
            blocks_free: free.saturating_sub(self.alloc.reserved),
            blocks_avail: free.saturating_sub(
                self.alloc.reserved + self.alloc.meta_reserve + self.alloc.cache_floor,
            ),
            files: geo.max_ino(),
            files_free,
            name_max: NAME_MAX as u32,
        }
    }
}
