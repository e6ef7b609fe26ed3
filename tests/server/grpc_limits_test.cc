// gRPC's limits on client connections (ServerOptions: streams, keepalive, idle connections, the
// memory budget), seen from a client.
#include <chrono>
#include <memory>
#include <string>

#include "test_util.h"

namespace komputed::server::testing {
namespace {

using ::testing::HasSubstr;

grpc::Status Ping(Stubs& client, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  v1::PingRequest req;
  v1::PingResponse resp;
  return client.sessions->Ping(&ctx, req, &resp);
}

// A channel of its own (its own connection, not one shared with the other channels of the
// process), with `args`.
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& address,
                                          grpc::ChannelArguments args = {}) {
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// Waits until the channel leaves READY (the daemon closed its connection); false after `timeout`.
bool LeavesReady(grpc::Channel& channel, absl::Duration timeout) {
  const auto deadline = absl::ToChronoTime(absl::Now() + timeout);
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/false);
  while (state == GRPC_CHANNEL_READY) {
    if (!channel.WaitForStateChange(state, deadline)) return false;
    state = channel.GetState(/*try_to_connect=*/false);
  }
  return true;
}

TEST(GrpcLimits, StartRefusesBadValues) {
  auto start = [](void (*change)(ServerOptions&)) {
    ServerOptions options = TestServerOptions();
    options.listen = "127.0.0.1:0";
    change(options);
    return Server::Start(options).status();
  };
  EXPECT_TRUE(
      absl::IsInvalidArgument(start([](ServerOptions& o) { o.max_concurrent_streams = -1; })));
  EXPECT_TRUE(absl::IsInvalidArgument(
      start([](ServerOptions& o) { o.keepalive_timeout = absl::ZeroDuration(); })));
  EXPECT_TRUE(absl::IsInvalidArgument(
      start([](ServerOptions& o) { o.keepalive_time = -absl::Seconds(1); })));
  EXPECT_TRUE(
      absl::IsInvalidArgument(start([](ServerOptions& o) { o.keepalive_max_ping_strikes = -1; })));
  EXPECT_TRUE(absl::IsInvalidArgument(
      start([](ServerOptions& o) { o.max_connection_idle = -absl::Seconds(1); })));
  for (double share : {0.0, -0.5, 1.5}) {
    static double bad;
    bad = share;
    const absl::Status status = start([](ServerOptions& o) { o.dispatch_share = bad; });
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << share << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("dispatch_share"));
  }
  for (int threads : {0, -1, 65}) {
    static int bad;
    bad = threads;
    const absl::Status status = start([](ServerOptions& o) { o.grpc_threads = bad; });
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << threads << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("--grpc_threads"));
  }
  const absl::Status poll = start([](ServerOptions& o) { o.eval_poll = -absl::Microseconds(1); });
  EXPECT_TRUE(absl::IsInvalidArgument(poll)) << poll;
  EXPECT_THAT(std::string(poll.message()), HasSubstr("--eval_poll"));
  const absl::Status small = start([](ServerOptions& o) { o.grpc_memory_bytes = 128 << 20; });
  EXPECT_TRUE(absl::IsInvalidArgument(small)) << small;
  EXPECT_THAT(std::string(small.message()), HasSubstr("at least 268435456"));
}

class GrpcLimitsTest : public ServerTest {
 protected:
  ServerOptions Options() override {
    ServerOptions options = ServerTest::Options();
    change_(options);
    return options;
  }
  void Start(void (*change)(ServerOptions&)) {
    server_.reset();
    change_ = change;
    ServerTest::SetUp();
  }
  void SetUp() override {}  // each test starts its daemon with Start

  void (*change_)(ServerOptions&) = [](ServerOptions&) {};
};

