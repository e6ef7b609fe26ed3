// Many clients at once, each in its own session.
#include <atomic>
#include <optional>
#include <string>
#include <thread>

#include "test_util.h"

namespace komputed::server::testing {
namespace {

// The unary Eval's serving threads (--grpc_threads) and their polling (--eval_poll).
struct EvalThreads {
  std::string name;
  int threads;
  std::optional<absl::Duration> poll;
};

class ConcurrentEvalTest : public ServerTest, public ::testing::WithParamInterface<EvalThreads> {
 protected:
  ServerOptions Options() override {
    ServerOptions options = ServerTest::Options();
    options.grpc_threads = GetParam().threads;
    options.eval_poll = GetParam().poll;
    return options;
  }
};

// Eight clients' evals at once and a ninth's pings, also where one polling thread serves them all:
// each answer is the one to its own request.
TEST_P(ConcurrentEvalTest, EightClientsFiftyEvalsEachAreCorrect) {
  constexpr int kClients = 8;
  constexpr int kEvals = 50;
  constexpr uint32_t kN = 1024;
  std::atomic<int> correct{0};
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      Client client(server_->address());
      const float scale = static_cast<float>(c + 1);
      grpc::ClientContext octx;
      v1::OpenSessionRequest open;
      open.set_client_name(absl::StrCat("client ", c));
      v1::OpenSessionResponse session;
      ASSERT_THAT(client.sessions->OpenSession(&octx, open, &session), IsOk());
      const std::string& s = session.session_id();
      // Everything is created by the first eval's commands.
      v1::EvalRequest setup;
      setup.set_session_id(s);
      *setup.add_commands()->mutable_create_tensor() = FloatTensor("", 1, std::vector<float>(kN));
      *setup.add_commands()->mutable_create_tensor() = FloatTensor("", 2, std::vector<float>(kN));
      *setup.add_commands()->mutable_create_algorithm() = ScaleAlgorithm("", 3, 1, 2, kN, scale);
      setup.add_commands()->mutable_create_sequence()->set_handle(4);
      v1::RecordRequest* rec = setup.add_commands()->mutable_record();
      rec->set_sequence(4);
      *rec->add_actions() = RecordOp(SyncDevice({1}));
      *rec->add_actions() = RecordOp(Dispatch(3));
      *rec->add_actions() = RecordOp(SyncLocal({2}));
      {
        grpc::ClientContext ctx;
        v1::EvalResponse resp;
        ASSERT_THAT(client.sequences->Eval(&ctx, setup, &resp), IsOk());
      }
      for (int e = 0; e < kEvals; ++e) {
        std::vector<float> in(kN);
        for (uint32_t i = 0; i < kN; ++i) in[i] = static_cast<float>((c * 7 + e * 13 + i) % 977);
        grpc::ClientContext ctx;
        v1::EvalResponse resp;
        ASSERT_THAT(client.sequences->Eval(&ctx, PipelineEval(s, 1, in), &resp), IsOk());
        ASSERT_EQ(resp.downloads_size(), 1);
        std::vector<float> out = Floats(resp.downloads(0).data());
        ASSERT_EQ(out.size(), kN);
        bool ok = true;
        for (uint32_t i = 0; i < kN; ++i) ok = ok && out[i] == in[i] * scale;
        EXPECT_TRUE(ok) << "client " << c << " eval " << e;
        if (ok) correct.fetch_add(1);
      }
      grpc::ClientContext cctx;
      v1::CloseSessionRequest close;
      close.set_session_id(s);
      v1::CloseSessionResponse closed;
      EXPECT_THAT(client.sessions->CloseSession(&cctx, close, &closed), IsOk());
    });
  }
  // Pings on the same threads meanwhile, each answered with its own payload.
  std::atomic<bool> evals_done{false};
  int pings = 0;
  std::thread pinger([&] {
    Client client(server_->address());
    while (!evals_done.load() || pings == 0) {
      grpc::ClientContext ctx;
      v1::PingRequest ping;
      ping.set_payload(absl::StrCat("ping ", pings));
      v1::PingResponse pong;
      ASSERT_THAT(client.sessions->Ping(&ctx, ping, &pong), IsOk());
      ASSERT_EQ(pong.payload(), ping.payload());
      ++pings;
    }
  });
  for (auto& t : threads) t.join();
  evals_done.store(true);
  pinger.join();
  EXPECT_GT(pings, 0);
  EXPECT_EQ(correct.load(), kClients * kEvals);
  std::printf("%d evals by %d clients in %s\n", kClients * kEvals, kClients,
              absl::FormatDuration(absl::Now() - start).c_str());

  grpc::ClientContext ctx;
  v1::ListDevicesResponse devices;
  ASSERT_THAT(client_->devices->ListDevices(&ctx, v1::ListDevicesRequest(), &devices), IsOk());
  EXPECT_EQ(devices.devices(0).memory_in_use_bytes(), 0u);
  EXPECT_EQ(devices.devices(0).sessions(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Threads, ConcurrentEvalTest,
    ::testing::Values(EvalThreads{"Default", ServerOptions().grpc_threads, std::nullopt},
                      EvalThreads{"OnePolling", 1, absl::Microseconds(250)},
                      EvalThreads{"TwoPolling", 2, absl::Microseconds(250)}),
    [](const ::testing::TestParamInfo<EvalThreads>& info) { return info.param.name; });

// A large tensor's memory takes milliseconds per MiB to fill, so it is created on the build pool
// rather than on one of gRPC's few serving threads, whether CreateTensor or an eval's command
// asks for it; small ones are created on the serving thread.
constexpr uint64_t kLargeTensor = uint64_t{1} << 18;  // elements

v1::EvalRequest CreateInEval(const std::string& session, const v1::CreateTensorRequest& tensor) {
  v1::EvalRequest r;
  r.set_session_id(session);
  *r.add_commands()->mutable_create_tensor() = tensor;
  r.mutable_commands(0)->mutable_create_tensor()->clear_session_id();
  return r;
}

TEST_F(ServerTest, LargeTensorsAreCreatedWithTheirData) {
  const std::string s = Open();
  std::vector<float> data(kLargeTensor);
  for (uint64_t i = 0; i < kLargeTensor; ++i) data[i] = static_cast<float>(i % 1000) + 0.25f;
  ASSERT_THAT(CreateTensor(FloatTensor(s, 1, data)), IsOk());
  ASSERT_THAT(CreateTensor(FloatTensor(s, 2, std::vector<float>(kLargeTensor, 0.0f))), IsOk());
  v1::EvalResponse created;
  ASSERT_THAT(Eval(CreateInEval(s, FloatTensor(s, 3, data)), &created), IsOk());
  v1::EvalRequest read;
  read.set_session_id(s);
  for (uint64_t h : {1, 2, 3}) read.add_downloads(h);
  v1::EvalResponse resp;
  ASSERT_THAT(Eval(read, &resp), IsOk());
  ASSERT_EQ(resp.downloads_size(), 3);
  EXPECT_TRUE(Floats(resp.downloads(0).data()) == data);
  EXPECT_TRUE(Floats(resp.downloads(1).data()) == std::vector<float>(kLargeTensor, 0.0f));
  EXPECT_TRUE(Floats(resp.downloads(2).data()) == data);
}

// A daemon whose build pool queues nothing: whatever is sent there is refused.
class NoBuildQueueTest : public ServerTest {
 protected:
  ServerOptions Options() override {
    ServerOptions options = ServerTest::Options();
    options.max_queued_builds = 0;
    return options;
  }
};

TEST_F(NoBuildQueueTest, LargeTensorsGoToTheBuildPool) {
  const std::string s = Open();
  const std::vector<float> large(kLargeTensor, 1.0f);
  const std::vector<float> small(kLargeTensor - 1, 1.0f);
  grpc::Status refused = CreateTensor(FloatTensor(s, 1, large));
  EXPECT_THAT(refused, HasCode(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_THAT(refused.error_message(), ::testing::HasSubstr("large tensors"));
  v1::EvalResponse resp;
  EXPECT_THAT(Eval(CreateInEval(s, FloatTensor(s, 2, large)), &resp),
              HasCode(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_THAT(CreateTensor(FloatTensor(s, 3, small)), IsOk());
  EXPECT_THAT(Eval(CreateInEval(s, FloatTensor(s, 4, small)), &resp), IsOk());
}

}  // namespace
}  // namespace komputed::server::testing
