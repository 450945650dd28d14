/*
 * The C half of the nvmf fio engine: fio's structures are read and written here, compiled
 * against the headers of the fio that loads the engine (build.rs); everything else (the
 * filename, connecting, the queues, buffers) is the Rust half's, reached through the
 * nvmf_fio_* functions below with plain values. This file calls no fio function, so the
 * crate's test binaries link without fio.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fio.h"
#include "optgroup.h"

/* The engine options fio fills in (td->eo); the Rust half reads them as `RawOptions`. */
struct nvmf_fio_options {
	void *pad; /* an option at offset 0 would be taken for "no offset" by fio's parser */
	char *hostnqn;
	char *dhchap_secret;
	char *dhchap_ctrl_secret;
	char *tls_psk;
	unsigned int hdgst;
	unsigned int ddgst;
	unsigned int hipri;
	unsigned int io_timeout_ms;
	unsigned int stats;
	char *polling;
};
/* The layout the Rust half's `RawOptions` has (its test checks the same numbers). */
_Static_assert(sizeof(struct nvmf_fio_options) == 72 &&
	       offsetof(struct nvmf_fio_options, tls_psk) == 32 &&
	       offsetof(struct nvmf_fio_options, hdgst) == 40 &&
	       offsetof(struct nvmf_fio_options, stats) == 56 &&
	       offsetof(struct nvmf_fio_options, polling) == 64,
	       "struct nvmf_fio_options and RawOptions differ");

/* The Rust half (src/lib.rs). Errors are printed there; these return 0 or a negative errno. */
extern int nvmf_fio_probe(const char *filename, const struct nvmf_fio_options *o,
			  uint64_t *size);
extern void *nvmf_fio_job_new(const char *name, unsigned int iodepth, unsigned int nr_files,
			      const struct nvmf_fio_options *o);
extern int nvmf_fio_job_connect(void *job, unsigned int fileno, const char *filename,
				const struct nvmf_fio_options *o);
extern void *nvmf_fio_job_buffer(void *job, unsigned int index, uint64_t len);
extern int nvmf_fio_queue(void *job, void *io_u, unsigned int index, unsigned int fileno,
			  int op, uint64_t offset, void *buf, uint64_t len);
extern int nvmf_fio_commit(void *job);
extern int nvmf_fio_getevents(void *job, unsigned int min, unsigned int max, int64_t timeout_ns);
extern void *nvmf_fio_event(void *job, unsigned int i, int *error);
extern void nvmf_fio_job_free(void *job);

/* Operations as the Rust half numbers them. */
enum { NVMF_OP_READ = 0, NVMF_OP_WRITE = 1, NVMF_OP_TRIM = 2, NVMF_OP_FLUSH = 3 };

/* fio calls setup in the process that parses the job (before it forks or starts the job's
 * thread): each file's namespace is looked up for its size, over a connection of its own. */
static int nvmf_setup(struct thread_data *td)
{
	struct fio_file *f;
	unsigned int i;

	for_each_file(td, f, i) {
		uint64_t size = 0;
		int ret = nvmf_fio_probe(f->file_name, td->eo, &size);

		if (ret)
			return ret;
		f->real_file_size = size;
		f->filetype = FIO_TYPE_BLOCK;
		fio_file_set_size_known(f);
	}
	return 0;
}

/* In the job's process or thread: one controller and one I/O queue of depth iodepth per file. */
static int nvmf_init(struct thread_data *td)
{
	struct fio_file *f;
	unsigned int i;
	void *job = nvmf_fio_job_new(td->o.name, td->o.iodepth, td->o.nr_files, td->eo);

	if (!job)
		return 1;
	td->io_ops_data = job;
	for_each_file(td, f, i) {
		int ret = nvmf_fio_job_connect(job, i, f->file_name, td->eo);

		if (ret)
			return ret;
	}
	return 0;
}

/* After fio laid out its io_u buffers: each io_u gets one of the queue's own buffers instead
 * (registered memory over NVMe/RDMA, so the target reads and writes it in place), with what
 * fio had put in its own (a buffer pattern, verify headers). fio sets io_u->buf only there
 * and points xfer_buf at it for every I/O. */
static int nvmf_post_init(struct thread_data *td)
{
	void *job = td->io_ops_data;
	unsigned long long max_bs = td_max_bs(td);
	int i;

	for (i = 0; i < td->io_u_all.nr; i++) {
		struct io_u *io_u = td->io_u_all.io_us[i];
		void *buf;

		if (!io_u->buf)
			continue;
		buf = nvmf_fio_job_buffer(job, io_u->index, max_bs);
		if (!buf)
			return 1;
		memcpy(buf, io_u->buf, max_bs);
		io_u->buf = buf;
	}
	return 0;
}

static enum fio_q_status nvmf_queue(struct thread_data *td, struct io_u *io_u)
{
	int op, ret;

	fio_ro_check(td, io_u);
	switch (io_u->ddir) {
	case DDIR_READ:
		op = NVMF_OP_READ;
		break;
	case DDIR_WRITE:
		op = NVMF_OP_WRITE;
		break;
	case DDIR_TRIM:
		op = NVMF_OP_TRIM;
		break;
	case DDIR_SYNC:
	case DDIR_DATASYNC:
	case DDIR_SYNC_FILE_RANGE:
		op = NVMF_OP_FLUSH;
		break;
	default:
		io_u->error = EINVAL;
		return FIO_Q_COMPLETED;
	}
	ret = nvmf_fio_queue(td->io_ops_data, io_u, io_u->index, io_u->file->fileno, op,
			     io_u->offset, io_u->xfer_buf, io_u->xfer_buflen);
	if (ret < 0) {
		io_u->error = -ret;
		return FIO_Q_COMPLETED;
	}
	return ret ? FIO_Q_QUEUED : FIO_Q_BUSY;
}

