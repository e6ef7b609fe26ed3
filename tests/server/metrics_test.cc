// The metrics table and what the server counts, read from the registry in-process.
#include "metrics.h"

#include <grpcpp/generic/generic_stub.h>

#include <chrono>
#include <future>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "status.h"
#include "test_util.h"

namespace komputed::server::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsTable, NamesTypesAndLabelsFollowTheConventions) {
  std::set<std::string> names;
#define KD_CHECK(type, member, name, ...)                                                \
  {                                                                                      \
    const std::string n = name;                                                          \
    EXPECT_TRUE(names.insert(n).second) << n << " is declared twice";                    \
    EXPECT_EQ(n.rfind("komputed_", 0), 0u) << n;                                         \
    const bool total = n.size() > 6 && n.compare(n.size() - 6, 6, "_total") == 0;        \
    EXPECT_EQ(total, std::string(type) == "counter") << n << ": counters end in _total"; \
  }
#define KD_COUNTER(member, name, help, ...) KD_CHECK("counter", member, name)
#define KD_GAUGE(member, name, help, ...) KD_CHECK("gauge", member, name)
#define KD_HISTOGRAM(member, name, help, buckets, ...) KD_CHECK("histogram", member, name)
  KOMPUTED_METRICS(KD_COUNTER, KD_GAUGE, KD_HISTOGRAM)
#undef KD_HISTOGRAM
#undef KD_GAUGE
#undef KD_COUNTER
#undef KD_CHECK
  EXPECT_EQ(names.size(), 31u);
  Metrics metrics;
  EXPECT_EQ(metrics.rpcs_total.label_names()[0], std::string("method"));
  EXPECT_EQ(metrics.rpcs_total.label_names()[1], std::string("code"));
  EXPECT_EQ(metrics.submissions_total.name(), "komputed_submissions_total");
  EXPECT_TRUE(std::is_sorted(kRpcDurationBuckets.begin(), kRpcDurationBuckets.end()));
  EXPECT_LE(kRpcDurationBuckets.front(), 1e-5);
  EXPECT_GE(kRpcDurationBuckets.back(), 10);
}

TEST(MetricsTable, ExpositionHasHelpAndTypeLines) {
  Metrics metrics;
  metrics.rpcs_total("komputed.v1.Sessions/Ping", "OK").Increment();
  metrics.rpc_duration_seconds("komputed.v1.Sessions/Ping").Observe(0.001);
  const std::string text = metrics.Text();
  EXPECT_THAT(text, HasSubstr("# TYPE komputed_rpcs_total counter"));
  EXPECT_THAT(text, HasSubstr("# HELP komputed_rpcs_total RPCs finished"));
  EXPECT_THAT(text, HasSubstr("# TYPE komputed_rpc_duration_seconds histogram"));
  EXPECT_THAT(text,
              HasSubstr("komputed_rpcs_total{code=\"OK\",method=\"komputed.v1.Sessions/Ping\"} 1"));
  EXPECT_THAT(text, HasSubstr("komputed_sessions_open 0"));
  EXPECT_THAT(text, HasSubstr("komputed_bytes_transferred_total{direction=\"upload\"} 0"));
}

TEST(MetricsTable, CodeLabelsAreCanonicalNames) {
  EXPECT_EQ(CodeLabel(0), "OK");
  EXPECT_EQ(CodeLabel(3), "INVALID_ARGUMENT");
  EXPECT_EQ(CodeLabel(5), "NOT_FOUND");
  EXPECT_EQ(CodeLabel(14), "UNAVAILABLE");
  EXPECT_EQ(CodeLabel(16), "UNAUTHENTICATED");
}

