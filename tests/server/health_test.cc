// grpc.health.v1 served by the daemon itself: SERVING while a device is usable and the daemon
// runs; NOT_SERVING once every device is lost (fault injection) or the daemon stops.
#include <chrono>
#include <memory>

#include "grpc/health/v1/health.grpc.pb.h"
#include "komputed/core/vulkan_calls.h"
#include "test_util.h"

namespace komputed::server::testing {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

HealthCheckResponse::ServingStatus Check(Health::Stub& stub, const std::string& service,
                                         grpc::Status* status = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  HealthCheckRequest req;
  req.set_service(service);
  HealthCheckResponse resp;
  grpc::Status s = stub.Check(&ctx, req, &resp);
  if (status != nullptr) *status = s;
  return resp.status();
}

class HealthTest : public ServerTest {
 protected:
  void SetUp() override {
    ServerTest::SetUp();
    health_ = Health::NewStub(client_->channel);
  }
  std::unique_ptr<Health::Stub> health_;
};

TEST_F(HealthTest, ServingForTheServerAndEachService) {
  for (const char* service :
       {"", "komputed.v1.Devices", "komputed.v1.Sessions", "komputed.v1.Tensors",
        "komputed.v1.Algorithms", "komputed.v1.Sequences"}) {
    grpc::Status status;
    EXPECT_EQ(Check(*health_, service, &status), HealthCheckResponse::SERVING) << service;
    EXPECT_THAT(status, IsOk());
  }
}

TEST_F(HealthTest, UnknownServiceIsNotFound) {
  grpc::Status status;
  Check(*health_, "grpc.health.v1.Health.Nope", &status);
  EXPECT_THAT(status, HasCode(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(status.error_message(), HasSubstr("grpc.health.v1.Health.Nope"));
}

TEST_F(HealthTest, WatchEndsWithNotServingWhenTheServerShutsDown) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  HealthCheckRequest req;
  auto reader = health_->Watch(&ctx, req);
  HealthCheckResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), HealthCheckResponse::SERVING);
  std::thread stop([&] { server_->Shutdown(absl::Seconds(10)); });
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), HealthCheckResponse::NOT_SERVING);
  EXPECT_FALSE(reader->Read(&resp));
  EXPECT_THAT(reader->Finish(), IsOk());
  stop.join();
}

// The device's queue submissions go through fault-injecting calls.
class DeviceLossTest : public HealthTest {
 protected:
  ServerOptions Options() override {
    ServerOptions options = HealthTest::Options();
    options.vulkan_calls = calls_;
    return options;
  }
  std::shared_ptr<core::FaultInjectingCalls> calls_ = std::make_shared<core::FaultInjectingCalls>();
};

TEST_F(DeviceLossTest, LosingTheOnlyDeviceTurnsHealthNotServing) {
  grpc::ClientContext watch_ctx;
  watch_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  HealthCheckRequest req;
  req.set_service("komputed.v1.Sequences");
  auto watch = health_->Watch(&watch_ctx, req);
  HealthCheckResponse update;
  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), HealthCheckResponse::SERVING);

  const std::string session = Open("loses-its-device");
  MakePipeline(session, 1, 16, 2.0f);
  calls_->FailNext(core::VulkanCall::kQueueSubmit, VK_ERROR_DEVICE_LOST);
  v1::EvalResponse resp;
  EXPECT_THAT(Eval(PipelineEval(session, 1, std::vector<float>(16, 1.0f)), &resp),
              HasCode(grpc::StatusCode::UNAVAILABLE));

  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Check(*health_, ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(server_->metrics().device_losses_total("0").Value(), 1);
  // No new session goes to a lost device.
  grpc::ClientContext ctx;
  v1::OpenSessionRequest open;
  v1::OpenSessionResponse opened;
  EXPECT_THAT(client_->sessions->OpenSession(&ctx, open, &opened),
              HasCode(grpc::StatusCode::UNAVAILABLE));
  // A second failure on the lost device is not a second loss.
  EXPECT_THAT(Eval(PipelineEval(session, 1, std::vector<float>(16, 1.0f)), &resp),
              HasCode(grpc::StatusCode::UNAVAILABLE));
  EXPECT_EQ(server_->metrics().device_losses_total("0").Value(), 1);
  watch_ctx.TryCancel();
  while (watch->Read(&update)) {
  }
  watch->Finish();
}

}  // namespace
}  // namespace komputed::server::testing
