// The same-host path: a client on the daemon's host keeps its tensors' host data in memory that
// it shares with the daemon (sealed memfds passed over the daemon's abstract socket), and the
// daemon makes the tensors' host-data buffers over it. The real daemon binary, the kp client.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grp.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <kompute/Kompute.hpp>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "komputed/v1/komputed.grpc.pb.h"
#include "komputed/v1/shared_memory_wire.h"
#include "support/daemon_process.h"
#include "support/metrics.h"
#include "support/poll.h"
#include "support/process.h"
#include "support/raw_channel.h"
#include "support/scoped_env.h"
#include "support/stalling_fuse.h"
#include "support/stubs.h"

namespace {

namespace v1 = komputed::v1;
using komputed::test_support::DaemonProcess;
using komputed::test_support::PollUntil;
using komputed::test_support::RawChannel;
using komputed::test_support::Samples;
using komputed::test_support::ScopedEnv;
using komputed::test_support::Spawn;
using komputed::test_support::StallingFuse;
using komputed::test_support::Stubs;
using ::testing::HasSubstr;

constexpr char kScaleShader[] = R"(
  #version 450
  layout(local_size_x = 64) in;
  layout(set = 0, binding = 0) buffer In { float in_v[]; };
  layout(set = 0, binding = 1) buffer Out { float out_v[]; };
  void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < in_v.length()) out_v[i] = in_v[i] * 2.0;
  }
)";

// A daemon on a Unix socket in a folder of its own.
class SocketDaemon {
 public:
  explicit SocketDaemon(std::vector<std::string> flags = {}) {
    char dir[] = "/tmp/komputed-same-host-XXXXXX";
    if (mkdtemp(dir) != nullptr) dir_ = dir;
    flags.push_back("--listen=unix:" + dir_ + "/komputed.sock");
    daemon_ = std::make_unique<DaemonProcess>(flags);
  }
  ~SocketDaemon() {
    daemon_.reset();
    rmdir(dir_.c_str());
  }
  DaemonProcess& daemon() { return *daemon_; }
  const std::string& address() const { return daemon_->address(); }

 private:
  std::string dir_;
  std::unique_ptr<DaemonProcess> daemon_;
};

constexpr char kTensorMemory[] = "memfd:komputed-tensor";
constexpr char kRingMemory[] = "memfd:komputed-channel-ring";

// How many mappings of shared memory named `what` (tensors' by default) the process `pid` has.
int SharedMappings(pid_t pid, const char* what = kTensorMemory) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find(what) != std::string::npos) ++n;
  }
  return n;
}

bool Within10s(const std::function<bool()>& done) { return PollUntil(absl::Seconds(10), done); }

// Waits up to 30 s for the process `pid` to have no mapping of shared memory named `what` (a call
// that has answered may still hold a tensor for a moment); returns how many it has at the end.
int MappingsAfterRelease(pid_t pid, const char* what = kTensorMemory) {
  int mappings = 0;
  PollUntil(absl::Seconds(30), [&] { return (mappings = SharedMappings(pid, what)) == 0; });
  return mappings;
}

// How many descriptors the process `pid` has open on files whose path contains `what`.
int OpenDescriptors(pid_t pid, const std::string& what) {
  int n = 0;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd/";
  for (int fd = 0; fd < 4096; ++fd) {
    char target[256] = {};
    if (readlink((fd_dir + std::to_string(fd)).c_str(), target, sizeof(target) - 1) > 0 &&
        std::string(target).find(what) != std::string::npos) {
      ++n;
    }
  }
  return n;
}

// b = 2 * a through the daemon, with a's data changed between two evals; returns whether every
// value came back right.
bool ScaleTwice(kp::Manager& mgr, size_t count) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = static_cast<float>(i % 1000);
  auto a = mgr.tensor(values);
  auto b = mgr.tensor(std::vector<float>(count, 0.0f));
  const std::vector<std::shared_ptr<kp::Tensor>> params = {a, b};
  auto algo = mgr.algorithm(params, kp::compileSource(kScaleShader),
                            kp::Workgroup{static_cast<uint32_t>((count + 63) / 64), 1, 1});
  auto seq = mgr.sequence();
  seq->record<kp::OpTensorSyncDevice>({a})
      ->record<kp::OpAlgoDispatch>(algo)
      ->record<kp::OpTensorSyncLocal>({b});
  seq->eval();
  bool ok = true;
  for (size_t i = 0; i < count; ++i) ok &= b->vector()[i] == 2.0f * values[i];
  for (float& v : values) v += 1.0f;
  a->setData(values);
  seq->eval();
  const std::vector<float> out = b->vector();
  for (size_t i = 0; i < count; ++i) ok &= out[i] == 2.0f * values[i];
  return ok;
}

TEST(SameHost, TensorsLiveInSharedMemoryAndNoByteCrossesTheSocket) {
  SocketDaemon d;
  ASSERT_TRUE(d.daemon().started());
  {
    kp::Manager mgr{d.address()};
    EXPECT_TRUE(ScaleTwice(mgr, 1 << 16));
    // The daemon maps both tensors' memory while they live.
    EXPECT_GE(SharedMappings(d.daemon().pid()), 2);
    const Samples samples = Samples::From(d.daemon());
    EXPECT_GE(samples.Get("komputed_shared_memory_tensors_total"), 2);
    EXPECT_EQ(samples.Get("komputed_bytes_transferred_total", {{"direction", "upload"}}), 0);
    EXPECT_EQ(samples.Get("komputed_bytes_transferred_total", {{"direction", "download"}}), 0);
    // Both evals went on the same-host channel, not gRPC.
    EXPECT_GE(samples.Get("komputed_same_host_evals_total"), 2);
    EXPECT_EQ(samples.Get("komputed_rpcs_total", {{"method", "Eval"}, {"code", "OK"}}), 0);
  }
  // The client closed its session: the daemon unmapped everything.
  EXPECT_EQ(MappingsAfterRelease(d.daemon().pid()), 0);
}

