// End-to-end tests: the real komputed binary on a free port, driven through the kp API and the
// generated stubs.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <kompute/Kompute.hpp>
#include <thread>

#include "komputed/v1/komputed.grpc.pb.h"
#include "support/daemon_process.h"
#include "support/process.h"

namespace {

using komputed::test_support::DaemonProcess;
using komputed::test_support::ScrapeMetrics;
using komputed::test_support::Spawn;
namespace v1 = komputed::v1;

constexpr char kScaleShader[] = R"(
  #version 450
  layout(local_size_x = 1) in;
  layout(set = 0, binding = 0) buffer In { float in_v[]; };
  layout(set = 0, binding = 1) buffer Out { float out_v[]; };
  layout(push_constant) uniform Push { float k; } push;
  void main() {
    uint i = gl_GlobalInvocationID.x;
    out_v[i] = in_v[i] * push.k;
  }
)";

struct Stubs {
  explicit Stubs(const std::string& address)
      : channel(grpc::CreateChannel(address, grpc::InsecureChannelCredentials())),
        sessions(v1::Sessions::NewStub(channel)),
        devices(v1::Devices::NewStub(channel)),
        tensors(v1::Tensors::NewStub(channel)),
        sequences(v1::Sequences::NewStub(channel)) {}

  std::string Open() {
    grpc::ClientContext c;
    v1::OpenSessionRequest req;
    v1::OpenSessionResponse resp;
    EXPECT_TRUE(sessions->OpenSession(&c, req, &resp).ok());
    return resp.session_id();
  }
  grpc::Status CreateTensor(const std::string& session, uint64_t handle, uint64_t count) {
    grpc::ClientContext c;
    v1::CreateTensorRequest req;
    req.set_session_id(session);
    req.set_handle(handle);
    req.set_element_type(v1::ELEMENT_TYPE_FLOAT32);
    req.set_count(count);
    v1::CreateTensorResponse resp;
    return tensors->CreateTensor(&c, req, &resp);
  }
  v1::ListDevicesResponse Devices() {
    grpc::ClientContext c;
    v1::ListDevicesResponse resp;
    EXPECT_TRUE(devices->ListDevices(&c, v1::ListDevicesRequest(), &resp).ok());
    return resp;
  }
  v1::ListSessionsResponse Sessions() {
    grpc::ClientContext c;
    v1::ListSessionsResponse resp;
    EXPECT_TRUE(sessions->ListSessions(&c, v1::ListSessionsRequest(), &resp).ok());
    return resp;
  }

  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Sessions::Stub> sessions;
  std::unique_ptr<v1::Devices::Stub> devices;
  std::unique_ptr<v1::Tensors::Stub> tensors;
  std::unique_ptr<v1::Sequences::Stub> sequences;
};

// Runs the scale shader remotely and returns out.
std::vector<float> Scale(kp::Manager& mgr, const std::vector<float>& in, float k) {
  auto a = mgr.tensor(in);
  auto out = mgr.tensorT<float>(in.size());
  std::vector<std::shared_ptr<kp::Tensor>> params = {a, out};
  auto algo = mgr.algorithm(params, kp::compileSource(kScaleShader), {}, std::vector<float>{},
                            std::vector<float>{k});
  mgr.sequence()
      ->record<kp::OpTensorSyncDevice>(params)
      ->record<kp::OpAlgoDispatch>(algo)
      ->record<kp::OpTensorSyncLocal>(params)
      ->eval();
  return out->vector();
}

kp::ErrorCode CodeOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const kp::Error& e) {
    return e.code();
  }
  return kp::ErrorCode::kOk;
}

TEST(EndToEnd, SeedExampleRunsRemotelyUnchanged) {
  DaemonProcess daemon;
  std::string command = std::string("KOMPUTED_ADDRESS=") + daemon.address() + " bash " +
                        SEED_SCRIPT + " " + SEED_FILE + " " + BUILD_DIR + " " + BUILD_DIR +
                        "/tests/e2e/seed-remote";
  int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "seed file not present";
  EXPECT_EQ(WEXITSTATUS(status), 0) << command;
}

TEST(EndToEnd, SessionsCannotSeeEachOthersHandles) {
  DaemonProcess daemon;
  Stubs stubs(daemon.address());
  std::string a = stubs.Open();
  std::string b = stubs.Open();
  ASSERT_NE(a, b);
  ASSERT_TRUE(stubs.CreateTensor(a, 7, 16).ok());
  {
    grpc::ClientContext c;
    v1::DestroyTensorRequest req;
    req.set_session_id(b);
    req.set_handle(7);
    v1::DestroyTensorResponse resp;
    EXPECT_EQ(stubs.tensors->DestroyTensor(&c, req, &resp).error_code(), grpc::NOT_FOUND);
  }
  {
    grpc::ClientContext c;
    v1::EvalRequest req;
    req.set_session_id(b);
    req.add_downloads(7);
    v1::EvalResponse resp;
    EXPECT_EQ(stubs.sequences->Eval(&c, req, &resp).error_code(), grpc::NOT_FOUND);
  }
  // The same handle is free in the other session, and still taken in the first.
  EXPECT_TRUE(stubs.CreateTensor(b, 7, 16).ok());
  EXPECT_EQ(stubs.CreateTensor(a, 7, 16).error_code(), grpc::ALREADY_EXISTS);
  // A made-up session id is NOT_FOUND.
  EXPECT_EQ(stubs.CreateTensor("no-such-session", 1, 16).error_code(), grpc::NOT_FOUND);
}

