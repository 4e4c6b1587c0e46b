/* The C ABI from C: include/foliofs.h against libfoliofs.a, so that the
 * header and the library agree (struct layouts, signatures, constants).
 * scripts/test.sh builds and runs it: abi IMAGE. Exit 0 when every check
 * holds; otherwise the failed check and the library's message. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include "foliofs.h"

#define CHECK(c)                                                                      \
    do {                                                                              \
        if (!(c)) {                                                                   \
            fprintf(stderr, "abi.c:%d: %s failed (%s)\n", __LINE__, #c,               \
                    foliofs_last_error());                                            \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

struct listing {
    int entries, dirs, saw_file;
};

static int count(void *ctx, const char *name, uint64_t ino, uint32_t type) {
    struct listing *l = ctx;
    l->entries++;
    l->dirs += type == DT_DIR;
    l->saw_file |= strcmp(name, "log") == 0 && type == DT_REG && ino != 0;
    return 0;
}

static int stop_at_two(void *ctx, const char *name, uint64_t ino, uint32_t type) {
    return ++*(int *)ctx == 2;
}

struct appender {
    foliofs *fs;
    int64_t fh;
    char tag;
};

/* 200 records of 100 bytes, each one byte repeated. */
static void *append(void *arg) {
    struct appender *a = arg;
    char rec[100];
    memset(rec, a->tag, sizeof rec);
    for (int i = 0; i < 200; i++)
        if (foliofs_pwrite(a->fs, a->fh, rec, sizeof rec, 0) != sizeof rec)
            return (void *)1;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: abi IMAGE\n");
        return 2;
    }
    CHECK(foliofs_mkfs(argv[1], 64 << 20, 1) == 0);
    foliofs *fs = foliofs_mount(argv[1], NULL);
    CHECK(fs != NULL);
    CHECK(foliofs_mkdir(fs, "d", 0755) == 0);

    /* O_APPEND from two threads: 400 whole records, none overwritten. */
    int64_t fh = foliofs_open(fs, "d/log", O_CREAT | O_RDWR | O_APPEND, 0644);
    CHECK(fh >= 0);
    pthread_t t[2];
    struct appender a[2] = {{fs, fh, 'a'}, {fs, fh, 'b'}};
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&t[i], NULL, append, &a[i]) == 0);
    for (int i = 0; i < 2; i++) {
        void *r;
        CHECK(pthread_join(t[i], &r) == 0 && r == NULL);
    }
    static char back[40000];
    CHECK(foliofs_pread(fs, fh, back, sizeof back, 0) == 40000);
    for (int r = 0; r < 400; r++)
        for (int i = 1; i < 100; i++)
            CHECK(back[r * 100 + i] == back[r * 100]);
    CHECK(foliofs_fsync(fs, fh, 0) == 0);
    struct foliofs_stat st;

    /* O_APPEND with O_DIRECT: whole blocks at a size of whole blocks. */
    int64_t dh = foliofs_open(fs, "d/direct", O_CREAT | O_RDWR | O_APPEND | O_DIRECT, 0644);
    CHECK(dh >= 0);
    void *blk;
    CHECK(posix_memalign(&blk, 4096, 8192) == 0);
    memset(blk, 'd', 8192);
    CHECK(foliofs_pwrite(fs, dh, blk, 8192, 12345) == 8192);
    CHECK(foliofs_pwrite(fs, dh, blk, 4096, 0) == 4096);
    CHECK(foliofs_fstat(fs, dh, &st) == 0 && st.size == 12288);
    CHECK(foliofs_close(fs, dh) == 0);
    CHECK(foliofs_pwrite(fs, fh, "x", 1, 0) == 1);
    dh = foliofs_open(fs, "d/log", O_RDWR | O_APPEND | O_DIRECT, 0);
    CHECK(foliofs_pwrite(fs, dh, blk, 4096, 0) == -EINVAL);
    CHECK(foliofs_close(fs, dh) == 0);
    CHECK(foliofs_ftruncate(fs, fh, 40000) == 0);
    free(blk);

    /* fallocate: past EOF with KEEP_SIZE, then a hole punched in the data. */
    CHECK(foliofs_fallocate(fs, fh, FALLOC_FL_KEEP_SIZE, 0, 1 << 20) == 0);
    CHECK(foliofs_fstat(fs, fh, &st) == 0);
    CHECK(st.size == 40000 && st.allocated >= 1 << 20);
    uint64_t before = st.allocated;
    CHECK(foliofs_fallocate(fs, fh, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 8192, 8192) ==
          0);
    CHECK(foliofs_fstat(fs, fh, &st) == 0);
    CHECK(st.size == 40000 && st.allocated == before - 8192);
    CHECK(foliofs_pread(fs, fh, back, 8192, 8192) == 8192);
    for (int i = 0; i < 8192; i++)
        CHECK(back[i] == 0);
    CHECK(foliofs_fallocate(fs, fh, FALLOC_FL_PUNCH_HOLE, 0, 4096) == -EINVAL);
    CHECK(foliofs_fallocate(fs, fh, FALLOC_FL_COLLAPSE_RANGE, 0, 4096) == -EOPNOTSUPP);

    /* Listing: ".", "..", "log", "direct", "sub". */
    CHECK(foliofs_mkdir(fs, "d/sub", 0700) == 0);
    struct listing l = {0};
    CHECK(foliofs_readdir(fs, "d", count, &l) == 5);
    CHECK(l.entries == 5 && l.dirs == 3 && l.saw_file);
    int seen = 0;
    CHECK(foliofs_readdir(fs, "d", stop_at_two, &seen) == 2 && seen == 2);
    CHECK(foliofs_readdir(fs, "d/log", count, &l) == -ENOTDIR);
    CHECK(foliofs_readdir(fs, "nowhere", count, &l) == -ENOENT);

    /* Links. */
    CHECK(foliofs_symlink(fs, "d/log", "ln") == 0);
    char target[64];
    CHECK(foliofs_readlink(fs, "ln", target, sizeof target) == 5);
    CHECK(memcmp(target, "d/log", 5) == 0);
    CHECK(foliofs_readlink(fs, "ln", target, 2) == 2);
    CHECK(foliofs_readlink(fs, "d/log", target, sizeof target) == -EINVAL);
    CHECK(foliofs_open(fs, "ln", O_RDONLY, 0) == -ELOOP);
    CHECK(foliofs_link(fs, "d/log", "hard") == 0);
    CHECK(foliofs_stat(fs, "hard", &st) == 0);
    CHECK(st.nlink == 2 && S_ISREG(st.mode) && st.size == 40000);

    /* Attributes: mode, owner (set-user-ID taken), times. */
    CHECK(foliofs_chmod(fs, "hard", 04755) == 0);
    CHECK(foliofs_stat(fs, "hard", &st) == 0 && (st.mode & 07777) == 04755);
    CHECK(foliofs_chown(fs, "hard", 1234, (uint32_t)-1) == 0);
    CHECK(foliofs_stat(fs, "hard", &st) == 0);
    CHECK(st.uid == 1234 && (st.mode & 07777) == 0755);
    struct timespec ts[2] = {{1000, 5}, {0, UTIME_OMIT}};
    int64_t mtime = st.mtime.sec;
    CHECK(foliofs_utimens(fs, "hard", ts) == 0);
    CHECK(foliofs_stat(fs, "hard", &st) == 0);
    CHECK(st.atime.sec == 1000 && st.atime.nsec == 5 && st.mtime.sec == mtime);
    CHECK(st.btime.sec > 0 && st.ctime.sec >= st.btime.sec);
    ts[1].tv_nsec = 1000000000;
    CHECK(foliofs_utimens(fs, "hard", ts) == -EINVAL);

    /* chattr flags, enforced. */
    CHECK(foliofs_set_flags(fs, "d/log", FS_IMMUTABLE_FL) == 0);
    uint32_t flags = 0;
    CHECK(foliofs_get_flags(fs, "hard", &flags) == 0 && flags == FS_IMMUTABLE_FL);
    CHECK(foliofs_pwrite(fs, fh, "x", 1, 0) == -EPERM);
    CHECK(foliofs_unlink(fs, "hard") == -EPERM);
    CHECK(foliofs_set_flags(fs, "d/log", 0) == 0);
    CHECK(foliofs_set_flags(fs, "d/log", FS_COMPR_FL) == -EOPNOTSUPP);

    /* Extended attributes. */
    CHECK(foliofs_setxattr(fs, "d", "user.k", "value", 5, XATTR_CREATE) == 0);
    CHECK(foliofs_setxattr(fs, "d", "user.k", "v", 1, XATTR_CREATE) == -EEXIST);
    CHECK(foliofs_setxattr(fs, "d", "user.none", "v", 1, XATTR_REPLACE) == -ENODATA);
    char v[16];
    CHECK(foliofs_getxattr(fs, "d", "user.k", NULL, 0) == 5);
    CHECK(foliofs_getxattr(fs, "d", "user.k", v, 2) == -ERANGE);
    CHECK(foliofs_getxattr(fs, "d", "user.k", v, sizeof v) == 5 && memcmp(v, "value", 5) == 0);
    CHECK(foliofs_listxattr(fs, "d", v, sizeof v) == 7 && strcmp(v, "user.k") == 0);
    CHECK(foliofs_removexattr(fs, "d", "user.k") == 0);
    CHECK(foliofs_getxattr(fs, "d", "user.k", v, sizeof v) == -ENODATA);

    struct foliofs_statfs sf;
    CHECK(foliofs_statfs(fs, &sf) == 0);
    CHECK(sf.block_size == 4096 && sf.blocks_free < sf.blocks && sf.files_free < sf.files);
    CHECK(sf.name_max == 255);

    /* Shutdown: what was fsynced stays, what follows fails. */
    CHECK(foliofs_fsync(fs, fh, 0) == 0);
    CHECK(foliofs_shutdown(fs, 1) == 0);
    CHECK(foliofs_mkdir(fs, "late", 0755) == -EIO);
    foliofs_unmount(fs);
    fs = foliofs_mount(argv[1], NULL);
    CHECK(fs != NULL);
    CHECK(foliofs_stat(fs, "d/log", &st) == 0 && st.size == 40000 && st.nlink == 2);
    CHECK(foliofs_stat(fs, "late", &st) == -ENOENT);
    CHECK(foliofs_unmount(fs) == 0);

    /* An object image (a file:// store: a directory) where an image path
     * goes: made, written, fsynced, held against a second writer,
     * unmounted and read back. */
    char url[4200];
    snprintf(url, sizeof url, "file://%s.objects/img", argv[1]);
    CHECK(foliofs_mkfs(url, 32 << 20, 0) == 0);
    CHECK(foliofs_mkfs(url, 32 << 20, 0) == -EEXIST);
    fs = foliofs_mount(url, "cache_dir=/nonexistent/never,durability=sometimes");
    CHECK(fs == NULL && strstr(foliofs_last_error(), "durability") != NULL);
    fs = foliofs_mount(url, NULL);
    CHECK(fs != NULL);
    CHECK(foliofs_mount(url, NULL) == NULL && strstr(foliofs_last_error(), "held by") != NULL);
    fh = foliofs_open(fs, "o", O_CREAT | O_RDWR, 0644);
    CHECK(fh >= 0);
    static char data[40000];
    memset(data, 'o', sizeof data);
    CHECK(foliofs_pwrite(fs, fh, data, sizeof data, 0) == 40000);
    CHECK(foliofs_fsync(fs, fh, 0) == 0);
    CHECK(foliofs_close(fs, fh) == 0);
    CHECK(foliofs_unmount(fs) == 0);
    fs = foliofs_mount(url, "ro");
    CHECK(fs != NULL);
    CHECK(foliofs_stat(fs, "o", &st) == 0 && st.size == 40000);
    CHECK(foliofs_unmount(fs) == 0);
    printf("C ABI: every check passed\n");
    return 0;
}
