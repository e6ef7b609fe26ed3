#pragma once
// The backends that the kp behaviour suite runs against. Every TEST_P(KpTest, ...) runs once per
// backend; adding a backend is adding an enum value here, a branch in MakeManager, and the value
// in the suite's instantiation (backends.cc).

#include <cstdint>
#include <kompute/Kompute.hpp>
#include <memory>
#include <string>
#include <vector>

namespace kptest {

enum class BackendKind {
  kInProcess,  // kp over core on the local Vulkan device
  kRemote,     // kp on a komputed daemon (the real binary, started once for the test program),
               // over TCP, all tensor data through gRPC (the daemon offers no shared memory)
  kSameHost,   // kp on another komputed daemon, over a Unix socket, with the tensors' host data
               // in memory shared with the daemon
};

// A name usable in a test name ("InProcess").
std::string Name(BackendKind kind);

// A Manager on `kind`'s default device: device 0, one queue of the first compute family.
std::unique_ptr<kp::Manager> MakeManager(BackendKind kind);
// kp::Manager() as a program constructs it, taking its device from the environment
// (KOMPUTED_DEVICE); remote through KOMPUTED_ADDRESS. Throws what the constructor throws.
std::unique_ptr<kp::Manager> MakeDefaultManager(BackendKind kind);
// A Manager on device `device_index` with one queue per entry of `family_queue_indices` (as
// kp::Manager's constructor). Throws what the constructor throws.
std::unique_ptr<kp::Manager> MakeManager(BackendKind kind, uint32_t device_index,
                                         const std::vector<uint32_t>& family_queue_indices,
                                         const std::vector<std::string>& extensions = {});

}  // namespace kptest
