/* Checks fs_pool.h's thread pool: every chunk of every job runs exactly once, whatever the
 * thread count (1 to more than the CPUs, changed between jobs), for nchunks 0, 1, 2, small
 * and huge; many tiny jobs in a row; two threads submitting jobs at once (one gets the
 * workers, the other runs serially); a nested call (serial); the pool in the child of a fork;
 * fs_pool_chunks' bounds; fs_pool_awake; fs_pool_keep_awake; fs_pool_run_jobs. The whole
 * run is done twice at once: by the parent with the default spin and by a child forked before
 * any use with FASTSPEC_SPIN_US=0 (every wait blocks at once: the sleeping paths). With
 * -DFS_TEST_PORTABLE the pool waits on condition variables instead of futexes. Built and run
 * by tests/test_pool_c.py; exit status = failures.
 */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* sched_getaffinity, sched_getcpu, pthread_attr_setaffinity_np */
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fs_pool.h"

#define MAXC 200000

typedef struct {
    _Atomic int *count;
    int nested;  /* chunk 0 runs a nested job */
    _Atomic long *sum;
} job;

static void chunk(void *ctx, int c)
{
    job *j = (job *)ctx;
    /* uneven work (0-3 us; not in the huge jobs): chunks finish out of order and a caller
     * that returned early would check them too soon */
    static volatile int spin;
    if (c < 4096)
        for (int i = 0; i < (c * 7919) % 4 * 300; i++) spin++;
    atomic_fetch_add_explicit(&j->count[c], 1, memory_order_relaxed);
    if (j->sum) atomic_fetch_add_explicit(j->sum, c + 1, memory_order_relaxed);
    if (j->nested && c == 0) {
        static _Atomic int inner[16];
        for (int i = 0; i < 16; i++) atomic_store(&inner[i], 0);
        job k = {inner, 0, NULL};
        fs_pool_run(chunk, &k, 16);
        for (int i = 0; i < 16; i++)
            if (atomic_load(&inner[i]) != 1) atomic_fetch_add(&j->count[c], 100);
    }
}

static int run_and_check(_Atomic int *count, int nchunks, int nested, const char *what)
{
    for (int c = 0; c < nchunks; c++) atomic_store(&count[c], 0);
    atomic_store(&count[nchunks], 0);  /* a sentinel past the end */
    job j = {count, nested, NULL};
    fs_pool_run(chunk, &j, nchunks);
    int bad = 0;
    for (int c = 0; c < nchunks; c++) bad += atomic_load(&count[c]) != 1;
    bad += atomic_load(&count[nchunks]) != 0;
    if (bad) printf("FAIL %s: %d of %d chunks not run exactly once (threads %d)\n", what, bad,
                    nchunks, fs_pool_threads());
    return bad != 0;
}

static _Atomic int counts[MAXC + 1];

static int sizes_and_threads(void)
{
    static const int threads[] = {1, 2, 3, 5, 8, 2, 1, 4, 3};
    static const int sizes[] = {0, 1, 2, 3, 7, 16, 64, 1000, MAXC};
    int fails = 0;
    for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
        fs_pool_set_threads(threads[t]);
        if (fs_pool_threads() != threads[t]) {
            printf("FAIL set_threads(%d): threads %d\n", threads[t], fs_pool_threads());
            fails++;
        }
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            fails += run_and_check(counts, sizes[s], 0, "sizes");
    }
    return fails;
}

static int tiny_jobs(int threads, int jobs)
{
    fs_pool_set_threads(threads);
    int fails = 0;
    for (int i = 0; i < jobs; i++) {
        int n = 2 + i % 7;
        _Atomic long sum = 0;
        _Atomic int c[10];
        for (int k = 0; k < 10; k++) atomic_store(&c[k], 0);
        job j = {c, 0, &sum};
        fs_pool_run(chunk, &j, n);
        int bad = atomic_load(&sum) != (long)n * (n + 1) / 2;
        for (int k = 0; k < n; k++) bad |= atomic_load(&c[k]) != 1;
        if (bad && fails++ < 5) printf("FAIL tiny job %d (%d chunks, threads %d)\n", i, n, threads);
    }
    return fails;
}

