// Happens-before edges that ThreadSanitizer cannot see for itself: orderings a library
// guarantees but implements in code TSan does not instrument (gRPC's own atomics). Each use
// names the guarantee it stands for. No-ops unless compiled with -fsanitize=thread.
#pragma once

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CKV_TSAN_ANNOTATIONS 1
#endif
#endif

#ifdef CKV_TSAN_ANNOTATIONS
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace centroidkv {

// Everything this thread did so far happens before what a thread does after a matching
// TsanHappensAfter(tag) (TSan's release / acquire on `tag`, an address used only as a key).
inline void TsanHappensBefore([[maybe_unused]] const void* tag) {
#ifdef CKV_TSAN_ANNOTATIONS
  __tsan_release(const_cast<void*>(tag));
#endif
}

inline void TsanHappensAfter([[maybe_unused]] const void* tag) {
#ifdef CKV_TSAN_ANNOTATIONS
  __tsan_acquire(const_cast<void*>(tag));
#endif
}

}  // namespace centroidkv