// kLanes sequences of `mgr`, each evaluated once, then kRounds rounds in which every lane is in
// flight at once (evalAsync of each, then evalAwait of each, with new input every round).
constexpr int kLanes = 8;
constexpr int kRounds = 40;
void EvalLanesAtOnce(kp::Manager& mgr, const std::function<void()>& before_rounds) {
  struct Lane {
    std::shared_ptr<kp::TensorT<float>> a, b;
    std::shared_ptr<kp::Sequence> seq;
  };
  std::vector<Lane> lanes;
  for (int l = 0; l < kLanes; ++l) {
    Lane lane;
    lane.a = mgr.tensorT<float>(std::vector<float>(64, static_cast<float>(l)));
    lane.b = mgr.tensorT<float>(std::vector<float>(64, 0.0f));
    auto algo =
        mgr.algorithm({lane.a, lane.b}, kp::compileSource(kScaleShader), kp::Workgroup{1, 1, 1});
    lane.seq = mgr.sequence();
    lane.seq->record<kp::OpTensorSyncDevice>({lane.a})
        ->record<kp::OpAlgoDispatch>(algo)
        ->record<kp::OpTensorSyncLocal>({lane.b});
    lane.seq->eval();  // the first eval creates the objects (over gRPC)
    lanes.push_back(std::move(lane));
  }
  before_rounds();
  for (int round = 0; round < kRounds; ++round) {
    for (int l = 0; l < kLanes; ++l) {
      lanes[l].a->data()[l] = static_cast<float>(round * 100 + l);
      lanes[l].seq->evalAsync();
    }
    for (int l = 0; l < kLanes; ++l) {
      lanes[l].seq->evalAwait();
      ASSERT_EQ(lanes[l].b->data()[l], 2.0f * static_cast<float>(round * 100 + l))
          << "lane " << l << " round " << round;
    }
  }
}

TEST(SameHost, AsyncEvalsArePipelinedOnTheChannelNotTheStream) {
  SocketDaemon d;
  ASSERT_TRUE(d.daemon().started());
  double before = 0, channel_evals = 0;
  {
    kp::Manager mgr{d.address()};
    EvalLanesAtOnce(
        mgr, [&] { before = Samples::From(d.daemon()).Get("komputed_same_host_evals_total"); });
    channel_evals = Samples::From(d.daemon()).Get("komputed_same_host_evals_total") - before;
  }
  EXPECT_GE(channel_evals, kLanes * kRounds);
  // No Execute stream was opened (a stream is counted when it ends, as the session closes).
  EXPECT_EQ(Samples::From(d.daemon()).Sum("komputed_rpcs_total", {{"method", "Execute"}}), 0);
}

TEST(ExecuteBatches, AsyncEvalsOnTheStreamGoSeveralToAMessage) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.started());
  ScopedEnv no_channel("KOMPUTED_SHARED_MEMORY", std::string("0"));  // the stream, not the channel
  for (const bool batches : {true, false}) {
    SCOPED_TRACE(batches ? "batches" : "KOMPUTED_EXECUTE_BATCHES=0");
    ScopedEnv setting("KOMPUTED_EXECUTE_BATCHES", std::string(batches ? "1" : "0"));
    const Samples start = Samples::From(daemon);
    {
      kp::Manager mgr{daemon.address()};
      EvalLanesAtOnce(mgr, [] {});
    }
    const Samples end = Samples::From(daemon);
    auto grew = [&](const std::string& name, const std::map<std::string, std::string>& labels) {
      return end.Get(name, labels) - start.Get(name, labels);
    };
    const double evals = grew("komputed_execute_evals_total", {});
    const double requests = grew("komputed_execute_messages_total", {{"direction", "upload"}});
    const double events = grew("komputed_execute_messages_total", {{"direction", "download"}});
    std::printf("%s: %.0f evals in %.0f requests and %.0f event messages\n",
                batches ? "batches" : "no batches", evals, requests, events);
    EXPECT_EQ(evals, kLanes * kRounds);
    if (batches) {
      // Eight evals go out at once each round: while the client's writer sends one request, the
      // others gather for the next.
      EXPECT_LT(requests, evals);
    } else {
      EXPECT_EQ(requests, evals);
      EXPECT_EQ(events, evals);
    }
  }
}

// A sync eval channel passes a ring of shared memory: the evals and their answers go through it.
// Without it (KOMPUTED_SAME_HOST_RING=0) they go on the channel's socket, as before. The client
// either sleeps at once (a CPU device) or polls for 20 us first, so that answers come both while
// it polls and after it has said that it sleeps.
TEST(SameHost, EvalsGoThroughTheChannelsRingUnlessTurnedOff) {
  struct Case {
    bool ring;
    const char* spin_us;
  };
  for (const Case& c : {Case{true, nullptr}, Case{true, "20"}, Case{false, nullptr}}) {
    const bool ring = c.ring;
    SCOPED_TRACE(ring ? (c.spin_us != nullptr ? "with the ring, polling" : "with the ring")
                      : "without");
    SocketDaemon d;
    ASSERT_TRUE(d.daemon().started());
    ScopedEnv env("KOMPUTED_SAME_HOST_RING", ring ? std::nullopt : std::optional<std::string>("0"));
    ScopedEnv spin("KOMPUTED_FENCE_SPIN_US",
                   c.spin_us != nullptr ? std::optional<std::string>(c.spin_us) : std::nullopt);
    {
      kp::Manager mgr{d.address()};
      EXPECT_TRUE(ScaleTwice(mgr, 1024));
      // Many more, each answered before the next is written into the ring.
      auto t = mgr.tensor(std::vector<float>(64, 1.0f));
      auto seq = mgr.sequence();
      seq->record<kp::OpTensorSyncDevice>({t});
      for (int i = 0; i < 200; ++i) seq->eval();
      EXPECT_EQ(SharedMappings(d.daemon().pid(), kRingMemory), ring ? 1 : 0);
      const Samples samples = Samples::From(d.daemon());
      EXPECT_EQ(samples.Get("komputed_same_host_rings_total"), ring ? 1 : 0);
      EXPECT_GE(samples.Get("komputed_same_host_evals_total"), 202);
      // Through the ring, or none of them.
      const double through_ring = samples.Get("komputed_same_host_ring_evals_total");
      if (ring) {
        EXPECT_EQ(through_ring, samples.Get("komputed_same_host_evals_total"));
      } else {
        EXPECT_EQ(through_ring, 0);
      }
      // A client asleep for a ring's answer sleeps on the answer's number, never on the socket:
      // the daemon wakes it with a futex wake and sends no doorbell record. (A client that sleeps
      // at once is asleep for most of 200 evals that each go through the device.)
      const double word_wakes =
          samples.Get("komputed_same_host_ring_wakes_total", {{"way", "answer_word"}});
      EXPECT_EQ(samples.Get("komputed_same_host_ring_wakes_total", {{"way", "socket"}}), 0);
      if (!ring) {
        EXPECT_EQ(word_wakes, 0);
      } else if (c.spin_us == nullptr) {
        EXPECT_GE(word_wakes, 1);
      }
      EXPECT_EQ(samples.Get("komputed_rpcs_total", {{"method", "Eval"}, {"code", "OK"}}), 0);
    }
    EXPECT_EQ(MappingsAfterRelease(d.daemon().pid(), kRingMemory), 0);
  }
}