TEST(EndToEnd, VanishedClientIsReapedAndItsMemoryReturned) {
  DaemonProcess daemon({"--session_idle_timeout=1s"});
  Stubs stubs(daemon.address());
  const char* env = std::getenv("VANISHING_CLIENT");
  const std::string client = env != nullptr && env[0] != '\0' ? env : VANISHING_CLIENT;
  int out = -1;
  const pid_t child = Spawn({client, daemon.address()}, &out);
  pollfd p{out, POLLIN, 0};
  ASSERT_GT(poll(&p, 1, 60000), 0) << "the client did not get ready";
  char buf[16] = {};
  ASSERT_GT(read(out, buf, sizeof(buf) - 1), 0);
  ASSERT_STREQ(buf, "ready\n");
  close(out);

  // While the client lives, its session holds device memory.
  auto devices = stubs.Devices();
  ASSERT_GT(devices.devices_size(), 0);
  EXPECT_GE(devices.devices(0).memory_in_use_bytes(), uint64_t{16} << 20);
  EXPECT_EQ(stubs.Sessions().sessions_size(), 1);

  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);

  // Reaped within a bounded time: no session, no memory.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  uint64_t in_use = 1;
  int sessions = 1;
  while (std::chrono::steady_clock::now() < deadline) {
    in_use = stubs.Devices().devices(0).memory_in_use_bytes();
    sessions = stubs.Sessions().sessions_size();
    if (in_use == 0 && sessions == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(sessions, 0);
  EXPECT_EQ(in_use, 0u);
}

TEST(EndToEnd, BadInputIsRejectedOverTheWireAndChangesNothing) {
  DaemonProcess daemon;
  kp::Manager mgr{daemon.address()};
  auto a = mgr.tensor({1, 2, 3});
  auto u = mgr.tensorT<uint32_t>({1, 2, 3});
  auto spirv = kp::compileSource(kScaleShader);
  const auto limits = mgr.getDeviceProperties().limits;

  EXPECT_EQ(CodeOf([&] { mgr.tensorT<float>(size_t{0}); }), kp::ErrorCode::kInvalidArgument);
  EXPECT_EQ(CodeOf([&] {
              mgr.algorithm({a, a}, std::vector<uint32_t>{1, 2, 3});
            }),
            kp::ErrorCode::kInvalidArgument);
  EXPECT_EQ(CodeOf([&] {
              mgr.algorithm({a, a}, spirv,
                            kp::Workgroup({limits.maxComputeWorkGroupCount[0] + 1, 1, 1}),
                            std::vector<float>{}, std::vector<float>{2});
            }),
            kp::ErrorCode::kInvalidArgument);
  auto algo = mgr.algorithm({a, a}, spirv, {}, std::vector<float>{}, std::vector<float>{2});
  EXPECT_EQ(CodeOf([&] { algo->setPushConstants(std::vector<double>{1.0}); }),
            kp::ErrorCode::kInvalidArgument);
  EXPECT_EQ(CodeOf([&] {
              mgr.sequence()->record<kp::OpAlgoDispatch>(algo, std::vector<float>{1, 2});
            }),
            kp::ErrorCode::kInvalidArgument);
  EXPECT_EQ(
      CodeOf([&] {
        mgr.sequence()->record<kp::OpTensorCopy>(std::vector<std::shared_ptr<kp::Tensor>>{a, u});
      }),
      kp::ErrorCode::kInvalidArgument);
  EXPECT_EQ(CodeOf([&] {
              kp::Manager too_many(kp::Remote{daemon.address(), 0, std::vector<uint32_t>(64, 0)});
            }),
            kp::ErrorCode::kInvalidArgument);
  EXPECT_EQ(CodeOf([&] {
              kp::Manager no_device(kp::Remote{daemon.address(), 99, {}});
            }),
            kp::ErrorCode::kInvalidArgument);

  // Chunks that do not add up.
  Stubs stubs(daemon.address());
  std::string session = stubs.Open();
  ASSERT_TRUE(stubs.CreateTensor(session, 1, 4).ok());
  {
    grpc::ClientContext c;
    v1::WriteTensorResponse resp;
    auto writer = stubs.tensors->WriteTensor(&c, &resp);
    v1::TensorChunk chunk;
    chunk.set_session_id(session);
    chunk.set_handle(1);
    chunk.set_total_bytes(16);
    chunk.set_data(std::string(8, 'x'));
    writer->Write(chunk);
    writer->WritesDone();
    EXPECT_EQ(writer->Finish().error_code(), grpc::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext c;
    v1::WriteTensorResponse resp;
    auto writer = stubs.tensors->WriteTensor(&c, &resp);
    v1::TensorChunk chunk;
    chunk.set_session_id(session);
    chunk.set_handle(1);
    chunk.set_total_bytes(8);
    chunk.set_offset(12);
    chunk.set_data(std::string(8, 'x'));
    writer->Write(chunk);
    writer->WritesDone();
    EXPECT_EQ(writer->Finish().error_code(), grpc::INVALID_ARGUMENT);
  }

  // Everything still works afterwards.
  EXPECT_EQ(Scale(mgr, {1, 2, 3}, 2), (std::vector<float>{2, 4, 6}));
}

TEST(EndToEnd, OneGibibyteRoundTrip) {
  DaemonProcess daemon;
  kp::Manager mgr{daemon.address()};
  const size_t count = size_t{1} << 28;  // 1 GiB of uint32
  auto t = mgr.tensorT<uint32_t>(count);
  uint32_t* data = t->data();
  for (size_t i = 0; i < count; ++i) data[i] = static_cast<uint32_t>(i * 2654435761u);
  auto seq = mgr.sequence();
  seq->eval<kp::OpTensorSyncDevice>(std::vector<std::shared_ptr<kp::Tensor>>{t});
  std::memset(data, 0, count * sizeof(uint32_t));
  seq->eval<kp::OpTensorSyncLocal>(std::vector<std::shared_ptr<kp::Tensor>>{t});
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += data[i] != static_cast<uint32_t>(i * 2654435761u);
  EXPECT_EQ(wrong, 0u);
}

// A bulk transfer split over parallel streams (ranges of whole 4 MiB chunks, the last one
// short): every byte arrives once, in its place, each way.
TEST(EndToEnd, BulkTransfersSplitOverParallelStreams) {
  DaemonProcess daemon({"--shared_memory=false"});  // the data goes through gRPC's streams
  ASSERT_EQ(setenv("KOMPUTED_TRANSFER_STREAMS", "3", 1), 0);
  kp::Manager mgr{daemon.address()};
  unsetenv("KOMPUTED_TRANSFER_STREAMS");
  const size_t count = (size_t{100} << 20) / 4 + 3;  // 100 MiB and 12 bytes: 26 chunks
  auto t = mgr.tensorT<uint32_t>(count);
  uint32_t* data = t->data();
  for (size_t i = 0; i < count; ++i) data[i] = static_cast<uint32_t>(i * 2654435761u + 7);
  auto seq = mgr.sequence();
  seq->eval<kp::OpTensorSyncDevice>(std::vector<std::shared_ptr<kp::Tensor>>{t});
  std::memset(data, 0, count * sizeof(uint32_t));
  seq->eval<kp::OpTensorSyncLocal>(std::vector<std::shared_ptr<kp::Tensor>>{t});
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += data[i] != static_cast<uint32_t>(i * 2654435761u + 7);
  EXPECT_EQ(wrong, 0u);
  // Three WriteTensor and three ReadTensor calls: the ranges went over three streams.
  const std::string metrics = ScrapeMetrics(daemon.metrics_address());
  EXPECT_THAT(metrics,
              ::testing::HasSubstr(
                  "komputed_rpcs_total{code=\"OK\",method=\"komputed.v1.Tensors/WriteTensor\"} 3"));
  EXPECT_THAT(metrics,
              ::testing::HasSubstr(
                  "komputed_rpcs_total{code=\"OK\",method=\"komputed.v1.Tensors/ReadTensor\"} 3"));
}

TEST(EndToEnd, SixteenConcurrentClients) {
  DaemonProcess daemon;
  constexpr int kClients = 16;
  constexpr int kEvals = 200;
  std::atomic<int> wrong{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      try {
        kp::Manager mgr{daemon.address()};
        auto in = mgr.tensor({1, 2, 3, 4});
        auto out = mgr.tensorT<float>(4);
        std::vector<std::shared_ptr<kp::Tensor>> params = {in, out};
        auto algo = mgr.algorithm(params, kp::compileSource(kScaleShader), {}, std::vector<float>{},
                                  std::vector<float>{0});
        auto seq = mgr.sequence();
        for (int i = 0; i < kEvals; ++i) {
          const float k = static_cast<float>(c * 1000 + i);
          seq->record<kp::OpTensorSyncDevice>(params)
              ->record<kp::OpAlgoDispatch>(algo, std::vector<float>{k})
              ->record<kp::OpTensorSyncLocal>(params)
              ->eval();
          seq->clear();
          auto v = out->vector();
          for (int j = 0; j < 4; ++j) wrong += v[j] != (j + 1) * k;
        }
      } catch (const std::exception& e) {
        ++failed;
        ADD_FAILURE() << "client " << c << ": " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
