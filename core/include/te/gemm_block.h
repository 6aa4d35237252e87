/* GEMMs on block-scaled operands: FP8 block scaling (te/fp8_block.h), MXFP8
 * (te/mxfp8.h) and NVFP4 (te/nvfp4.h), and through the same parameters the
 * formats of te/gemm.h (high precision, per-tensor FP8); one GEMM at a time
 * or as a group of independent GEMMs (the experts of an MoE layer).
 *
 *     D = alpha * op(A) @ op(B) + beta * C + bias[n]      (row-major, as te/gemm.h)
 *
 * op(A) is [M, K] (A stored [M, K], or [K, M] when transa), op(B) is [K, N] (B
 * stored [K, N], or [N, K] when transb); leading dims fold into rows. Every
 * element of op(A) and op(B) means its dequantized FP32 value, exactly as the
 * format's dequantize function defines it:
 *   TE_SCALING_NONE          x                                FP32, BF16, FP16
 *   TE_SCALING_TENSOR        float(q) * scale_inv             FP8, FP32 scalar
 *   TE_SCALING_FP8_BLOCK_1D  float(q) * scale_inv[block]      FP8, FP32 per 1x128 block
 *   TE_SCALING_FP8_BLOCK_2D  float(q) * scale_inv[tile]       FP8, FP32 per 128x128 tile
 *   TE_SCALING_MXFP8         float(q) * 2^(e - 127)           FP8, E8M0 per 32 elements
 *   TE_SCALING_NVFP4         float(q) * (float(s_b) * S_dec)  FP4, E4M3 per 16 elements,
 *                            S_dec = 1 / S_enc(amax) with the operand's global amax
 * Both operands belong to one family: NONE x NONE (same type), TENSOR x TENSOR
 * (te_gemm's rules), FP8 block (1-D or 2-D each), MXFP8 x MXFP8, NVFP4 x NVFP4.
 *
 * Layouts. A block's scale factors out of a dot product only when the block
 * runs along K, so each operand is the copy of its tensor whose blocks do:
 *   FP8 block, NVFP4: the TN form only, transa = 0 and transb = 1: A stored
 *     [M, K], B stored [N, K]. A tensor's rowwise copy, or its columnwise copy
 *     (stored transposed by those formats). Scales in the layout of the stored
 *     [rows, K] matrix (rows = M for A, N for B):
 *       FP8 block 1-D  FP32 [cdiv(K,128), pad4(rows)]            } the GEMM-ready
 *       FP8 block 2-D  FP32 [cdiv(rows,128), pad4(cdiv(K,128))]  } layouts of fp8_block.h
 *       NVFP4          E4M3 [roundup(rows,128), roundup(K/16,4)] and amax, the
 *                      FP32 global amax the copy was quantized with
 *   MXFP8: any transa / transb; the flag says which copy (MXFP8 never transposes):
 *       A, transa = 0: rowwise copy [M, K] (1x32 blocks), E8M0 [roundup(M,128), roundup(K/32,4)]
 *       A, transa = 1: columnwise copy [K, M] (32x1 blocks), E8M0 [roundup(K/32,4), roundup(M,128)]
 *       B, transb = 1: rowwise copy [N, K];  B, transb = 0: columnwise copy [K, N]
 *   MXFP8 and NVFP4 scales may be compact or swizzled (te/swizzle.h; same
 *   shape), as swizzled_scales says.
 * For a Linear layer Y = X W^T with X [T, In], W [Out, In], dY [T, Out]:
 *   fprop  Y  = X W^T    A = X rowwise,        B = W rowwise              (TN)
 *   dgrad  dX = dY W     A = dY rowwise,       B = W columnwise ([In, Out], TN;
 *                                               MXFP8: W columnwise, transb = 0)
 *   wgrad  dW = dY^T X   A = dY columnwise,    B = X columnwise           (TN;
 *                                               MXFP8: transa = 1, transb = 0)
 * With NVFP4's random Hadamard transform, both wgrad operands must carry it
 * ((A H)(H^T B) = A B); the GEMM itself is agnostic.
 *
 * Output: D FP32, BF16 or FP16 [M, N]; C ([M, N], D's type, may be D itself)
 * with beta (beta == 0: C is not read); bias [N] FP32/BF16/FP16. All as te_gemm.
 *
 * Paths (te_gemm_block_plan says which one a call takes, te_gemm_block which
 * one it took):
 *   TE_GEMM_PATH_NATIVE    the operands go into the GEMM as stored: cuBLASLt's
 *                          block-scaled kernels; te_gemm itself for NONE/TENSOR
 *                          (on every device).
 *   TE_GEMM_PATH_EMULATED  each operand is dequantized first (CUDA: to BF16, in
 *                          the workspace; CPU: to FP32), then te_gemm multiplies
 *                          them with the same C, bias, alpha and beta: D is
 *                          exactly te_gemm on the dequantized operands.
 * Native paths (CUDA; anything else is emulated, as is every CPU call):
 *   FP8 block  compute capability 9.x, cuBLASLt >= 12.9 at run time, not 2-D x
 *              2-D, M % 16 == N % 16 == 0, whole blocks (K % 128 == 0, and the
 *              rows of a 2-D operand % 128 == 0), not both E5M2 (scale modes
 *              VEC128_32F / BLK128x128_32F, which read the GEMM-ready layouts
 *              above as they are).
 *   MXFP8      compute capability 10.x, cuBLASLt >= 12.8, swizzled scales on
 *              both operands, M % 16 == N % 16 == 0, not both E5M2 (VEC32_UE8M0).
 *   NVFP4      compute capability 10.x, cuBLASLt >= 12.8, swizzled scales on
 *              both, M % 16 == N % 16 == 0, K % 32 == 0 (VEC16_UE4M3; alpha *
 *              S_dec(a) * S_dec(b) is computed on the device).
 *   and in each case cuBLASLt's heuristic must have a kernel for the call.
 *   The 10.x paths are written and compile-checked only: no such GPU was at
 *   hand when they were written.
 * force_emulation = 1 takes the emulated path whatever the device.
 *
 * Numerics (docs/numerics.md gives the bounds): the CPU path is exact
 * arithmetic on the FP32 dequantized values up to te_gemm's FP32 summation.
 * The CUDA emulated path rounds each dequantized element to BF16 (exact for
 * MXFP8 and for power-of-two FP8-block scales, except below BF16's normal
 * range), then sums in FP32. The native FP8-block path runs on Hopper's FP8
 * tensor cores (te_gemm's FP8 accumulator model) with the block scales
 * applied to each block's partial sum.
 *
 * Workspace: te_gemm_block_plan gives the bytes of the path the call takes
 * (CPU: 0). It reads the device (compute capability, cuBLASLt version and
 * heuristic, assuming 16-byte aligned buffers) but no data pointer. A call
 * given at least that much takes the planned path, or the native one when its
 * pointers let cuBLASLt do better. The grouped functions need the maximum
 * over the groups (the groups run one after another and share it). No call
 * allocates device memory or synchronizes.
 */