// Each invocation adds v[0] times to v[1]. Lavapipe ends an invocation's loops after 65535 steps,
// so the length comes from the workgroups: 20000 x 64 of them with v[0] = 60000 make 7.7e10 adds
// to one word, minutes on any device (lavapipe does 3e7 a second here).
constexpr char kLongShader[] = R"(
  #version 450
  layout(local_size_x = 1) in;
  layout(set = 0, binding = 0) buffer Data { uint v[]; };
  void main() {
    for (uint i = 0; i < v[0]; ++i) atomicAdd(v[1], 1u);
  }
)";

// A client asleep on its ring (on the answer's number, which the daemon wakes) still looks at the
// socket now and then: when the daemon dies during its eval, the eval fails within moments, not
// at its timeout (it has none here).
TEST(SameHost, AClientAsleepOnTheRingLearnsThatTheDaemonIsGone) {
  SocketDaemon d({"--max_kernel_time=0"});
  ASSERT_TRUE(d.daemon().started());
  ScopedEnv spin("KOMPUTED_FENCE_SPIN_US", std::string("0"));  // asleep at once
  auto mgr = std::make_shared<kp::Manager>(d.address());
  auto t = mgr->tensorT<uint32_t>(std::vector<uint32_t>{60000u, 0u});
  auto algo = mgr->algorithm({t}, kp::compileSource(kLongShader), kp::Workgroup{20000, 64, 1});
  auto quick = mgr->sequence();
  quick->eval<kp::OpTensorSyncDevice>({t});  // the ring is passed with the channel's first eval
  const double before = Samples::From(d.daemon()).Get("komputed_same_host_ring_evals_total");
  ASSERT_GE(before, 1);
  auto seq = mgr->sequence();
  seq->record<kp::OpAlgoDispatch>(algo);
  auto outcome = std::make_shared<std::promise<std::string>>();
  std::future<std::string> ended = outcome->get_future();
  // Holds the Manager: should the eval never end, the thread is left behind with it.
  std::thread evaluating([mgr, seq, outcome] {
    try {
      seq->eval();
      outcome->set_value("completed");
    } catch (const std::exception& e) {
      outcome->set_value(e.what());
    }
  });
  ASSERT_TRUE(Within10s([&] {
    return Samples::From(d.daemon()).Get("komputed_same_host_ring_evals_total") > before;
  }));
  absl::SleepFor(absl::Milliseconds(200));  // the client asleep by now
  if (ended.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    evaluating.join();
    FAIL() << "the eval ended before the daemon was killed: " << ended.get();
  }
  ASSERT_EQ(kill(d.daemon().pid(), SIGKILL), 0);
  if (ended.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    evaluating.detach();
    FAIL() << "the eval still waits 60 s after the daemon was killed";
  }
  evaluating.join();
  EXPECT_THAT(ended.get(), HasSubstr("same-host channel"));
}

TEST(SameHost, TurnedOffByTheClientTheDataGoesOverGrpc) {
  SocketDaemon d;
  ASSERT_TRUE(d.daemon().started());
  ScopedEnv off("KOMPUTED_SHARED_MEMORY", std::string("0"));
  kp::Manager mgr{d.address()};
  EXPECT_TRUE(ScaleTwice(mgr, 1 << 16));
  const Samples samples = Samples::From(d.daemon());
  EXPECT_EQ(samples.Get("komputed_shared_memory_tensors_total"), 0);
  EXPECT_EQ(samples.Get("komputed_same_host_evals_total"), 0);
  EXPECT_GE(samples.Get("komputed_bytes_transferred_total", {{"direction", "upload"}}),
            2 * (1 << 16) * sizeof(float));
  EXPECT_EQ(SharedMappings(d.daemon().pid()), 0);
}

TEST(SameHost, TurnedOffByTheDaemonNoneIsOffered) {
  SocketDaemon d({"--shared_memory=false"});
  ASSERT_TRUE(d.daemon().started());
  Stubs stubs(d.address());
  grpc::ClientContext context;
  v1::OpenSessionRequest request;
  v1::OpenSessionResponse response;
  ASSERT_TRUE(stubs.sessions->OpenSession(&context, request, &response).ok());
  EXPECT_EQ(response.shared_memory_socket(), "");
  EXPECT_EQ(response.shared_memory_ticket(), "");
  kp::Manager mgr{d.address()};
  EXPECT_TRUE(ScaleTwice(mgr, 1024));
  EXPECT_EQ(Samples::From(d.daemon()).Get("komputed_shared_memory_tensors_total"), 0);
}

TEST(SameHost, KilledClientLeavesNoMappingBehind) {
  SocketDaemon d({"--session_idle_timeout=1s"});
  ASSERT_TRUE(d.daemon().started());
  const char* env = std::getenv("VANISHING_CLIENT");
  const std::string client = env != nullptr && env[0] != '\0' ? env : VANISHING_CLIENT;
  int out = -1;
  const pid_t child = Spawn({client, d.address()}, &out);
  pollfd p{out, POLLIN, 0};
  ASSERT_GT(poll(&p, 1, 60000), 0) << "the client did not get ready";
  char buf[16] = {};
  ASSERT_GT(read(out, buf, sizeof(buf) - 1), 0);
  ASSERT_STREQ(buf, "ready\n");
  close(out);
  // Its 16 MiB tensor lives in shared memory, and its eval channel has a ring: the daemon maps
  // both.
  EXPECT_EQ(SharedMappings(d.daemon().pid()), 1);
  EXPECT_EQ(SharedMappings(d.daemon().pid(), kRingMemory), 1);
  EXPECT_EQ(Samples::From(d.daemon()).Get("komputed_shared_memory_tensors_total"), 1);
  EXPECT_EQ(Samples::From(d.daemon()).Get("komputed_same_host_rings_total"), 1);

  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  // Reaped: no mapping stays (the memfd had only the client's and the mapping's references).
  EXPECT_EQ(MappingsAfterRelease(d.daemon().pid()), 0);
  EXPECT_EQ(MappingsAfterRelease(d.daemon().pid(), kRingMemory), 0);
  // No descriptor of a memfd stays open in the daemon either.
  EXPECT_EQ(OpenDescriptors(d.daemon().pid(), "memfd:"), 0);
}

