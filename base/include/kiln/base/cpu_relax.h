// cpu_relax(): the spin-wait hint of the processor (x86 `pause`, ARM `yield`), for the loops that
// poll a flag for a few microseconds before sleeping (stream actors, waiters, IPC receivers): it
// saves power and lets the sibling hyperthread run while the poll waits.
#pragma once

namespace kiln {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace kiln
