/* fs_pool.c -- the thread pool (fs_pool.h): persistent workers that spin briefly, then sleep.
 *
 * One job at a time (the caller that owns the pool, `busy`). A job is fn + ctx + nchunks and
 * the 64-bit word `claim` = generation << 32 | chunks not yet claimed. A thread claims a chunk
 * by a compare-and-swap that checks the generation, so a worker that wakes late (its job
 * already finished, the next one perhaps being written) can never claim a chunk of a job it
 * did not see: it fails the swap and goes back to waiting. A successful claim also proves the
 * job is not finished (this chunk is not done), so fn/ctx/nchunks, written before the job was
 * published, stay valid until the claimer's own increment of `done`.
 *
 * Waiting: the workers wait for `seq` (the generation, a 32-bit futex word) to change, the
 * caller for `done` to reach nchunks. Both spin on a relaxed load with a pause for spin_ns,
 * then announce themselves (`sleepers`, `caller_sleeps`) and block; the other side reads the
 * announcement after its own store (both sequentially consistent), so it either sees the
 * sleeper and wakes it or the sleeper sees the new value and does not block. Nobody asleep:
 * no system call.
 */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* syscall(), clock_gettime() under -std=c11 */
#endif
#include "fs_pool.h"

#include "fs_isa.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32) || defined(FS_POOL_SERIAL)
#define FS_POOL_THREADED 0
#else
#define FS_POOL_THREADED 1
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <time.h>
#endif

/* Linux: futexes; elsewhere (and in tests/c's portable build) a mutex and condition variable
 * per waited word. */
#if FS_POOL_THREADED && defined(__linux__) && !defined(FS_TEST_PORTABLE) \
    && !defined(FS_POOL_NO_FUTEX)
#define FS_POOL_FUTEX 1
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define FS_POOL_FUTEX 0
#endif

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(FS_TEST_PORTABLE)
#define FS_POOL_RELAX() __builtin_ia32_pause()
#elif defined(__GNUC__) && defined(__aarch64__) && !defined(FS_TEST_PORTABLE)
#define FS_POOL_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define FS_POOL_RELAX() ((void)0)
#endif

static void fs_pool_serial(fs_pool_fn fn, void *ctx, int nchunks)
{
    for (int c = 0; c < nchunks; c++) fn(ctx, c);
}

int fs_pool_chunks(int units, size_t unit_cost, int min_units)
{
    int t = fs_pool_threads();
    if (t <= 1 || units < 2) return 1;
    double total = (double)units * (double)unit_cost;
    double n = (double)t * FS_POOL_CHUNKS_PER_THREAD;
    double most = total / FS_POOL_CHUNK_MAX_COST;
    if (n < most) n = most;
    double by_units = (double)(units / (min_units > 1 ? min_units : 1));
    double by_cost = total / FS_POOL_CHUNK_MIN_COST;
    if (n > by_units) n = by_units;
    if (n > by_cost) n = by_cost;
    if (n < 2) return 1;
    /* a multiple of the threads where there are that many: 3 chunks on 2 threads leave one
     * thread idle for a third of the work (the 576-column products at 2 threads) */
    int c = (int)n;
    return c > t ? c - c % t : c;
}

typedef struct {
    fs_pool_range_fn fn;
    void *ctx;
    size_t n;
    int nchunks;
    int rc[FS_POOL_RANGES_MAX];
} fs_pool_ranges_job;

static void fs_pool_range_chunk(void *ctx, int c)
{
    fs_pool_ranges_job *j = (fs_pool_ranges_job *)ctx;
    size_t begin = j->n * (size_t)c / (size_t)j->nchunks;
    size_t end = j->n * (size_t)(c + 1) / (size_t)j->nchunks;
    j->rc[c] = j->fn(j->ctx, begin, end);
}

int fs_pool_run_ranges(fs_pool_range_fn fn, void *ctx, size_t n, size_t item_cost)
{
    fs_pool_ranges_job j;
    int t = fs_pool_threads();
    if (n == 0) return 0;
    memset(&j, 0, sizeof j);
    j.fn = fn;
    j.ctx = ctx;
    j.n = n;
    j.nchunks = fs_pool_chunks(n > (size_t)INT_MAX ? INT_MAX : (int)n, item_cost, 1);
    if (j.nchunks > FS_POOL_RANGES_MAX)  /* a multiple of the threads where they are fewer */
        j.nchunks = t < FS_POOL_RANGES_MAX ? FS_POOL_RANGES_MAX - FS_POOL_RANGES_MAX % t
                                           : FS_POOL_RANGES_MAX;
    fs_pool_run(fs_pool_range_chunk, &j, j.nchunks);
    for (int c = 0; c < j.nchunks; c++)
        if (j.rc[c] != 0) return j.rc[c];
    return 0;
}