/* Two submitters at once, each with its own counters. */
static void *submitter(void *arg)
{
    static _Atomic int c2[2][4097];
    int who = (int)(long)arg, fails = 0;
    for (int i = 0; i < 300; i++)
        fails += run_and_check(c2[who], 1 + (i * 37 + who) % 4096, 0, "concurrent");
    return (void *)(long)fails;
}

static int concurrent(void)
{
    fs_pool_set_threads(3);
    pthread_t t[2];
    for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, submitter, (void *)i);
    int fails = 0;
    for (int i = 0; i < 2; i++) {
        void *r;
        pthread_join(t[i], &r);
        fails += (int)(long)r;
    }
    return fails;
}

static int nested(void)
{
#ifdef FS_DEBUG
    return 0;  /* a nested job aborts there */
#else
    fs_pool_set_threads(2);
    return run_and_check(counts, 64, 1, "nested");
#endif
}

static int after_fork(void)
{
    fs_pool_set_threads(3);
    int fails = run_and_check(counts, 500, 0, "before fork");  /* workers running */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int f = run_and_check(counts, 500, 0, "child");
        fs_pool_set_threads(2);
        f += run_and_check(counts, 3000, 0, "child, 2 threads");
        f += tiny_jobs(4, 200);
        fflush(stdout);
        _exit(f);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        printf("FAIL fork: child status %d\n", status);
        fails++;
    }
    return fails + run_and_check(counts, 500, 0, "parent after fork");
}

static int chunk_counts(void)
{
    int fails = 0;
    fs_pool_set_threads(1);
    fails += fs_pool_chunks(1000, 1 << 20, 1) != 1;
    fs_pool_set_threads(2);
    fails += fs_pool_chunks(1, 1 << 20, 1) != 1;                    /* one unit */
    fails += fs_pool_chunks(100, 1, 1) != 1;                        /* too little work */
    fails += fs_pool_chunks(8, 1 << 20, 4) != 2;                    /* min units per chunk */
    fails += fs_pool_chunks(1000, 1 << 20, 1) != 1000;              /* cap on the cost */
    int n = fs_pool_chunks(64, FS_POOL_CHUNK_MAX_COST / 8, 1);
    fails += n < 2 || n > 64;
    fs_pool_set_threads(0);
    fails += fs_pool_threads() != 1;
    fs_pool_set_threads(1 << 20);
    fails += fs_pool_threads() != FS_POOL_MAX;
    fs_pool_set_threads(2);
    if (fails) printf("FAIL fs_pool_chunks / clamping: %d\n", fails);
    return fails;
}

/* This run never spins (the forked child's FASTSPEC_SPIN_US=0). */
static int spin_off(void)
{
    const char *spin = getenv("FASTSPEC_SPIN_US");
    return spin != NULL && strcmp(spin, "0") == 0;
}

/* CPUs this process may run on (Linux: its affinity, e.g. under taskset; elsewhere taken as
 * 2). With one, a worker never spins beside the caller: the checks of spinning workers skip. */
static int cpus_available(void)
{
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
#endif
    return 2;
}

/* fs_pool_awake: 0 at one thread; seen right after a job when the worker spins (2 threads,
 * within up to 1000 rounds of 100 jobs: the worker may be preempted, and a job that waited on
 * it holds the hint at 0 for FS_POOL_STALL_HOLD_NS, 20 ms: the rounds are 25 ms apart; with
 * more threads than CPUs that is most jobs; on one CPU, all of them: skipped); 0 once they
 * sleep (FASTSPEC_SPIN_US=0 and 20 ms after a job). */
