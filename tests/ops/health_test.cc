// grpc.health.v1 and server reflection on the real daemon.
#include <signal.h>
#include <sys/wait.h>

#include <set>
#include <string>

#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "test_util.h"

namespace komputed::ops_testing {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

const char* const kServices[] = {"komputed.v1.Devices", "komputed.v1.Sessions",
                                 "komputed.v1.Tensors", "komputed.v1.Algorithms",
                                 "komputed.v1.Sequences"};

TEST(Health, TheServerAndEveryServiceAreServing) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.started());
  Client client(daemon.address());
  grpc::Status status;
  EXPECT_EQ(client.Health("", &status), HealthCheckResponse::SERVING);
  EXPECT_THAT(status, IsOk());
  for (const char* service : kServices) {
    EXPECT_EQ(client.Health(service, &status), HealthCheckResponse::SERVING) << service;
    EXPECT_THAT(status, IsOk());
  }
}

TEST(Health, UnknownServiceIsNotFound) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.started());
  Client client(daemon.address());
  grpc::Status status;
  client.Health("komputed.v1.NoSuchService", &status);
  EXPECT_THAT(status, HasCode(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(status.error_message(), testing::HasSubstr("komputed.v1.NoSuchService"));
}

// Opens a Watch of `service`, bounded by 30 s.
std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> Watch(Client& client,
                                                               grpc::ClientContext& ctx,
                                                               const std::string& service) {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  HealthCheckRequest req;
  req.set_service(service);
  return client.health->Watch(&ctx, req);
}

TEST(Health, WatchSeesServingThenNotServingWhenTheDaemonDrains) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.started());
  Client client(daemon.address());
  grpc::ClientContext ctx;
  auto reader = Watch(client, ctx, "komputed.v1.Sequences");
  HealthCheckResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), HealthCheckResponse::SERVING);

  kill(daemon.pid(), SIGTERM);
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), HealthCheckResponse::NOT_SERVING);
  while (reader->Read(&resp)) EXPECT_EQ(resp.status(), HealthCheckResponse::NOT_SERVING);
  reader->Finish();  // the daemon ends the stream as it stops
  const int status = daemon.WaitExit(absl::Seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << "wait status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(Health, WatchOfAnUnknownServiceSaysServiceUnknown) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.started());
  Client client(daemon.address());
  grpc::ClientContext ctx;
  auto reader = Watch(client, ctx, "no.such.Service");
  HealthCheckResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), HealthCheckResponse::SERVICE_UNKNOWN);
  ctx.TryCancel();
  while (reader->Read(&resp)) {
  }
  EXPECT_THAT(reader->Finish(), HasCode(grpc::StatusCode::CANCELLED));
}

// One request on a reflection stream, and its response.
grpc::reflection::v1alpha::ServerReflectionResponse Reflect(
    const std::string& address, const grpc::reflection::v1alpha::ServerReflectionRequest& req) {
  auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub->ServerReflectionInfo(&ctx);
  grpc::reflection::v1alpha::ServerReflectionResponse resp;
  EXPECT_TRUE(stream->Write(req));
  stream->WritesDone();
  EXPECT_TRUE(stream->Read(&resp));
  grpc::reflection::v1alpha::ServerReflectionResponse extra;
  while (stream->Read(&extra)) ADD_FAILURE() << "a second response: " << extra.DebugString();
  EXPECT_THAT(stream->Finish(), IsOk());
  return resp;
}

TEST(Reflection, ListsEveryServiceAndDescribesThem) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.started());
  grpc::reflection::v1alpha::ServerReflectionRequest list;
  list.set_list_services("*");
  const auto listed = Reflect(daemon.address(), list);
  ASSERT_TRUE(listed.has_list_services_response()) << listed.DebugString();
  std::set<std::string> names;
  for (const auto& s : listed.list_services_response().service()) names.insert(s.name());
  for (const char* service : kServices) EXPECT_TRUE(names.contains(service)) << service;
  EXPECT_TRUE(names.contains("grpc.health.v1.Health"));
  EXPECT_TRUE(names.contains("grpc.reflection.v1alpha.ServerReflection"));

  // What grpcurl asks next: the file that defines a service.
  grpc::reflection::v1alpha::ServerReflectionRequest symbol;
  symbol.set_file_containing_symbol("komputed.v1.Sequences");
  const auto described = Reflect(daemon.address(), symbol);
  ASSERT_TRUE(described.has_file_descriptor_response()) << described.DebugString();
  ASSERT_GT(described.file_descriptor_response().file_descriptor_proto_size(), 0);
  EXPECT_THAT(described.file_descriptor_response().file_descriptor_proto(0),
              testing::HasSubstr("komputed/v1/komputed.proto"));
}

}  // namespace
}  // namespace komputed::ops_testing
