/* Transformer Engine core: the whole public C API. */
#ifndef TE_TE_H_
#define TE_TE_H_
#include "te/types.h"
#include "te/cast.h"
#include "te/transpose.h"
#include "te/recipe.h"
#include "te/gemm.h"
#include "te/norm.h"
#include "te/fp8_block.h"
#include "te/nvfp4.h"
#include "te/mxfp8.h"
#include "te/swizzle.h"
#include "te/gemm_block.h"
#include "te/activation.h"
#include "te/attention.h"
#include "te/rope.h"
#include "te/softmax.h"
#endif
