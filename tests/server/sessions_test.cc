// Devices and Sessions services: listing, opening, closing, isolation and the idle reaper.
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "test_util.h"

namespace komputed::server::testing {
namespace {

using ::testing::Each;
using ::testing::HasSubstr;

TEST_F(ServerTest, PingEchoesThePayload) {
  grpc::ClientContext ctx;
  v1::PingRequest req;
  req.set_payload("hello");
  v1::PingResponse resp;
  ASSERT_THAT(client_->sessions->Ping(&ctx, req, &resp), IsOk());
  EXPECT_EQ(resp.payload(), "hello");
}

TEST_F(ServerTest, ListDevicesDescribesEachDevice) {
  grpc::ClientContext ctx;
  v1::ListDevicesResponse resp;
  ASSERT_THAT(client_->devices->ListDevices(&ctx, v1::ListDevicesRequest(), &resp), IsOk());
  ASSERT_GE(resp.devices_size(), 1);
  const v1::DeviceInfo& d = resp.devices(0);
  EXPECT_EQ(d.index(), 0u);
  EXPECT_FALSE(d.name().empty());
  ASSERT_GE(d.queue_families_size(), 1);
  EXPECT_TRUE(d.queue_families(0).compute());
  EXPECT_GE(d.queue_families(0).queue_count(), 1u);
  EXPECT_EQ(d.limits().max_compute_work_group_count_size(), 3);
  EXPECT_GT(d.limits().max_compute_work_group_count(0), 0u);
  EXPECT_EQ(d.properties_raw().size(), sizeof(VkPhysicalDeviceProperties));
  EXPECT_EQ(d.memory_in_use_bytes(), 0u);
  EXPECT_EQ(d.sessions(), 0u);
}

TEST_F(ServerTest, OpenListAndCloseSession) {
  grpc::ClientContext ctx;
  v1::OpenSessionRequest req;
  req.set_client_name("alice");
  v1::OpenSessionResponse resp;
  ASSERT_THAT(client_->sessions->OpenSession(&ctx, req, &resp), IsOk());
  EXPECT_EQ(resp.session_id().size(), 32u);  // 128 bits in hex
  EXPECT_EQ(resp.queue_count(), 1u);
  EXPECT_EQ(resp.idle_timeout_ms(), 60000u);
  EXPECT_EQ(resp.max_message_bytes(), 64u << 20);
  EXPECT_FALSE(resp.device().name().empty());
  EXPECT_EQ(resp.device().sessions(), 1u);

  {
    grpc::ClientContext c;
    v1::ListSessionsResponse list;
    ASSERT_THAT(client_->sessions->ListSessions(&c, v1::ListSessionsRequest(), &list), IsOk());
    ASSERT_EQ(list.sessions_size(), 1);
    EXPECT_EQ(list.sessions(0).session_id(), resp.session_id());
    EXPECT_EQ(list.sessions(0).client_name(), "alice");
    EXPECT_FALSE(list.sessions(0).peer().empty());
  }
  {
    grpc::ClientContext c;
    v1::KeepAliveRequest keep;
    keep.set_session_id(resp.session_id());
    v1::KeepAliveResponse r;
    EXPECT_THAT(client_->sessions->KeepAlive(&c, keep, &r), IsOk());
  }
  {
    grpc::ClientContext c;
    v1::CloseSessionRequest close;
    close.set_session_id(resp.session_id());
    v1::CloseSessionResponse r;
    ASSERT_THAT(client_->sessions->CloseSession(&c, close, &r), IsOk());
  }
  {
    grpc::ClientContext c;
    v1::ListSessionsResponse list;
    ASSERT_THAT(client_->sessions->ListSessions(&c, v1::ListSessionsRequest(), &list), IsOk());
    EXPECT_EQ(list.sessions_size(), 0);
  }
  {
    grpc::ClientContext c;
    v1::CloseSessionRequest close;
    close.set_session_id(resp.session_id());
    v1::CloseSessionResponse r;
    EXPECT_THAT(client_->sessions->CloseSession(&c, close, &r),
                HasCode(grpc::StatusCode::NOT_FOUND));
  }
}

TEST_F(ServerTest, UnknownSessionIsNotFound) {
  grpc::ClientContext ctx;
  v1::KeepAliveRequest req;
  req.set_session_id("0123456789abcdef0123456789abcdef");
  v1::KeepAliveResponse resp;
  grpc::Status s = client_->sessions->KeepAlive(&ctx, req, &resp);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(s.error_message(), HasSubstr("0123456789abcdef0123456789abcdef"));
  // It names the daemon that answered: behind a balancer, a call may reach another daemon.
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("not found on komputed on ", host)));
  EXPECT_THAT(s.error_message(), HasSubstr("another daemon"));
  EXPECT_THAT(CreateTensor(FloatTensor("0123456789abcdef0123456789abcdef", 1, {1.0f})),
              HasCode(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(CreateTensor(FloatTensor("", 1, {1.0f})),
              HasCode(grpc::StatusCode::INVALID_ARGUMENT));
}

TEST_F(ServerTest, OpenSessionChecksDeviceAndQueues) {
  auto open = [&](uint32_t device, std::vector<uint32_t> families) {
    grpc::ClientContext ctx;
    v1::OpenSessionRequest req;
    req.set_device_index(device);
    for (uint32_t f : families) req.add_queue_families(f);
    v1::OpenSessionResponse resp;
    return client_->sessions->OpenSession(&ctx, req, &resp);
  };
  grpc::Status s = open(7, {});
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("device index 7"));

  grpc::ClientContext ctx;
  v1::ListDevicesResponse devices;
  ASSERT_THAT(client_->devices->ListDevices(&ctx, v1::ListDevicesRequest(), &devices), IsOk());
  const v1::QueueFamily& family = devices.devices(0).queue_families(0);
  std::vector<uint32_t> too_many(family.queue_count() + 1, family.index());
  s = open(0, too_many);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("queue(s)"));