static int nvmf_commit(struct thread_data *td)
{
	return nvmf_fio_commit(td->io_ops_data);
}

static int nvmf_getevents(struct thread_data *td, unsigned int min, unsigned int max,
			  const struct timespec *t)
{
	int64_t timeout_ns = t ? (int64_t)t->tv_sec * 1000000000 + t->tv_nsec : -1;

	return nvmf_fio_getevents(td->io_ops_data, min, max, timeout_ns);
}

static struct io_u *nvmf_event(struct thread_data *td, int event)
{
	int error = 0;
	struct io_u *io_u = nvmf_fio_event(td->io_ops_data, event, &error);

	if (io_u) {
		io_u->error = error;
		io_u->resid = error ? io_u->xfer_buflen : 0;
	}
	return io_u;
}

static void nvmf_cleanup(struct thread_data *td)
{
	if (td->io_ops_data) {
		nvmf_fio_job_free(td->io_ops_data);
		td->io_ops_data = NULL;
	}
}

/* Connections are made per job in init; fio's open and close of a file have nothing to do,
 * and there is no page cache to invalidate. */
static int nvmf_open_file(struct thread_data *td, struct fio_file *f)
{
	return 0;
}

static int nvmf_close_file(struct thread_data *td, struct fio_file *f)
{
	return 0;
}

static int nvmf_invalidate(struct thread_data *td, struct fio_file *f)
{
	return 0;
}

/* An engine option: a field of struct nvmf_fio_options, in fio's engine category. */
#define NVMF_OPT(nm, long_name, kind, field, help_text, ...)                            \
	{                                                                               \
		.name = nm, .lname = long_name, .type = FIO_OPT_##kind,                 \
		.off1 = offsetof(struct nvmf_fio_options, field), .help = help_text,    \
		.category = FIO_OPT_C_ENGINE, .group = FIO_OPT_G_INVALID, __VA_ARGS__   \
	}

static struct fio_option options[] = {
	NVMF_OPT("hostnqn", "NVMe-oF host NQN", STR_STORE, hostnqn,
		 "Host NQN (default: a random UUID-based one; hostnqn= in the filename wins)"),
	NVMF_OPT("dhchap_secret", "DH-HMAC-CHAP host secret", STR_STORE, dhchap_secret,
		 "The host's DH-HMAC-CHAP secret (DHHC-1:..., as nvme gen-dhchap-key prints it)"),
	NVMF_OPT("dhchap_ctrl_secret", "DH-HMAC-CHAP controller secret", STR_STORE,
		 dhchap_ctrl_secret, "The controller's DH-HMAC-CHAP secret: bidirectional authentication"),
	NVMF_OPT("tls_psk", "NVMe/TCP TLS PSK", STR_STORE, tls_psk,
		 "NVMe/TCP over TLS 1.3 with this configured PSK (NVMeTLSkey-1:...)"),
	NVMF_OPT("hdgst", "NVMe/TCP header digest", BOOL, hdgst,
		 "Negotiate NVMe/TCP header digests", .def = "0"),
	NVMF_OPT("ddgst", "NVMe/TCP data digest", BOOL, ddgst,
		 "Negotiate NVMe/TCP data digests", .def = "0"),
	NVMF_OPT("hipri", "Busy-poll completions", BOOL, hipri,
		 "Spin without bound while waiting for completions (default: spin briefly, then sleep)",
		 .def = "0"),
	NVMF_OPT("polling", "How queues wait", STR_STORE, polling,
		 "adaptive (default: spin briefly, then sleep), busy (never sleep; hipri) or interrupt (always sleep)"),
	NVMF_OPT("io_timeout_ms", "Command timeout", INT, io_timeout_ms,
		 "Bound of every command and of connecting, in milliseconds", .def = "30000",
		 .minval = 1),
	NVMF_OPT("queue_stats", "Queue statistics", BOOL, stats,
		 "At the end of each job, print its queues' commands, system calls and copies per payload byte",
		 .def = "0"),
	{
		.name = NULL,
	},
};

static struct ioengine_ops ops = {
	.name = "nvmf",
	.version = FIO_IOOPS_VERSION,
	.flags = FIO_RAWIO | FIO_NOEXTEND | FIO_NODISKUTIL | FIO_DISKLESSIO,
	.setup = nvmf_setup,
	.init = nvmf_init,
	.post_init = nvmf_post_init,
	.queue = nvmf_queue,
	.commit = nvmf_commit,
	.getevents = nvmf_getevents,
	.event = nvmf_event,
	.cleanup = nvmf_cleanup,
	.open_file = nvmf_open_file,
	.close_file = nvmf_close_file,
	.invalidate = nvmf_invalidate,
	.option_struct_size = sizeof(struct nvmf_fio_options),
	.options = options,
};

/* fio finds external engines by the symbol `ioengine` or, failing that, by calling
 * `get_ioengine` (the Rust half exports that one: a cdylib exports only Rust's symbols). */
struct ioengine_ops *nvmf_fio_ops(void)
{
	return &ops;
}
