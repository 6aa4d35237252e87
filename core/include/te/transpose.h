/* Transpose of a matrix view. A tensor of any rank is viewed as [M, K] (K its
 * last dimension); the output is [K, M]. Works for 1-, 2-, 4- and 8-byte types
 * (FP8, BF16, FP16, FP32, ...; not packed FP4). FP8 cast-transpose is
 * te_cast_quantize_fp8 with a columnwise output (cast.h). */
#ifndef TE_TRANSPOSE_H_
#define TE_TRANSPOSE_H_

#include "te/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* \param[in]  input   any shape, last dim K, M = numel / K.
 * \param[out] output  shape [K, M], same dtype and device as input. */
TE_API te_status te_transpose(const te_tensor* input, te_tensor* output, te_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_TRANSPOSE_H_ */
