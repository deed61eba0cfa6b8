"""The C structs of a model's weights, shared by fastspec.model._model_weights and fastspec.model._model."""
from fastspec.kernels._csrc cimport (
    fs_dims,
    fs_layer_f32,
    fs_layer_f32h,
    fs_layer_f64,
    fs_model_f32,
    fs_model_f32h,
    fs_model_f64,
    fs_layer_f32q,
    fs_model_f32q,
    fs_qmat,
)


cdef class ModelWeights:
    cdef fs_dims dims
    cdef bint is64
    cdef bint half  # 16-bit matrices (float16 or bfloat16), in m16 / layers16
    cdef bint bf16  # ... bfloat16 (m16 read as the identical fs_model_f32b)
    cdef readonly bint tiles  # ... packed in the tile layout (fs_linear_bf16_amx() at build)
    cdef fs_model_f32 m32
    cdef fs_model_f64 m64
    cdef fs_model_f32h m16
    cdef fs_layer_f32 *layers32
    cdef fs_layer_f64 *layers64
    cdef fs_layer_f32h *layers16
    cdef readonly bint quant  # quantized matrices (q8_0/q4_0/q4_1), in mq / layersq / qmats
    cdef fs_model_f32q mq
    cdef fs_layer_f32q *layersq
    cdef fs_qmat *qmats  # one per quantized matrix, in the order the structs point at them
    cdef int variant  # FS_MV_* of the float-compute model (mptr)
    cdef const void *mptr
    cdef object _qkinds  # the kinds present (their scratch sizes)
    cdef object _qscratch  # the quantized products' scratch (bytes), grown by quant_scratch
    cdef int _qin  # widest input of a product
    cdef int _init_quant(self, model) except -1
    cdef void *quant_scratch(self, size_t rows) except NULL
    cdef object _keep
    cdef readonly object dtype

