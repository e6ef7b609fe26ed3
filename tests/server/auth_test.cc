// Tenants on one daemon: authentication by bearer token, sessions that belong to their tenant
// (another tenant cannot list, read, write, evaluate, keep alive or close them), admins, and a
// tenants file that grants and revokes without a restart.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server.h"
#include "tenant_client.h"
#include "test_options.h"
#include "tls.h"

namespace komputed::server::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

// An eval of AuthTest::AliceSession's pipeline: 5s in, 10s out.
v1::EvalRequest PipelineEvalOf(const std::string& id) {
  return UploadEvalDownload(id, 4, 1, FloatBytes(std::vector<float>(8, 5.0f)), 2);
}

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tenants_.Write(absl::StrCat("tenants:\n", Entry("alice"), Entry("bob"),
                                Entry("ops", "    admin: true\n")));
    ServerOptions options = TestServerOptions();
    options.listen = "127.0.0.1:0";
    options.tenants_file = tenants_.path();
    options.tenants_poll_interval = absl::Milliseconds(20);
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    alice_ = Connect(Bearer(Token("alice")));
    bob_ = Connect(Bearer(Token("bob")));
    ops_ = Connect(Bearer(Token("ops")));
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  std::unique_ptr<TenantClient> Connect(const std::string& authorization) {
    return std::make_unique<TenantClient>(server_->address(), authorization);
  }

  // Alice's session with a pipeline (tensors 1, 2; algorithm 3; sequence 4) of 8 floats.
  std::string AliceSession() {
    std::string id;
    EXPECT_THAT(Open(*alice_, &id, "alice-job"), IsOk());
    EXPECT_THAT(CreateTensor(*alice_, FloatTensor(id, 1, std::vector<float>(8, 1.0f))), IsOk());
    EXPECT_THAT(CreateTensor(*alice_, FloatTensor(id, 2, std::vector<float>(8, 0.0f))), IsOk());
    grpc::ClientContext ctx;
    v1::CreateAlgorithmResponse aresp;
    EXPECT_THAT(
        alice_->algorithms->CreateAlgorithm(&ctx, ScaleAlgorithm(id, 3, 1, 2, 8, 2.0f), &aresp),
        IsOk());
    grpc::ClientContext sctx;
    v1::CreateSequenceRequest sreq;
    sreq.set_session_id(id);
    sreq.set_handle(4);
    v1::CreateSequenceResponse sresp;
    EXPECT_THAT(alice_->sequences->CreateSequence(&sctx, sreq, &sresp), IsOk());
    grpc::ClientContext rctx;
    v1::RecordRequest rreq;
    rreq.set_session_id(id);
    rreq.set_sequence(4);
    *rreq.add_actions() = RecordOp(SyncDevice({1}));
    *rreq.add_actions() = RecordOp(Dispatch(3));
    *rreq.add_actions() = RecordOp(SyncLocal({2}));
    v1::RecordResponse rresp;
    EXPECT_THAT(alice_->sequences->Record(&rctx, rreq, &rresp), IsOk());
    return id;
  }

  TenantsDir tenants_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<TenantClient> alice_, bob_, ops_;
};

TEST_F(AuthTest, CallsWithoutAKnownTokenAreUnauthenticated) {
  auto anonymous = Connect("");
  grpc::Status s = Open(*anonymous, nullptr);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::UNAUTHENTICATED));
  EXPECT_THAT(s.error_message(), HasSubstr("authorization: Bearer"));
  EXPECT_THAT(s.error_message(), HasSubstr("KOMPUTED_TOKEN"));

  for (const std::string& authorization :
       {Bearer("token-mallory"), std::string("Basic dXNlcjpwYXNz"), Bearer(""),
        Bearer(std::string(5000, 'x')), Token("alice")}) {
    auto stranger = Connect(authorization);
    grpc::Status refused = Open(*stranger, nullptr);
    EXPECT_THAT(refused, HasCode(grpc::StatusCode::UNAUTHENTICATED)) << authorization.substr(0, 20);
    EXPECT_THAT(refused.error_message(), ::testing::Not(HasSubstr(authorization)));
    grpc::ClientContext ctx;
    v1::ListSessionsResponse list;
    EXPECT_THAT(stranger->sessions->ListSessions(&ctx, v1::ListSessionsRequest(), &list),
                HasCode(grpc::StatusCode::UNAUTHENTICATED));
    grpc::ClientContext ping_ctx;
    v1::PingResponse pong;
    EXPECT_THAT(stranger->sessions->Ping(&ping_ctx, v1::PingRequest(), &pong),
                HasCode(grpc::StatusCode::UNAUTHENTICATED));
  }
  // The devices stay public.
  grpc::ClientContext ctx;
  v1::ListDevicesResponse devices;
  EXPECT_THAT(anonymous->devices->ListDevices(&ctx, v1::ListDevicesRequest(), &devices), IsOk());
  EXPECT_GT(devices.devices_size(), 0);
  // The scheme is case-insensitive, as HTTP's.
  auto lower = Connect("bearer " + Token("alice"));
  EXPECT_THAT(Open(*lower, nullptr), IsOk());
  EXPECT_GE(server_->metrics().auth_failures_total("unknown_token").Value(), 1);
  EXPECT_GE(server_->metrics().auth_failures_total("malformed").Value(), 1);
}

