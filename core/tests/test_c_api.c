/* Compiled as C (not C++): the public headers must be plain C, statuses and
 * messages must work from C callers. Run by ctest (TE_BUILD_TESTS=ON). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "te/te.h"

static int failures = 0;
#define EXPECT(cond)                                                     \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                        \
    }                                                                    \
  } while (0)

static te_tensor cpu_tensor(void* data, te_dtype dtype, int ndim, const int64_t* shape) {
  te_tensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.dtype = dtype;
  t.ndim = ndim;
  for (int i = 0; i < ndim; ++i) t.shape[i] = shape[i];
  t.device_type = TE_DEVICE_CPU;
  return t;
}

int main(void) {
  float x[2 * 16];
  for (int i = 0; i < 32; ++i) x[i] = (float)(i - 16) * 3.5f;
  unsigned char q[32];
  float scale = 2.0f, scale_inv = 0.0f, amax = 0.0f;
  const int64_t shape[2] = {2, 16};
  te_tensor in = cpu_tensor(x, TE_DTYPE_FLOAT32, 2, shape);
  te_tensor out = cpu_tensor(q, TE_DTYPE_FLOAT8E4M3, 2, shape);
  te_tensor s = cpu_tensor(&scale, TE_DTYPE_FLOAT32, 0, NULL);
  te_tensor si = cpu_tensor(&scale_inv, TE_DTYPE_FLOAT32, 0, NULL);
  te_tensor a = cpu_tensor(&amax, TE_DTYPE_FLOAT32, 0, NULL);

  EXPECT(te_cast_quantize_fp8(&in, &s, &out, NULL, &si, &a, NULL) == TE_SUCCESS);
  EXPECT(strcmp(te_last_error_message(), "") == 0);
  EXPECT(scale_inv == 0.5f);
  EXPECT(amax == 56.0f); /* |-16 * 3.5| */
  EXPECT(q[0] ==
         0xEE); /* -56 * 2 = -112 = -1.75 * 2^6 -> sign 1, exponent 6+7 = 1101, mantissa 110 */

  /* A wrong dtype is a status plus a message naming the argument. */
  te_tensor bad_scale = cpu_tensor(&scale, TE_DTYPE_FLOAT16, 0, NULL);
  EXPECT(te_cast_quantize_fp8(&in, &bad_scale, &out, NULL, NULL, NULL, NULL) ==
         TE_ERROR_INVALID_DTYPE);
  EXPECT(strstr(te_last_error_message(), "argument 'scale' must be float32") != NULL);

  /* A NULL descriptor is rejected, never dereferenced. */
  EXPECT(te_cast_quantize_fp8(NULL, &s, &out, NULL, NULL, NULL, NULL) == TE_ERROR_INVALID_ARGUMENT);
  EXPECT(strstr(te_last_error_message(), "argument 'input' is required") != NULL);

  /* A deprecated alias forwards to the new name (same bytes, the new name in messages). */
  unsigned char q_old[32];
  te_tensor out_old = cpu_tensor(q_old, TE_DTYPE_FLOAT8E4M3, 2, shape);
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
  EXPECT(te_quantize_fp8(&in, &s, &out_old, NULL, &si, &a, NULL) == TE_SUCCESS);
  EXPECT(memcmp(q, q_old, sizeof(q)) == 0);
  EXPECT(te_quantize_fp8(&in, &bad_scale, &out_old, NULL, NULL, NULL, NULL) ==
         TE_ERROR_INVALID_DTYPE);
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif
  EXPECT(strstr(te_last_error_message(), "te_cast_quantize_fp8: argument 'scale'") != NULL);

  /* The activation enum comes from the TE_ACTIVATION_KINDS table; its codes are ABI. */
  EXPECT(TE_ACTIVATION_GELU == 0 && TE_ACTIVATION_GEGLU == 5);
  EXPECT(TE_ACTIVATION_CLAMPED_SWIGLU == 11);

  /* Entry points with many arguments take a params struct: NULL fields are "not given".
   * Row 1 of x is 3.5 * (0 .. 15): mean square 3.5^2 * 77.5. */
  float g[16], y[32], rs[2];
  for (int i = 0; i < 16; ++i) g[i] = 1.0f;
  const int64_t h_shape[1] = {16}, n_shape[1] = {2};
  te_tensor tg = cpu_tensor(g, TE_DTYPE_FLOAT32, 1, h_shape);
  te_tensor ty = cpu_tensor(y, TE_DTYPE_FLOAT32, 2, shape);
  te_tensor trs = cpu_tensor(rs, TE_DTYPE_FLOAT32, 1, n_shape);
  te_norm_fwd_params norm = {0};
  norm.x = &in;
  norm.gamma = &tg;
  norm.eps = 0.0f;
  norm.y = &ty;
  norm.rsigma = &trs;
  EXPECT(te_rmsnorm_fwd(&norm, NULL) == TE_SUCCESS);
  EXPECT(fabsf(rs[1] - 1.0f / sqrtf(77.5f * 3.5f * 3.5f)) < 1e-6f * rs[1]);
  norm.beta = &tg; /* RMSNorm has no beta */
  EXPECT(te_rmsnorm_fwd(&norm, NULL) == TE_ERROR_INVALID_ARGUMENT);
  EXPECT(strstr(te_last_error_message(), "argument 'beta' must be NULL") != NULL);
  EXPECT(te_layernorm_fwd(NULL, NULL) == TE_ERROR_INVALID_ARGUMENT);
  EXPECT(strstr(te_last_error_message(), "argument 'params' is required") != NULL);

  EXPECT(strlen(te_version()) > 0);
  if (failures == 0) printf("1 passed, 0 failed\n");
  return failures == 0 ? 0 : 1;
}
