// Process-wide glibc malloc settings for the binaries that move whole KV layers through the
// heap (centroidkv-server, centroidkv-bench). Call once at the start of main().
#pragma once

namespace centroidkv {

// Keeps freed heap memory for reuse instead of returning it to the kernel after every job:
// blocks up to 32 MiB (glibc's largest mmap threshold) come from the heap, and the heap is
// not trimmed below 1 GiB of free memory. Without this each layer job's buffers were
// mmap'ed and faulted in afresh: page faults were ~28% of a server's CPU samples (profile
// in docs/results/service-bench.md). Returns false if glibc refused a setting.
bool KeepFreedHeapMemory();

}  // namespace centroidkv
