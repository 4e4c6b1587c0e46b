/*
 * fio external ioengine over the foliofs engine (libfoliofs.a, C ABI in
 * crates/foliofs-capi/include/foliofs.h): the seed job files run against
 * the embedded file system with only their ioengine line changed.
 *
 *   ioengine=external:/path/to/foliofs-fio.so
 *   thread=1   (required: every job shares one in-process file system)
 *
 * The image comes from the engine option foliofs_image= or the environment
 * (FOLIOFS_FIO_IMAGE); foliofs_mount= (FOLIOFS_FIO_OPTIONS) passes mount
 * options, and foliofs_mkfs=SIZE (FOLIOFS_FIO_MKFS) formats the image at
 * the first mount if it holds no file system yet. File names are paths
 * inside the file system; missing parent directories are created.
 *
 * fio lays files out and pre-reads them with system calls, which cannot
 * reach an embedded file system, so the engine does both itself:
 * prepopulate_file writes what a job needs to read or overwrite, and
 * pre_read=1 reads each file through the engine's page cache when it is
 * opened. Synchronous engine: queue() completes every request.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fio.h"
#include "optgroup.h"

#include "foliofs.h"

struct foliofs_fio_options {
	void *pad; /* fio options must not sit at offset 0 */
	char *image;
	char *mount_options;
	unsigned long long mkfs_size;
};

static struct fio_option options[] = {
	{
		.name = "foliofs_image",
		.lname = "foliofs image",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct foliofs_fio_options, image),
		.help = "Image file holding the foliofs file system (or FOLIOFS_FIO_IMAGE)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "foliofs_mount",
		.lname = "foliofs mount options",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct foliofs_fio_options, mount_options),
		.help = "Mount options, as for foliofs mount -o (or FOLIOFS_FIO_OPTIONS)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "foliofs_mkfs",
		.lname = "foliofs mkfs size",
		.type = FIO_OPT_STR_VAL,
		.off1 = offsetof(struct foliofs_fio_options, mkfs_size),
		.help = "Format the image with this size if it holds no file system (or FOLIOFS_FIO_MKFS)",
		.def = "0",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = NULL,
	},
};

/* The one file system all jobs of this fio process share. */
static pthread_mutex_t fs_lock = PTHREAD_MUTEX_INITIALIZER;
static foliofs *fs_shared;
static char fs_image[PATH_MAX];
static int fs_users;

/* Per job: whether it holds a reference, and whether it pre-reads. */
struct job_data {
	int pre_read;
};

/* Per open file. */
struct file_data {
	int64_t fh;
};

static const char *opt_or_env(const char *opt, const char *env)
{
	if (opt && *opt)
		return opt;
	return getenv(env);
}

static int parse_size_env(const char *s, unsigned long long *out)
{
	char *end;
	unsigned long long n;

	if (!s || !*s)
		return 0;
	n = strtoull(s, &end, 10);
	switch (*end) {
	case 'k': case 'K': n <<= 10; end++; break;
	case 'm': case 'M': n <<= 20; end++; break;
	case 'g': case 'G': n <<= 30; end++; break;
	case 't': case 'T': n <<= 40; end++; break;
	}
	if (*end)
		return -EINVAL;
	*out = n;
	return 0;
}

/* Take this job's reference on the shared file system, mounting (and if
 * asked, formatting) it first. */
static int job_attach(struct thread_data *td)
{
	struct foliofs_fio_options *o = td->eo;
	struct job_data *jd;
	const char *image, *mopts;
	unsigned long long mkfs = o ? o->mkfs_size : 0;
	int ret = 0;

	if (td->io_ops_data)
		return 0;
	if (!td->o.use_thread) {
		log_err("foliofs: set thread=1 (--thread): jobs share one in-process file system\n");
		return -EINVAL;
	}
	image = opt_or_env(o ? o->image : NULL, "FOLIOFS_FIO_IMAGE");
	mopts = opt_or_env(o ? o->mount_options : NULL, "FOLIOFS_FIO_OPTIONS");
	if (!image) {
		log_err("foliofs: no image: set foliofs_image= or FOLIOFS_FIO_IMAGE\n");
		return -EINVAL;
	}
	if (!mkfs && parse_size_env(getenv("FOLIOFS_FIO_MKFS"), &mkfs)) {
		log_err("foliofs: FOLIOFS_FIO_MKFS is not a size\n");
		return -EINVAL;
	}
	jd = calloc(1, sizeof(*jd));
	if (!jd)
		return -ENOMEM;

	pthread_mutex_lock(&fs_lock);
	if (fs_shared && strcmp(fs_image, image)) {
		log_err("foliofs: jobs name two images (%s, %s): one per run\n", fs_image, image);
		ret = -EINVAL;
		goto out;
	}
	if (!fs_shared) {
		if (mkfs) {
			ret = foliofs_mkfs(image, mkfs, 0);
			if (ret == -EEXIST)
				ret = 0;
			if (ret) {
				log_err("foliofs: mkfs %s: %s\n", image, foliofs_last_error());
				goto out;
			}
		}
		fs_shared = foliofs_mount(image, mopts);
		if (!fs_shared) {
			log_err("foliofs: mount %s: %s\n", image, foliofs_last_error());
			ret = -EIO;
			goto out;
		}
		snprintf(fs_image, sizeof(fs_image), "%s", image);
	}
	fs_users++;
	td->io_ops_data = jd;
	jd = NULL;
out:
	pthread_mutex_unlock(&fs_lock);
	free(jd);
	return ret;
}

