// OpenBLAS on its callers' threads (blas.h).
#include "kernels/fit/blas.h"

extern "C" {
void openblas_set_num_threads(int threads);
int blas_thread_shutdown_(void);
}

namespace centroidkv::fit {
namespace {

// OpenBLAS's pthread build starts a pool of threads when it is loaded, before main(): they
// would take signals the server's threads block (a SIGTERM meant for the drain would kill
// the process) and compete with the engine's own threads. One thread per call, and the pool
// stopped, at static initialisation (after OpenBLAS's own, which the loader runs first).
const bool kOnCallersThread = [] {
  openblas_set_num_threads(1);
  blas_thread_shutdown_();
  return true;
}();

}  // namespace

bool BlasOnCallersThread() { return kOnCallersThread; }

}  // namespace centroidkv::fit
