/*
 * qpdrain trace shim: preloaded (LD_PRELOAD) into an unchanged program, it
 * records the life of every QP, CQ and SRQ the program creates through
 * libibverbs, one binary record per event, into the file named by
 * QPDRAIN_TRACE_FILE, mapped shared by every process of the program. qpdrain's trace package
 * decodes them into text (recfile.go), parses and judges them (record.go documents the fields).
 *
 * ibv_post_send, ibv_post_recv, ibv_post_srq_recv and ibv_poll_cq are static
 * inline in <infiniband/verbs.h>: they call through the ibv_context_ops table
 * of the object's context, so no symbol can interpose them. The shim
 * interposes the exported verbs that create and destroy objects and open
 * devices, and once ibv_open_device returns it replaces that context's post
 * and poll entries (and the verbs_context create_*_ex entries the inline
 * ibv_create_*_ex use) by wrappers that record and call the saved originals;
 * a QP created with ibv_qp_ex send operations gets its builders (ibv_wr_*)
 * wrapped the same way.
 *
 * Safe in an arbitrary program: the wrappers allocate nothing and take no
 * lock (the context table is read with acquire loads, written under a mutex
 * by ibv_open_device/ibv_close_device only), build binary records on the
 * stack (no formatting) and copy them into the shared mapping of the record
 * file (an atomic add reserves the bytes), so they are
 * async-signal-safe as far as the provider's own post/poll are; errno is
 * preserved; the pid is re-read in the child after fork (pthread_atfork);
 * the file is mapped at the first ibv_open_device, no descriptor kept, and
 * an exec'd program maps it again by name. The records carry the call site
 * of their verb (the caller's return address); only the create, destroy
 * and get_async_event verbs, which allocate anyway, look at the loaded
 * objects for it (dl_iterate_phdr, which takes the loader's lock).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#define MAX_CONTEXTS 64
#define IBVERBS_VERSION "IBVERBS_1.1"

/* ctx_slot holds one open context's original ops; ctx is published last
 * (release) so a wrapper that finds it (acquire) sees the originals. */
struct ctx_slot {
	struct ibv_context *ctx;
	int (*post_send)(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **);
	int (*post_recv)(struct ibv_qp *, struct ibv_recv_wr *, struct ibv_recv_wr **);
	int (*post_srq_recv)(struct ibv_srq *, struct ibv_recv_wr *, struct ibv_recv_wr **);
	int (*poll_cq)(struct ibv_cq *, int, struct ibv_wc *);
	struct ibv_qp *(*create_qp_ex)(struct ibv_context *, struct ibv_qp_init_attr_ex *);
	struct ibv_cq_ex *(*create_cq_ex)(struct ibv_context *, struct ibv_cq_init_attr_ex *);
	struct ibv_srq *(*create_srq_ex)(struct ibv_context *, struct ibv_srq_init_attr_ex *);
};

static struct ctx_slot slots[MAX_CONTEXTS];
static pthread_mutex_t slots_mu = PTHREAD_MUTEX_INITIALIZER;
/* The record file, made by qpdrain: a header page, then the records. Every
 * process of the program maps it shared and reserves each record's bytes
 * with one atomic add on the header's next, so records need no system call,
 * keep one order across threads and processes, and survive SIGKILL (they
 * are in the page cache) and a daemon closing every descriptor (no
 * descriptor is kept). */
struct rec_header {
	char magic[8]; /* REC_MAGIC */
	uint64_t size; /* the file's size */
	uint64_t next; /* the bytes reserved after the header page */
	uint64_t lost; /* records that did not fit */
};
#define REC_MAGIC "QPDTRC02"
#define REC_DATA 4096 /* the records start a page in */
#define REC_CHUNK (1u << 20)
#define REC_POPULATE_WRITE 23 /* MADV_POPULATE_WRITE, Linux 5.14 */
static char *rec_map;   /* NULL: no records */
static uint64_t rec_cap; /* bytes for records */
static char rec_path[4096]; /* QPDRAIN_TRACE_FILE, copied at load time */
static int opened; /* a device was opened: the exit record matters */
static char exe_path[384]; /* /proc/self/exe, read when the file is mapped */
static pid_t cached_pid;
static __thread pid_t cached_tid __attribute__((tls_model("initial-exec")));
/* create_site: the call site of the exported create verb running on this
 * thread, for the ops-table create_*_ex wrapper a provider may reach
 * through it (the program's call site, not libibverbs') */
static __thread uint64_t create_site __attribute__((tls_model("initial-exec")));