  s = open(0, {99});
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("queue family 99"));

  // All of a family's queues are fine.
  std::vector<uint32_t> all(family.queue_count(), family.index());
  EXPECT_THAT(open(0, all), IsOk());
}

TEST_F(ServerTest, SessionsCannotSeeEachOthersHandles) {
  const std::string a = Open("a");
  const std::string b = Open("b");
  ASSERT_NE(a, b);
  MakePipeline(a, 1, 8, 2.0f);

  EXPECT_THAT(DestroyTensor(b, 1), HasCode(grpc::StatusCode::NOT_FOUND));
  v1::EvalRequest req = PipelineEval(b, 1, std::vector<float>(8, 1.0f));
  v1::EvalResponse resp;
  grpc::Status s = Eval(req, &resp);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(s.error_message(), HasSubstr("not found in this session"));
  EXPECT_THAT(Record(b, 4, {RecordOp(Dispatch(3))}), HasCode(grpc::StatusCode::NOT_FOUND));

  // The same handles in b are b's own.
  MakePipeline(b, 1, 8, 3.0f);
  ExpectPipelineWorks(a, 1, 8, 2.0f);
  ExpectPipelineWorks(b, 1, 8, 3.0f);
}

TEST_F(ServerTest, MemoryIsCountedPerSessionAndDevice) {
  const std::string s = Open();
  ASSERT_THAT(CreateTensor(FloatTensor(s, 1, std::vector<float>(1024))), IsOk());  // device: ×2
  ASSERT_THAT(CreateTensor(FloatTensor(s, 2, std::vector<float>(256), v1::MEMORY_TYPE_HOST)),
              IsOk());
  {
    grpc::ClientContext ctx;
    v1::ListSessionsResponse list;
    ASSERT_THAT(client_->sessions->ListSessions(&ctx, v1::ListSessionsRequest(), &list), IsOk());
    ASSERT_EQ(list.sessions_size(), 1);
    EXPECT_EQ(list.sessions(0).memory_bytes(), 2 * 4096u + 1024u);
    EXPECT_EQ(list.sessions(0).tensors(), 2u);
  }
  ASSERT_THAT(DestroyTensor(s, 1), IsOk());
  grpc::ClientContext ctx;
  v1::ListDevicesResponse devices;
  ASSERT_THAT(client_->devices->ListDevices(&ctx, v1::ListDevicesRequest(), &devices), IsOk());
  EXPECT_EQ(devices.devices(0).memory_in_use_bytes(), 1024u);
}

// A daemon whose sessions expire after 300 ms.
class ShortIdleTest : public ServerTest {
 protected:
  ServerOptions Options() override {
    ServerOptions options = ServerTest::Options();
    options.session_idle_timeout = absl::Milliseconds(300);
    return options;
  }