TEST_F(AuthTest, AnotherTenantCannotFindTheSessionAtAll) {
  const std::string id = AliceSession();
  // What an id that does not exist gets, for comparison.
  const std::string unknown(32, '0');
  grpc::Status nothing = KeepAlive(*bob_, unknown);
  ASSERT_THAT(nothing, HasCode(grpc::StatusCode::NOT_FOUND));
  // Nothing tells "exists, not yours" from "does not exist": the same code and message.
  auto same_answer = [&](const grpc::Status& s) {
    EXPECT_THAT(s, HasCode(grpc::StatusCode::NOT_FOUND));
    std::string message = s.error_message();
    const size_t at = message.find(id);
    if (at != std::string::npos) message.replace(at, id.size(), unknown);
    EXPECT_EQ(message, nothing.error_message());
  };

  EXPECT_THAT(List(*bob_).sessions(), IsEmpty());
  same_answer(KeepAlive(*bob_, id));
  same_answer(CreateTensor(*bob_, FloatTensor(id, 9, {1, 2, 3})));
  same_answer(DestroyTensor(*bob_, id, 1));
  std::string stolen;
  same_answer(ReadTensor(*bob_, id, 1, &stolen));
  EXPECT_THAT(stolen, IsEmpty());
  same_answer(WriteTensor(*bob_, id, 1, FloatBytes(std::vector<float>(8, 7.0f))));
  v1::EvalResponse resp;
  same_answer(Eval(*bob_, PipelineEvalOf(id), &resp));
  EXPECT_EQ(Execute(*bob_, PipelineEvalOf(id)), grpc::StatusCode::NOT_FOUND);
  same_answer(Close(*bob_, id));
  grpc::ClientContext ts_ctx;
  v1::GetTimestampsRequest ts;
  ts.set_session_id(id);
  ts.set_handle(4);
  v1::GetTimestampsResponse ts_resp;
  same_answer(bob_->sequences->GetTimestamps(&ts_ctx, ts, &ts_resp));

  // Alice's session is untouched: her tensor still holds what she wrote, and her pipeline runs.
  std::string bytes;
  ASSERT_THAT(ReadTensor(*alice_, id, 1, &bytes), IsOk());
  EXPECT_EQ(Floats(bytes), std::vector<float>(8, 1.0f));
  ASSERT_THAT(Eval(*alice_, PipelineEvalOf(id), &resp), IsOk());
  ASSERT_EQ(resp.downloads_size(), 1);
  EXPECT_EQ(Floats(resp.downloads(0).data()), std::vector<float>(8, 10.0f));
  EXPECT_EQ(Execute(*alice_, PipelineEvalOf(id)), 0);
  // Bob's failures count as his errors, none as Alice's.
  EXPECT_GE(server_->metrics().tenant_errors_total("bob", "NOT_FOUND").Value(), 10);
  EXPECT_EQ(server_->metrics().tenant_errors_total("alice", "NOT_FOUND").Value(), 0);
  const v1::ListSessionsResponse mine = List(*alice_);
  ASSERT_EQ(mine.sessions_size(), 1);
  EXPECT_EQ(mine.sessions(0).session_id(), id);
  EXPECT_EQ(mine.sessions(0).tenant(), "alice");
}