// The server counts what it does (the binary's /metrics is tested in tests/ops).
TEST_F(ServerTest, MetricsCountRpcsSessionsMemoryAndSubmissions) {
  Metrics& m = server_->metrics();
  const std::string session = Open("metrics");
  MakePipeline(session, 1, 32, 2.0f);
  ExpectPipelineWorks(session, 1, 32, 2.0f);
  ExpectPipelineWorks(session, 1, 32, 2.0f);
  EXPECT_THAT(DestroyTensor(session, 99), HasCode(grpc::StatusCode::NOT_FOUND));

  EXPECT_EQ(m.rpcs_total("komputed.v1.Sequences/Eval", "OK").Value(), 2);
  EXPECT_EQ(m.rpcs_total("komputed.v1.Tensors/DestroyTensor", "NOT_FOUND").Value(), 1);
  EXPECT_EQ(m.rpcs_total("komputed.v1.Sessions/OpenSession", "OK").Value(), 1);
  EXPECT_EQ(m.sessions_open().Value(), 1);
  EXPECT_EQ(m.sessions_opened_total().Value(), 1);
  EXPECT_EQ(m.device_memory_used_bytes("0").Value(), 2 * 2 * 32 * 4);
  EXPECT_GT(m.device_memory_limit_bytes("0").Value(), 0);
  EXPECT_EQ(m.submissions_total("0", "0").Value(), 2);
  EXPECT_EQ(m.queue_depth("0", "0").Value(), 0);
  EXPECT_EQ(m.shader_compilations_total("ok").Value(), 1);
  EXPECT_EQ(m.shader_validations_total("ok").Value(), 1);

  grpc::ClientContext ctx;
  v1::CloseSessionRequest close;
  close.set_session_id(session);
  v1::CloseSessionResponse closed;
  ASSERT_THAT(client_->sessions->CloseSession(&ctx, close, &closed), IsOk());
  EXPECT_EQ(m.sessions_open().Value(), 0);
  EXPECT_EQ(m.device_memory_used_bytes("0").Value(), 0);
  EXPECT_EQ(m.sessions_reaped_total("idle").Value(), 0);
}

// A unary call of `path` through gRPC's generic API, with an empty message.
grpc::Status CallPath(const std::shared_ptr<grpc::Channel>& channel, const std::string& path) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, path, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status status) { done.set_value(std::move(status)); });
  return done.get_future().get();
}

TEST_F(ServerTest, CallsOfUnknownMethodsShareOneMethodLabel) {
  Metrics& m = server_->metrics();
  for (int i = 0; i < 10; ++i) {
    EXPECT_THAT(CallPath(client_->channel, absl::StrCat("/made.up.Service", i, "/Method")),
                HasCode(grpc::StatusCode::UNIMPLEMENTED));
  }
  EXPECT_THAT(CallPath(client_->channel, "/komputed.v1.Sessions/NoSuchMethod"),
              HasCode(grpc::StatusCode::UNIMPLEMENTED));
  EXPECT_THAT(CallPath(client_->channel, "/komputed.v1.Sessions/Ping"), IsOk());
  // Health and reflection are methods of the daemon too.
  (void)CallPath(client_->channel, "/grpc.health.v1.Health/Check");
  (void)CallPath(client_->channel,
                 "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo");

  EXPECT_EQ(m.rpcs_total("unknown", "UNIMPLEMENTED").Value(), 11);
  EXPECT_EQ(m.rpcs_total("komputed.v1.Sessions/Ping", "OK").Value(), 1);
  const std::string text = m.Text();
  EXPECT_THAT(text, Not(HasSubstr("made.up")));
  EXPECT_THAT(text, Not(HasSubstr("NoSuchMethod")));
  EXPECT_THAT(text, HasSubstr("method=\"grpc.health.v1.Health/Check\""));
  EXPECT_THAT(
      text, HasSubstr("method=\"grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo\""));
}

TEST_F(ServerTest, SessionsOpenAtShutdownAreReapedForDrain) {
  Open("one");
  Open("two");
  server_->Shutdown();
  EXPECT_EQ(server_->metrics().sessions_reaped_total("drain").Value(), 2);
  EXPECT_EQ(server_->metrics().sessions_open().Value(), 0);
}

TEST(LogLevelFor, ClientMistakesAreDebugServerFaultsAreErrors) {
  EXPECT_EQ(LogLevelFor(absl::OkStatus()), spdlog::level::off);
  EXPECT_EQ(LogLevelFor(absl::InvalidArgumentError("x")), spdlog::level::debug);
  EXPECT_EQ(LogLevelFor(absl::NotFoundError("x")), spdlog::level::debug);
  EXPECT_EQ(LogLevelFor(absl::FailedPreconditionError("x")), spdlog::level::debug);
  EXPECT_EQ(LogLevelFor(absl::AlreadyExistsError("x")), spdlog::level::debug);
  EXPECT_EQ(LogLevelFor(absl::ResourceExhaustedError("x")), spdlog::level::warn);
  EXPECT_EQ(LogLevelFor(absl::DeadlineExceededError("x")), spdlog::level::warn);
  EXPECT_EQ(LogLevelFor(absl::UnavailableError("device 0 was lost")), spdlog::level::warn);
  EXPECT_EQ(LogLevelFor(WorkGate::Refusal("sessions")), spdlog::level::debug);
  EXPECT_EQ(LogLevelFor(absl::InternalError("x")), spdlog::level::err);
  EXPECT_EQ(LogLevelFor(absl::DataLossError("x")), spdlog::level::err);
}

}  // namespace
}  // namespace komputed::server::testing