#if !FS_POOL_THREADED

static int fs_pool_want = 1;
static void fs_pool_run_impl(fs_pool_fn fn, void *ctx, int nchunks)
{
    fs_pool_serial(fn, ctx, nchunks);
}
static int fs_pool_threads_impl(void) { return fs_pool_want; }
static int fs_pool_awake_impl(void) { return 0; }
static void fs_pool_keep_awake_impl(int on) { (void)on; }
long fs_pool_spin_limit_ns(void) { return 0; }
static void fs_pool_set_threads_impl(int n)
{
    fs_pool_want = n < 1 ? 1 : n > FS_POOL_MAX ? FS_POOL_MAX : n;
}

#else /* FS_POOL_THREADED */

#define FS_POOL_SPIN_US_DEFAULT 30
/* Waking a sleeping worker costs the caller a system call and, in a virtual machine, an
 * interrupt to the other CPU (~10 us a wake on the machine below: the gaps between jobs grew
 * by that much per wake), and a worker asleep between jobs that follow each other within
 * microseconds is one whose CPU another process holds: it spun for its 30 us without being
 * scheduled. Beside a busy loop on one of 2 CPUs (AMD EPYC Zen 5
 * KVM guest, SmolLM-shape bf16 decode step, ~155 jobs a step), 60-72% of the jobs found the
 * worker asleep (2-3% on the idle machine), and 2 threads ran 1.2-1.3x slower than 1. So a
 * job that finds every worker asleep although the previous job ended less than a spin ago
 * (so they spun without being scheduled) wakes them only if no such job did so in the last
 * FS_POOL_WAKE_GAP_NS; otherwise it runs on the caller alone. Workers that fell asleep because
 * the caller was away longer than the spin (short steps of a small model, with Python between
 * them) are woken at once, as before. The chunks, and so the bits, are the same either way. */
#ifndef FS_POOL_WAKE_GAP_NS
#define FS_POOL_WAKE_GAP_NS 1000000L
#endif
/* fs_pool_awake answers 0 for this long after a job whose caller, its own chunks done, waited
 * for the workers longer than those chunks took plus a spin: a worker preempted inside a chunk
 * (another process holds its CPU), which every further job may wait on too. Work that is worth
 * threads only when they answer at once (a prompt's row-wise phases, small attention) then
 * stays on the caller. The 256-row prefill of the real SmolLM2 file at 2 threads beside a busy
 * loop (in-process A/B, Zen 4 EPYC, 2 vCPUs) took 1.04-1.09x as long with the row-wise phases
 * on the threads as on the caller without this hold, and 0.96-0.99x with it (idle: 0.90-0.96
 * without, 0.95-0.96 with); decode and 8- and 16-row steps, hold against none, 0.98-1.03
 * idle and beside the busy loop. */