static void job_detach(struct thread_data *td)
{
	if (!td->io_ops_data)
		return;
	free(td->io_ops_data);
	td->io_ops_data = NULL;
	pthread_mutex_lock(&fs_lock);
	if (--fs_users == 0) {
		if (foliofs_unmount(fs_shared))
			log_err("foliofs: unmount: %s\n", foliofs_last_error());
		fs_shared = NULL;
	}
	pthread_mutex_unlock(&fs_lock);
}

/* Path of F inside the file system: fio's name without leading '/'. */
static const char *inner_path(struct fio_file *f)
{
	const char *p = f->file_name;

	while (*p == '/')
		p++;
	return p;
}

static int make_parents(const char *path)
{
	char buf[PATH_MAX];
	char *s;
	int ret;

	snprintf(buf, sizeof(buf), "%s", path);
	for (s = strchr(buf, '/'); s; s = strchr(s + 1, '/')) {
		*s = 0;
		ret = foliofs_mkdir(fs_shared, buf, 0755);
		*s = '/';
		if (ret && ret != -EEXIST)
			return ret;
	}
	return 0;
}

static int fio_foliofs_init(struct thread_data *td)
{
	struct job_data *jd;
	int ret = job_attach(td);

	if (ret)
		return ret;
	/* fio's own pre-read uses read(2) on a descriptor; do it here. */
	jd = td->io_ops_data;
	jd->pre_read = td->o.pre_read;
	td->o.pre_read = 0;
	return 0;
}

static void fio_foliofs_cleanup(struct thread_data *td)
{
	job_detach(td);
}

static int fio_foliofs_get_file_size(struct thread_data *td, struct fio_file *f)
{
	struct foliofs_stat st;
	int ret = job_attach(td);

	if (ret)
		return -ret;
	ret = foliofs_stat(fs_shared, inner_path(f), &st);
	if (ret == 0)
		f->real_file_size = st.size;
	else if (ret == -ENOENT)
		f->real_file_size = 0;
	else {
		log_err("foliofs: stat %s: %s\n", f->file_name, foliofs_last_error());
		return -ret;
	}
	fio_file_set_size_known(f);
	return 0;
}

/* Lay the file out as fio would: fresh for plain writes, filled to its
 * I/O range for reads and overwrites. */
static int fio_foliofs_prepopulate_file(struct thread_data *td, struct fio_file *f)
{
	const char *path = inner_path(f);
	unsigned long long want = f->file_offset + f->io_size, at;
	const size_t chunk = 1 << 20;
	int64_t fh, n;
	char *buf;
	int ret;

	ret = job_attach(td);
	if (ret)
		return -ret;
	ret = make_parents(path);
	if (ret) {
		log_err("foliofs: mkdir for %s: %s\n", path, foliofs_last_error());
		return -ret;
	}
	if (f->real_file_size >= want)
		return 0;
	if (td_write(td) && !td->o.overwrite && !td->o.file_append && !td_read(td)) {
		ret = foliofs_unlink(fs_shared, path);
		if (ret && ret != -ENOENT)
			return -ret;
		/* The job's writes extend it. */
		f->real_file_size = want;
		return 0;
	}
	fh = foliofs_open(fs_shared, path, O_WRONLY | O_CREAT, 0644);
	if (fh < 0) {
		log_err("foliofs: create %s: %s\n", path, foliofs_last_error());
		return (int)-fh;
	}
	buf = calloc(1, chunk);
	if (!buf) {
		foliofs_close(fs_shared, fh);
		return ENOMEM;
	}
	log_info("%s: foliofs: laying out %s (%llu MiB)\n", td->o.name, path, want >> 20);
	for (at = f->real_file_size; at < want && !ret; at += n) {
		size_t len = want - at < chunk ? want - at : chunk;

		n = foliofs_pwrite(fs_shared, fh, buf, len, at);
		if (n <= 0)
			ret = n < 0 ? (int)-n : EIO;
	}
	if (!ret && foliofs_fsync(fs_shared, fh, 0))
		ret = EIO;
	if (ret)
		log_err("foliofs: laying out %s: %s\n", path, foliofs_last_error());
	foliofs_close(fs_shared, fh);
	free(buf);
	if (!ret)
		f->real_file_size = want;
	return ret;
}

