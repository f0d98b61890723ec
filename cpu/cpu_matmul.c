/*
 * cpu/cpu_matmul.c - the linear layers: y = x W^T and its backward, fp32.
 *
 * All three products are one kernel, C (+)= A B with B row-major over the summed index:
 *     forward   y[T, n_out]  = x[T, n_in]       W^T[n_in, n_out]   (W transposed once per call)
 *     dx        dx[T, n_in]  = dout[T, n_out]   W[n_out, n_in]
 *     dW        dW[n_out, n_in] += dout^T[n_out, T] x[T, n_in]     (dout transposed once)
 * (out and dx may start from a given c: the residual add, or an accumulation.)
 * The kernel keeps a block of 4 rows x 16 columns of C in registers (GCC vector types: AVX2 and
 * FMA where the CPU has them, SSE otherwise) and walks the summed index once, so every element of
 * C is one running sum in a fixed order: the result does not depend on the thread count. Threads
 * take blocks of rows of C.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "util/error.h"

/* Eight floats; aligned(4) makes loads and stores through a cast pointer legal at any float. */
typedef float v8 __attribute__((vector_size(32), aligned(4)));
#define LOAD8(p) (*(const v8 *)(p))
#define STORE8(p, v) (*(v8 *)(p) = (v))

/* C[rows r0..r0+4, cols c0..c0+16) (+)= A B over the R summed indices; full blocks only. */
CPU_HOT static void block_4x16(float *restrict C, const float *restrict A, const float *restrict B, int64_t R,
                               int64_t P, int64_t lda, int accumulate)
{
    v8 c[4][2];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            c[i][j] = accumulate ? LOAD8(C + i * P + 8 * j) : (v8){0};
    for (int64_t k = 0; k < R; k++) {
        v8 b0 = LOAD8(B + k * P), b1 = LOAD8(B + k * P + 8);
        for (int i = 0; i < 4; i++) {
            float a = A[i * lda + k];
            c[i][0] += a * b0;
            c[i][1] += a * b1;
        }
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            STORE8(C + i * P + 8 * j, c[i][j]);
}

/* The same for any block (the edges): rows x cols with rows <= 4, cols <= 16, in plain C. */
static void block_edge(float *C, const float *A, const float *B, int64_t R, int64_t P, int64_t lda, int rows,
                       int cols, int accumulate)
{
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            float s = accumulate ? C[i * P + j] : 0.0f;
            for (int64_t k = 0; k < R; k++)
                s += A[i * lda + k] * B[k * P + j];
            C[i * P + j] = s;
        }
}

/* C[M, P] (+)= A[M, R] B[R, P], all row-major. */
static void gemm(float *C, const float *A, const float *B, int64_t M, int64_t R, int64_t P, int accumulate)
{
#pragma omp parallel for schedule(static)
    for (int64_t i0 = 0; i0 < M; i0 += 4) {
        int rows = M - i0 < 4 ? (int)(M - i0) : 4;
        for (int64_t j0 = 0; j0 < P; j0 += 16) {
            int cols = P - j0 < 16 ? (int)(P - j0) : 16;
            float *c = C + i0 * P + j0;
            if (rows == 4 && cols == 16)
                block_4x16(c, A + i0 * R, B + j0, R, P, R, accumulate);
            else
                block_edge(c, A + i0 * R, B + j0, R, P, R, rows, cols, accumulate);
        }
    }
}

/* dst[c, r] = src[r, c] for a rows x cols matrix. */
static void transpose(float *restrict dst, const float *restrict src, int64_t rows, int64_t cols)
{
    enum { B = 32 };
#pragma omp parallel for schedule(static)
    for (int64_t r0 = 0; r0 < rows; r0 += B)
        for (int64_t c0 = 0; c0 < cols; c0 += B)
            for (int64_t r = r0; r < r0 + B && r < rows; r++)
                for (int64_t c = c0; c < c0 + B && c < cols; c++)
                    dst[c * rows + r] = src[r * cols + c];
}

/* C = c + product: C starts as c (a copy unless c is C itself) and the product accumulates. */
static int start_from(float *C, const float *c, int64_t n)
{
    if (c && c != C)
        memcpy(C, c, (size_t)n * sizeof *C);
    return c != NULL;
}

void cpu_k_matmul(float *out, const float *c, const float *x, const float *w, int64_t T, int64_t n_in, int64_t n_out)
{
    float *wt = cpu_scratch((size_t)(n_in * n_out + 1) * sizeof *wt);
    transpose(wt, w, n_out, n_in);
    gemm(out, x, wt, T, n_in, n_out, start_from(out, c, T * n_out));
    free(wt);
}

void cpu_k_matmul_dx(float *dx, const float *c, const float *dout, const float *w, int64_t T, int64_t n_in,
                     int64_t n_out)
{
    gemm(dx, dout, w, T, n_out, n_in, start_from(dx, c, T * n_in));
}

void cpu_k_matmul_dw(float *dw, const float *dout, const float *x, int64_t T, int64_t n_in, int64_t n_out)
{
    float *dt = cpu_scratch((size_t)(T * n_out + 1) * sizeof *dt);
    transpose(dt, dout, T, n_out);
    gemm(dw, dt, x, n_out, T, n_in, 1);
    free(dt);
}
