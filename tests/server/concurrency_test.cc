// Many clients at once, each in its own session.
#include <atomic>
#include <thread>

#include "test_util.h"

namespace komputed::server::testing {
namespace {

TEST_F(ServerTest, EightClientsFiftyEvalsEachAreCorrect) {
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
  for (auto& t : threads) t.join();
  EXPECT_EQ(correct.load(), kClients * kEvals);
  std::printf("%d evals by %d clients in %s\n", kClients * kEvals, kClients,
              absl::FormatDuration(absl::Now() - start).c_str());

  grpc::ClientContext ctx;
  v1::ListDevicesResponse devices;
  ASSERT_THAT(client_->devices->ListDevices(&ctx, v1::ListDevicesRequest(), &devices), IsOk());
  EXPECT_EQ(devices.devices(0).memory_in_use_bytes(), 0u);
  EXPECT_EQ(devices.devices(0).sessions(), 0u);
}

}  // namespace
}  // namespace komputed::server::testing