static int pre_read(struct file_data *fd, struct fio_file *f)
{
	const size_t chunk = 1 << 20;
	unsigned long long at, end = f->file_offset + f->io_size;
	char *buf = malloc(chunk);
	int64_t n = 0;

	if (!buf)
		return ENOMEM;
	for (at = f->file_offset; at < end; at += n) {
		n = foliofs_pread(fs_shared, fd->fh, buf, chunk, at);
		if (n <= 0)
			break;
	}
	free(buf);
	return n < 0 ? (int)-n : 0;
}

static int fio_foliofs_open_file(struct thread_data *td, struct fio_file *f)
{
	struct job_data *jd;
	struct file_data *fd;
	const char *path = inner_path(f);
	int flags, ret;

	ret = job_attach(td);
	if (ret)
		return -ret;
	jd = td->io_ops_data;
	if (td_trim(td)) {
		log_err("foliofs: trim is not supported by this engine\n");
		return EINVAL;
	}
	flags = td_write(td) ? (td_read(td) ? O_RDWR : O_WRONLY) : O_RDONLY;
	if (td_write(td))
		flags |= O_CREAT;
	if (td->o.odirect)
		flags |= O_DIRECT;
	if (td_write(td)) {
		ret = make_parents(path);
		if (ret)
			return -ret;
	}
	fd = calloc(1, sizeof(*fd));
	if (!fd)
		return ENOMEM;
	fd->fh = foliofs_open(fs_shared, path, flags, 0644);
	if (fd->fh < 0) {
		ret = (int)-fd->fh;
		log_err("foliofs: open %s: %s\n", path, foliofs_last_error());
		free(fd);
		td_verror(td, ret, "open");
		return ret;
	}
	if (jd->pre_read) {
		ret = pre_read(fd, f);
		if (ret) {
			log_err("foliofs: pre-read %s: %s\n", path, foliofs_last_error());
			foliofs_close(fs_shared, fd->fh);
			free(fd);
			return ret;
		}
	}
	FILE_SET_ENG_DATA(f, fd);
	return 0;
}

static int fio_foliofs_close_file(struct thread_data *td, struct fio_file *f)
{
	struct file_data *fd = FILE_ENG_DATA(f);
	int ret = 0;

	if (!fd)
		return 0;
	if (foliofs_close(fs_shared, fd->fh)) {
		log_err("foliofs: close %s: %s\n", f->file_name, foliofs_last_error());
		ret = EIO;
	}
	free(fd);
	FILE_SET_ENG_DATA(f, NULL);
	return ret;
}

static int fio_foliofs_unlink_file(struct thread_data *td, struct fio_file *f)
{
	int ret = job_attach(td);

	if (ret)
		return -ret;
	ret = foliofs_unlink(fs_shared, inner_path(f));
	return ret == -ENOENT ? 0 : -ret;
}

static enum fio_q_status fio_foliofs_queue(struct thread_data *td, struct io_u *io_u)
{
	struct file_data *fd = FILE_ENG_DATA(io_u->file);
	int64_t n = 0;

	fio_ro_check(td, io_u);
	switch (io_u->ddir) {
	case DDIR_READ:
		n = foliofs_pread(fs_shared, fd->fh, io_u->xfer_buf, io_u->xfer_buflen, io_u->offset);
		break;
	case DDIR_WRITE:
		n = foliofs_pwrite(fs_shared, fd->fh, io_u->xfer_buf, io_u->xfer_buflen, io_u->offset);
		break;
	case DDIR_SYNC:
		n = foliofs_fsync(fs_shared, fd->fh, 0);
		break;
	case DDIR_DATASYNC:
		n = foliofs_fsync(fs_shared, fd->fh, 1);
		break;
	default:
		n = -EINVAL;
		break;
	}
	if (n < 0) {
		io_u->error = (int)-n;
		td_verror(td, io_u->error, foliofs_last_error());
	} else if (ddir_rw(io_u->ddir) && (unsigned long long)n < io_u->xfer_buflen) {
		io_u->resid = io_u->xfer_buflen - n;
	}
	return FIO_Q_COMPLETED;
}

struct ioengine_ops ioengine = {
	.name = "foliofs",
	.version = FIO_IOOPS_VERSION,
	.flags = FIO_SYNCIO | FIO_DISKLESSIO | FIO_NODISKUTIL,
	.init = fio_foliofs_init,
	.cleanup = fio_foliofs_cleanup,
	.queue = fio_foliofs_queue,
	.open_file = fio_foliofs_open_file,
	.close_file = fio_foliofs_close_file,
	.unlink_file = fio_foliofs_unlink_file,
	.get_file_size = fio_foliofs_get_file_size,
	.prepopulate_file = fio_foliofs_prepopulate_file,
	.option_struct_size = sizeof(struct foliofs_fio_options),
	.options = options,
};
