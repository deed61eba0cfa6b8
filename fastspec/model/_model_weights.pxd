"""The C structs of a model's weights, shared by fastspec.model._model_weights and fastspec.model._model."""
from fastspec.kernels._csrc cimport (
    fs_dims,
    fs_layer_f32,
    fs_layer_f32h,
    fs_layer_f64,
    fs_model_f32,
    fs_model_f32h,
    fs_model_f64,
)


cdef class ModelWeights:
    cdef fs_dims dims
    cdef bint is64
    cdef bint half  # 16-bit matrices (float16 or bfloat16), in m16 / layers16
    cdef bint bf16  # ... bfloat16 (m16 read as the identical fs_model_f32b)
    cdef readonly bint tiles  # ... packed for the AMX tiles (fs_linear_bf16_amx() at build)
    cdef fs_model_f32 m32
    cdef fs_model_f64 m64
    cdef fs_model_f32h m16
    cdef fs_layer_f32 *layers32
    cdef fs_layer_f64 *layers64
    cdef fs_layer_f32h *layers16
    cdef object _keep
    cdef readonly object dtype

