/* fs_pool.h -- the core's one thread pool: every product that splits its work between threads
 * (float, quantized, attention) goes through fs_pool_run.
 *
 * Contract for callers:
 *   - the work is cut into `nchunks` independent chunks (typically groups of output columns:
 *     each thread streams its own part of W), and chunk c's result must not depend on which
 *     thread runs it or in what order chunks run (results are bit-identical for any thread
 *     count);
 *   - fn(ctx, c) is called exactly once for every c in [0, nchunks); fs_pool_run returns when
 *     all calls have returned; the caller's thread takes part;
 *   - fn must not call fs_pool_run (no nesting), must not touch Python, and must be
 *     noexcept (no longjmp out of it). A nested call runs its chunks serially on the calling
 *     thread (a build with FS_DEBUG aborts instead, to find the caller);
 *   - Small products should not ask for threads: fs_pool_run with nchunks <= 1, or
 *     fs_pool_threads() == 1, runs every chunk on the caller with no synchronisation
 *     (fs_pool_chunks says how many chunks a piece of work is worth).
 *   - Several threads of the process may call fs_pool_run at once (e.g. two Python threads,
 *     each decoding its own model): one of them gets the pool's workers, the others run their
 *     chunks serially on their own thread. Either way every chunk runs exactly once.
 *
 * Threads: fs_pool_set_threads(n) (1 <= n <= FS_POOL_MAX; out-of-range values are clamped)
 * takes effect at the next fs_pool_run; the Python layer's default is the number of CPUs the
 * process may run on (os.sched_getaffinity). The pool is the caller plus n - 1 persistent
 * workers, started on the first run that needs them and restarted when n changes. A worker
 * claims chunks dynamically (a slow or preempted thread just claims fewer); between jobs it
 * spins for FASTSPEC_SPIN_US microseconds (environment, read once; default 30; longer inside
 * fs_pool_keep_awake), then sleeps (a futex on Linux, a condition variable elsewhere); the
 * caller waits for the last chunk the same way. Workers found asleep right after a job (they
 * spun without being scheduled: another process holds their CPU) are woken at most once per
 * FS_POOL_WAKE_GAP_NS; the jobs between run on the caller alone (fs_pool.c). After fork() the
 * child starts with no workers (it starts its own on first use).
 * Builds for Windows (no pthreads) run every chunk on the caller.
 *
 * One pool per process: every extension links its own copy of the core, and the copies reach
 * the owner's pool through the shared dispatch table (fs_isa.h, field `pool`).
 */
#ifndef FS_POOL_H
#define FS_POOL_H

#include <stddef.h>

typedef void (*fs_pool_fn)(void *ctx, int chunk);

void fs_pool_run(fs_pool_fn fn, void *ctx, int nchunks);
/* Several independent jobs run as one (count <= FS_POOL_JOBS_MAX): one wake of the workers and
 * one wait instead of `count`, each thread claiming chunks across the jobs (chunk c of job i
 * is fn_i(ctx_i, c) exactly once, as fs_pool_run would call it). Jobs of at most one chunk
 * each run on the caller, job after job; when one job is cut, the threads take them all, so a
 * job too small to cut runs beside it. The products of one input with several matrices (a
 * layer's q, k and v; its gate and up) use it. */
typedef struct {
    fs_pool_fn fn;
    void *ctx;
    int nchunks;
} fs_pool_job;
#define FS_POOL_JOBS_MAX 4
void fs_pool_run_jobs(const fs_pool_job *jobs, int count);
int fs_pool_threads(void);
void fs_pool_set_threads(int n);
/* 1 when the pool has its workers and none of them sleeps (they spin after a recent job), so
 * a job handed out now starts on every thread at once; 0 otherwise (one thread, workers not
 * started, asleep, a build without threads, or a worker lately preempted inside a chunk:
 * FS_POOL_STALL_HOLD_NS in fs_pool.c). A hint for work that pays off in parallel only when no
 * worker must be woken: it may be stale by the time the caller acts on it. */