#ifndef FS_POOL_STALL_HOLD_NS
#define FS_POOL_STALL_HOLD_NS 20000000L
#endif
/* A block of rows keeps the workers awake (fs_pool_keep_awake, around the layers of a step of
 * 2 rows or more: FS_KEEP_MIN_ROWS in fs_model.c; first written for prompts). Between a
 * prompt's jobs the caller works alone for 50-120 us (the embedded float16 target's 256-row
 * prompt at 2 threads on the Zen 4 EPYC KVM guest: the row-wise phases while fs_pool_awake says
 * no, the keys' transposition), longer than the 30 us spin, so the worker slept and was woken
 * at every job. After 100 ms of idle the prompt then took 17.6-18.1 ms at 2 threads, as long as
 * at 1 thread (10.2-10.3 ms when the previous prompt ended 1 ms before): in this guest, once a
 * vCPU has idled, Linux wakes the worker on the caller's own CPU (the idle vCPU looks
 * preempted: vcpu_is_preempted), and a late worker leaves most of each job to the caller.
 * After the jobs of a caller inside fs_pool_keep_awake, while the pool is keeping
 * (fs_pool_keeping):
 *   - both sides spin up to FS_POOL_KEEP_SPIN_NS instead of the spin (the caller, blocked
 *     on the last chunk, is woken as late as a worker);
 *   - a worker woken from sleep on the CPU of the caller that woke it moves to another CPU of
 *     its mask (fs_pool_leave_callers_cpu);
 *   - the caller watches its own CPU time (fs_pool_keep_check): when in two windows of at
 *     least FS_POOL_KEEP_WINDOW_NS, less than FS_POOL_KEEP_LOST_GAP_NS apart, it had its CPU for
 *     less than three quarters of the time and was switched out involuntarily, another thread
 *     shares its CPU (a process beside it), and the pool stops keeping for
 *     FS_POOL_KEEP_QUIET_NS.
 * Medians of 12 prompts per process, after 1 ms / 100 ms of idle, builds alternated: before,
 * 10.2-13.3 / 17.4-19.4 ms (four processes); the long spin and the check without the move
 * 9.7-10.1 / 17.1-18.0 (six); all three 9.8-12.6 / 10.3-12.7 (four). Beside a busy loop on
 * the other CPU, three processes each: 16.2-17.8 / 18.0-18.1 before, 16.5-17.7 / 18.1-18.2
 * after; without the check 19-26 ms (the worker spun on one CPU and left the caller to share
 * the other with the busy loop). The same chunks either way: only where and how long the
 * threads wait. */
#ifndef FS_POOL_KEEP_SPIN_NS
#define FS_POOL_KEEP_SPIN_NS 1000000L
#endif
#ifndef FS_POOL_KEEP_QUIET_NS
#define FS_POOL_KEEP_QUIET_NS 1000000000L
#endif
#ifndef FS_POOL_KEEP_WINDOW_NS
#define FS_POOL_KEEP_WINDOW_NS 1000000L
#endif
/* The pool stops keeping at a window in which the caller lost its CPU that starts less than
 * this long after the end of another such window: a process beside it takes the CPU every few
 * milliseconds, while a single interruption (the host's, in a virtual machine) would stop the
 * keeping for FS_POOL_KEEP_QUIET_NS, some 2000 steps of a small model (docs/PERFORMANCE.md,
 * 2026-12-06). */
#ifndef FS_POOL_KEEP_LOST_GAP_NS
#define FS_POOL_KEEP_LOST_GAP_NS 50000000L
#endif

static struct {
    /* the job; written by the owner of `busy` while no chunk of the previous job is claimable */
    fs_pool_fn fn;
    void *ctx;
    int nchunks;
    _Atomic uint64_t claim;    /* generation << 32 | chunks not yet claimed */
    _Atomic uint32_t done;     /* chunks finished (the caller waits on it) */
    _Atomic uint32_t seq;      /* generation of the last job (the workers wait on it) */
    _Atomic int sleepers;      /* workers blocked on seq */
    _Atomic int caller_sleeps; /* the caller is blocked on done */
    _Atomic int quit;          /* workers: exit at the next wake-up */
    _Atomic int busy;          /* a caller owns the pool (the workers, the job) */
    _Atomic int want;          /* threads asked for, caller included */
    int running;               /* workers started (owner of busy only) */
    _Atomic int live;          /* a copy of running that any thread may read */
    long spin_ns;              /* -1 until read from FASTSPEC_SPIN_US */
    long last_wake;            /* when a job last found every worker asleep and woke them */
    long last_end;             /* when the last job of the pool ended */
    _Atomic long last_stall;   /* when a job's caller last waited long for a worker (awake) */
    _Atomic int keep_job;      /* the last job's caller was inside fs_pool_keep_awake */
    _Atomic long last_preempt; /* when a caller inside fs_pool_keep_awake lost its CPU twice */
    _Atomic int waker_cpu;     /* the CPU of the keeping caller that last woke workers, or -1 */
    pthread_t tid[FS_POOL_MAX];
#if !FS_POOL_FUTEX
    pthread_mutex_t mu;
    pthread_cond_t cv_seq, cv_done;
#endif
} fs_pool = {
    .want = 1, .spin_ns = -1, .waker_cpu = -1,
#if !FS_POOL_FUTEX
    .mu = PTHREAD_MUTEX_INITIALIZER, .cv_seq = PTHREAD_COND_INITIALIZER,
    .cv_done = PTHREAD_COND_INITIALIZER,
#endif
};

