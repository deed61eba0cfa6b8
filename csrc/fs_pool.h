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
 *     noexcept (no longjmp out of it).
 *   - Small products should not ask for threads: fs_pool_run with nchunks <= 1, or
 *     fs_pool_threads() == 1, runs every chunk on the caller with no synchronisation.
 *
 * Threads: fs_pool_set_threads(n) (n >= 1); the Python layer's default is the number of CPUs
 * the process may run on (os.sched_getaffinity). One pool per process: every extension links
 * its own copy of the core, and the copies reach the owner's pool through the shared dispatch
 * table (fs_isa.h).
 */
#ifndef FS_POOL_H
#define FS_POOL_H

typedef void (*fs_pool_fn)(void *ctx, int chunk);

void fs_pool_run(fs_pool_fn fn, void *ctx, int nchunks);
int fs_pool_threads(void);
void fs_pool_set_threads(int n);

#endif /* FS_POOL_H */