static int awake_hint(void)
{
    int fails = 0;
    static _Atomic int count[64];
    job j = {count, 0, NULL};
    fs_pool_set_threads(1);
    fs_pool_run(chunk, &j, 64);
    if (fs_pool_awake()) {
        printf("FAIL fs_pool_awake at one thread\n");
        fails++;
    }
    fs_pool_set_threads(3);
    if (spin_off()) {
        fs_pool_run(chunk, &j, 64);
        usleep(20000);
        if (fs_pool_awake()) {
            printf("FAIL fs_pool_awake with every worker asleep\n");
            fails++;
        }
    } else if (cpus_available() < 2) {
        printf("skip fs_pool_awake right after a job: one CPU, no worker spins beside us\n");
    } else {
        fs_pool_set_threads(2);
        /* a pause every 100 jobs: workers found asleep right after a job (preempted on a
         * loaded machine) are woken at most once a millisecond (fs_pool.c's wake gap), but
         * always after the caller was away longer than their spin; and the stall hold of a
         * job that waited on a preempted worker has run out */
        int seen = 0;
        for (int i = 0; i < 100000 && !seen; i++) {
            fs_pool_run(chunk, &j, 64);
            seen = fs_pool_awake();
            if (i % 100 == 99) usleep(25000);
        }
        if (!seen) {
            printf("FAIL fs_pool_awake never 1 right after a job (workers spinning)\n");
            fails++;
        }
    }
    return fails;
}

static void busy_wait_us(long us)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    do clock_gettime(CLOCK_MONOTONIC, &b);
    while ((b.tv_sec - a.tv_sec) * 1000000L + (b.tv_nsec - a.tv_nsec) / 1000 < us);
}

/* fs_pool_keep_awake (2 threads), read through fs_pool_spin_limit_ns: the spin (30 us) before
 * and after it; 1 ms after a job handed out inside it, not before that job; nested calls
 * keep until the outermost 0, and an unpaired 0 changes nothing; a caller that slept 3 ms
 * inside it still keeps (Linux: the check counts a lost CPU only with an involuntary switch);
 * with FASTSPEC_SPIN_US=0, 0 inside it too. These are states of the pool, not races, but a
 * caller preempted twice within 50 ms in between (a loaded machine) stops the keeping for a
 * second, as it should: up to 5 tries, 1.1 s apart (on one CPU, where the workers always
 * preempt the caller, skipped). Last (Linux), a second thread pinned to the caller's CPU with
 * the caller stops the keeping within 100 windows of 1.5 ms. */
static void *hold_cpu(void *arg)
{
    busy_wait_us(*(long *)arg);
    return NULL;
}

#define KEEP_EXPECT(want, what)                                                              \
    do {                                                                                     \
        long got_ = fs_pool_spin_limit_ns();                                                 \
        if (got_ != (want)) {                                                                \
            if (say)                                                                         \
                printf("FAIL fs_pool_keep_awake: spin %ld ns %s (expected %ld)\n", got_,     \
                       what, (long)(want));                                                  \
            fails++;                                                                         \
        }                                                                                    \
    } while (0)

static int keep_states(job *j, long base, long keep, int say)
{
    int fails = 0;
    KEEP_EXPECT(base, "before");
    fs_pool_keep_awake(1);
    KEEP_EXPECT(base, "inside, before a job");
    fs_pool_run(chunk, j, 64);
    KEEP_EXPECT(keep, "inside, after a job");
    fs_pool_keep_awake(1);
    fs_pool_run(chunk, j, 64);
    fs_pool_keep_awake(0);
    KEEP_EXPECT(keep, "after an inner 0");
    fs_pool_keep_awake(0);
    KEEP_EXPECT(base, "after the outer 0");
    fs_pool_keep_awake(0);
    fs_pool_keep_awake(1);
    fs_pool_run(chunk, j, 64);
    KEEP_EXPECT(keep, "inside, after an unpaired 0 before it");
#ifdef __linux__
    usleep(3000);
    fs_pool_run(chunk, j, 64);
    KEEP_EXPECT(keep, "inside, after the caller slept 3 ms");
#endif
    fs_pool_keep_awake(0);
    KEEP_EXPECT(base, "after");
    return fails;
}