/* 1 on a thread that runs chunks of a job now (a worker, or the caller inside its job). */
static _Thread_local int fs_pool_inside;
/* This thread's fs_pool_keep_awake depth, and while it is inside: the start of its current
 * window, wall clock (0: none yet), own CPU time and involuntary context switches
 * (fs_pool_keep_check). */
static _Thread_local int fs_pool_keep_depth;
static _Thread_local long fs_pool_keep_wall0, fs_pool_keep_cpu0, fs_pool_keep_nivcsw0;
/* When this thread's last window in which it lost its CPU ended (fs_pool_keep_check). */
static _Thread_local long fs_pool_keep_lost_at;

static long fs_pool_clock_ns(clockid_t id)
{
    struct timespec ts = {0, 0};
    clock_gettime(id, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static long fs_pool_now_ns(void) { return fs_pool_clock_ns(CLOCK_MONOTONIC); }

/* This thread's CPU time (0 if the clock fails: the check then reads a lost CPU). */
static long fs_pool_cpu_ns(void) { return fs_pool_clock_ns(CLOCK_THREAD_CPUTIME_ID); }

/* This thread's involuntary context switches so far (Linux: getrusage RUSAGE_THREAD); -1
 * where unknown. */
static long fs_pool_nivcsw(void)
{
#if defined(__linux__) && defined(RUSAGE_THREAD)
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) == 0) return ru.ru_nivcsw;
#endif
    return -1;
}

/* FASTSPEC_SPIN_US: decimal microseconds in [0, 1000000]; anything else is the default. */
static long fs_pool_read_spin(void)
{
    const char *s = getenv("FASTSPEC_SPIN_US");
    long us = FS_POOL_SPIN_US_DEFAULT;
    if (s != NULL && *s != '\0') {
        char *end;
        long v = strtol(s, &end, 10);
        if (*end == '\0' && v >= 0 && v <= 1000000) us = v;
    }
    return us * 1000L;
}

/* ---- blocking on a 32-bit word ------------------------------------------------------------ */

#if FS_POOL_FUTEX
static void fs_pool_block(_Atomic uint32_t *word, uint32_t seen)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
}
static void fs_pool_wake(_Atomic uint32_t *word, int count)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}
#else
static pthread_cond_t *fs_pool_cv(_Atomic uint32_t *word)
{
    return word == &fs_pool.seq ? &fs_pool.cv_seq : &fs_pool.cv_done;
}
static void fs_pool_block(_Atomic uint32_t *word, uint32_t seen)
{
    pthread_mutex_lock(&fs_pool.mu);
    while (atomic_load(word) == seen) pthread_cond_wait(fs_pool_cv(word), &fs_pool.mu);
    pthread_mutex_unlock(&fs_pool.mu);
}
static void fs_pool_wake(_Atomic uint32_t *word, int count)
{
    (void)count;
    pthread_mutex_lock(&fs_pool.mu);
    pthread_cond_broadcast(fs_pool_cv(word));
    pthread_mutex_unlock(&fs_pool.mu);
}
#endif

/* ---- the job ------------------------------------------------------------------------------ */

/* Claim and run chunks of generation g until none is left (or the job is another one). */
static void fs_pool_work(uint32_t g)
{
    uint64_t w = atomic_load_explicit(&fs_pool.claim, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(w >> 32) != g || (uint32_t)w == 0) return;
        if (!atomic_compare_exchange_weak_explicit(&fs_pool.claim, &w, w - 1,
                                                   memory_order_acquire, memory_order_acquire))
            continue;  /* w reloaded */
        int n = fs_pool.nchunks;  /* valid: this job cannot finish before our chunk */
        fs_pool.fn(fs_pool.ctx, n - (int)(uint32_t)w);
        uint32_t d = atomic_fetch_add(&fs_pool.done, 1) + 1;  /* seq_cst: see caller_sleeps */
        if (d == (uint32_t)n) {
            if (atomic_load(&fs_pool.caller_sleeps)) fs_pool_wake(&fs_pool.done, 1);
            return;
        }
        w = atomic_load_explicit(&fs_pool.claim, memory_order_acquire);
    }
}

/* The last job's caller was inside fs_pool_keep_awake (and has not left it), and no caller
 * lost its CPU there twice within FS_POOL_KEEP_LOST_GAP_NS in the last FS_POOL_KEEP_QUIET_NS
 * (see "A block of rows keeps the workers awake" above). */
