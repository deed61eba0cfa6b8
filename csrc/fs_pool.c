/* fs_pool.c -- the thread pool (fs_pool.h). Placeholder: runs every chunk on the caller. */
#include "fs_pool.h"

#include "fs_isa.h"

void fs_pool_run(fs_pool_fn fn, void *ctx, int nchunks)
{
    for (int c = 0; c < nchunks; c++) fn(ctx, c);
}

int fs_pool_threads(void) { return fs_linear_get_threads(); }

void fs_pool_set_threads(int n) { fs_linear_set_threads(n); }
