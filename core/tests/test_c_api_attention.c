/* The attention family from C: a hand-computed causal case, the backend and
 * workspace queries, and statuses with messages naming the argument. */
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
  /* B = 1, S = 2, H = 1, D = 2 (bshd), scale 1, causal. */
  float q[4] = {1, 0, 0, 1}, k[4] = {1, 0, 0, 1}, v[4] = {1, 2, 3, 4};
  float o[4] = {0}, lse[2] = {0};
  const int64_t qkv_shape[4] = {1, 2, 1, 2}, lse_shape[3] = {1, 1, 2};
  te_tensor tq = cpu_tensor(q, TE_DTYPE_FLOAT32, 4, qkv_shape);
  te_tensor tk = cpu_tensor(k, TE_DTYPE_FLOAT32, 4, qkv_shape);
  te_tensor tv = cpu_tensor(v, TE_DTYPE_FLOAT32, 4, qkv_shape);
  te_tensor to = cpu_tensor(o, TE_DTYPE_FLOAT32, 4, qkv_shape);
  te_tensor tl = cpu_tensor(lse, TE_DTYPE_FLOAT32, 3, lse_shape);
  te_attention_fwd_params p;
  memset(&p, 0, sizeof(p));
  p.config.qkv_format = TE_QKV_FORMAT_BSHD;
  p.config.mask_type = TE_ATTN_MASK_CAUSAL;
  p.config.scale = 1.0f;
  p.config.window_left = -1;
  p.config.window_right = -1;
  p.q = &tq;
  p.k = &tk;
  p.v = &tv;
  p.o = &to;
  p.softmax_lse = &tl;

  int backend = -1;
  size_t ws = 123;
  EXPECT(te_attention_backend(&p, &backend) == TE_SUCCESS && backend == TE_ATTENTION_BACKEND_CPU);
  EXPECT(te_attention_fwd_workspace_size(&p, &ws) == TE_SUCCESS && ws == 0);
  EXPECT(te_attention_fwd(&p, NULL) == TE_SUCCESS);
  /* Row 0 sees key 0 (S = 1); row 1 sees keys 0, 1 with S = (0, 1). */
  const double e = exp(1.0), p0 = 1.0 / (1.0 + e), p1 = e / (1.0 + e);
  EXPECT(fabs(o[0] - 1.0) < 1e-6 && fabs(o[1] - 2.0) < 1e-6);
  EXPECT(fabs(o[2] - (p0 * 1 + p1 * 3)) < 1e-6 && fabs(o[3] - (p0 * 2 + p1 * 4)) < 1e-6);
  EXPECT(fabs(lse[0] - 1.0) < 1e-6 && fabs(lse[1] - log(1.0 + e)) < 1e-6);

  /* Backward: dO = 1 everywhere; dV of key 1 = P[1][1] = p1 (only row 1 sees it). */
  float d_o[4] = {1, 1, 1, 1}, dq[4], dk[4], dv[4];
  te_tensor tdo = cpu_tensor(d_o, TE_DTYPE_FLOAT32, 4, qkv_shape);
  te_tensor tdq = cpu_tensor(dq, TE_DTYPE_FLOAT32, 4, qkv_shape);
  te_tensor tdk = cpu_tensor(dk, TE_DTYPE_FLOAT32, 4, qkv_shape);
  te_tensor tdv = cpu_tensor(dv, TE_DTYPE_FLOAT32, 4, qkv_shape);
  te_attention_bwd_params b;
  memset(&b, 0, sizeof(b));
  b.config = p.config;
  b.q = &tq;
  b.k = &tk;
  b.v = &tv;
  b.o = &to;
  b.d_o = &tdo;
  b.softmax_lse = &tl;
  b.dq = &tdq;
  b.dk = &tdk;
  b.dv = &tdv;
  EXPECT(te_attention_bwd(&b, NULL) == TE_SUCCESS);
  EXPECT(fabs(dv[2] - p1) < 1e-6 && fabs(dv[0] - (1.0 + p0)) < 1e-6);
  EXPECT(dq[0] == 0.0f && dq[1] == 0.0f); /* row 0 has one key: P = 1, dS = 0 */

  /* A causal mask with keys right of the diagonal is a named error. */
  p.config.window_right = 1;
  EXPECT(te_attention_fwd(&p, NULL) == TE_ERROR_INVALID_ARGUMENT);
  EXPECT(strstr(te_last_error_message(), "argument 'config.window_right'") != NULL);
  p.config.window_right = -1;

  /* FP8 inputs are refused as unsupported, naming the argument. */
  unsigned char q8[4] = {0};
  te_tensor tq8 = cpu_tensor(q8, TE_DTYPE_FLOAT8E4M3, 4, qkv_shape);
  p.q = &tq8;
  EXPECT(te_attention_fwd(&p, NULL) == TE_ERROR_UNSUPPORTED);
  EXPECT(strstr(te_last_error_message(), "FP8 attention is not yet supported") != NULL);

  EXPECT(te_attention_fwd(NULL, NULL) == TE_ERROR_INVALID_ARGUMENT);
  if (failures == 0) printf("attention: all passed\n");
  return failures == 0 ? 0 : 1;
}
