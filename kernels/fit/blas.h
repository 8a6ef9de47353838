// The few BLAS and LAPACK routines the fit uses, overloaded on float and double so that one
// template (head_fit.h) runs in either precision. OpenBLAS from Debian, row-major through
// CBLAS; the Cholesky factor and solve from its LAPACK (column-major, on symmetric matrices,
// so the layout does not matter). Each call runs on its caller's thread: the heads run as
// the engine's tasks, several calls at once (cmake/ckv_openblas.cmake says why the pthread
// build), and blas.cc stops OpenBLAS's own threads when the program starts. Internal to
// kernels/fit/.
#pragma once

#include <cblas.h>

#include <cstddef>
#include <cstdint>

extern "C" {
// LAPACK's Fortran interface; the trailing length is gfortran's hidden string length.
void spotrf_(const char* uplo, const int* n, float* a, const int* lda, int* info, size_t);
void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info, size_t);
void spotrs_(const char* uplo, const int* n, const int* nrhs, const float* a, const int* lda,
             float* b, const int* ldb, int* info, size_t);
void dpotrs_(const char* uplo, const int* n, const int* nrhs, const double* a, const int* lda,
             double* b, const int* ldb, int* info, size_t);
}

namespace centroidkv::fit {

// Whether OpenBLAS runs each call on its caller's thread (blas.cc sets it so at start-up).
bool BlasOnCallersThread();

// C[m, n] = alpha * op(A) op(B) + beta * C, row-major.
inline void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void Gemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a,
                 int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// C[n, n] = A^T A (A is [k, n], row-major), both triangles filled.
template <typename T>
void Gram(int n, int k, const T* a, int lda, T* c);

template <>
inline void Gram<float>(int n, int k, const float* a, int lda, float* c) {
  cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, n, k, 1.0f, a, lda, 0.0f, c, n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < i; ++j) c[i * n + j] = c[j * n + i];
  }
}
template <>
inline void Gram<double>(int n, int k, const double* a, int lda, double* c) {
  cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, n, k, 1.0, a, lda, 0.0, c, n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < i; ++j) c[i * n + j] = c[j * n + i];
  }
}

// Cholesky factor of the symmetric positive definite a[n, n] in place; false if it is not.
inline bool Cholesky(int n, float* a) {
  int info = 0;
  spotrf_("L", &n, a, &n, &info, 1);
  return info == 0;
}
inline bool Cholesky(int n, double* a) {
  int info = 0;
  dpotrf_("L", &n, a, &n, &info, 1);
  return info == 0;
}

// Solves a x = b for `nrhs` right-hand sides (b: [nrhs, n], each a contiguous vector) with
// the factor Cholesky() left in a.
inline void CholeskySolve(int n, int nrhs, const float* a, float* b) {
  int info = 0;
  spotrs_("L", &n, &nrhs, a, &n, b, &n, &info, 1);
}
inline void CholeskySolve(int n, int nrhs, const double* a, double* b) {
  int info = 0;
  dpotrs_("L", &n, &nrhs, a, &n, b, &n, &info, 1);
}

}  // namespace centroidkv::fit
