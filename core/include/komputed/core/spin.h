#pragma once
// Polling without sleeping: the pause between two looks at what a polling loop waits for.

namespace komputed::core {

// Tells the CPU that this thread spins (x86 PAUSE, Arm YIELD): the core's other hardware thread
// runs at full speed meanwhile, and the loop checks less often, with less traffic on the memory
// or the driver it looks at. Every polling loop calls it between two checks.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace komputed::core