static int fs_pool_keeping(long now)
{
    return atomic_load_explicit(&fs_pool.keep_job, memory_order_relaxed) &&
           now - atomic_load_explicit(&fs_pool.last_preempt, memory_order_relaxed) >=
               FS_POOL_KEEP_QUIET_NS;
}

/* How long a thread spins before it blocks: the spin (> 0), or FS_POOL_KEEP_SPIN_NS while the
 * pool is keeping. */
static long fs_pool_spin_most(long spin, long now)
{
    return spin < FS_POOL_KEEP_SPIN_NS && fs_pool_keeping(now) ? FS_POOL_KEEP_SPIN_NS : spin;
}

/* A thread that started spinning at t0 has spun long enough (fs_pool_spin_most). */
static int fs_pool_spun_out(long t0, long spin)
{
    long now = fs_pool_now_ns();
    return now - t0 > fs_pool_spin_most(spin, now);
}

/* A worker just woken from sleep, while the pool is keeping, on the CPU of the caller that
 * woke it (Linux, futex builds): it leaves that CPU out of its affinity mask, which migrates it
 * to another CPU of the mask, then restores the mask (three system calls, only then; if the
 * restore fails it is tried once more). Since Linux 6.2 the restored mask is also recorded as
 * the thread's own request, so a cpuset that later grows beyond it does not widen it. Not
 * outside a block of rows: beside a busy loop on the other of 2 CPUs, moving every woken
 * worker there made decode at 2 threads 1.11-1.18 times as slow as at 1 (1.03-1.05 without
 * the move). */
static void fs_pool_leave_callers_cpu(void)
{
#if FS_POOL_FUTEX
    if (!fs_pool_keeping(fs_pool_now_ns())) return;
    int cpu = sched_getcpu();
    if (cpu < 0 || cpu != atomic_load_explicit(&fs_pool.waker_cpu, memory_order_relaxed)) return;
    cpu_set_t mask, others;
    if (sched_getaffinity(0, sizeof mask, &mask) != 0 || !CPU_ISSET(cpu, &mask)) return;
    others = mask;
    CPU_CLR(cpu, &others);
    if (CPU_COUNT(&others) == 0) return;
    if (sched_setaffinity(0, sizeof others, &others) == 0 &&
        sched_setaffinity(0, sizeof mask, &mask) != 0)
        sched_setaffinity(0, sizeof mask, &mask);
#endif
}

/* Wait (spin, then block) until seq != seen; return the new seq. */
static uint32_t fs_pool_wait_job(uint32_t seen)
{
    long spin = fs_pool.spin_ns, t0 = spin > 0 ? fs_pool_now_ns() : 0;
    for (unsigned i = 1; spin > 0; i++) {
        uint32_t g = atomic_load_explicit(&fs_pool.seq, memory_order_acquire);
        if (g != seen) return g;
        FS_POOL_RELAX();
        if ((i & 15) == 0 && fs_pool_spun_out(t0, spin)) break;
    }
    for (;;) {
        atomic_fetch_add(&fs_pool.sleepers, 1);
        uint32_t g = atomic_load(&fs_pool.seq);
        if (g == seen) fs_pool_block(&fs_pool.seq, seen);
        atomic_fetch_sub(&fs_pool.sleepers, 1);
        g = atomic_load_explicit(&fs_pool.seq, memory_order_acquire);
        if (g != seen) {
            fs_pool_leave_callers_cpu();
            return g;
        }
    }
}

static void *fs_pool_worker(void *arg)
{
    uint32_t seen = (uint32_t)(uintptr_t)arg;
    fs_pool_inside = 1;
    for (;;) {
        seen = fs_pool_wait_job(seen);
        if (atomic_load(&fs_pool.quit)) return NULL;
        fs_pool_work(seen);
    }
}

/* The caller: wait (spin, then block) until all n chunks are done. */
static void fs_pool_wait_done(uint32_t n)
{
    long spin = fs_pool.spin_ns, t0 = spin > 0 ? fs_pool_now_ns() : 0;
    for (unsigned i = 1; spin > 0; i++) {
        if (atomic_load_explicit(&fs_pool.done, memory_order_acquire) == n) return;
        FS_POOL_RELAX();
        if ((i & 15) == 0 && fs_pool_spun_out(t0, spin)) break;
    }
    for (;;) {
        atomic_store(&fs_pool.caller_sleeps, 1);
        uint32_t d = atomic_load(&fs_pool.done);
        if (d == n) break;
        fs_pool_block(&fs_pool.done, d);
    }
    atomic_store(&fs_pool.caller_sleeps, 0);
}