  v1::ListSessionsResponse Sessions() {
    grpc::ClientContext ctx;
    v1::ListSessionsResponse list;
    EXPECT_THAT(client_->sessions->ListSessions(&ctx, v1::ListSessionsRequest(), &list), IsOk());
    return list;
  }
  v1::DeviceInfo Device0() {
    grpc::ClientContext ctx;
    v1::ListDevicesResponse devices;
    EXPECT_THAT(client_->devices->ListDevices(&ctx, v1::ListDevicesRequest(), &devices), IsOk());
    return devices.devices(0);
  }
  // Polls (ListSessions and ListDevices do not touch sessions) until no session is listed and the
  // device holds none and none of their memory (the reaper takes a session out of the table
  // before it frees what the session held); bounded.
  bool WaitForNoSessions(absl::Duration bound = absl::Seconds(10)) {
    const absl::Time until = absl::Now() + bound;
    while (absl::Now() < until) {
      if (Sessions().sessions_size() == 0) {
        const v1::DeviceInfo device = Device0();
        if (device.sessions() == 0 && device.memory_in_use_bytes() == 0) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
};

TEST_F(ShortIdleTest, IdleSessionIsReapedAndItsMemoryFreed) {
  const absl::Time opened = absl::Now();
  const std::string s = Open();
  ASSERT_THAT(CreateTensor(FloatTensor(s, 1, std::vector<float>(1024))), IsOk());
  EXPECT_EQ(Device0().memory_in_use_bytes(), 8192u);
  EXPECT_EQ(Device0().sessions(), 1u);

  ASSERT_TRUE(WaitForNoSessions());
  EXPECT_GE(absl::Now() - opened, absl::Milliseconds(300));
  EXPECT_EQ(Device0().memory_in_use_bytes(), 0u);
  EXPECT_EQ(Device0().sessions(), 0u);
  EXPECT_THAT(DestroyTensor(s, 1), HasCode(grpc::StatusCode::NOT_FOUND));
}

TEST_F(ShortIdleTest, OpenExecuteStreamKeepsTheSessionAlive) {
  const std::string s = Open();
  MakePipeline(s, 1, 4, 2.0f);
  grpc::ClientContext ctx;
  auto stream = client_->sequences->Execute(&ctx);
  v1::ExecuteRequest req;
  *req.mutable_eval() = PipelineEval(s, 1, {1, 2, 3, 4});
  ASSERT_TRUE(stream->Write(req));
  v1::ExecuteEvent event;
  ASSERT_TRUE(stream->Read(&event));
  EXPECT_EQ(event.code(), 0) << event.message();

  // Three idle timeouts pass with only the stream open: the session stays.
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  ASSERT_EQ(Sessions().sessions_size(), 1);

  stream->WritesDone();
  EXPECT_THAT(stream->Finish(), IsOk());
  ASSERT_TRUE(WaitForNoSessions());
  EXPECT_EQ(Device0().memory_in_use_bytes(), 0u);
}

TEST_F(ShortIdleTest, KeepAliveKeepsTheSessionAlive) {
  const std::string s = Open();
  const absl::Time until = absl::Now() + absl::Milliseconds(900);
  while (absl::Now() < until) {
    grpc::ClientContext ctx;
    v1::KeepAliveRequest req;
    req.set_session_id(s);
    v1::KeepAliveResponse resp;
    ASSERT_THAT(client_->sessions->KeepAlive(&ctx, req, &resp), IsOk());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Sessions().sessions_size(), 1);
}

// A daemon whose idle sequences give their command buffers back after 300 ms.
class SequenceReleaseTest : public ServerTest {
 protected:
  ServerOptions Options() override {
    ServerOptions options = ServerTest::Options();
    options.sequence_release_after = absl::Milliseconds(300);
    return options;
  }
  double Released() { return server_->metrics().sequences_released_total().Value(); }
  // Polls the counter until it reaches `at_least`; bounded.
  bool WaitForReleased(double at_least) {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (Released() < at_least) {
      if (absl::Now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }
};

// An idle sequence gives its command buffer back while its session and its Execute stream stay
// open, and its next evals (unary and on the stream) run the same commands; a sequence in use is
// not given back.
TEST_F(SequenceReleaseTest, AnIdleSequenceGivesBackItsCommandBufferAndStillRuns) {
  const std::string s = Open();
  MakePipeline(s, 1, 64, 3.0f);
  MakePipeline(s, 11, 64, 5.0f);
  ExpectPipelineWorks(s, 1, 64, 3.0f);
  grpc::ClientContext ctx;
  auto stream = client_->sequences->Execute(&ctx);

  // Sequence 14 is evaluated every 10 ms, until sequence 4 has been given back and 500 ms more.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  absl::Time busy_until = absl::InfiniteFuture();
  while (absl::Now() < busy_until && absl::Now() < deadline) {
    ExpectPipelineWorks(s, 11, 64, 5.0f);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (busy_until == absl::InfiniteFuture() && Released() >= 1) {
      busy_until = absl::Now() + absl::Milliseconds(500);
    }
  }
  ASSERT_NE(busy_until, absl::InfiniteFuture()) << "sequence 4 was not given back";
  EXPECT_EQ(Released(), 1);

  ExpectPipelineWorks(s, 1, 64, 3.0f);  // recorded again
  ASSERT_TRUE(WaitForReleased(3));      // both idle now: 4 once more, and 14
  v1::ExecuteRequest req;
  *req.mutable_eval() = PipelineEval(s, 11, std::vector<float>(64, 2.0f));
  ASSERT_TRUE(stream->Write(req));
  v1::ExecuteEvent event;
  ASSERT_TRUE(stream->Read(&event));
  ASSERT_EQ(event.code(), 0) << event.message();
  ASSERT_EQ(event.result().downloads_size(), 1);
  EXPECT_THAT(Floats(event.result().downloads(0).data()), Each(10.0f));
  stream->WritesDone();
  EXPECT_THAT(stream->Finish(), IsOk());
}

}  // namespace
}  // namespace komputed::server::testing
