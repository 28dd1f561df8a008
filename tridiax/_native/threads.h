// Sharing a kernel's tiles out over the cores: one std::thread per core, each with a scratch
// of its own. Internal linkage, a copy per source: see lanes.h.

#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace tridiax::cpu {
namespace {

// The cores the kernels share their tiles over (read once: the call costs microseconds).
int64_t Cores() {
  static const int64_t cores = std::max<unsigned>(1, std::thread::hardware_concurrency());
  return cores;
}

// Share a kernel's tiles out over one thread per core, when each gets enough work to pay for
// starting it. Kernel: tiles(), scratch_size() (elements of T), Run(begin, end, scratch), the
// scratch 64-byte aligned and uninitialised (every kernel writes it before reading it).
template <typename T, typename Kernel>
void RunTiles(const Kernel& kernel, int64_t work) {
  const int64_t tiles = kernel.tiles();
  if (tiles == 0) return;
  const int64_t threads =
      std::min<int64_t>({Cores(), tiles, std::max<int64_t>(1, work / (1 << 16))});
  const int64_t bytes = kernel.scratch_size() * static_cast<int64_t>(sizeof(T)) + 64;
  auto run = [&](int64_t id) {
    // A small scratch is kept by the thread across calls, so a small solve in a time loop pays
    // no allocation; a large one is allocated for the call.
    constexpr int64_t kKept = int64_t{1} << 19;
    thread_local std::vector<char> kept;
    std::unique_ptr<char[]> local;
    char* raw;
    if (bytes <= kKept) {
      if (static_cast<int64_t>(kept.size()) < bytes) kept.resize(kKept);
      raw = kept.data();
    } else {
      local.reset(new char[bytes]);
      raw = local.get();
    }
    const uintptr_t at = (reinterpret_cast<uintptr_t>(raw) + 63) & ~uintptr_t{63};
    const int64_t begin = tiles * id / threads, end = tiles * (id + 1) / threads;
    kernel.Run(begin, end, reinterpret_cast<T*>(at));
  };
  std::vector<std::thread> pool;
  for (int64_t id = 1; id < threads; ++id) pool.emplace_back(run, id);
  run(0);
  for (auto& th : pool) th.join();
}

}  // namespace
}  // namespace tridiax::cpu
