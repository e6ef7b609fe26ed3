// Every device of a node served at once: the daemon owns them all, each session runs on the
// device it asked for, and work, memory and metrics are kept apart per device.
//
// The devices are the machine's own when it has two or more. Otherwise the one Vulkan driver that
// VK_DRIVER_FILES names (else lavapipe) is listed twice, under two ICD files: the loader then
// offers two physical devices backed by one driver and the daemon opens each as its own VkDevice,
// with its own queues, completion waiter and accounting, as it would two GPUs (the work of both
// shares the one piece of hardware). Each test says which kind it ran on.
//
// Sizes: the defaults fit lavapipe on two cores; on GPUs raise them.
//   KOMPUTED_E2E_SAXPY_MB       MiB per saxpy vector (default 4)
//   KOMPUTED_E2E_SAXPY_ROUNDS   saxpy evaluations per device (default 20)
//   KOMPUTED_E2E_BIG_TENSOR_MB  MiB of the device-only tensor that each device holds at once
//                               (default 64; 40960 for 40 GiB)
//   ARRAY_MULTIPLICATION        the example program (default: this build's)
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <kompute/Kompute.hpp>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "komputed/v1/komputed.grpc.pb.h"
#include "support/daemon_process.h"
#include "support/metrics.h"
#include "support/process.h"
#include "support/scoped_env.h"
#include "support/stubs.h"