// A memfd of `size` bytes with `seals`.
int Memfd(uint64_t size, int seals) {
  const int fd = memfd_create("komputed-tensor", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) return -1;
  if (seals != 0 && fcntl(fd, F_ADD_SEALS, seals) != 0) return -1;
  return fd;
}

constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;

// A child process running as user `uid` that, when told to (Go), passes a new memfd of `size`
// bytes as region `region` of the session with `ticket` on `socket`. It is forked when made, so
// that it inherits no descriptor opened later (a file whose close would hold its exit).
class PassAsUser {
 public:
  PassAsUser(uid_t uid, const std::string& socket, const std::string& ticket, uint64_t region,
             uint64_t size) {
    int go[2];
    if (pipe2(go, O_CLOEXEC) != 0) return;
    child_ = fork();
    if (child_ == 0) {
      close(go[1]);
      if (setgroups(0, nullptr) != 0 || setresgid(uid, uid, uid) != 0 ||
          setresuid(uid, uid, uid) != 0) {
        _exit(2);
      }
      char byte;
      if (read(go[0], &byte, 1) != 1) _exit(3);  // not told to
      const int fd = Memfd(size, kSizeSeals);
      const absl::Status passed =
          v1::wire::PassSharedMemory(socket, ticket, region, fd, size, absl::Seconds(10));
      if (!passed.ok()) std::fprintf(stderr, "as user %u: %s\n", uid, passed.ToString().c_str());
      _exit(passed.ok() ? 0 : 1);
    }
    close(go[0]);
    go_ = go[1];
  }
  ~PassAsUser() {
    if (go_ >= 0) close(go_);  // a child not told ends
    if (child_ > 0) waitpid(child_, nullptr, 0);
  }

  // The child's exit status once told: 0 taken, 1 refused (its reason on stderr), 2 it could not
  // become the user; -1 when it did not end within 15 s or never started.
  int Go() {
    if (child_ <= 0 || write(go_, "g", 1) != 1) return -1;
    int status = 0;
    if (!PollUntil(absl::Seconds(15),
                   [&] { return waitpid(child_, &status, WNOHANG) == child_; })) {
      kill(child_, SIGKILL);
      return -1;
    }
    child_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t child_ = -1;
  int go_ = -1;
};

class SameHostWire : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(d_.daemon().started());
    grpc::ClientContext context;
    v1::OpenSessionRequest request;
    ASSERT_TRUE(stubs_.sessions->OpenSession(&context, request, &session_).ok());
    ASSERT_FALSE(session_.shared_memory_socket().empty()) << "lavapipe imports host memory";
    ASSERT_EQ(session_.shared_memory_ticket().size(), v1::wire::kSharedMemoryTicketSize);
  }

  absl::Status Pass(uint64_t region, int fd, uint64_t size, std::string ticket = "") {
    return v1::wire::PassSharedMemory(session_.shared_memory_socket(),
                                      ticket.empty() ? session_.shared_memory_ticket() : ticket,
                                      region, fd, size, absl::Seconds(10));
  }

  grpc::Status Create(uint64_t handle, uint64_t count, uint64_t region,
                      v1::MemoryType memory = v1::MEMORY_TYPE_DEVICE, std::string data = "") {
    grpc::ClientContext context;
    v1::CreateTensorRequest request;
    request.set_session_id(session_.session_id());
    request.set_handle(handle);
    request.set_element_type(v1::ELEMENT_TYPE_FLOAT32);
    request.set_count(count);
    request.set_memory_type(memory);
    request.set_shared_memory(region);
    request.set_data(data);
    v1::CreateTensorResponse response;
    return stubs_.tensors->CreateTensor(&context, request, &response);
  }

  SocketDaemon d_;
  Stubs stubs_{d_.address()};
  v1::OpenSessionResponse session_;
};

TEST_F(SameHostWire, HostileMemoryIsRefusedWithItsReason) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  // Not sealed: the client could shrink it under the daemon.
  int fd = Memfd(page, 0);
  absl::Status s = Pass(1, fd, page);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("not sealed against shrinking"));
  close(fd);
  // Sealed against shrinking only.
  fd = Memfd(page, F_SEAL_SHRINK);
  EXPECT_EQ(Pass(1, fd, page).code(), absl::StatusCode::kInvalidArgument);
  close(fd);
  // Sealed against writes.
  fd = Memfd(page, kSizeSeals | F_SEAL_WRITE);
  s = Pass(1, fd, page);
  EXPECT_THAT(std::string(s.message()), HasSubstr("sealed against writes"));
  close(fd);
  // Another size than the one declared, and sizes that are not whole pages.
  fd = Memfd(page, kSizeSeals);
  s = Pass(1, fd, 2 * page);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not " + std::to_string(2 * page)));
  EXPECT_THAT(std::string(Pass(1, fd, page / 2).message()), HasSubstr("whole number"));
  EXPECT_EQ(Pass(1, fd, 0).code(), absl::StatusCode::kInvalidArgument);
  // Region 0, and a ticket that is no session's.
  EXPECT_EQ(Pass(0, fd, page).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Pass(1, fd, page, std::string(v1::wire::kSharedMemoryTicketSize, 'a')).code(),
            absl::StatusCode::kNotFound);
  close(fd);
  // A file that is not a memfd.
  char path[] = "/tmp/komputed-not-memfd-XXXXXX";
  fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(page)), 0);
  s = Pass(1, fd, page);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not a memfd"));
  close(fd);
  // A pipe.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  EXPECT_THAT(std::string(Pass(1, pipe_fds[0], page).message()), HasSubstr("not a memfd"));
  close(pipe_fds[0]);
  close(pipe_fds[1]);

  // Records of another shape, without a descriptor: refused, and the daemon goes on.
  for (size_t bytes : {size_t{0}, size_t{3}, size_t{56}, size_t{4000}}) {
    absl::StatusOr<int> connected = v1::wire::ConnectSharedMemory(session_.shared_memory_socket());
    ASSERT_TRUE(connected.ok()) << connected.status();
    const int sock = *connected;
    std::vector<char> junk(bytes, 'x');
    if (bytes > 0) {
      EXPECT_EQ(send(sock, junk.data(), junk.size(), 0), ssize_t(bytes));
    } else {
      shutdown(sock, SHUT_WR);
    }
    pollfd p{sock, POLLIN, 0};
    EXPECT_GT(poll(&p, 1, 10000), 0) << "the daemon answered, or closed, the connection";
    close(sock);
  }

  // None of it left a region behind: a tensor over region 1 does not exist.
  EXPECT_EQ(Create(1, 4, 1).error_code(), grpc::NOT_FOUND);
  grpc::ClientContext context;
  v1::PingRequest ping;
  v1::PingResponse pong;
  EXPECT_TRUE(stubs_.sessions->Ping(&context, ping, &pong).ok());
}