int fs_pool_awake(void);
/* fs_pool_keep_awake(1) before a long run of jobs with work on the caller between them (the
 * layers of a block of rows), fs_pool_keep_awake(0) after it (the calls pair per thread and
 * may nest; an unpaired 0 does nothing). The jobs this thread hands out in between keep the
 * pool awake: the workers after them, and the caller waiting for their last chunk, spin up to
 * FS_POOL_KEEP_SPIN_NS (fs_pool.c, 1 ms) instead of the spin (none with FASTSPEC_SPIN_US=0),
 * and a worker woken on the caller's CPU moves to another; unless a keeping caller lost its
 * CPU in two windows less than FS_POOL_KEEP_LOST_GAP_NS (50 ms) apart in the last
 * FS_POOL_KEEP_QUIET_NS (1 s). Only where and how long threads wait: the same chunks. */
void fs_pool_keep_awake(int on);
/* How long a thread of this copy's pool that waits now spins before it sleeps, in ns: the
 * spin, or FS_POOL_KEEP_SPIN_NS while the pool keeps awake; 0 with FASTSPEC_SPIN_US=0 and in
 * builds without threads. For tests/c/pool.c, which links one copy (not through the dispatch
 * table). */
long fs_pool_spin_limit_ns(void);

/* The most threads a pool runs (fs_pool_set_threads clamps to it). */
#define FS_POOL_MAX 1024
/* fs_pool_chunks' targets: about this many chunks per thread (dynamic claiming balances a
 * busy neighbour), no chunk below FS_POOL_CHUNK_MIN_COST units of cost (a few microseconds
 * of streaming: the claim and the cache lines shared at chunk edges must stay negligible),
 * and more chunks when they would exceed FS_POOL_CHUNK_MAX_COST (a worker preempted inside a
 * chunk stalls the caller until it runs again: keep chunks to tens of microseconds). The
 * cost unit is the caller's; the products count weights (one weight ~ 2-4 bytes read). */
#ifndef FS_POOL_CHUNKS_PER_THREAD
#define FS_POOL_CHUNKS_PER_THREAD 8
#endif
#ifndef FS_POOL_CHUNK_MIN_COST
#define FS_POOL_CHUNK_MIN_COST 32768
#endif
#ifndef FS_POOL_CHUNK_MAX_COST
#define FS_POOL_CHUNK_MAX_COST 262144
#endif

/* How many chunks to cut `units` equal units of work into (each costing `unit_cost`, each
 * chunk at least `min_units` units) at the current thread count: 1 means "run it on the
 * caller". Where it is more than the thread count it is a multiple of it (equal shares on
 * threads of equal speed). Chunk c of n then covers units [c * units / n, (c + 1) * units / n). */
int fs_pool_chunks(int units, size_t unit_cost, int min_units);

/* Work over items [0, n) that can fail (a load-time pass over a file's blocks): cut into at
 * most FS_POOL_RANGES_MAX chunks of whole items (fs_pool_chunks' count, each item costing
 * `item_cost`, kept a multiple of the threads), fn(ctx, begin, end) run once for each chunk
 * through fs_pool_run; each chunk's status is kept apart (no shared writes), and the first
 * nonzero one in chunk order is returned, else 0. The same rules as fs_pool_run for fn. */
#define FS_POOL_RANGES_MAX 64
typedef int (*fs_pool_range_fn)(void *ctx, size_t begin, size_t end);
int fs_pool_run_ranges(fs_pool_range_fn fn, void *ctx, size_t n, size_t item_cost);

/* The functions behind fs_pool_run, fs_pool_threads, fs_pool_set_threads, fs_pool_awake and
 * fs_pool_keep_awake in one copy of the core; the dispatch table (fs_isa.h) points at the
 * owner's. */
typedef struct fs_pool_ops {
    void (*run)(fs_pool_fn fn, void *ctx, int nchunks);
    int (*threads)(void);
    void (*set_threads)(int n);
    int (*awake)(void);
    void (*keep_awake)(int on);
} fs_pool_ops;

/* This copy's pool. */
extern const fs_pool_ops fs_pool_local;

#endif /* FS_POOL_H */