TEST_F(GrpcLimitsTest, CallsPastMaxConcurrentStreamsWaitForAFreeStream) {
  Start([](ServerOptions& o) { o.max_concurrent_streams = 1; });
  Stubs client(OwnChannel(server_->address()));
  ASSERT_THAT(Ping(client), IsOk());
  {
    grpc::ClientContext ctx;
    auto stream = client.sequences->Execute(&ctx);  // takes the connection's one stream
    v1::ExecuteRequest nothing;
    nothing.mutable_eval()->set_request_id(1);
    ASSERT_TRUE(stream->Write(nothing));
    v1::ExecuteEvent event;
    ASSERT_TRUE(stream->Read(&event));  // the stream is open on the daemon
    EXPECT_THAT(Ping(client, std::chrono::milliseconds(500)),
                HasCode(grpc::StatusCode::DEADLINE_EXCEEDED));
    // Another connection has streams of its own.
    Stubs other(OwnChannel(server_->address()));
    EXPECT_THAT(Ping(other), IsOk());
    stream->WritesDone();
    EXPECT_THAT(stream->Finish(), IsOk());
  }
  EXPECT_THAT(Ping(client), IsOk());
}

TEST_F(GrpcLimitsTest, IdleConnectionsAreClosedAndClientsReconnect) {
  Start([](ServerOptions& o) { o.max_connection_idle = absl::Milliseconds(300); });
  auto channel = OwnChannel(server_->address());
  Stubs client(channel);
  ASSERT_THAT(Ping(client), IsOk());
  EXPECT_TRUE(LeavesReady(*channel, absl::Seconds(20)));
  EXPECT_THAT(Ping(client), IsOk());
}

TEST_F(GrpcLimitsTest, ClientsThatPingTooOftenAreDisconnected) {
  Start([](ServerOptions& o) {
    o.keepalive_min_client_interval = absl::Seconds(10);
    o.keepalive_max_ping_strikes = 2;
    o.max_connection_idle = absl::ZeroDuration();
  });
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 100);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  auto channel = OwnChannel(server_->address(), args);
  Stubs client(channel);
  ASSERT_THAT(Ping(client), IsOk());
  EXPECT_TRUE(LeavesReady(*channel, absl::Seconds(20)));
}

TEST_F(GrpcLimitsTest, ClientsThatPingWithinTheIntervalStayConnected) {
  Start([](ServerOptions& o) {
    o.keepalive_min_client_interval = absl::Milliseconds(50);
    o.max_connection_idle = absl::ZeroDuration();
  });
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 100);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  auto channel = OwnChannel(server_->address(), args);
  Stubs client(channel);
  ASSERT_THAT(Ping(client), IsOk());
  // About ten pings: the connection stays up.
  EXPECT_FALSE(LeavesReady(*channel, absl::Seconds(1)));
}

TEST_F(GrpcLimitsTest, LargeTransfersFitTheSmallestMemoryBudget) {
  Start([](ServerOptions& o) {
    o.max_message_bytes = 8 << 20;
    o.grpc_memory_bytes = 32 << 20;
  });
  const std::string session = Open("budget");
  constexpr uint32_t kCount = (6 << 20) / 4;  // one 6 MiB message each way
  std::vector<float> input(kCount);
  for (uint32_t i = 0; i < kCount; ++i) input[i] = static_cast<float>(i % 1000);
  ASSERT_THAT(CreateTensor(FloatTensor(session, 1, input)), IsOk());
  ASSERT_THAT(CreateSequence(session, 2), IsOk());
  ASSERT_THAT(Record(session, 2, {RecordOp(SyncDevice({1})), RecordOp(SyncLocal({1}))}), IsOk());
  for (int round = 0; round < 3; ++round) {
    v1::EvalResponse resp;
    ASSERT_THAT(Eval(UploadEvalDownload(session, 2, 1, FloatBytes(input), 1), &resp), IsOk());
    ASSERT_EQ(resp.downloads_size(), 1);
    EXPECT_EQ(Floats(resp.downloads(0).data()), input);
  }
}

}  // namespace
}  // namespace komputed::server::testing