/* ---- workers: start, stop, fork ------------------------------------------------------------ */

static void fs_pool_stop_workers(void)
{
    if (fs_pool.running == 0) return;
    atomic_store(&fs_pool.quit, 1);
    atomic_store(&fs_pool.seq, atomic_load(&fs_pool.seq) + 1);
    fs_pool_wake(&fs_pool.seq, 0x7fffffff);
    for (int i = 0; i < fs_pool.running; i++) pthread_join(fs_pool.tid[i], NULL);
    fs_pool.running = 0;
    atomic_store(&fs_pool.live, 0);
    atomic_store(&fs_pool.quit, 0);
}

/* The child of a fork has only the thread that forked: no workers, nobody waiting, no job. */
static void fs_pool_after_fork(void)
{
    fs_pool.running = 0;
    atomic_store(&fs_pool.live, 0);
    atomic_store(&fs_pool.sleepers, 0);
    atomic_store(&fs_pool.caller_sleeps, 0);
    atomic_store(&fs_pool.quit, 0);
    atomic_store(&fs_pool.busy, 0);
    atomic_store(&fs_pool.keep_job, 0); /* the next job's caller says again */
    atomic_store(&fs_pool.waker_cpu, -1);
    fs_pool_inside = 0;
#if !FS_POOL_FUTEX
    pthread_mutex_init(&fs_pool.mu, NULL);
    pthread_cond_init(&fs_pool.cv_seq, NULL);
    pthread_cond_init(&fs_pool.cv_done, NULL);
#endif
}

static void fs_pool_first_use(void)
{
    fs_pool.spin_ns = fs_pool_read_spin();
    pthread_atfork(NULL, NULL, fs_pool_after_fork);
}

/* Start workers until `count` run (fewer when the system refuses threads). Signals are blocked
 * in them: they go to the threads the program (Python) started. */
static void fs_pool_start_workers(int count)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fs_pool_first_use);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    uint32_t seen = atomic_load(&fs_pool.seq);
    while (fs_pool.running < count
           && pthread_create(&fs_pool.tid[fs_pool.running], NULL, fs_pool_worker,
                             (void *)(uintptr_t)seen) == 0)
        fs_pool.running++;
    atomic_store(&fs_pool.live, fs_pool.running);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* A caller inside fs_pool_keep_awake, at its first job (the first window starts) and at a job
 * that ends a window of at least FS_POOL_KEEP_WINDOW_NS: if in that window it had its CPU for
 * less than three quarters of the time and was switched out involuntarily (Linux; elsewhere
 * the time alone), it lost its CPU; at the second such window less than
 * FS_POOL_KEEP_LOST_GAP_NS after the first, another thread takes its CPU, and the pool stops
 * keeping for FS_POOL_KEEP_QUIET_NS (last_preempt). A thread that slept by itself (a page
 * fault on mapped weights) is not counted. A new window starts either way: two system calls a
 * window, none between. */
static void fs_pool_keep_check(void)
{
    if (fs_pool_keep_depth == 0) return;
    long now = fs_pool_now_ns(), wall = now - fs_pool_keep_wall0;
    if (fs_pool_keep_wall0 != 0 && wall < FS_POOL_KEEP_WINDOW_NS) return;
    long cpu = fs_pool_cpu_ns(), nivcsw = fs_pool_nivcsw();
    if (fs_pool_keep_wall0 != 0) {
        int lost = 4 * (cpu - fs_pool_keep_cpu0) < 3 * wall &&
                   (nivcsw < 0 || nivcsw > fs_pool_keep_nivcsw0);
        /* from the end of the last lost window to the start of this one (0 back to back) */
        if (lost && fs_pool_keep_lost_at != 0 &&
            fs_pool_keep_wall0 - fs_pool_keep_lost_at < FS_POOL_KEEP_LOST_GAP_NS)
            atomic_store_explicit(&fs_pool.last_preempt, now, memory_order_relaxed);
        if (lost) fs_pool_keep_lost_at = now;
    }
    fs_pool_keep_wall0 = now;
    fs_pool_keep_cpu0 = cpu;
    fs_pool_keep_nivcsw0 = nivcsw;
}

