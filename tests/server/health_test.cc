// grpc.health.v1 served by the daemon itself: SERVING while a device is usable and the daemon
// runs; NOT_SERVING once every device is lost (fault injection) or the daemon stops.
#include <chrono>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
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

// The device's queue submissions go through fault-injecting calls. A lost device is not opened
// again within these tests unless a test says so.
class DeviceLossTest : public HealthTest {
 protected:
  ServerOptions Options() override {
    ServerOptions options = HealthTest::Options();
    options.vulkan_calls = calls_;
    options.device_recovery_interval = recovery_interval_;
    return options;
  }
  // Loses device 0 through an evaluation of `session` (a scale pipeline at handle 1).
  void LoseTheDevice(const std::string& session) {
    calls_->FailNext(core::VulkanCall::kQueueSubmit, VK_ERROR_DEVICE_LOST);
    v1::EvalResponse resp;
    EXPECT_THAT(Eval(PipelineEval(session, 1, std::vector<float>(16, 1.0f)), &resp),
                HasCode(grpc::StatusCode::UNAVAILABLE));
  }
  v1::DeviceInfo Device0() {
    grpc::ClientContext ctx;
    v1::ListDevicesResponse devices;
    EXPECT_THAT(client_->devices->ListDevices(&ctx, v1::ListDevicesRequest(), &devices), IsOk());
    return devices.devices_size() > 0 ? devices.devices(0) : v1::DeviceInfo();
  }
  uint64_t MemoryInUse() { return Device0().memory_in_use_bytes(); }

  std::shared_ptr<core::FaultInjectingCalls> calls_ = std::make_shared<core::FaultInjectingCalls>();
  absl::Duration recovery_interval_ = absl::Hours(1);
};

class DeviceRecoveryTest : public DeviceLossTest {
 protected:
  DeviceRecoveryTest() { recovery_interval_ = absl::Milliseconds(20); }
};

// Lost, then opened again: new sessions work on the new opening, the old session's calls fail
// with UNAVAILABLE until it is closed, and its memory is returned then.
TEST_F(DeviceRecoveryTest, LostDeviceIsOpenedAgainForNewSessions) {
  grpc::ClientContext watch_ctx;
  watch_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto watch = health_->Watch(&watch_ctx, HealthCheckRequest());
  HealthCheckResponse update;
  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), HealthCheckResponse::SERVING);

  const std::string old_session = Open("loses-its-device");
  MakePipeline(old_session, 1, 16, 2.0f);
  const uint64_t old_memory = MemoryInUse();
  EXPECT_GT(old_memory, 0u);
  LoseTheDevice(old_session);
  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), HealthCheckResponse::NOT_SERVING);
  ASSERT_TRUE(watch->Read(&update));  // bounded by the watch's deadline
  EXPECT_EQ(update.status(), HealthCheckResponse::SERVING);
  EXPECT_EQ(server_->metrics().device_losses_total("0").Value(), 1);
  EXPECT_EQ(server_->metrics().device_recoveries_total("0").Value(), 1);
  EXPECT_FALSE(Device0().lost());
  EXPECT_EQ(Device0().recoveries(), 1u);

  // A new session runs on the new opening.
  const std::string new_session = Open("after-the-loss");
  MakePipeline(new_session, 1, 16, 3.0f);
  v1::EvalResponse resp;
  ASSERT_THAT(Eval(PipelineEval(new_session, 1, std::vector<float>(16, 2.0f)), &resp), IsOk());
  ASSERT_EQ(resp.downloads_size(), 1);
  EXPECT_EQ(Floats(resp.downloads(0).data()), std::vector<float>(16, 6.0f));

  // The old session's objects are gone with the old opening: creating, recording and evaluating
  // fail with UNAVAILABLE and say what to do; failing again is not another loss.
  grpc::Status status = Eval(PipelineEval(old_session, 1, std::vector<float>(16, 1.0f)), &resp);
  EXPECT_THAT(status, HasCode(grpc::StatusCode::UNAVAILABLE));
  EXPECT_THAT(status.error_message(), HasSubstr("open a new one"));
  EXPECT_THAT(CreateTensor(FloatTensor(old_session, 9, {1, 2})),
              HasCode(grpc::StatusCode::UNAVAILABLE));
  EXPECT_THAT(CreateSequence(old_session, 10), HasCode(grpc::StatusCode::UNAVAILABLE));
  EXPECT_THAT(DestroyTensor(old_session, 1), IsOk());
  EXPECT_EQ(server_->metrics().device_losses_total("0").Value(), 1);

  // Closing it returns its memory; the new session's stays.
  const uint64_t both = MemoryInUse();
  grpc::ClientContext close_ctx;
  v1::CloseSessionRequest close;
  close.set_session_id(old_session);
  v1::CloseSessionResponse closed;
  ASSERT_THAT(client_->sessions->CloseSession(&close_ctx, close, &closed), IsOk());
  EXPECT_LT(MemoryInUse(), both);
  EXPECT_EQ(MemoryInUse(), old_memory);  // the new pipeline has the old one's shape
  watch_ctx.TryCancel();
  while (watch->Read(&update)) {
  }
  watch->Finish();
}