static int keep_awake(void)
{
    int fails = 0;
    static _Atomic int count[64];
    job j = {count, 0, NULL};
    fs_pool_set_threads(2);
    fs_pool_run(chunk, &j, 64);
    long base = spin_off() ? 0 : 30000, keep = base ? 1000000 : 0;
    if (base && cpus_available() < 2) {  /* the workers preempt the caller: no keeping */
        printf("skip fs_pool_keep_awake's states: one CPU\n");
        return 0;
    }
    for (int t = 0; t < 5; t++) {
        if (t > 0) usleep(1100000);
        fails = keep_states(&j, base, keep, t == 4);
        if (!fails) break;
    }
    if (base == 0) return fails;
#ifdef __linux__
    cpu_set_t old, one;
    if (sched_getaffinity(0, sizeof old, &old) == 0 && CPU_COUNT(&old) > 1) {
        CPU_ZERO(&one);
        CPU_SET(sched_getcpu(), &one);
        long hold = 200000;
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setaffinity_np(&at, sizeof one, &one);
        if (sched_setaffinity(0, sizeof one, &one) == 0 &&
            pthread_create(&t, &at, hold_cpu, &hold) == 0) {
            fs_pool_keep_awake(1);
            fs_pool_run(chunk, &j, 64);
            int stopped = 0;
            for (int i = 0; i < 100 && !stopped; i++) {
                busy_wait_us(1500);
                fs_pool_run(chunk, &j, 64);
                stopped = fs_pool_spin_limit_ns() == base;
            }
            fs_pool_keep_awake(0);
            pthread_join(t, NULL);
            if (!stopped) {
                printf("FAIL fs_pool_keep_awake: still keeping with another thread on the "
                       "caller's CPU\n");
                fails++;
            }
        }
        pthread_attr_destroy(&at);
        sched_setaffinity(0, sizeof old, &old);
    }
#endif
    return fails;
}
#undef KEEP_EXPECT

/* fs_pool_run_jobs: every chunk of every job once, with its own job's context and index,
 * for 1-4 jobs (some of 0 or 1 chunks; all of at most one: on the caller); and more jobs than
 * FS_POOL_JOBS_MAX (run one after another). */
static int run_jobs(void)
{
    static const int threads[] = {1, 2, 3};
    static const int sizes[][5] = {{3, 0, 0, 0, 0}, {1, 1, 1, 0, 0}, {5, 0, 2, 0, 0},
                                   {0, 0, 0, 0, 0}, {7, 1, 64, 3, 0}, {2, 2, 2, 2, 9}};
    static const int counts_of[] = {1, 3, 3, 2, 4, 5};
    static _Atomic int c[5][70];
    int fails = 0;
    for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
        fs_pool_set_threads(threads[t]);
        for (size_t s = 0; s < sizeof counts_of / sizeof *counts_of; s++)
            for (int rep = 0; rep < 200; rep++) {
                int count = counts_of[s];
                job j[5];
                fs_pool_job jobs[5];
                for (int i = 0; i < count; i++) {
                    for (int k = 0; k < 70; k++) atomic_store(&c[i][k], 0);
                    j[i] = (job){c[i], 0, NULL};
                    jobs[i] = (fs_pool_job){chunk, &j[i], sizes[s][i]};
                }
                fs_pool_run_jobs(jobs, count);
                int bad = 0;
                for (int i = 0; i < count; i++)
                    for (int k = 0; k < 70; k++)
                        bad += atomic_load(&c[i][k]) != (k < sizes[s][i]);
                if (bad && fails++ < 5)
                    printf("FAIL run_jobs: %d jobs (case %zu), threads %d: %d chunks wrong\n",
                           count, s, threads[t], bad);
            }
    }
    return fails;
}

static int all(void)
{
    int fails = sizes_and_threads();
    fails += tiny_jobs(2, 20000);
    fails += tiny_jobs(5, 3000);
    fails += concurrent();
    fails += nested();
    fails += after_fork();
    fails += chunk_counts();
    fails += awake_hint();
    fails += keep_awake();
    fails += run_jobs();
    fails += run_and_check(counts, MAXC, 0, "last");
    return fails;
}

int main(void)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("FASTSPEC_SPIN_US", "0", 1);
        int failed = all();
        fflush(stdout); /* _exit does not flush: the failures' lines would be lost */
        _exit(failed ? 1 : 0);
    }
    int fails = all();
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        printf("FAIL the run with FASTSPEC_SPIN_US=0 (status %d)\n", status);
        fails++;
    }
    printf("%d failures\n", fails);
    return fails != 0;
}