static int fs_pool_try_own(void)
{
    int free_ = 0;
    return atomic_compare_exchange_strong_explicit(&fs_pool.busy, &free_, 1,
                                                   memory_order_acquire, memory_order_relaxed);
}

static void fs_pool_release(void) { atomic_store_explicit(&fs_pool.busy, 0, memory_order_release); }

static void fs_pool_run_impl(fs_pool_fn fn, void *ctx, int nchunks)
{
    int want = atomic_load_explicit(&fs_pool.want, memory_order_relaxed);
    if (fs_pool_inside) {
#ifdef FS_DEBUG
        fprintf(stderr, "fs_pool_run: called from inside a chunk (nesting is not allowed)\n");
        abort();
#endif
        fs_pool_serial(fn, ctx, nchunks);
        return;
    }
    if (want <= 1 || !fs_pool_try_own()) {
        fs_pool_serial(fn, ctx, nchunks);
        return;
    }
    if (fs_pool.running != want - 1) {
        if (fs_pool.running > want - 1) fs_pool_stop_workers();
        fs_pool_start_workers(want - 1);
    }
    if (fs_pool.running == 0) {  /* no thread could be started */
        fs_pool_release();
        fs_pool_serial(fn, ctx, nchunks);
        return;
    }
    /* Every worker asleep although the previous job ended less than a spin ago, and a job
     * woke them less than FS_POOL_WAKE_GAP_NS ago: this job runs on the caller alone (see
     * FS_POOL_WAKE_GAP_NS). */
    if (atomic_load(&fs_pool.sleepers) == fs_pool.running) {
        long now = fs_pool_now_ns();
        if (now - fs_pool.last_end < fs_pool.spin_ns
            && now - fs_pool.last_wake < FS_POOL_WAKE_GAP_NS) {
            fs_pool_inside = 1;
            fs_pool_serial(fn, ctx, nchunks);
            fs_pool_inside = 0;
            fs_pool.last_end = fs_pool_now_ns();
            fs_pool_release();
            return;
        }
        fs_pool.last_wake = now;
    }
    fs_pool_keep_check();
    atomic_store_explicit(&fs_pool.keep_job, fs_pool_keep_depth > 0, memory_order_relaxed);
    fs_pool.fn = fn;
    fs_pool.ctx = ctx;
    fs_pool.nchunks = nchunks;
    atomic_store_explicit(&fs_pool.done, 0, memory_order_relaxed);
    uint32_t g = atomic_load_explicit(&fs_pool.seq, memory_order_relaxed) + 1;
    atomic_store_explicit(&fs_pool.claim, (uint64_t)g << 32 | (uint32_t)nchunks,
                          memory_order_release);
    atomic_store(&fs_pool.seq, g);  /* seq_cst: see sleepers */
    int sleeping = atomic_load(&fs_pool.sleepers);
    if (sleeping > 0) {
#if FS_POOL_FUTEX
        atomic_store_explicit(&fs_pool.waker_cpu, fs_pool_keep_depth > 0 ? sched_getcpu() : -1,
                              memory_order_relaxed);
#endif
        fs_pool_wake(&fs_pool.seq, sleeping < nchunks - 1 ? sleeping : nchunks - 1);
    }
    fs_pool_inside = 1;
    long t0 = fs_pool_now_ns();
    fs_pool_work(g);
    long t1 = fs_pool_now_ns();
    fs_pool_inside = 0;
    fs_pool_wait_done((uint32_t)nchunks);
    fs_pool.last_end = fs_pool_now_ns();
    /* the caller waited for the workers longer than its own share took, and more than a spin:
     * a worker was preempted inside a chunk (FS_POOL_STALL_HOLD_NS) */
    if (fs_pool.last_end - t1 > (t1 - t0) + fs_pool.spin_ns)
        atomic_store_explicit(&fs_pool.last_stall, fs_pool.last_end, memory_order_relaxed);
    fs_pool_release();
}

static int fs_pool_threads_impl(void) { return atomic_load(&fs_pool.want); }