TEST_F(SameHostWire, TensorsTakeOnlyTheirOwnRegionsAsTheyFit) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const int fd = Memfd(page, kSizeSeals);
  ASSERT_GE(fd, 0);
  float* values =
      static_cast<float*>(mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(values, MAP_FAILED);
  for (int i = 0; i < 16; ++i) values[i] = static_cast<float>(i) + 0.5f;
  ASSERT_TRUE(Pass(5, fd, page).ok());
  // Twice the same region.
  EXPECT_EQ(Pass(5, fd, page).code(), absl::StatusCode::kAlreadyExists);
  close(fd);

  // Not a region of this session; data as well as shared memory; more than the region holds;
  // a memory type that cannot take it. None of them takes the region.
  EXPECT_EQ(Create(1, 16, 6).error_code(), grpc::NOT_FOUND);
  EXPECT_EQ(Create(1, 4, 5, v1::MEMORY_TYPE_DEVICE, std::string(16, '\0')).error_code(),
            grpc::INVALID_ARGUMENT);
  grpc::Status st = Create(1, page, 5);
  EXPECT_EQ(st.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("do not fit in shared-memory region 5"));
  EXPECT_EQ(Create(1, 16, 5, v1::MEMORY_TYPE_DEVICE_AND_HOST).error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(Create(1, 16, 5, v1::MEMORY_TYPE_STORAGE).error_code(), grpc::INVALID_ARGUMENT);

  // Another session cannot take it, even knowing the region's number.
  grpc::ClientContext context;
  v1::OpenSessionRequest open;
  v1::OpenSessionResponse other;
  ASSERT_TRUE(stubs_.sessions->OpenSession(&context, open, &other).ok());
  {
    grpc::ClientContext c;
    v1::CreateTensorRequest request;
    request.set_session_id(other.session_id());
    request.set_handle(1);
    request.set_element_type(v1::ELEMENT_TYPE_FLOAT32);
    request.set_count(16);
    request.set_shared_memory(5);
    v1::CreateTensorResponse response;
    EXPECT_EQ(stubs_.tensors->CreateTensor(&c, request, &response).error_code(), grpc::NOT_FOUND);
  }

  // The tensor takes it; its host data is the memory as the client wrote it.
  ASSERT_TRUE(Create(1, 16, 5).ok());
  EXPECT_EQ(Create(2, 16, 5).error_code(), grpc::NOT_FOUND);  // taken
  {
    grpc::ClientContext c;
    v1::ReadTensorRequest request;
    request.set_session_id(session_.session_id());
    request.set_handle(1);
    auto reader = stubs_.tensors->ReadTensor(&c, request);
    std::string data;
    v1::TensorChunk chunk;
    while (reader->Read(&chunk)) data += chunk.data();
    ASSERT_TRUE(reader->Finish().ok());
    ASSERT_EQ(data.size(), 16 * sizeof(float));
    EXPECT_EQ(std::memcmp(data.data(), values, data.size()), 0);
  }
  munmap(values, page);
  EXPECT_EQ(SharedMappings(d_.daemon().pid()), 1);
  {
    grpc::ClientContext c;
    v1::CloseSessionRequest request;
    request.set_session_id(session_.session_id());
    v1::CloseSessionResponse response;
    ASSERT_TRUE(stubs_.sessions->CloseSession(&c, request, &response).ok());
  }
  EXPECT_EQ(MappingsAfterRelease(d_.daemon().pid()), 0);
}

std::string EvalRecord(const v1::EvalRequest& request) {
  return v1::wire::EncodeChannelRequest(v1::wire::ChannelOp::kEval, request.SerializeAsString());
}

TEST_F(SameHostWire, TheEvalChannelTakesOnlyWhatItShould) {
  const std::string& name = session_.shared_memory_socket();
  const std::string bind =
      v1::wire::EncodeChannelRequest(v1::wire::ChannelOp::kBind, session_.shared_memory_ticket());
  {
    // An eval before any bind, then the connection is closed.
    RawChannel c(name);
    ASSERT_TRUE(c.connected());
    absl::StatusOr<std::string> a = c.Ask(EvalRecord(v1::EvalRequest()));
    EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition) << a.status();
    EXPECT_TRUE(c.Closed());
  }
  {
    // Another session's ticket (none), and a record of an unknown version or op.
    RawChannel c(name);
    EXPECT_EQ(
        c.Ask(v1::wire::EncodeChannelRequest(v1::wire::ChannelOp::kBind,
                                             std::string(v1::wire::kSharedMemoryTicketSize, 'b')))
            .status()
            .code(),
        absl::StatusCode::kNotFound);
    RawChannel d(name);
    std::string bad = bind;
    bad[8] = 9;  // the op
    EXPECT_EQ(d.Ask(bad).status().code(), absl::StatusCode::kInvalidArgument);
    RawChannel e(name);
    bad = bind;
    bad[12] = 1;  // a payload size that is not the record's
    EXPECT_EQ(e.Ask(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    // A channel record with a descriptor.
    RawChannel c(name);
    const int fd = Memfd(4096, kSizeSeals);
    EXPECT_EQ(c.Ask(bind, fd).status().code(), absl::StatusCode::kInvalidArgument);
    close(fd);
  }
  RawChannel c(name);
  ASSERT_TRUE(c.Ask(bind).ok());
  // Bound twice.
  {
    RawChannel twice(name);
    ASSERT_TRUE(twice.Ask(bind).ok());
    EXPECT_EQ(twice.Ask(bind).status().code(), absl::StatusCode::kFailedPrecondition);
  }
  // Not an EvalRequest; an eval that creates a tensor; one with downloads; one over a record.
  {
    RawChannel k(name);
    ASSERT_TRUE(k.Ask(bind).ok());
    EXPECT_EQ(k.Ask(v1::wire::EncodeChannelRequest(v1::wire::ChannelOp::kEval, "\xff\xff\xff"))
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument);
  }
  v1::EvalRequest create;
  v1::CreateTensorRequest* t = create.add_commands()->mutable_create_tensor();
  t->set_handle(1);
  t->set_element_type(v1::ELEMENT_TYPE_FLOAT32);
  t->set_count(4);
  absl::StatusOr<std::string> a = c.Ask(EvalRecord(create));
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("creates objects"));
  v1::EvalRequest downloads;
  downloads.add_downloads(1);
  EXPECT_EQ(c.Ask(EvalRecord(downloads)).status().code(), absl::StatusCode::kInvalidArgument);
  {
    RawChannel big(name);
    ASSERT_TRUE(big.Ask(bind).ok());
    v1::EvalRequest large;
    large.add_uploads()->set_data(std::string(v1::wire::kMaxChannelRecord, 'x'));
    absl::StatusOr<std::string> answer = big.Ask(EvalRecord(large));
    EXPECT_FALSE(answer.ok());
    EXPECT_TRUE(big.Closed());
  }
  // Nothing of that was made: tensor 1 is free, and a real eval on the channel works.
  ASSERT_TRUE(Create(1, 4, 0).ok());
  v1::EvalRequest nothing;  // no sequence: runs no submission, succeeds
  absl::StatusOr<std::string> ok = c.Ask(EvalRecord(nothing));
  EXPECT_TRUE(ok.ok()) << ok.status();
  EXPECT_GE(Samples::From(d_.daemon()).Get("komputed_same_host_evals_total"), 1);
  // Once the session is closed, its channel's evals are NOT_FOUND.
  {
    grpc::ClientContext context;
    v1::CloseSessionRequest request;
    request.set_session_id(session_.session_id());
    v1::CloseSessionResponse response;
    ASSERT_TRUE(stubs_.sessions->CloseSession(&context, request, &response).ok());
  }
  EXPECT_EQ(c.Ask(EvalRecord(nothing)).status().code(), absl::StatusCode::kNotFound);
}

// A ring (kRing) is taken only on a bound channel, once, as a sealed memfd of the ring's size. An
// eval in it is answered in it; one that the channel does not take is refused there with its
// reason; a request in it that is malformed ends the channel.
TEST_F(SameHostWire, ARingIsTakenOnlyAsItShouldBeAndCarriesEvals) {
  using Sleep = v1::wire::ChannelRing::Sleep;
  const std::string& name = session_.shared_memory_socket();
  const std::string bind =
      v1::wire::EncodeChannelRequest(v1::wire::ChannelOp::kBind, session_.shared_memory_ticket());
  const std::string ring_record = v1::wire::EncodeChannelRequest(v1::wire::ChannelOp::kRing, {});
  const std::string doorbell = v1::wire::EncodeChannelRequest(v1::wire::ChannelOp::kDoorbell, {});
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t size = (v1::wire::kRingBytes + page - 1) / page * page;
  // Asks with a new memfd of `bytes` and `seals`.
  auto pass = [&](RawChannel& c, uint64_t bytes, int seals) {
    const int fd = Memfd(bytes, seals);
    absl::StatusOr<std::string> answer = c.Ask(ring_record, fd);
    close(fd);
    return answer.status().code();
  };
  {
    RawChannel c(name);  // bound to no session
    EXPECT_EQ(pass(c, size, kSizeSeals), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(c.Closed());
  }
  {
    RawChannel none(name);
    ASSERT_TRUE(none.Ask(bind).ok());
    EXPECT_EQ(none.Ask(ring_record).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(none.Closed());
    RawChannel small(name);
    ASSERT_TRUE(small.Ask(bind).ok());
    EXPECT_EQ(pass(small, page, kSizeSeals), absl::StatusCode::kInvalidArgument);
    RawChannel unsealed(name);
    ASSERT_TRUE(unsealed.Ask(bind).ok());
    EXPECT_EQ(pass(unsealed, size, 0), absl::StatusCode::kInvalidArgument);
    RawChannel twice(name);
    ASSERT_TRUE(twice.Ask(bind).ok());
    EXPECT_EQ(pass(twice, size, kSizeSeals), absl::StatusCode::kOk);
    EXPECT_EQ(pass(twice, size, kSizeSeals), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(twice.Closed());
  }
  EXPECT_EQ(Samples::From(d_.daemon()).Get("komputed_same_host_rings_total"), 1);

  // Binds `channel`, passes it a new ring, and maps the ring here too (until the test ends): its
  // memory, or null when any step failed.
  std::vector<void*> mapped;
  const absl::Cleanup unmap = [&] {
    for (void* m : mapped) munmap(m, size);
  };
  auto attach = [&](RawChannel& channel) -> void* {
    if (!channel.Ask(bind).ok()) return nullptr;
    const int fd = Memfd(size, kSizeSeals);
    void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      close(fd);
      return nullptr;
    }
    mapped.push_back(base);
    absl::StatusOr<std::string> taken = channel.Ask(ring_record, fd);
    close(fd);
    EXPECT_TRUE(taken.ok()) << taken.status();
    return taken.ok() ? base : nullptr;
  };

  // A good ring.
  RawChannel c(name);
  void* base = attach(c);
  ASSERT_NE(base, nullptr);
  v1::wire::ChannelRing ring(base, nullptr);
  // The daemon's channel thread, idle, says that it sleeps (a CPU device's never polls; a GPU's
  // polls for --eval_spin first).
  const absl::Time idle_until = absl::Now() + absl::Seconds(10);
  while (!ring.daemon_sleeping() && absl::Now() < idle_until) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(ring.daemon_sleeping());
  // As a client does: says that it sleeps (here before the request, so that every answer comes
  // with a doorbell), publishes the request, rings if the daemon sleeps, and waits on the socket
  // for the daemon's doorbell. Returns the decoded answer.
  int doorbells = 0;
  auto ask = [&](uint32_t seq, const std::string& record) -> absl::StatusOr<std::string> {
    ring.set_client_sleeping(Sleep::kOnSocket);
    ring.PutRequest(seq, record);
    if (ring.daemon_sleeping()) {
      EXPECT_TRUE(c.Send(doorbell));
    }
    absl::StatusOr<std::string> rung = c.Record();
    ring.set_client_sleeping(Sleep::kAwake);
    if (!rung.ok()) return rung.status();
    v1::wire::ChannelOp op;
    absl::string_view payload;
    if (v1::wire::DecodeChannelRequest(*rung, &op, &payload).ok() &&
        op == v1::wire::ChannelOp::kDoorbell) {
      ++doorbells;
    }
    if (ring.answer_seq() != seq) return absl::DeadlineExceededError("no answer in the ring");
    absl::StatusOr<std::string> answer = ring.TakeAnswer();
    if (!answer.ok()) return answer.status();
    return v1::wire::DecodeChannelReply(*answer);
  };
  // A request published while the daemon sleeps, without its doorbell, waits for one.
  ring.PutRequest(1, EvalRecord(v1::EvalRequest()));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(ring.answer_seq(), 0u) << "served without its doorbell while the daemon slept";
  ASSERT_TRUE(c.Send(doorbell));
  const absl::Time until1 = absl::Now() + absl::Seconds(10);
  while (ring.answer_seq() != 1 && absl::Now() < until1) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(ring.answer_seq(), 1u);
  EXPECT_EQ(ring.taken_seq(), 1u);
  EXPECT_EQ(Samples::From(d_.daemon()).Get("komputed_same_host_ring_evals_total"), 1);
  const v1::EvalRequest nothing;  // no sequence: runs no submission, succeeds
  for (uint32_t seq = 2; seq <= 3; ++seq) {
    absl::StatusOr<std::string> a = ask(seq, EvalRecord(nothing));
    EXPECT_TRUE(a.ok()) << a.status();
  }
  EXPECT_EQ(doorbells, 2) << "an answer to a client that said it slept came without a doorbell";
  v1::EvalRequest create;
  create.add_commands()->mutable_create_tensor()->set_handle(1);
  absl::StatusOr<std::string> refused = ask(4, EvalRecord(create));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("creates objects"));
  EXPECT_TRUE(ask(5, EvalRecord(nothing)).ok());
  // The daemon said, when it took the ring, that it wakes a client asleep on the answer's number:
  // one asleep so is woken there, and gets no doorbell on the socket. The request goes while the
  // daemon sleeps, and its doorbell from another thread once this one is asleep, so that the answer
  // comes during the sleep. (The sleep is bounded by 20 s: one that lasts 10 s was not woken.)
  ASSERT_TRUE(ring.wakes_answer_word());
  {
    const absl::Time asleep_until = absl::Now() + absl::Seconds(10);
    while (!ring.daemon_sleeping() && absl::Now() < asleep_until) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    ASSERT_TRUE(ring.daemon_sleeping());
    ring.set_client_sleeping(Sleep::kOnAnswerWord);
    const uint32_t seen = ring.answer_seq();
    ASSERT_EQ(seen, 5u);
    ring.PutRequest(6, EvalRecord(nothing));
    std::thread ring_later([&] {
      absl::SleepFor(absl::Milliseconds(100));
      EXPECT_TRUE(c.Send(doorbell));
    });
    const absl::Time slept = absl::Now();
    ring.WaitAnswer(seen, absl::Seconds(20));
    EXPECT_LT(absl::Now() - slept, absl::Seconds(10)) << "the answer's number was not woken";
    ring_later.join();
    ring.set_client_sleeping(Sleep::kAwake);
    const absl::Time until6 = absl::Now() + absl::Seconds(10);
    while (ring.answer_seq() != 6 && absl::Now() < until6) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_EQ(ring.answer_seq(), 6u);
    absl::StatusOr<std::string> answer = ring.TakeAnswer();
    ASSERT_TRUE(answer.ok());
    EXPECT_TRUE(v1::wire::DecodeChannelReply(*answer).ok());
    EXPECT_EQ(c.Record(absl::Milliseconds(200)).status().code(),
              absl::StatusCode::kDeadlineExceeded)
        << "a doorbell on the socket for a client asleep on the answer's number";
  }
  // A record in the ring that is not an eval ends the channel, answered with why.
  absl::StatusOr<std::string> not_eval = ask(7, bind);
  EXPECT_EQ(not_eval.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(not_eval.status().message()), HasSubstr("not an eval"));
  EXPECT_TRUE(c.Closed());

  // A request whose size is over a record's: refused with its size, and the channel ends.
  RawChannel h(name);
  void* hbase = attach(h);
  ASSERT_NE(hbase, nullptr);
  auto* words = static_cast<uint32_t*>(hbase);
  words[v1::wire::ChannelRing::kRequestSize / 4] = 0xffffffffu;
  __atomic_store_n(&words[v1::wire::ChannelRing::kRequestSeq / 4], 1u, __ATOMIC_SEQ_CST);
  ASSERT_TRUE(h.Send(doorbell));
  v1::wire::ChannelRing hostile(hbase, nullptr);
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (hostile.answer_seq() != 1 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(hostile.answer_seq(), 1u);
  absl::StatusOr<std::string> record = hostile.TakeAnswer();
  ASSERT_TRUE(record.ok());
  absl::StatusOr<std::string> over = v1::wire::DecodeChannelReply(*record);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("4294967295 bytes"));
  EXPECT_TRUE(h.Closed());
  // The daemon serves on: a new channel with a ring of its own is taken.
  RawChannel again(name);
  ASSERT_TRUE(again.Ask(bind).ok());
  EXPECT_EQ(pass(again, size, kSizeSeals), absl::StatusCode::kOk);
}

// A client can pass, in place of a memfd, a file whose close does not return: one of its own FUSE
// mount, whose flush it leaves unanswered. The daemon closes each such descriptor on a thread of
// its own: each way of passing one is refused at once, the same-host path goes on, and none stays
// in the daemon's descriptor table (where a child it forks would inherit it). Once 16 such closes
// wait, the socket takes no descriptor (the kernel drops them unseen) until they are done.
TEST_F(SameHostWire, AFileWhoseCloseHangsHoldsNoServingThread) {
  // Started first: it must not inherit the FUSE file (its exit would wait on the held flush).
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::optional<PassAsUser> other_user;
  if (geteuid() == 0) {
    other_user.emplace(65534, session_.shared_memory_socket(), session_.shared_memory_ticket(), 3,
                       page);
  }
  StallingFuse fuse;
  if (!fuse.mounted()) GTEST_SKIP() << "no FUSE mount can be made here: " << fuse.error();
  const int file = open(fuse.file().c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(file, 0) << std::strerror(errno);
  const absl::Cleanup close_file = [&] {
    fuse.Release();
    close(file);
  };
  fuse.Stall();
  const std::string& name = session_.shared_memory_socket();
  const std::string bind =
      v1::wire::EncodeChannelRequest(v1::wire::ChannelOp::kBind, session_.shared_memory_ticket());
  const std::string ring_record = v1::wire::EncodeChannelRequest(v1::wire::ChannelOp::kRing, {});
  const uint64_t ring_size = (v1::wire::kRingBytes + page - 1) / page * page;

  // As a region (taken on the import worker), as a bound channel's ring (on a channel reactor),
  // with an unbound channel's record (on the socket's own thread), and with a record that a bound
  // channel does not take.
  absl::Status passed = Pass(1, file, page);
  EXPECT_THAT(std::string(passed.message()), HasSubstr("not a memfd")) << passed;
  {
    RawChannel c(name);
    ASSERT_TRUE(c.Ask(bind).ok());
    absl::StatusOr<std::string> ring = c.Ask(ring_record, file);
    EXPECT_THAT(std::string(ring.status().message()), HasSubstr("not a memfd")) << ring.status();
  }
  {
    RawChannel c(name);
    absl::StatusOr<std::string> bound = c.Ask(bind, file);
    EXPECT_THAT(std::string(bound.status().message()), HasSubstr("with descriptors"))
        << bound.status();
  }
  {
    RawChannel c(name);
    ASSERT_TRUE(c.Ask(bind).ok());
    EXPECT_EQ(c.Ask("not a channel record", file).status().code(), absl::StatusCode::kUnavailable)
        << "a bound channel that gets another record is closed";
  }
  // Each close waits on its flush, none in the daemon's table.
  EXPECT_TRUE(Within10s([&] { return fuse.flushes() == 4; })) << fuse.flushes();
  EXPECT_EQ(OpenDescriptors(d_.daemon().pid(), fuse.file()), 0);

  // Meanwhile memory is taken, and a channel binds and takes a ring.
  const int memfd = Memfd(page, kSizeSeals);
  EXPECT_TRUE(Pass(1, memfd, page).ok());
  {
    RawChannel c(name);
    ASSERT_TRUE(c.Ask(bind).ok());
    const int ring = Memfd(ring_size, kSizeSeals);
    EXPECT_TRUE(c.Ask(ring_record, ring).ok());
    close(ring);
  }

  // Once 16 wait, a descriptor is dropped unseen, and its record refused with the reason; records
  // without one are still served.
  for (int i = 4; i < 16; ++i) {
    RawChannel c(name);
    EXPECT_THAT(std::string(c.Ask(bind, file).status().message()), HasSubstr("with descriptors"));
  }
  EXPECT_TRUE(Within10s([&] { return fuse.flushes() == 16; })) << fuse.flushes();
  {
    RawChannel c(name);
    absl::StatusOr<std::string> bound = c.Ask(bind, file);
    EXPECT_EQ(bound.status().code(), absl::StatusCode::kResourceExhausted) << bound.status();
    EXPECT_THAT(std::string(bound.status().message()), HasSubstr("takes no descriptors"));
  }
  const absl::Status refused = Pass(2, memfd, page);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("takes no descriptors")) << refused;
  EXPECT_TRUE(RawChannel(name).Ask(bind).ok());
  EXPECT_EQ(fuse.flushes(), 16);
  EXPECT_EQ(OpenDescriptors(d_.daemon().pid(), fuse.file()), 0);
  // The closes that wait are counted by the user who passed the files: another user's memory is
  // still taken (this needs root, to run a child as another user).
  if (other_user.has_value()) {
    EXPECT_EQ(other_user->Go(), 0) << "another user's memfd was not taken";
  } else {
    std::cout << "not root: the other user's region was not tried\n";
  }

  // Answered, every close ends, and descriptors are taken again.
  fuse.Release();
  absl::Status again;
  EXPECT_TRUE(Within10s([&] {
    again = Pass(2, memfd, page);
    return again.ok();
  })) << again;
  EXPECT_EQ(fuse.flushes(), 16);
  close(memfd);
}

TEST_F(SameHostWire, SubmitsAreAnsweredWithTheirIdsAndRefusedWhenMalformed) {
  const std::string& name = session_.shared_memory_socket();
  const std::string bind =
      v1::wire::EncodeChannelRequest(v1::wire::ChannelOp::kBind, session_.shared_memory_ticket());
  const std::string nothing = v1::EvalRequest().SerializeAsString();  // no submission: succeeds
  {
    // A submit before any bind: refused with its id, and the connection is closed.
    RawChannel c(name);
    ASSERT_TRUE(c.Send(v1::wire::EncodeChannelSubmit(41, nothing)));
    uint64_t id = 0;
    absl::StatusOr<std::string> a = c.SubmitAnswer(&id);
    EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition) << a.status();
    EXPECT_EQ(id, 41u);
    EXPECT_TRUE(c.Closed());
  }
  {
    // A submit too short to hold its id.
    RawChannel c(name);
    ASSERT_TRUE(c.Ask(bind).ok());
    ASSERT_TRUE(c.Send(v1::wire::EncodeChannelRequest(v1::wire::ChannelOp::kSubmit, "ab")));
    uint64_t id = 0;
    EXPECT_EQ(c.SubmitAnswer(&id).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(c.Closed());
  }
  RawChannel c(name);
  ASSERT_TRUE(c.Ask(bind).ok());
  // Several sent before any answer is read; each comes back with its own id.
  v1::EvalRequest create;
  create.add_commands()->mutable_create_tensor()->set_handle(1);
  ASSERT_TRUE(c.Send(v1::wire::EncodeChannelSubmit(7, nothing)));
  ASSERT_TRUE(c.Send(v1::wire::EncodeChannelSubmit(8, create.SerializeAsString())));
  ASSERT_TRUE(c.Send(v1::wire::EncodeChannelSubmit(9, "\xff\xff\xff")));
  std::map<uint64_t, absl::StatusCode> answers;
  for (int i = 0; i < 3; ++i) {
    uint64_t id = 0;
    absl::StatusOr<std::string> a = c.SubmitAnswer(&id);
    answers[id] = a.status().code();
  }
  EXPECT_EQ(answers[7], absl::StatusCode::kOk);
  EXPECT_EQ(answers[8], absl::StatusCode::kInvalidArgument);  // creates objects: gRPC's
  EXPECT_EQ(answers[9], absl::StatusCode::kInvalidArgument);  // not an EvalRequest
  // The channel still serves after those refusals.
  ASSERT_TRUE(c.Send(v1::wire::EncodeChannelSubmit(10, nothing)));
  uint64_t id = 0;
  EXPECT_TRUE(c.SubmitAnswer(&id).ok());
  EXPECT_EQ(id, 10u);
}

}  // namespace