TEST_F(AuthTest, AnAdminListsWithoutIdsAndCanClose) {
  const std::string id = AliceSession();
  std::string bobs;
  ASSERT_THAT(Open(*bob_, &bobs, "bob-job"), IsOk());

  const v1::ListSessionsResponse all = List(*ops_);
  ASSERT_EQ(all.sessions_size(), 2);
  for (const v1::SessionInfo& info : all.sessions()) {
    EXPECT_THAT(info.session_id(), IsEmpty()) << info.tenant();
  }
  EXPECT_EQ(all.sessions(0).tenant(), "alice");
  EXPECT_EQ(all.sessions(0).client_name(), "alice-job");
  EXPECT_EQ(all.sessions(1).tenant(), "bob");
  const v1::ListSessionsResponse with_ids = List(*ops_, /*include_ids=*/true);
  ASSERT_EQ(with_ids.sessions_size(), 2);
  EXPECT_EQ(with_ids.sessions(0).session_id(), id);
  // A tenant that is no admin sees only its own, asked for ids or not.
  EXPECT_EQ(List(*bob_, /*include_ids=*/true).sessions_size(), 1);

  // An admin cannot use another tenant's session, only close it.
  EXPECT_THAT(KeepAlive(*ops_, id), HasCode(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(Close(*ops_, id), IsOk());
  EXPECT_THAT(KeepAlive(*alice_, id), HasCode(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(KeepAlive(*bob_, bobs), IsOk());
  EXPECT_EQ(List(*ops_).sessions_size(), 1);
}

// A stream opened before its token was revoked does no more work after the revocation.
TEST_F(AuthTest, ARevokedTokenEndsTheWorkOfAnOpenStream) {
  std::string bobs;
  ASSERT_THAT(Open(*bob_, &bobs), IsOk());
  ASSERT_THAT(CreateTensor(*bob_, FloatTensor(bobs, 1, {1})), IsOk());
  v1::EvalRequest eval;  // an eval without a sequence: a download only
  eval.set_session_id(bobs);
  eval.add_downloads(1);
  grpc::ClientContext ctx;
  auto stream = bob_->sequences->Execute(&ctx);
  v1::ExecuteRequest req;
  *req.mutable_eval() = eval;
  v1::ExecuteEvent event;
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&event));
  EXPECT_EQ(event.code(), 0) << event.message();

  const uint64_t generation = server_->authenticator().registry()->generation();
  tenants_.Write(absl::StrCat("tenants:\n", Entry("alice"), Entry("ops", "    admin: true\n")));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (server_->authenticator().registry()->generation() == generation &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&event));
  EXPECT_EQ(event.code(), static_cast<int>(grpc::StatusCode::UNAUTHENTICATED)) << event.message();
  stream->WritesDone();
  EXPECT_THAT(stream->Finish(), IsOk());
}

TEST_F(AuthTest, AReloadedFileGrantsAndRevokesWithoutARestart) {
  const std::string id = AliceSession();
  std::string bobs;
  ASSERT_THAT(Open(*bob_, &bobs), IsOk());
  auto carol = Connect(Bearer(Token("carol")));
  EXPECT_THAT(Open(*carol, nullptr), HasCode(grpc::StatusCode::UNAUTHENTICATED));

  // Bob is removed, Carol added; the daemon notices the file's change by itself.
  const uint64_t generation = server_->authenticator().registry()->generation();
  tenants_.Write(absl::StrCat("tenants:\n", Entry("alice"), Entry("carol"),
                              Entry("ops", "    admin: true\n")));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (server_->authenticator().registry()->generation() == generation &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_GT(server_->authenticator().registry()->generation(), generation);
  EXPECT_THAT(Open(*carol, nullptr), IsOk());
  EXPECT_THAT(KeepAlive(*bob_, bobs), HasCode(grpc::StatusCode::UNAUTHENTICATED));
  // Alice's session, whose tenant stays, is still there.
  EXPECT_THAT(KeepAlive(*alice_, id), IsOk());

  // A malformed file keeps the tenants in force.
  tenants_.Write("tenants: [ {name: alice, token_sha256: nothex} ]\n");
  EXPECT_THAT(server_->ReloadTenants().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(KeepAlive(*alice_, id), IsOk());
  EXPECT_THAT(Open(*carol, nullptr), IsOk());
}

// Without a tenants file, on loopback: the one implicit tenant, as before tenants existed.
TEST(ImplicitTenantTest, LoopbackWithoutTenantsNeedsNoCredentials) {
  ServerOptions options = TestServerOptions();
  options.listen = "127.0.0.1:0";
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  Client client((*server)->address());
  grpc::ClientContext ctx;
  v1::OpenSessionResponse opened;
  ASSERT_THAT(client.sessions->OpenSession(&ctx, v1::OpenSessionRequest(), &opened), IsOk());
  grpc::ClientContext list_ctx;
  v1::ListSessionsResponse list;
  ASSERT_THAT(client.sessions->ListSessions(&list_ctx, v1::ListSessionsRequest(), &list), IsOk());
  ASSERT_EQ(list.sessions_size(), 1);
  EXPECT_EQ(list.sessions(0).session_id(), opened.session_id());
  EXPECT_EQ(list.sessions(0).tenant(), "default");
  (*server)->Shutdown();
}

TEST(SecureByDefaultTest, OnlyLoopbackLiteralsAndUnixSocketsAreLocal) {
  for (const char* local : {"127.0.0.1:50051", "127.8.9.10:1", "[::1]:50051", "localhost:50051",
                            "unix:/tmp/komputed.sock", "unix-abstract:komputed"}) {
    EXPECT_TRUE(IsLocalAddress(local)) << local;
  }
  for (const char* remote :
       {"0.0.0.0:50051", "[::]:50051", ":50051", "10.0.0.5:50051", "127.app.10.0.0.5.nip.io:50051",
        "localhost.example.org:50051", "[::ffff:10.0.0.5]:50051", "gpu1:50051"}) {
    EXPECT_FALSE(IsLocalAddress(remote)) << remote;
  }
}

TEST(SecureByDefaultTest, OffLoopbackWithoutAuthenticationDoesNotStart) {
  for (const char* listen : {"0.0.0.0:0", "[::]:0"}) {
    ServerOptions options = TestServerOptions();
    options.listen = listen;
    auto refused = Server::Start(options);
    ASSERT_FALSE(refused.ok()) << listen;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.status().message(), HasSubstr("--tenants_file"));
    EXPECT_THAT(refused.status().message(), HasSubstr("--insecure"));
  }
  ServerOptions options = TestServerOptions();
  options.listen = "0.0.0.0:0";
  options.insecure = true;
  auto started = Server::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  (*started)->Shutdown();
}

}  // namespace
}  // namespace komputed::server::testing