static int fs_pool_awake_impl(void)
{
    int want = atomic_load_explicit(&fs_pool.want, memory_order_relaxed);
    return want > 1 && atomic_load_explicit(&fs_pool.live, memory_order_relaxed) == want - 1 &&
           atomic_load_explicit(&fs_pool.sleepers, memory_order_relaxed) == 0 &&
           fs_pool_now_ns() - atomic_load_explicit(&fs_pool.last_stall, memory_order_relaxed) >=
               FS_POOL_STALL_HOLD_NS;
}

/* Per thread: the outermost (1) starts watching, the matching (0) ends the keeping of this
 * thread's jobs (the next job's caller sets keep_job again); an unpaired (0) does nothing. */
static void fs_pool_keep_awake_impl(int on)
{
    if (on) {
        if (fs_pool_keep_depth++ == 0) { /* a window from its first job */
            fs_pool_keep_wall0 = 0;
            fs_pool_keep_lost_at = 0;
        }
    } else if (fs_pool_keep_depth > 0 && --fs_pool_keep_depth == 0) {
        atomic_store_explicit(&fs_pool.keep_job, 0, memory_order_relaxed);
    }
}

long fs_pool_spin_limit_ns(void)
{
    long spin = fs_pool.spin_ns >= 0 ? fs_pool.spin_ns : fs_pool_read_spin();
    return spin > 0 ? fs_pool_spin_most(spin, fs_pool_now_ns()) : 0;
}

static void fs_pool_set_threads_impl(int n)
{
    n = n < 1 ? 1 : n > FS_POOL_MAX ? FS_POOL_MAX : n;
    atomic_store(&fs_pool.want, n);
    /* Fewer threads: let the extra workers go now if no job runs (else at the next run). */
    if (!fs_pool_inside && fs_pool_try_own()) {
        if (fs_pool.running > n - 1) fs_pool_stop_workers();
        fs_pool_release();
    }
}

#endif /* FS_POOL_THREADED */

const fs_pool_ops fs_pool_local = {fs_pool_run_impl, fs_pool_threads_impl,
                                   fs_pool_set_threads_impl, fs_pool_awake_impl,
                                   fs_pool_keep_awake_impl};

void fs_pool_run(fs_pool_fn fn, void *ctx, int nchunks)
{
    if (nchunks <= 1) {
        if (nchunks == 1) fn(ctx, 0);
        return;
    }
    fs_disp->pool->run(fn, ctx, nchunks);
}

/* The jobs as one: chunk c of the whole is chunk c - first[i] of job i. */
typedef struct {
    const fs_pool_job *jobs;
    int first[FS_POOL_JOBS_MAX + 1];
} fs_pool_jobs_ctx;

static void fs_pool_jobs_chunk(void *ctx, int c)
{
    const fs_pool_jobs_ctx *j = (const fs_pool_jobs_ctx *)ctx;
    int i = 0;
    while (c >= j->first[i + 1]) i++;
    j->jobs[i].fn(j->jobs[i].ctx, c - j->first[i]);
}

void fs_pool_run_jobs(const fs_pool_job *jobs, int count)
{
    int parallel = 0; /* some job is cut: the others, one chunk each, run beside it */
    for (int i = 0; i < count; i++) parallel |= jobs[i].nchunks > 1;
    if (!parallel) {
        for (int i = 0; i < count; i++)
            for (int c = 0; c < jobs[i].nchunks; c++) jobs[i].fn(jobs[i].ctx, c);
        return;
    }
    if (count > FS_POOL_JOBS_MAX) { /* not the contract: run them one after another */
        for (int i = 0; i < count; i++) fs_pool_run(jobs[i].fn, jobs[i].ctx, jobs[i].nchunks);
        return;
    }
    fs_pool_jobs_ctx ctx = {jobs, {0}};
    for (int i = 0; i < count; i++)
        ctx.first[i + 1] = ctx.first[i] + (jobs[i].nchunks > 0 ? jobs[i].nchunks : 0);
    if (count == 1)
        fs_pool_run(jobs[0].fn, jobs[0].ctx, jobs[0].nchunks);
    else if (count > 1)
        fs_pool_run(fs_pool_jobs_chunk, &ctx, ctx.first[count]);
}

int fs_pool_threads(void) { return fs_disp->pool->threads(); }

void fs_pool_set_threads(int n) { fs_disp->pool->set_threads(n); }

int fs_pool_awake(void) { return fs_disp->pool->awake(); }

void fs_pool_keep_awake(int on) { fs_disp->pool->keep_awake(on); }