namespace {

using komputed::test_support::DaemonProcess;
using komputed::test_support::KomputectlBinary;
using komputed::test_support::RunProgram;
using komputed::test_support::Samples;
using komputed::test_support::ScopedEnv;
using komputed::test_support::Stubs;
using ::testing::HasSubstr;
namespace v1 = komputed::v1;

uint64_t EnvNumber(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  uint64_t n = 0;
  return value != nullptr && absl::SimpleAtoi(value, &n) && n > 0 ? n : fallback;
}

std::string ExampleProgram() {
  const char* value = std::getenv("ARRAY_MULTIPLICATION");
  return value != nullptr && value[0] != '\0' ? value : ARRAY_MULTIPLICATION;
}

// One unary call with a 30 s deadline; a failure fails the test and returns an empty response.
template <typename Response, typename Stub, typename Request>
Response Call(Stub& stub,
              grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
              const Request& request) {
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  Response response;
  const grpc::Status status = (stub.*method)(&c, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response;
}

v1::ListDevicesResponse ListDevices(Stubs& stubs) {
  return Call(*stubs.devices, &v1::Devices::Stub::ListDevices, v1::ListDevicesRequest());
}

v1::ListSessionsResponse ListSessions(Stubs& stubs) {
  return Call(*stubs.sessions, &v1::Sessions::Stub::ListSessions, v1::ListSessionsRequest());
}

// A daemon that serves two or more devices, and how they came about.
struct MultiDeviceDaemon {
  std::unique_ptr<DaemonProcess> daemon;
  int devices = 0;
  std::string kind;  // "native" or "one driver listed twice (...)"
};

// The ICD file to list twice: the only entry of VK_DRIVER_FILES (or VK_ICD_FILENAMES), else
// lavapipe's; "" when there is none.
std::string DriverToTwin() {
  for (const char* name : {"VK_DRIVER_FILES", "VK_ICD_FILENAMES"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || value[0] == '\0') continue;
    std::vector<std::string> files = absl::StrSplit(value, ':', absl::SkipEmpty());
    return files.size() == 1 ? files[0] : "";
  }
  for (const char* path :
       {"/usr/share/vulkan/icd.d/lvp_icd.x86_64.json", "/usr/share/vulkan/icd.d/lvp_icd.json"}) {
    if (access(path, R_OK) == 0) return path;
  }
  return "";
}

MultiDeviceDaemon StartMultiDeviceDaemon() {
  MultiDeviceDaemon result;
  result.daemon = std::make_unique<DaemonProcess>();
  if (!result.daemon->started()) return result;
  {
    Stubs stubs(result.daemon->address());
    result.devices = ListDevices(stubs).devices_size();
  }
  if (result.devices >= 2) {
    result.kind = "native";
    return result;
  }
  result.daemon.reset();
  result.devices = 0;
  const std::string icd = DriverToTwin();
  if (icd.empty()) return result;
  const std::string copy = ::testing::TempDir() + "komputed_second_icd.json";
  {
    std::ifstream in(icd);
    std::ofstream out(copy);
    out << in.rdbuf();
    if (!out) return result;
  }
  {
    // The daemon inherits the environment at its start.
    ScopedEnv files("VK_DRIVER_FILES", icd + ":" + copy);
    ScopedEnv legacy("VK_ICD_FILENAMES", icd + ":" + copy);
    result.daemon = std::make_unique<DaemonProcess>();
  }
  if (!result.daemon->started()) return result;
  Stubs stubs(result.daemon->address());
  result.devices = ListDevices(stubs).devices_size();
  result.kind = absl::StrCat("one driver listed twice (", icd, ")");
  return result;
}

#define START_MULTI_DEVICE_DAEMON(var)                                                        \
  MultiDeviceDaemon var = StartMultiDeviceDaemon();                                           \
  if (var.devices < 2)                                                                        \
    GTEST_SKIP() << "needs two Vulkan devices: this machine has fewer, and no single driver " \
                    "(the only VK_DRIVER_FILES entry, or lavapipe) to list twice";            \
  std::cout << "devices: " << var.devices << ", " << var.kind << "\n"

constexpr char kSaxpyShader[] = R"(
  #version 450
  layout(local_size_x = 256) in;
  layout(set = 0, binding = 0) readonly buffer X { float x[]; };
  layout(set = 0, binding = 1) buffer Y { float y[]; };
  layout(push_constant) uniform Push { float a; };
  void main() {
    uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 256;
    if (i < uint(y.length())) y[i] += a * x[i];
  }
)";

// Workgroups of 256 covering `count`, in two dimensions where one would pass 65535.
kp::Workgroup SaxpyWorkgroup(uint64_t count) {
  const uint64_t groups = (count + 255) / 256;
  const uint64_t rows = (groups + 65534) / 65535;
  return {static_cast<uint32_t>((groups + rows - 1) / rows), static_cast<uint32_t>(rows), 1};
}

TEST(MultiDevice, KomputectlListsEveryDevice) {
  START_MULTI_DEVICE_DAEMON(d);
  Stubs stubs(d.daemon->address());
  const v1::ListDevicesResponse devices = ListDevices(stubs);
  std::string out, err;
  ASSERT_EQ(
      RunProgram({KomputectlBinary(), "--address=" + d.daemon->address(), "devices"}, &out, &err),
      0)
      << err;
  std::cout << out;
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), static_cast<size_t>(devices.devices_size()) + 1) << out;
  for (int i = 0; i < devices.devices_size(); ++i) {
    const v1::DeviceInfo& info = devices.devices(i);
    EXPECT_EQ(info.index(), static_cast<uint32_t>(i));
    EXPECT_GT(info.memory_bytes(), 0u);
    EXPECT_FALSE(info.queue_families().empty());
    const std::string& row = lines[static_cast<size_t>(i) + 1];
    EXPECT_THAT(row, ::testing::StartsWith(absl::StrCat(i, " ")));
    EXPECT_THAT(row, HasSubstr(info.name()));
    // Every queue family, as "index:caps x count".
    for (const auto& f : info.queue_families()) {
      EXPECT_THAT(row, HasSubstr(absl::StrCat(f.index(), ":")));
    }
  }
}