/* The exported verbs, resolved once at load time. */
static struct ibv_context *(*real_open_device)(struct ibv_device *);
static int (*real_close_device)(struct ibv_context *);
static struct ibv_cq *(*real_create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
static int (*real_destroy_cq)(struct ibv_cq *);
static struct ibv_srq *(*real_create_srq)(struct ibv_pd *, struct ibv_srq_init_attr *);
static int (*real_destroy_srq)(struct ibv_srq *);
static struct ibv_qp *(*real_create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
static int (*real_modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
static int (*real_destroy_qp)(struct ibv_qp *);
static int (*real_get_async_event)(struct ibv_context *, struct ibv_async_event *);
static void (*real_ack_async_event)(struct ibv_async_event *);

/* qpx_slot holds one ibv_qp_ex's original send builders and the WRs built
 * since ibv_wr_start, recorded when ibv_wr_complete posts them. The builders
 * live in each QP (per provider and QP type), hence a table of QPs, open
 * addressed by pointer; a QP must not be built on by two threads at once
 * (ibv_wr_post(3)), so a slot's batch needs no lock. */
#define MAX_QPX 1024
#define QPX_BATCH 256
struct qpx_slot {
	struct ibv_qp_ex *qpx; /* NULL: free; TOMB: was used */
	void (*wr_start)(struct ibv_qp_ex *);
	int (*wr_complete)(struct ibv_qp_ex *);
	void (*wr_abort)(struct ibv_qp_ex *);
	void (*wr_send)(struct ibv_qp_ex *);
	void (*wr_send_imm)(struct ibv_qp_ex *, __be32);
	void (*wr_send_inv)(struct ibv_qp_ex *, uint32_t);
	void (*wr_rdma_write)(struct ibv_qp_ex *, uint32_t, uint64_t);
	void (*wr_rdma_write_imm)(struct ibv_qp_ex *, uint32_t, uint64_t, __be32);
	void (*wr_rdma_read)(struct ibv_qp_ex *, uint32_t, uint64_t);
	void (*wr_atomic_cmp_swp)(struct ibv_qp_ex *, uint32_t, uint64_t, uint64_t, uint64_t);
	void (*wr_atomic_fetch_add)(struct ibv_qp_ex *, uint32_t, uint64_t, uint64_t);
	void (*wr_local_inv)(struct ibv_qp_ex *, uint32_t);
	void (*wr_bind_mw)(struct ibv_qp_ex *, struct ibv_mw *, uint32_t, const struct ibv_mw_bind_info *);
	void (*wr_send_tso)(struct ibv_qp_ex *, void *, uint16_t, uint16_t);
	void (*wr_atomic_write)(struct ibv_qp_ex *, uint32_t, uint64_t, const void *);
	void (*wr_flush)(struct ibv_qp_ex *, uint32_t, uint64_t, size_t, uint8_t, uint8_t);
	int n;
	int overflow;
	struct {
		uint64_t id;
		uint8_t op, sig;
	} batch[QPX_BATCH];
};
#define QPX_TOMB ((struct ibv_qp_ex *)1)

static struct qpx_slot qpx_slots[MAX_QPX];
static struct ibv_qp_ex *(*real_qp_to_qp_ex)(struct ibv_qp *);

/* The records are binary, decoded by qpdrain (recfile.go reads these two
 * tables from this source, so the names are written once): a kind, then
 * KEY=VALUE fields, as record.go documents them. A key's format is how the
 * decoder prints it: HEX, DEC, INT (signed) or STR (the record's one string,
 * its bytes after the values). "ns" is CLOCK_MONOTONIC beside a TSC time, for
 * the decoder's conversion; "clock" records carry only that. The kinds
 * written on the post and poll path come first: they take no ns. */
#define REC_KINDS(X) X(send) X(recv) X(srecv) X(wc) X(start) X(fork) X(open) X(close) X(cq) X(cqd) X(srq) X(srqd) \
	X(qp) X(mod) X(qpd) X(pollerr) X(ev) X(ack) X(qpxlost) X(fail) X(exit) X(clock) X(map) X(unposted)
#define REC_KEYS(X) X(ctx, HEX) X(qp, HEX) X(cq, HEX) X(srq, HEX) X(scq, HEX) X(rcq, HEX) X(wr, HEX) X(ret, INT) \
	X(cqe, INT) X(errno, INT) X(dev, STR) X(verb, STR) X(exe, STR) X(traced, DEC) X(ex, DEC) X(begin, DEC) \
	X(max_wr, DEC) X(qpn, DEC) X(type, DEC) X(max_send_wr, DEC) X(max_recv_wr, DEC) X(sig_all, DEC) \
	X(state, DEC) X(op, DEC) X(sig, DEC) X(st, DEC) X(port, DEC) X(ppid, DEC) X(ns, DEC) \
	X(site, HEX) X(base, HEX) X(lo, HEX) X(hi, HEX) X(path, STR) X(wrs, DEC)
#define KIND_ENUM(n) KIND_##n,
#define KEY_ENUM(n, f) KEY_##n,
enum rec_kind { REC_KINDS(KIND_ENUM) };
enum rec_key { REC_KEYS(KEY_ENUM) };

/* rec is a record under construction, on the caller's stack, in the
 * record file's layout (8-byte words, little-endian on the hosts that
 * have libibverbs):
 *   w[0] header: byte 0 REC_MARK, 1 kind, 2 words in all, 3 values; 4-7 tid
 *   w[1] the time: TSC ticks (w[2] bit 32) or CLOCK_MONOTONIC ns
 *   w[2] pid (bits 0-31), flags (32-39), string length (40-55), check (56-63)
 *   w[3], w[4] the values' keys, a byte each
 *   w[5...] the values, then the string's bytes
 * The header is stored last (release): a record whose header is there is
 * whole; check (the values' bytes folded by xor) rejects what a process
 * killed mid-copy left that would look like a header. */
#define REC_MARK 0xb5
#define REC_VALS 16
#define REC_TSC (1ull << 32)
struct rec {
	uint64_t w[5 + REC_VALS];
	const char *str;
	unsigned slen;
};
static void *resolve(void *h, const char *name)
{
	void *p = dlvsym(h, name, IBVERBS_VERSION);
	return p ? p : dlsym(h, name);
}

/* resolve_all finds the exported verbs behind the shim's in h: RTLD_NEXT at
 * load time (a program linked with libibverbs), or the handle of a
 * libibverbs the program dlopen()ed (RTLD_LOCAL: not behind the shim). */
static void resolve_all(void *h)
{
	real_open_device = resolve(h, "ibv_open_device");
	real_close_device = resolve(h, "ibv_close_device");
	real_create_cq = resolve(h, "ibv_create_cq");
	real_destroy_cq = resolve(h, "ibv_destroy_cq");
	real_create_srq = resolve(h, "ibv_create_srq");
	real_destroy_srq = resolve(h, "ibv_destroy_srq");
	real_create_qp = resolve(h, "ibv_create_qp");
	real_modify_qp = resolve(h, "ibv_modify_qp");
	real_destroy_qp = resolve(h, "ibv_destroy_qp");
	real_get_async_event = resolve(h, "ibv_get_async_event");
	real_ack_async_event = resolve(h, "ibv_ack_async_event");
	real_qp_to_qp_ex = dlsym(h, "ibv_qp_to_qp_ex");
}

/* A program that dlopen()s libibverbs and takes the verbs from its handle
 * with dlsym or dlvsym (NCCL, Python's ctypes, qpdrain's own binding) would
 * never reach the shim's definitions: a handle's lookup searches that
 * library and its dependencies only. So dlopen of libibverbs returns instead
 * the handle of the shim's companion, QPDRAIN_TRACE_DLHELPER: an object with
 * no code whose dependencies are the shim (by soname), then libibverbs, so
 * that a lookup on it finds the shim's verbs first and libibverbs' others.
 * Interposing dlopen rather than dlsym: dlsym(RTLD_NEXT) answers relative to
 * its caller, which a dlsym wrapper would hide on every glibc; dlopen's
 * caller only chooses the RUNPATH searched, and other names pass through as
 * a tail call. */
static void *(*real_dlopen)(const char *, int);
static char dl_helper[4096];

static int verbs_library(const char *file)
{
	const char *base = file ? strrchr(file, '/') : NULL;

	base = base ? base + 1 : file;
	return base && !strncmp(base, "libibverbs.so", 13);
}

static void *open_verbs(const char *file, int mode)
{
	void *h = real_dlopen(file, mode), *helper;

	if (!h)
		return NULL;
	if (!real_open_device)
		resolve_all(h);
	/* h stays open: the shim calls into it for the rest of the process */
	if (!dl_helper[0] || !(helper = real_dlopen(dl_helper, RTLD_NOW | RTLD_LOCAL)))
		return h;
	return helper;
}

void *dlopen(const char *file, int mode)
{
	if (!real_dlopen)
		real_dlopen = (void *(*)(const char *, int))dlsym(RTLD_NEXT, "dlopen");
	if (verbs_library(file))
		return open_verbs(file, mode);
	return real_dlopen(file, mode);
}

/* use_tsc: the time of a record is the TSC, read in a few ns where
 * clock_gettime costs 20-50, when the kernel's own clock is the TSC (its
 * clocksource is "tsc": it found the TSC invariant and in step on every CPU,
 * and CLOCK_MONOTONIC is then a linear function of it); the cold records
 * carry CLOCK_MONOTONIC beside it, so the decoder converts. Elsewhere (a
 * guest whose CPUs' TSCs differ, other architectures) clock_gettime; and
 * where that is a system call (a clocksource the vDSO cannot read, as a
 * qemu guest's hpet: 1.2 us a call on rxe's 6.1 guest, about a round
 * trip's twentieth per record) the post and poll records take
 * CLOCK_MONOTONIC_COARSE instead (the vDSO's time of the last tick, 40 ns
 * there), the others CLOCK_MONOTONIC: the decoder keeps the times from going
 * back in the records' order, so a post is placed at the latest record
 * before it when its tick is older. */
static int use_tsc;
static clockid_t hot_clock = CLOCK_MONOTONIC;

static uint64_t clock_ns(clockid_t c)
{
	struct timespec ts;

	clock_gettime(c, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t mono_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

/* slow_clock: whether CLOCK_MONOTONIC costs a system call, by the
 * fastest of a few calls in a row (the vDSO's take tens of ns, a system
 * call hundreds at least; preemption only lengthens some) */
static int slow_clock(void)
{
	uint64_t best = ~0ull, a = mono_ns(), b;

	for (int i = 0; i < 8; i++, a = b) {
		b = mono_ns();
		if (b - a < best)
			best = b - a;
	}
	return best > 250;
}

static void detect_clock(void)
{
#if defined(__x86_64__)
	char cs[16] = "";
	int fd = open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC);

	if (fd >= 0) {
		if (read(fd, cs, sizeof(cs) - 1) < 0)
			cs[0] = 0;
		close(fd);
	}
	use_tsc = !strcmp(cs, "tsc\n");
#endif
	if (!use_tsc && slow_clock())
		hot_clock = CLOCK_MONOTONIC_COARSE;
}

static inline uint64_t rec_time(enum rec_kind kind)
{
#if defined(__x86_64__)
	if (use_tsc)
		return __rdtsc();
#endif
	return clock_ns(kind <= KIND_wc ? hot_clock : CLOCK_MONOTONIC);
}

/* The objects a "map" record was written for (see scan_modules). */
#define MAX_MODS 512
static struct {
	uintptr_t lo, hi;
} mods[MAX_MODS];
static int nmods;
static unsigned long long mods_adds = ~0ull; /* dlpi_adds at the last scan */
static pthread_mutex_t mods_mu = PTHREAD_MUTEX_INITIALIZER;

static inline void begin(struct rec *r, enum rec_kind kind);
static void emit(struct rec *r);
static void scan_modules(void);
static void put_name(struct rec *r, enum rec_key key, const char *s, unsigned max);
static inline void put_uint(struct rec *r, enum rec_key key, uint64_t v);

/* after_fork_child: the child shares its parent's uverbs file and so its
 * verbs objects (a QP the child destroys is gone for the parent too); its
 * first record says whose they are. */
static void after_fork_child(void)
{
	int saved = errno;

	cached_pid = getpid();
	cached_tid = 0;
	/* another thread may have held them at fork: the child has no such thread */
	pthread_mutex_init(&slots_mu, NULL);
	pthread_mutex_init(&mods_mu, NULL);
	if (__atomic_load_n(&rec_map, __ATOMIC_ACQUIRE)) {
		struct rec r;

		begin(&r, KIND_fork);
		put_uint(&r, KEY_ppid, (uint64_t)getppid());
		emit(&r);
	}
	errno = saved;
}

__attribute__((constructor)) static void shim_init(void)
{
	int saved = errno;
	const char *path = getenv("QPDRAIN_TRACE_FILE");
	const char *helper = getenv("QPDRAIN_TRACE_DLHELPER");

	resolve_all(RTLD_NEXT);
	if (helper && strlen(helper) < sizeof(dl_helper))
		strcpy(dl_helper, helper);
	cached_pid = getpid();
	pthread_atfork(NULL, NULL, after_fork_child);
	if (path && strlen(path) < sizeof(rec_path))
		strcpy(rec_path, path);
	errno = saved;
}

/* open_records maps the record file the first time a device is opened
 * (under slots_mu), so that processes of the program that use no device
 * map nothing; a forked child inherits the mapping, an exec'd image maps
 * the file again. */
static void open_records(void)
{
	struct rec_header h;
	void *m;
	int fd;

	if (rec_map || !rec_path[0])
		return;
	fd = open(rec_path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return;
	if (pread(fd, &h, sizeof(h), 0) != sizeof(h) || memcmp(h.magic, REC_MAGIC, 8) || h.size <= REC_DATA) {
		close(fd);
		return;
	}
	m = mmap(NULL, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return;
	rec_cap = h.size - REC_DATA;
	detect_clock();
	/* the chunk the records go on in now, and the next, faulted in at once:
	 * emit does it for the chunks after, and a page fault each costs a
	 * guest under TCG microseconds (a short run's records all fit there) */
	{
		uint64_t at = __atomic_load_n(&((struct rec_header *)m)->next, __ATOMIC_RELAXED) / REC_CHUNK * REC_CHUNK;

		if (at < rec_cap)
			madvise((char *)m + REC_DATA + at, at + 2 * REC_CHUNK <= rec_cap ? 2 * REC_CHUNK : rec_cap - at, REC_POPULATE_WRITE);
	}
	__atomic_store_n(&rec_map, (char *)m, __ATOMIC_RELEASE);
	/* a new program image: exec closed the uverbs files of the one
	 * before (close-on-exec), its objects are not this one's; its
	 * executable is what a suppression's program= matches */
	struct rec r;
	ssize_t n = readlink("/proc/self/exe", exe_path, sizeof(exe_path) - 1);

	exe_path[n > 0 ? n : 0] = 0;
	begin(&r, KIND_start);
	if (n > 0)
		put_name(&r, KEY_exe, exe_path, sizeof(exe_path));
	emit(&r);
	scan_modules();
}


static inline void put_uint(struct rec *r, enum rec_key key, uint64_t v)
{
	unsigned n = (unsigned)(r->w[0] >> 24) & 0xff;

	if (n >= REC_VALS)
		return;
	((uint8_t *)&r->w[3])[n] = (uint8_t)key;
	r->w[5 + n] = v;
	r->w[0] += 1u << 24;
}

static inline void put_int(struct rec *r, enum rec_key key, int64_t v) { put_uint(r, key, (uint64_t)v); }
static inline void put_ptr(struct rec *r, enum rec_key key, const void *p) { put_uint(r, key, (uint64_t)(uintptr_t)p); }

/* put_name adds the record's string, cut to max bytes (the decoder makes
 * it printable). */
static void put_name(struct rec *r, enum rec_key key, const char *s, unsigned max)
{
	size_t n = s ? strnlen(s, max) : 0;

	r->str = s;
	r->slen = (unsigned)n;
	put_uint(r, key, n);
}

/* begin starts a record of kind; the cold kinds (after wc) also take
 * CLOCK_MONOTONIC when the time is the TSC. */
static inline void begin(struct rec *r, enum rec_kind kind)
{
	if (!cached_tid)
		cached_tid = (pid_t)syscall(SYS_gettid);
	r->w[0] = (uint64_t)kind << 8 | (uint64_t)(uint32_t)cached_tid << 32;
	r->w[1] = rec_time(kind);
	r->w[2] = (uint32_t)cached_pid | (use_tsc ? REC_TSC : 0);
	r->w[3] = r->w[4] = 0;
	r->slen = 0;
	if (use_tsc && kind > KIND_wc)
		put_uint(r, KEY_ns, mono_ns());
}

static void emit(struct rec *r)
{
	char *m = __atomic_load_n(&rec_map, __ATOMIC_ACQUIRE);
	struct rec_header *h = (struct rec_header *)m;
	unsigned nv = (unsigned)(r->w[0] >> 24) & 0xff, words = 5 + nv + (r->slen + 7) / 8;
	uint64_t off, x = 0, *dst;

	if (!m)
		return;
	off = __atomic_fetch_add(&h->next, (uint64_t)words * 8, __ATOMIC_RELAXED);
	if (off + words * 8 > rec_cap) {
		__atomic_fetch_add(&h->lost, 1, __ATOMIC_RELAXED);
		return;
	}
	/* The record that enters a chunk faults in the next one, in one
	 * system call rather than a page fault per page (Linux 5.14; older
	 * kernels refuse and fault page by page), and gives the decoder a
	 * TSC/CLOCK_MONOTONIC pair. */
	if ((off + words * 8) / REC_CHUNK != off / REC_CHUNK && (off / REC_CHUNK + 2) * REC_CHUNK <= rec_cap) {
		int saved = errno; /* a post's records come before the provider's post, which may set errno */

		madvise(m + REC_DATA + (off / REC_CHUNK + 1) * REC_CHUNK, REC_CHUNK, REC_POPULATE_WRITE);
		errno = saved;
		if (use_tsc) {
			struct rec c;

			begin(&c, KIND_clock);
			emit(&c);
		}
	}
	for (unsigned i = 0; i < nv; i++)
		x ^= r->w[5 + i];
	x ^= r->w[1] ^ r->w[3] ^ r->w[4];
	x ^= x >> 32;
	x ^= x >> 16;
	x ^= x >> 8;
	r->w[0] |= (uint64_t)REC_MARK | (uint64_t)words << 16;
	r->w[2] |= (uint64_t)r->slen << 40 | (x & 0xff) << 56;
	dst = (uint64_t *)(m + REC_DATA + off);
	memcpy(dst + 1, &r->w[1], (4 + nv) * 8);
	if (r->slen)
		memcpy(dst + 5 + nv, r->str, r->slen); /* the file's zeros pad it */
	__atomic_store_n(dst, r->w[0], __ATOMIC_RELEASE);
}

static struct ctx_slot *find_slot(const struct ibv_context *ctx)
{
	for (int i = 0; i < MAX_CONTEXTS; i++)
		if (__atomic_load_n(&slots[i].ctx, __ATOMIC_ACQUIRE) == ctx)
			return &slots[i];
	return NULL;
}

/* ---- call sites ----
 *
 * The records a finding points to carry the call site of their verb: the
 * return address into the caller (SITE(), in the function the caller called,
 * the exported verb or the ops-table wrapper the static inline verb calls
 * through), one load where a frame walk would cost more than the record and
 * could fault on a program built without frame pointers. The decoder needs
 * the object each address lies in, and the program may have exited (or been
 * killed) before anyone could read its /proc/PID/maps: so the shim records
 * the loaded objects itself, one "map" record each (its path, load bias and
 * address range, from dl_iterate_phdr), when it maps the record file and,
 * after that, whenever a cold verb finds that the loader has added objects
 * since (dlpi_adds); the post path never scans, and a post from an object
 * loaded after the last cold verb keeps a bare address. */
#define SITE() ((uint64_t)(uintptr_t)__builtin_extract_return_addr(__builtin_return_address(0)))

static int scan_module(struct dl_phdr_info *info, size_t size, void *first)
{
	const char *path = info->dlpi_name;
	uintptr_t lo = UINTPTR_MAX, hi = 0;
	struct rec r;
	int i;

	if (*(int *)first) {
		*(int *)first = 0;
		if (size < offsetof(struct dl_phdr_info, dlpi_subs) || info->dlpi_adds == mods_adds)
			return 1; /* nothing loaded since the last scan */
		mods_adds = info->dlpi_adds;
	}
	if (!path || !path[0])
		path = exe_path; /* the program itself */
	else if (!strchr(path, '/'))
		return 0; /* the vDSO: no file to read symbols from */
	for (i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];

		if (ph->p_type != PT_LOAD)
			continue;
		if (info->dlpi_addr + ph->p_vaddr < lo)
			lo = info->dlpi_addr + ph->p_vaddr;
		if (info->dlpi_addr + ph->p_vaddr + ph->p_memsz > hi)
			hi = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
	}
	for (i = 0; i < nmods; i++)
		if (mods[i].lo == lo && mods[i].hi == hi)
			return 0;
	if (hi <= lo || nmods == MAX_MODS)
		return 0;
	mods[nmods].lo = lo;
	mods[nmods++].hi = hi;
	begin(&r, KIND_map);
	put_uint(&r, KEY_base, info->dlpi_addr);
	put_uint(&r, KEY_lo, lo);
	put_uint(&r, KEY_hi, hi);
	put_name(&r, KEY_path, path, 1024);
	emit(&r);
	return 0;
}

/* scan_modules records the objects loaded since the last scan; cold verbs
 * call it before their record, so that the map of their call site comes
 * first. */
static void scan_modules(void)
{
	int first = 1;

	if (!__atomic_load_n(&rec_map, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&mods_mu);
	dl_iterate_phdr(scan_module, &first);
	pthread_mutex_unlock(&mods_mu);
}

static void rec_fail(const char *verb, int err)
{
	struct rec r;

	begin(&r, KIND_fail);
	put_name(&r, KEY_verb, verb, 64);
	put_int(&r, KEY_errno, err);
	emit(&r);
}

/* rec_qp, rec_cq and rec_srq record the object a create verb made or, when
 * it made none, the verb's failure with err, the errno it left. */
static void rec_qp(const char *verb, struct ibv_qp *qp, int err, struct ibv_context *ctx, const struct ibv_qp_cap *cap, int sig_all, int ex,
		   uint64_t site)
{
	struct rec r;

	if (!qp) {
		rec_fail(verb, err);
		return;
	}
	scan_modules();
	begin(&r, KIND_qp);
	put_uint(&r, KEY_site, site);
	put_ptr(&r, KEY_ctx, ctx);
	put_ptr(&r, KEY_qp, qp);
	put_uint(&r, KEY_qpn, qp->qp_num);
	put_uint(&r, KEY_type, qp->qp_type);
	put_ptr(&r, KEY_scq, qp->send_cq);
	put_ptr(&r, KEY_rcq, qp->recv_cq);
	put_ptr(&r, KEY_srq, qp->srq);
	put_uint(&r, KEY_max_send_wr, cap->max_send_wr);
	put_uint(&r, KEY_max_recv_wr, cap->max_recv_wr);
	put_uint(&r, KEY_sig_all, sig_all != 0);
	put_uint(&r, KEY_ex, ex != 0);
	emit(&r);
}

static void rec_cq(const char *verb, struct ibv_cq *cq, int err, struct ibv_context *ctx, int ex, uint64_t site)
{
	struct rec r;

	if (!cq) {
		rec_fail(verb, err);
		return;
	}
	scan_modules();
	begin(&r, KIND_cq);
	put_uint(&r, KEY_site, site);
	put_ptr(&r, KEY_ctx, ctx);
	put_ptr(&r, KEY_cq, cq);
	put_int(&r, KEY_cqe, cq->cqe);
	put_uint(&r, KEY_ex, ex != 0);
	emit(&r);
}

static void rec_srq(const char *verb, struct ibv_srq *srq, int err, struct ibv_context *ctx, uint32_t max_wr, uint64_t site)
{
	struct rec r;

	if (!srq) {
		rec_fail(verb, err);
		return;
	}
	scan_modules();
	begin(&r, KIND_srq);
	put_uint(&r, KEY_site, site);
	put_ptr(&r, KEY_ctx, ctx);
	put_ptr(&r, KEY_srq, srq);
	put_uint(&r, KEY_max_wr, max_wr);
	emit(&r);
}

/* ---- the ops-table wrappers ---- */

/* The post wrappers record a post's WRs before the provider sees them:
 * a provider may execute a WR inside its post (siw sends it from
 * ibv_post_send; rxe's kernel worker may complete it before the call
 * returns), and another thread may poll its completion then, whose record
 * must come after the post's. A post that fails adds one "unposted"
 * record, written before the call returns: its last n WRs (bad_wr and the
 * WRs after it) were not posted. */

/* rec_unposted writes that record for a post of n WRs of which the first
 * posted were; without a bad_wr the first WR is taken as the failed one. */
static void rec_unposted(enum rec_key key, const void *obj, unsigned n, unsigned posted, int ret)
{
	struct rec r;

	begin(&r, KIND_unposted);
	put_ptr(&r, key, obj);
	put_uint(&r, KEY_wrs, n - posted);
	put_int(&r, KEY_ret, ret);
	emit(&r);
}

static int wrap_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct ctx_slot *s = find_slot(qp->context);
	struct ibv_send_wr *badl = NULL, *w;
	uint64_t site = SITE();
	unsigned n = 0, posted = 0;
	int ret, saved;

	if (!s)
		return ENODEV; /* the context was closed: posting to it is the program's bug */
	for (w = wr; w; w = w->next, n++) {
		struct rec r;

		begin(&r, KIND_send);
		put_ptr(&r, KEY_qp, qp);
		put_uint(&r, KEY_site, site);
		put_uint(&r, KEY_wr, w->wr_id);
		put_uint(&r, KEY_op, w->opcode);
		put_uint(&r, KEY_sig, (w->send_flags & IBV_SEND_SIGNALED) != 0);
		emit(&r);
	}
	ret = s->post_send(qp, wr, &badl);
	saved = errno;
	if (bad)
		*bad = badl;
	if (ret) {
		for (w = wr; badl && w && w != badl; w = w->next)
			posted++;
		rec_unposted(KEY_qp, qp, n, w ? posted : 0, ret);
	}
	errno = saved;
	return ret;
}

/* rec_recv_chain records the WRs of a receive chain, before it is posted;
 * it returns how many there are. */
static unsigned rec_recv_chain(enum rec_kind kind, enum rec_key key, const void *obj, struct ibv_recv_wr *wr, uint64_t site)
{
	unsigned n = 0;

	for (struct ibv_recv_wr *w = wr; w; w = w->next, n++) {
		struct rec r;

		begin(&r, kind);
		put_ptr(&r, key, obj);
		put_uint(&r, KEY_site, site);
		put_uint(&r, KEY_wr, w->wr_id);
		emit(&r);
	}
	return n;
}

/* recv_failed writes the unposted record of a receive chain of n WRs whose
 * post failed at badl. */
static void recv_failed(enum rec_key key, const void *obj, struct ibv_recv_wr *wr, struct ibv_recv_wr *badl, unsigned n, int ret)
{
	unsigned posted = 0;
	struct ibv_recv_wr *w;

	for (w = wr; badl && w && w != badl; w = w->next)
		posted++;
	rec_unposted(key, obj, n, w ? posted : 0, ret);
}

static int wrap_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct ctx_slot *s = find_slot(qp->context);
	struct ibv_recv_wr *badl = NULL;
	uint64_t site = SITE();
	unsigned n;
	int ret, saved;

	if (!s)
		return ENODEV;
	n = rec_recv_chain(KIND_recv, KEY_qp, qp, wr, site);
	ret = s->post_recv(qp, wr, &badl);
	saved = errno;
	if (bad)
		*bad = badl;
	if (ret)
		recv_failed(KEY_qp, qp, wr, badl, n, ret);
	errno = saved;
	return ret;
}

static int wrap_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct ctx_slot *s = find_slot(srq->context);
	struct ibv_recv_wr *badl = NULL;
	uint64_t site = SITE();
	unsigned n;
	int ret, saved;

	if (!s)
		return ENODEV;
	n = rec_recv_chain(KIND_srecv, KEY_srq, srq, wr, site);
	ret = s->post_srq_recv(srq, wr, &badl);
	saved = errno;
	if (bad)
		*bad = badl;
	if (ret)
		recv_failed(KEY_srq, srq, wr, badl, n, ret);
	errno = saved;
	return ret;
}

static int wrap_poll_cq(struct ibv_cq *cq, int num, struct ibv_wc *wc)
{
	struct ctx_slot *s = find_slot(cq->context);
	int n, saved;

	if (!s)
		return -1;
	n = s->poll_cq(cq, num, wc);
	saved = errno;
	if (n < 0) {
		struct rec r;

		begin(&r, KIND_pollerr);
		put_ptr(&r, KEY_cq, cq);
		put_int(&r, KEY_ret, n);
		emit(&r);
	}
	for (int i = 0; i < n; i++) {
		struct rec r;

		begin(&r, KIND_wc);
		put_ptr(&r, KEY_cq, cq);
		put_uint(&r, KEY_wr, wc[i].wr_id);
		put_uint(&r, KEY_st, wc[i].status);
		put_uint(&r, KEY_op, wc[i].opcode);
		put_uint(&r, KEY_qpn, wc[i].qp_num);
		emit(&r);
	}
	errno = saved;
	return n;
}

static unsigned qpx_hash(const struct ibv_qp_ex *q) { return (unsigned)(((uintptr_t)q >> 4) % MAX_QPX); }

static struct qpx_slot *qpx_find(const struct ibv_qp_ex *q)
{
	for (unsigned i = qpx_hash(q), k = 0; k < MAX_QPX; k++, i = (i + 1) % MAX_QPX) {
		struct ibv_qp_ex *p = __atomic_load_n(&qpx_slots[i].qpx, __ATOMIC_ACQUIRE);

		if (p == q)
			return &qpx_slots[i];
		if (!p)
			return NULL;
	}
	return NULL;
}

/* qpx_note adds the WR a builder just started to its QP's batch. */
static struct qpx_slot *qpx_note(struct ibv_qp_ex *q, enum ibv_wr_opcode op)
{
	struct qpx_slot *s = qpx_find(q);

	if (!s)
		return NULL;
	if (s->n < QPX_BATCH) {
		s->batch[s->n].id = q->wr_id;
		s->batch[s->n].op = (uint8_t)op;
		s->batch[s->n].sig = (q->wr_flags & IBV_SEND_SIGNALED) != 0;
		s->n++;
	} else {
		s->overflow = 1;
	}
	return s;
}

static void qpx_start(struct ibv_qp_ex *q)
{
	struct qpx_slot *s = qpx_find(q);

	if (!s)
		return;
	s->n = 0;
	s->overflow = 0;
	s->wr_start(q);
}

static void qpx_abort(struct ibv_qp_ex *q)
{
	struct qpx_slot *s = qpx_find(q);

	if (!s)
		return;
	s->n = 0;
	s->wr_abort(q);
}

static int qpx_complete(struct ibv_qp_ex *q)
{
	struct qpx_slot *s = qpx_find(q);
	uint64_t site = SITE();
	int ret, saved;

	if (!s)
		return ENODEV;
	/* recorded before the provider rings the doorbell, as a post's WRs
	 * are (wrap_post_send) */
	for (int i = 0; i < s->n; i++) {
		struct rec r;

		begin(&r, KIND_send);
		put_ptr(&r, KEY_qp, &q->qp_base);
		put_uint(&r, KEY_site, site);
		put_uint(&r, KEY_wr, s->batch[i].id);
		put_uint(&r, KEY_op, s->batch[i].op);
		put_uint(&r, KEY_sig, s->batch[i].sig);
		emit(&r);
	}
	if (s->overflow) {
		struct rec r;

		begin(&r, KIND_qpxlost);
		put_ptr(&r, KEY_qp, &q->qp_base);
		emit(&r);
	}
	ret = s->wr_complete(q);
	saved = errno;
	/* ibv_wr_complete posts the whole batch or, failing, none of it (ibv_wr_post(3)) */
	if (ret && s->n)
		rec_unposted(KEY_qp, &q->qp_base, (unsigned)s->n, 0, ret);
	s->n = 0;
	errno = saved;
	return ret;
}

static void qpx_send(struct ibv_qp_ex *q)
{
	struct qpx_slot *s = qpx_note(q, IBV_WR_SEND);
	if (s)
		s->wr_send(q);
}

static void qpx_send_imm(struct ibv_qp_ex *q, __be32 imm)
{
	struct qpx_slot *s = qpx_note(q, IBV_WR_SEND_WITH_IMM);
	if (s)
		s->wr_send_imm(q, imm);
}

static void qpx_send_inv(struct ibv_qp_ex *q, uint32_t rkey)
{
	struct qpx_slot *s = qpx_note(q, IBV_WR_SEND_WITH_INV);
	if (s)
		s->wr_send_inv(q, rkey);
}

static void qpx_rdma_write(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr)
{
	struct qpx_slot *s = qpx_note(q, IBV_WR_RDMA_WRITE);
	if (s)
		s->wr_rdma_write(q, rkey, addr);
}

static void qpx_rdma_write_imm(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr, __be32 imm)
{
	struct qpx_slot *s = qpx_note(q, IBV_WR_RDMA_WRITE_WITH_IMM);
	if (s)
		s->wr_rdma_write_imm(q, rkey, addr, imm);
}

static void qpx_rdma_read(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr)
{
	struct qpx_slot *s = qpx_note(q, IBV_WR_RDMA_READ);
	if (s)
		s->wr_rdma_read(q, rkey, addr);
}

static void qpx_atomic_cmp_swp(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr, uint64_t cmp, uint64_t swp)
{
	struct qpx_slot *s = qpx_note(q, IBV_WR_ATOMIC_CMP_AND_SWP);
	if (s)
		s->wr_atomic_cmp_swp(q, rkey, addr, cmp, swp);
}

static void qpx_atomic_fetch_add(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr, uint64_t add)
{
	struct qpx_slot *s = qpx_note(q, IBV_WR_ATOMIC_FETCH_AND_ADD);
	if (s)
		s->wr_atomic_fetch_add(q, rkey, addr, add);
}

static void qpx_local_inv(struct ibv_qp_ex *q, uint32_t rkey)
{
	struct qpx_slot *s = qpx_note(q, IBV_WR_LOCAL_INV);
	if (s)
		s->wr_local_inv(q, rkey);
}

static void qpx_bind_mw(struct ibv_qp_ex *q, struct ibv_mw *mw, uint32_t rkey, const struct ibv_mw_bind_info *info)
{
	struct qpx_slot *s = qpx_note(q, IBV_WR_BIND_MW);
	if (s)
		s->wr_bind_mw(q, mw, rkey, info);
}

static void qpx_send_tso(struct ibv_qp_ex *q, void *hdr, uint16_t hdr_sz, uint16_t mss)
{
	struct qpx_slot *s = qpx_note(q, IBV_WR_TSO);
	if (s)
		s->wr_send_tso(q, hdr, hdr_sz, mss);
}

/* ATOMIC_WRITE and FLUSH (rdma-core 44 and later) are named by number and
 * reached past wr_abort, where struct ibv_qp_ex grew them (it only grows at
 * its end), so that the shim builds against older headers too; a provider
 * that accepts their send_ops_flags has them. */
#define QPX_WITH_FLUSH (1ull << 11)
#define QPX_WITH_ATOMIC_WRITE (1ull << 12)
#define QPX_WR_FLUSH 14
#define QPX_WR_ATOMIC_WRITE 15
struct qpx_tail {
	void (*wr_atomic_write)(struct ibv_qp_ex *, uint32_t, uint64_t, const void *);
	void (*wr_flush)(struct ibv_qp_ex *, uint32_t, uint64_t, size_t, uint8_t, uint8_t);
};
static struct qpx_tail *qpx_tail(struct ibv_qp_ex *q) { return (struct qpx_tail *)(&q->wr_abort + 1); }

static void qpx_atomic_write(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr, const void *buf)
{
	struct qpx_slot *s = qpx_note(q, QPX_WR_ATOMIC_WRITE);
	if (s)
		s->wr_atomic_write(q, rkey, addr, buf);
}

static void qpx_flush(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr, size_t len, uint8_t type, uint8_t level)
{
	struct qpx_slot *s = qpx_note(q, QPX_WR_FLUSH);
	if (s)
		s->wr_flush(q, rkey, addr, len, type, level);
}

/* qpx_wrap takes over q's builders when the shim knows every operation
 * its send_ops_flags ask for (one newer than ATOMIC_WRITE leaves the QP
 * untraced, and named in a note). It returns whether it did. */
static int qpx_wrap(struct ibv_qp_ex *q, uint64_t ops)
{
	const uint64_t known = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
			       IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
			       IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_SEND_WITH_INV |
			       IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_TSO | QPX_WITH_FLUSH | QPX_WITH_ATOMIC_WRITE;
	int done = 0;

	if (!q || (ops & ~known))
		return 0;
	pthread_mutex_lock(&slots_mu);
	for (unsigned i = qpx_hash(q), k = 0; k < MAX_QPX && !done; k++, i = (i + 1) % MAX_QPX) {
		struct qpx_slot *s = &qpx_slots[i];

		if (s->qpx && s->qpx != QPX_TOMB)
			continue;
		s->wr_start = q->wr_start;
		s->wr_complete = q->wr_complete;
		s->wr_abort = q->wr_abort;
		s->wr_send = q->wr_send;
		s->wr_send_imm = q->wr_send_imm;
		s->wr_send_inv = q->wr_send_inv;
		s->wr_rdma_write = q->wr_rdma_write;
		s->wr_rdma_write_imm = q->wr_rdma_write_imm;
		s->wr_rdma_read = q->wr_rdma_read;
		s->wr_atomic_cmp_swp = q->wr_atomic_cmp_swp;
		s->wr_atomic_fetch_add = q->wr_atomic_fetch_add;
		s->wr_local_inv = q->wr_local_inv;
		s->wr_bind_mw = q->wr_bind_mw;
		s->wr_send_tso = q->wr_send_tso;
		s->wr_atomic_write = ops & QPX_WITH_ATOMIC_WRITE ? qpx_tail(q)->wr_atomic_write : NULL;
		s->wr_flush = ops & QPX_WITH_FLUSH ? qpx_tail(q)->wr_flush : NULL;
		s->n = 0;
		__atomic_store_n(&s->qpx, q, __ATOMIC_RELEASE);
#define WRAP(f, w) do { if (q->f) q->f = w; } while (0)
		WRAP(wr_start, qpx_start);
		WRAP(wr_complete, qpx_complete);
		WRAP(wr_abort, qpx_abort);
		WRAP(wr_send, qpx_send);
		WRAP(wr_send_imm, qpx_send_imm);
		WRAP(wr_send_inv, qpx_send_inv);
		WRAP(wr_rdma_write, qpx_rdma_write);
		WRAP(wr_rdma_write_imm, qpx_rdma_write_imm);
		WRAP(wr_rdma_read, qpx_rdma_read);
		WRAP(wr_atomic_cmp_swp, qpx_atomic_cmp_swp);
		WRAP(wr_atomic_fetch_add, qpx_atomic_fetch_add);
		WRAP(wr_local_inv, qpx_local_inv);
		WRAP(wr_bind_mw, qpx_bind_mw);
		WRAP(wr_send_tso, qpx_send_tso);
		if (s->wr_atomic_write)
			qpx_tail(q)->wr_atomic_write = qpx_atomic_write;
		if (s->wr_flush)
			qpx_tail(q)->wr_flush = qpx_flush;
#undef WRAP
		done = 1;
	}
	pthread_mutex_unlock(&slots_mu);
	return done;
}

/* qpx_forget frees qp's slot when it is destroyed (a tombstone, so that
 * probes past it still find later QPs). */
static void qpx_forget(struct ibv_qp *qp)
{
	struct qpx_slot *s;

	if (!real_qp_to_qp_ex)
		return;
	pthread_mutex_lock(&slots_mu);
	for (unsigned i = 0; i < MAX_QPX; i++) {
		s = &qpx_slots[i];
		if (s->qpx && s->qpx != QPX_TOMB && &s->qpx->qp_base == qp)
			__atomic_store_n(&s->qpx, QPX_TOMB, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&slots_mu);
}

static struct ibv_qp *wrap_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr)
{
	struct ctx_slot *s = find_slot(ctx);
	uint64_t site = SITE();
	struct ibv_qp *qp;
	int saved, ex;

	if (!s) {
		errno = ENODEV;
		return NULL;
	}
	qp = s->create_qp_ex(ctx, attr);
	saved = errno;
	site = create_site ? create_site : site;
	/* ex=1: an ibv_qp_ex send path the shim could not take over */
	ex = (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && attr->send_ops_flags;
	if (qp && ex && real_qp_to_qp_ex && qpx_wrap(real_qp_to_qp_ex(qp), attr->send_ops_flags))
		ex = 0;
	rec_qp("ibv_create_qp_ex", qp, saved, ctx, &attr->cap, attr->sq_sig_all, ex, site);
	errno = saved;
	return qp;
}

/* cqx_slot holds one ibv_cq_ex's original start_poll and next_poll (they
 * live in each CQ, per provider), open addressed by pointer as qpx_slots
 * are; the wrappers record each completion they return. */
#define MAX_CQX 1024
struct cqx_slot {
	struct ibv_cq_ex *cq; /* NULL: free; CQX_TOMB: was used */
	int (*start_poll)(struct ibv_cq_ex *, struct ibv_poll_cq_attr *);
	int (*next_poll)(struct ibv_cq_ex *);
};
#define CQX_TOMB ((struct ibv_cq_ex *)1)
static struct cqx_slot cqx_slots[MAX_CQX];

static unsigned cqx_hash(const struct ibv_cq_ex *q) { return (unsigned)(((uintptr_t)q >> 4) % MAX_CQX); }

static struct cqx_slot *cqx_find(const struct ibv_cq_ex *q)
{
	for (unsigned i = cqx_hash(q), k = 0; k < MAX_CQX; k++, i = (i + 1) % MAX_CQX) {
		struct ibv_cq_ex *p = __atomic_load_n(&cqx_slots[i].cq, __ATOMIC_ACQUIRE);

		if (p == q)
			return &cqx_slots[i];
		if (!p)
			return NULL;
	}
	return NULL;
}

/* cqx_record records the completion start_poll or next_poll returned (ret
 * 0), or the poll's failure (ENOENT is an empty CQ, not one). The opcode is
 * read on success only: it is undefined otherwise (ibv_poll_cq(3)). */
static void cqx_record(struct ibv_cq_ex *cq, int ret)
{
	struct rec r;

	if (ret == ENOENT)
		return;
	if (ret) {
		begin(&r, KIND_pollerr);
		put_ptr(&r, KEY_cq, cq);
		put_int(&r, KEY_ret, ret);
		emit(&r);
		return;
	}
	begin(&r, KIND_wc);
	put_ptr(&r, KEY_cq, cq);
	put_uint(&r, KEY_wr, cq->wr_id);
	put_uint(&r, KEY_st, cq->status);
	put_uint(&r, KEY_op, cq->status == IBV_WC_SUCCESS ? cq->read_opcode(cq) : 0);
	put_uint(&r, KEY_qpn, cq->read_qp_num(cq));
	emit(&r);
}

static int cqx_start_poll(struct ibv_cq_ex *cq, struct ibv_poll_cq_attr *attr)
{
	struct cqx_slot *s = cqx_find(cq);
	int ret, saved;

	if (!s)
		return ENODEV;
	ret = s->start_poll(cq, attr);
	saved = errno;
	cqx_record(cq, ret);
	errno = saved;
	return ret;
}

static int cqx_next_poll(struct ibv_cq_ex *cq)
{
	struct cqx_slot *s = cqx_find(cq);
	int ret, saved;

	if (!s)
		return ENODEV;
	ret = s->next_poll(cq);
	saved = errno;
	cqx_record(cq, ret);
	errno = saved;
	return ret;
}

/* cqx_wrap takes over cq's poll entries; it returns whether it did (the
 * table may be full). */
static int cqx_wrap(struct ibv_cq_ex *cq)
{
	int done = 0;

	pthread_mutex_lock(&slots_mu);
	for (unsigned i = cqx_hash(cq), k = 0; k < MAX_CQX && !done; k++, i = (i + 1) % MAX_CQX) {
		struct cqx_slot *s = &cqx_slots[i];

		if (s->cq && s->cq != CQX_TOMB)
			continue;
		s->start_poll = cq->start_poll;
		s->next_poll = cq->next_poll;
		__atomic_store_n(&s->cq, cq, __ATOMIC_RELEASE);
		cq->start_poll = cqx_start_poll;
		cq->next_poll = cqx_next_poll;
		done = 1;
	}
	pthread_mutex_unlock(&slots_mu);
	return done;
}

/* cqx_forget frees cq's slot when it is destroyed. */
static void cqx_forget(struct ibv_cq *cq)
{
	pthread_mutex_lock(&slots_mu);
	for (unsigned i = 0; i < MAX_CQX; i++)
		if (cqx_slots[i].cq && cqx_slots[i].cq != CQX_TOMB && ibv_cq_ex_to_cq(cqx_slots[i].cq) == cq)
			__atomic_store_n(&cqx_slots[i].cq, CQX_TOMB, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&slots_mu);
}

/* wrap_create_cq_ex asks the provider for the QP number in every completion
 * (IBV_WC_EX_WITH_QP_NUM, which the trace needs to place it) on top of what
 * the program asked for, and gives the program its own attributes back; a
 * provider that refuses is asked again with the program's alone, and that
 * CQ is not traced (ex=1). */
static struct ibv_cq_ex *wrap_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *attr)
{
	struct ctx_slot *s = find_slot(ctx);
	uint64_t site = create_site ? create_site : SITE();
	struct ibv_cq_ex *cq;
	uint64_t asked = attr->wc_flags;
	int saved, untraced;

	if (!s) {
		errno = ENODEV;
		return NULL;
	}
	attr->wc_flags |= IBV_WC_EX_WITH_QP_NUM;
	cq = s->create_cq_ex(ctx, attr);
	attr->wc_flags = asked;
	if (!cq && !(asked & IBV_WC_EX_WITH_QP_NUM))
		cq = s->create_cq_ex(ctx, attr);
	else if (cq)
		asked |= IBV_WC_EX_WITH_QP_NUM;
	saved = errno;
	untraced = !(asked & IBV_WC_EX_WITH_QP_NUM) || !cq || !cq->start_poll || !cq->next_poll || !cq->read_qp_num || !cqx_wrap(cq);
	rec_cq("ibv_create_cq_ex", ibv_cq_ex_to_cq(cq), saved, ctx, untraced, site);
	errno = saved;
	return cq;
}

static struct ibv_srq *wrap_create_srq_ex(struct ibv_context *ctx, struct ibv_srq_init_attr_ex *attr)
{
	struct ctx_slot *s = find_slot(ctx);
	uint64_t site = create_site ? create_site : SITE();
	struct ibv_srq *srq;
	int saved;

	if (!s) {
		errno = ENODEV;
		return NULL;
	}
	srq = s->create_srq_ex(ctx, attr);
	saved = errno;
	rec_srq("ibv_create_srq_ex", srq, saved, ctx, attr->attr.max_wr, site);
	errno = saved;
	return srq;
}

/* ---- the exported verbs ---- */

/* wrap_context saves ctx's ops and installs the wrappers; it returns 0 when
 * the table is full (the context then runs untraced, and says so). */
static int wrap_context(struct ibv_context *ctx)
{
	struct verbs_context *vctx;
	int done = 0;

	pthread_mutex_lock(&slots_mu);
	open_records();
	for (int i = 0; i < MAX_CONTEXTS && !done; i++) {
		struct ctx_slot *s = &slots[i];

		if (s->ctx)
			continue;
		s->post_send = ctx->ops.post_send;
		s->post_recv = ctx->ops.post_recv;
		s->post_srq_recv = ctx->ops.post_srq_recv;
		s->poll_cq = ctx->ops.poll_cq;
		s->create_qp_ex = NULL;
		s->create_cq_ex = NULL;
		s->create_srq_ex = NULL;
		if ((vctx = verbs_get_ctx_op(ctx, create_qp_ex)))
			s->create_qp_ex = vctx->create_qp_ex;
		if ((vctx = verbs_get_ctx_op(ctx, create_cq_ex)))
			s->create_cq_ex = vctx->create_cq_ex;
		if ((vctx = verbs_get_ctx_op(ctx, create_srq_ex)))
			s->create_srq_ex = vctx->create_srq_ex;
		__atomic_store_n(&s->ctx, ctx, __ATOMIC_RELEASE);
		if (s->post_send)
			ctx->ops.post_send = wrap_post_send;
		if (s->post_recv)
			ctx->ops.post_recv = wrap_post_recv;
		if (s->post_srq_recv)
			ctx->ops.post_srq_recv = wrap_post_srq_recv;
		if (s->poll_cq)
			ctx->ops.poll_cq = wrap_poll_cq;
		vctx = verbs_get_ctx(ctx);
		if (s->create_qp_ex)
			vctx->create_qp_ex = wrap_create_qp_ex;
		if (s->create_cq_ex)
			vctx->create_cq_ex = wrap_create_cq_ex;
		if (s->create_srq_ex)
			vctx->create_srq_ex = wrap_create_srq_ex;
		done = 1;
	}
	pthread_mutex_unlock(&slots_mu);
	return done;
}

struct ibv_context *ibv_open_device(struct ibv_device *dev)
{
	struct ibv_context *ctx;
	int saved;

	if (!real_open_device)
		resolve_all(RTLD_NEXT); /* libibverbs loaded since, as another's dependency */
	if (!real_open_device) {
		errno = ENOSYS;
		return NULL;
	}
	ctx = real_open_device(dev);
	saved = errno;
	if (ctx) {
		struct rec r;
		int traced = wrap_context(ctx);

		__atomic_store_n(&opened, 1, __ATOMIC_RELAXED);

		begin(&r, KIND_open);
		put_ptr(&r, KEY_ctx, ctx);
		put_name(&r, KEY_dev, dev->name, 64);
		put_uint(&r, KEY_traced, traced);
		emit(&r);
	}
	errno = saved;
	return ctx;
}

int ibv_close_device(struct ibv_context *ctx)
{
	struct rec r;
	int ret, saved;

	ret = real_close_device(ctx);
	saved = errno;
	if (ret == 0) {
		struct ctx_slot *s = find_slot(ctx);

		if (s) {
			pthread_mutex_lock(&slots_mu);
			__atomic_store_n(&s->ctx, NULL, __ATOMIC_RELEASE);
			pthread_mutex_unlock(&slots_mu);
		}
	}
	begin(&r, KIND_close);
	put_ptr(&r, KEY_ctx, ctx);
	put_int(&r, KEY_ret, ret);
	emit(&r);
	errno = saved;
	return ret;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context, struct ibv_comp_channel *channel, int comp_vector)
{
	uint64_t site = SITE();
	struct ibv_cq *cq;
	int saved;

	create_site = site;
	cq = real_create_cq(ctx, cqe, cq_context, channel, comp_vector);
	saved = errno;
	create_site = 0;
	rec_cq("ibv_create_cq", cq, saved, ctx, 0, site);
	errno = saved;
	return cq;
}

/* rec_destroy writes "KIND t= pid= tid= KEY=OBJ [ret=RET]"; a destroy is
 * recorded before it is called too ("begin"), so one that blocks (a QP with
 * unacknowledged events) shows. */
static void rec_destroy(enum rec_kind kind, enum rec_key key, const void *obj, int phase_end, int ret, uint64_t site)
{
	struct rec r;

	if (!phase_end)
		scan_modules();
	begin(&r, kind);
	put_ptr(&r, key, obj);
	put_uint(&r, KEY_site, site);
	if (phase_end)
		put_int(&r, KEY_ret, ret);
	else
		put_uint(&r, KEY_begin, 1);
	emit(&r);
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
	uint64_t site = SITE();
	int ret, saved;

	rec_destroy(KIND_cqd, KEY_cq, cq, 0, 0, site);
	ret = real_destroy_cq(cq);
	saved = errno;
	if (ret == 0)
		cqx_forget(cq);
	rec_destroy(KIND_cqd, KEY_cq, cq, 1, ret, site);
	errno = saved;
	return ret;
}

struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	uint64_t site = SITE();
	struct ibv_srq *srq;
	int saved;

	create_site = site;
	srq = real_create_srq(pd, attr);
	saved = errno;
	create_site = 0;
	rec_srq("ibv_create_srq", srq, saved, pd->context, attr->attr.max_wr, site);
	errno = saved;
	return srq;
}

int ibv_destroy_srq(struct ibv_srq *srq)
{
	uint64_t site = SITE();
	int ret, saved;

	rec_destroy(KIND_srqd, KEY_srq, srq, 0, 0, site);
	ret = real_destroy_srq(srq);
	saved = errno;
	rec_destroy(KIND_srqd, KEY_srq, srq, 1, ret, site);
	errno = saved;
	return ret;
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	uint64_t site = SITE();
	struct ibv_qp *qp;
	int saved;

	create_site = site;
	qp = real_create_qp(pd, attr);
	saved = errno;
	create_site = 0;
	rec_qp("ibv_create_qp", qp, saved, pd->context, &attr->cap, attr->sq_sig_all, 0, site);
	errno = saved;
	return qp;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	int ret = real_modify_qp(qp, attr, mask);
	int saved = errno;

	if (mask & IBV_QP_STATE) {
		struct rec r;

		begin(&r, KIND_mod);
		put_ptr(&r, KEY_qp, qp);
		put_uint(&r, KEY_state, attr->qp_state);
		put_int(&r, KEY_ret, ret);
		emit(&r);
	}
	errno = saved;
	return ret;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
	uint64_t site = SITE();
	int ret, saved;

	rec_destroy(KIND_qpd, KEY_qp, qp, 0, 0, site);
	ret = real_destroy_qp(qp);
	saved = errno;
	if (ret == 0)
		qpx_forget(qp);
	rec_destroy(KIND_qpd, KEY_qp, qp, 1, ret, site);
	errno = saved;
	return ret;
}

/* rec_event writes an async event's record: its type and the object it names. */
static void rec_event(enum rec_kind kind, struct ibv_context *ctx, const struct ibv_async_event *ev, uint64_t site)
{
	struct rec r;

	if (site)
		scan_modules();
	begin(&r, kind);
	put_ptr(&r, KEY_ctx, ctx);
	if (site)
		put_uint(&r, KEY_site, site);
	put_uint(&r, KEY_type, ev->event_type);
	switch (ev->event_type) {
	case IBV_EVENT_CQ_ERR:
		put_ptr(&r, KEY_cq, ev->element.cq);
		break;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		put_ptr(&r, KEY_srq, ev->element.srq);
		break;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		put_uint(&r, KEY_port, (uint64_t)ev->element.port_num);
		break;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		put_ptr(&r, KEY_qp, ev->element.qp);
		if (ev->element.qp)
			put_uint(&r, KEY_qpn, ev->element.qp->qp_num);
		break;
	default: /* IBV_EVENT_DEVICE_FATAL, IBV_EVENT_WQ_FATAL (a WQ, not traced) and newer kinds: the type only */
		break;
	}
	emit(&r);
}

int ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev)
{
	uint64_t site = SITE();
	int ret = real_get_async_event(ctx, ev);
	int saved = errno;

	if (ret == 0)
		rec_event(KIND_ev, ctx, ev, site);
	errno = saved;
	return ret;
}

void ibv_ack_async_event(struct ibv_async_event *ev)
{
	int saved;

	/* recorded first: the event's object may be freed as soon as it is acknowledged */
	saved = errno;
	rec_event(KIND_ack, NULL, ev, 0);
	errno = saved;
	real_ack_async_event(ev);
}

__attribute__((destructor)) static void shim_fini(void)
{
	struct rec r;
	int saved = errno;

	if (!__atomic_load_n(&opened, __ATOMIC_RELAXED))
		return;
	begin(&r, KIND_exit);
	emit(&r);
	errno = saved;
}
