/* fs_linear_def.c -- the baseline variant of the packed float products (fs_linear_f32.inc):
 * the build's own target, 64-byte GCC vectors. */
#include "fs_variants.h"

#if defined(__GNUC__)
typedef union { fs_v16f_u v; float f[16]; } fs_linf_u;

/* Loads of 16 weights as one vector (FS_LOADV). */
#define FS_LINF_LOAD_F32(p) (*(const fs_v16f_u *)(const void *)(p))
/* 16 weights of 16 bits, widened one by one (widen is inlined). */
FS_ALWAYS_INLINE fs_v16f_u fs_linf_load16_def(const uint16_t *p, float (*widen)(uint16_t))
{
    fs_linf_u u;
    for (int i = 0; i < 16; i++) u.f[i] = widen(p[i]);
    return u.v;
}
#define FS_LINF_LOAD_F32H_DEF(p) fs_linf_load16_def(p, fs_h2f)
/* bfloat16: 16 bits up into the float's upper half. */
#define FS_LINF_LOAD_BF16_DEF(p) fs_linf_load16_def(p, fs_bf2f)

#define FS_SFX f32_def
#define FS_WT float
#define FS_ATTR
#define FS_LOADV FS_LINF_LOAD_F32
#define FS_YMM 0
#define FS_LINF_SMALL 1
#include "fs_linear_f32.inc"
#define FS_SFX f32h_def
#define FS_WT uint16_t
#define FS_ATTR
#define FS_LOADV FS_LINF_LOAD_F32H_DEF
#define FS_YMM 0
#define FS_LINF_SMALL 1
#include "fs_linear_f32.inc"
#define FS_SFX f32b_def
#define FS_WT uint16_t
#define FS_ATTR
#define FS_LOADV FS_LINF_LOAD_BF16_DEF
#define FS_YMM 0
#define FS_LINF_SMALL 1
#include "fs_linear_f32.inc"
#endif /* __GNUC__ */