// Per device at the same time: a client evaluating saxpy rounds while it holds a tensor of its
// own size, and the example program (KOMPUTED_DEVICE picking the device). Then, with each saxpy
// client still holding its memory: every device counts its own session, memory and submissions,
// in ListDevices, ListSessions and the metrics alike.
TEST(MultiDevice, ClientsOnEveryDeviceAtOnce) {
  START_MULTI_DEVICE_DAEMON(d);
  const int n = d.devices;
  const uint64_t count = EnvNumber("KOMPUTED_E2E_SAXPY_MB", 4) * (uint64_t{1} << 20) / 4;
  const int rounds = static_cast<int>(EnvNumber("KOMPUTED_E2E_SAXPY_ROUNDS", 20));
  Stubs stubs(d.daemon->address());
  const Samples before = Samples::From(*d.daemon);

  std::atomic<int> ready{0};
  std::atomic<bool> release{false};
  std::vector<std::string> failures(static_cast<size_t>(n));
  std::vector<std::string> example_out(static_cast<size_t>(n));
  std::vector<int> example_rc(static_cast<size_t>(n), -2);
  auto held_bytes = [](int device) { return static_cast<uint64_t>(device + 1) << 24; };
  std::vector<std::thread> threads;
  for (int dev = 0; dev < n; ++dev) {
    threads.emplace_back([&, dev] {
      std::string err;
      example_rc[static_cast<size_t>(dev)] =
          RunProgram({"/usr/bin/env", "KOMPUTED_ADDRESS=" + d.daemon->address(),
                      absl::StrCat("KOMPUTED_DEVICE=", dev), ExampleProgram()},
                     &example_out[static_cast<size_t>(dev)], &err, absl::Seconds(300));
      example_out[static_cast<size_t>(dev)] += err;
    });
    threads.emplace_back([&, dev] {
      std::string& failure = failures[static_cast<size_t>(dev)];
      try {
        kp::Manager mgr(kp::Remote{d.daemon->address(), static_cast<uint32_t>(dev), {}});
        auto held = mgr.tensorT<float>(held_bytes(dev) / 4, kp::Tensor::TensorTypes::eStorage);
        auto x = mgr.tensor(std::vector<float>(count, 1.0f));
        auto y = mgr.tensor(std::vector<float>(count, 0.0f));
        const float a = static_cast<float>(dev + 2);  // a different result on every device
        const std::vector<std::shared_ptr<kp::Tensor>> params = {x, y};
        auto algo = mgr.algorithm(params, kp::compileSource(kSaxpyShader), SaxpyWorkgroup(count),
                                  std::vector<float>{}, std::vector<float>{a});
        mgr.sequence()->eval<kp::OpTensorSyncDevice>(params);
        auto seq = mgr.sequence();
        seq->record<kp::OpAlgoDispatch>(algo);
        for (int r = 0; r < rounds; ++r) seq->eval();
        mgr.sequence()->eval<kp::OpTensorSyncLocal>(std::vector<std::shared_ptr<kp::Tensor>>{y});
        const float expected = a * static_cast<float>(rounds);
        const float* v = y->data();
        const uint64_t wrong = static_cast<uint64_t>(
            std::count_if(v, v + count, [&](float f) { return f != expected; }));
        if (wrong != 0) {
          failure = absl::StrCat("device ", dev, ": ", wrong, " of ", count,
                                 " saxpy results wrong; y[0] = ", v[0], ", expected ", expected);
        }
        ++ready;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(600);
        while (!release && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      } catch (const std::exception& e) {
        failure = absl::StrCat("device ", dev, ": ", e.what());
        ++ready;
      }
    });
  }
  // The example programs end by themselves; the saxpy clients wait, holding their memory.
  for (size_t i = 0; i < threads.size(); i += 2) threads[i].join();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(600);
  while (ready < n && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const bool all_ready = ready == n;
  const v1::ListDevicesResponse devices = ListDevices(stubs);
  const v1::ListSessionsResponse sessions = ListSessions(stubs);
  const Samples during = Samples::From(*d.daemon);
  release = true;
  for (size_t i = 1; i < threads.size(); i += 2) threads[i].join();
  ASSERT_TRUE(all_ready) << "the saxpy clients did not finish within 600 s";

  for (int dev = 0; dev < n; ++dev) {
    const size_t i = static_cast<size_t>(dev);
    EXPECT_EQ(failures[i], "");
    EXPECT_EQ(example_rc[i], 0) << example_out[i];
    EXPECT_THAT(example_out[i], HasSubstr("out_a: 4 8 12")) << "device " << dev;
    EXPECT_THAT(example_out[i], HasSubstr("out_b: 10 10 10")) << "device " << dev;
    EXPECT_THAT(example_out[i], HasSubstr("device: " + devices.devices(dev).name()));
  }

  // One session per device is left: the saxpy client's.
  ASSERT_EQ(sessions.sessions_size(), n);
  std::map<uint32_t, uint64_t> session_memory;
  for (const auto& s : sessions.sessions()) session_memory[s.device_index()] += s.memory_bytes();
  ASSERT_EQ(session_memory.size(), static_cast<size_t>(n)) << "two sessions on one device";
  for (int dev = 0; dev < n; ++dev) {
    const v1::DeviceInfo& info = devices.devices(dev);
    const std::string label = absl::StrCat(dev);
    const uint64_t in_use = info.memory_in_use_bytes();
    std::cout << "device " << dev << " (" << info.name() << "): in use " << in_use << " B, "
              << "submissions "
              << during.Sum("komputed_submissions_total", {{"device", label}}) -
                     before.Sum("komputed_submissions_total", {{"device", label}})
              << "\n";
    EXPECT_EQ(info.sessions(), 1u) << "device " << dev;
    // The held tensor (device only) and x and y (each a buffer and its staging copy).
    EXPECT_GE(in_use, held_bytes(dev) + 4 * count * sizeof(float)) << "device " << dev;
    EXPECT_LT(in_use, held_bytes(dev) + 4 * count * sizeof(float) + (uint64_t{8} << 20))
        << "device " << dev;
    EXPECT_EQ(session_memory[static_cast<uint32_t>(dev)], in_use) << "device " << dev;
    EXPECT_EQ(during.Get("komputed_device_memory_used_bytes", {{"device", label}}),
              static_cast<double>(in_use))
        << "device " << dev;
    // The saxpy rounds, the uploads and downloads, and the example's evaluations.
    EXPECT_GE(during.Sum("komputed_submissions_total", {{"device", label}}) -
                  before.Sum("komputed_submissions_total", {{"device", label}}),
              rounds + 2)
        << "device " << dev;
  }
}

// Every device holds a large device-only tensor at once, each accounted to its own device, and
// all of it is returned when the sessions close.
TEST(MultiDevice, LargeTensorOnEveryDeviceAtOnce) {
  START_MULTI_DEVICE_DAEMON(d);
  const int n = d.devices;
  const uint64_t bytes = EnvNumber("KOMPUTED_E2E_BIG_TENSOR_MB", 64) << 20;
  Stubs stubs(d.daemon->address());
  std::atomic<int> ready{0};
  std::atomic<bool> release{false};
  std::vector<std::string> failures(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int dev = 0; dev < n; ++dev) {
    threads.emplace_back([&, dev] {
      try {
        kp::Manager mgr(kp::Remote{d.daemon->address(), static_cast<uint32_t>(dev), {}});
        auto big = mgr.tensorT<float>(bytes / 4, kp::Tensor::TensorTypes::eStorage);
        ++ready;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(600);
        while (!release && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      } catch (const std::exception& e) {
        failures[static_cast<size_t>(dev)] = absl::StrCat("device ", dev, ": ", e.what());
        ++ready;
      }
    });
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(600);
  while (ready < n && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const v1::ListDevicesResponse held = ListDevices(stubs);
  const Samples during = Samples::From(*d.daemon);
  release = true;
  for (auto& t : threads) t.join();
  for (const std::string& f : failures) EXPECT_EQ(f, "");
  for (int dev = 0; dev < n; ++dev) {
    const std::string label = absl::StrCat(dev);
    std::cout << "device " << dev << ": " << held.devices(dev).memory_in_use_bytes()
              << " B in use while holding " << bytes << " B\n";
    EXPECT_EQ(held.devices(dev).memory_in_use_bytes(), bytes) << "device " << dev;
    EXPECT_EQ(during.Get("komputed_device_memory_used_bytes", {{"device", label}}),
              static_cast<double>(bytes))
        << "device " << dev;
  }
  // Closing the sessions returned every byte, on every device.
  const v1::ListDevicesResponse after = ListDevices(stubs);
  const Samples closed = Samples::From(*d.daemon);
  for (int dev = 0; dev < n; ++dev) {
    EXPECT_EQ(after.devices(dev).memory_in_use_bytes(), 0u) << "device " << dev;
    EXPECT_EQ(after.devices(dev).sessions(), 0u) << "device " << dev;
    EXPECT_EQ(closed.Get("komputed_device_memory_used_bytes", {{"device", absl::StrCat(dev)}}), 0)
        << "device " << dev;
  }
}

}  // namespace