#ifndef TE_GEMM_BLOCK_H_
#define TE_GEMM_BLOCK_H_

#include "te/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How an operand's stored values map to its elements (see the table above). */
typedef enum TE_ENUM_BASE {
  TE_SCALING_NONE = 0,
  TE_SCALING_TENSOR = 1,
  TE_SCALING_FP8_BLOCK_1D = 2,
  TE_SCALING_FP8_BLOCK_2D = 3,
  TE_SCALING_MXFP8 = 4,
  TE_SCALING_NVFP4 = 5
} te_scaling_mode;

typedef enum TE_ENUM_BASE { TE_GEMM_PATH_NATIVE = 0, TE_GEMM_PATH_EMULATED = 1 } te_gemm_path;

typedef struct {
  const te_tensor* data; /* required: the stored copy (see Layouts) */
  te_scaling_mode scaling;
  const te_tensor* scale_inv; /* NULL for NONE; TENSOR: FP32 scalar; else the block scales */
  const te_tensor* amax;      /* NVFP4 only: FP32 scalar, the copy's global amax */
  int swizzled_scales;        /* MXFP8 / NVFP4: 1 when scale_inv is in the swizzled layout */
} te_gemm_operand;

typedef struct {
  te_gemm_operand a;
  int transa;
  te_gemm_operand b;
  int transb;
  const te_tensor* c;    /* [M, N], D's type, or NULL (then beta must be 0) */
  te_tensor* d;          /* [M, N]: FP32, BF16 or FP16 */
  const te_tensor* bias; /* [N] FP32/BF16/FP16, or NULL */
  float alpha;
  float beta;
  int use_split_accumulator; /* TENSOR on CUDA, as te_gemm; block formats always split */
  int force_emulation;       /* 1: the emulated path even where a native one exists */
} te_gemm_block_params;

/* The path te_gemm_block takes for these parameters and the workspace bytes
 * it needs (data pointers are not read). Either output may be NULL. */
TE_API te_status te_gemm_block_plan(const te_gemm_block_params* params, te_gemm_path* path,
                                    size_t* workspace_bytes);

/* One GEMM. workspace: bytes (TE_DTYPE_BYTE) on the operands' device, at least
 * te_gemm_block_plan's size; may be NULL when that is 0. path_taken (may be
 * NULL) receives the path this call took. */
TE_API te_status te_gemm_block(const te_gemm_block_params* params, te_tensor* workspace,
                               te_gemm_path* path_taken, te_stream stream);

/* Groups: num_groups independent GEMMs that share the operands' scaling modes
 * and types, transa, transb, D's type and the device (shapes, C, bias, alpha
 * and beta may differ). Messages name the group ("group 3: ..."). paths, when
 * not NULL, has num_groups entries and receives each group's path. The
 * workspace is the largest single-group need; CUDA runs the groups back to
 * back on the stream, the CPU one after another. */
TE_API te_status te_gemm_block_grouped_plan(const te_gemm_block_params* groups, int num_groups,
                                            te_gemm_path* paths, size_t* workspace_bytes);

TE_API te_status te_gemm_block_grouped(const te_gemm_block_params* groups, int num_groups,
                                       te_tensor* workspace, te_gemm_path* paths, te_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_GEMM_BLOCK_H_ */