class NoDeviceRecoveryTest : public DeviceLossTest {
 protected:
  NoDeviceRecoveryTest() { recovery_interval_ = absl::ZeroDuration(); }
};

TEST_F(NoDeviceRecoveryTest, LostDeviceStaysLostWithRecoveryOff) {
  const std::string session = Open("loses-its-device");
  MakePipeline(session, 1, 16, 2.0f);
  LoseTheDevice(session);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(server_->metrics().device_recoveries_total("0").Value(), 0);
  EXPECT_EQ(Check(*health_, ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_TRUE(Device0().lost());
  EXPECT_EQ(Device0().recoveries(), 0u);
  grpc::Status status = TryOpen();
  EXPECT_THAT(status, HasCode(grpc::StatusCode::UNAVAILABLE));
  EXPECT_THAT(status.error_message(), HasSubstr("device 0 was lost"));
}

TEST_F(DeviceRecoveryTest, RecoveredDeviceCanBeLostAndOpenedAgain) {
  for (int round = 1; round <= 2; ++round) {
    const std::string session = Open(absl::StrCat("round-", round));
    MakePipeline(session, 1, 16, 2.0f);
    LoseTheDevice(session);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (server_->metrics().device_recoveries_total("0").Value() < round &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(server_->metrics().device_losses_total("0").Value(), round);
    EXPECT_EQ(server_->metrics().device_recoveries_total("0").Value(), round);
  }
  const std::string session = Open("after-two-losses");
  MakePipeline(session, 1, 4, 5.0f);
  v1::EvalResponse resp;
  ASSERT_THAT(Eval(PipelineEval(session, 1, std::vector<float>(4, 1.0f)), &resp), IsOk());
  EXPECT_EQ(Floats(resp.downloads(0).data()), std::vector<float>(4, 5.0f));
}

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
  LoseTheDevice(session);

  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Check(*health_, ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(server_->metrics().device_losses_total("0").Value(), 1);
  // No new session goes to a lost device.
  EXPECT_THAT(TryOpen(), HasCode(grpc::StatusCode::UNAVAILABLE));
  // A second failure on the lost device is not a second loss.
  v1::EvalResponse resp;
  EXPECT_THAT(Eval(PipelineEval(session, 1, std::vector<float>(16, 1.0f)), &resp),
              HasCode(grpc::StatusCode::UNAVAILABLE));
  EXPECT_EQ(server_->metrics().device_losses_total("0").Value(), 1);
  EXPECT_EQ(server_->metrics().device_recoveries_total("0").Value(), 0);
  watch_ctx.TryCancel();
  while (watch->Read(&update)) {
  }
  watch->Finish();
}

}  // namespace
}  // namespace komputed::server::testing
