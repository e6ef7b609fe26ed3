// Quotas per tenant: each one hit gives RESOURCE_EXHAUSTED naming the quota, its limit and the
// use, creates nothing, and is counted; releasing makes room again. Memory stays charged while a
// destroyed tensor is still used by a submission in flight.
#include <iostream>
#include <thread>

#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "support/slow_kernel.h"
#include "tenant_client.h"
#include "test_options.h"

namespace komputed::server::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// One tenant per quota under test, each named after it and limited by it alone.
class QuotaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tenants_.Write(absl::StrCat(
        "tenants:\n", Entry("free"), Entry("sessions", "    quota: {sessions: 2}\n"),
        Entry("client_name_bytes", "    quota: {client_name_bytes: 16}\n"),
        Entry("objects_per_session", "    quota: {objects_per_session: 3}\n"),
        Entry("tensor_bytes", "    quota: {tensor_bytes: 1024}\n"),
        Entry("device_memory_bytes", "    quota: {device_memory_bytes: 8192}\n"),
        Entry("host_memory_bytes", "    quota: {host_memory_bytes: 4096}\n"),
        Entry("source_bytes", "    quota: {source_bytes: 200}\n"),
        Entry("dispatch_invocations", "    quota: {dispatch_invocations: 64}\n"),
        Entry("ops_per_sequence", "    quota: {ops_per_sequence: 3}\n"),
        Entry("inflight_submissions", "    quota: {inflight_submissions: 1}\n"),
        Entry("held_memory",
              absl::StrCat("    quota: {device_memory_bytes: ", 2 * kSlowBytes, "}\n"))));
    ServerOptions options = TestServerOptions();
    options.listen = "127.0.0.1:0";
    options.tenants_file = tenants_.path();
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  std::unique_ptr<TenantClient> As(const std::string& tenant) {
    return std::make_unique<TenantClient>(server_->address(), Bearer(Token(tenant)));
  }
  std::string OpenAs(TenantClient& c) {
    std::string id;
    EXPECT_THAT(Open(c, &id), IsOk());
    return id;
  }
  double Refusals(const std::string& quota) {
    return server_->metrics().quota_refusals_total(quota).Value();
  }
  double TenantMemory(const std::string& tenant, const std::string& kind) {
    return server_->metrics().tenant_memory_used_bytes(tenant, kind).Value();
  }

  // kSlowShader over kSlowCount uints: tensor h, algorithm h+1, sequence h+2.
  static constexpr uint32_t kSlowCount = 16384;
  static constexpr uint64_t kSlowBytes = kSlowCount * 4;
  void MakeSlow(TenantClient& c, const std::string& id, uint64_t h,
                const test_support::SlowWork& work) {
    v1::CreateTensorRequest t;
    t.set_session_id(id);
    t.set_handle(h);
    t.set_element_type(v1::ELEMENT_TYPE_UINT32);
    t.set_count(kSlowCount);
    ASSERT_THAT(CreateTensor(c, t), IsOk());
    v1::CreateAlgorithmRequest a =
        GlslAlgorithm(id, h + 1, {h}, test_support::kSlowShader, kSlowCount, work.PushConstants());
    ASSERT_THAT(CreateAlgorithm(c, a), IsOk());
    ASSERT_THAT(CreateSequence(c, id, h + 2), IsOk());
    ASSERT_THAT(Record(c, id, h + 2, {RecordOp(SyncDevice({h})), RecordOp(Dispatch(h + 1))}),
                IsOk());
  }
  static v1::EvalRequest EvalOf(const std::string& id, uint64_t sequence) {
    v1::EvalRequest req;
    req.set_session_id(id);
    req.set_sequence(sequence);
    return req;
  }
  // Work that takes about `target` here, measured in a session of the unlimited tenant.
  test_support::SlowWork WorkOf(absl::Duration target) {
    auto free = As("free");
    const std::string id = OpenAs(*free);
    grpc::ClientContext context;
    v1::ListDevicesResponse devices;
    EXPECT_THAT(free->devices->ListDevices(&context, v1::ListDevicesRequest(), &devices), IsOk());
    const bool cpu = devices.devices_size() > 0 && devices.devices(0).device_type() == 4;
    uint64_t h = 900;
    return test_support::SlowWorkFor(target, cpu, [&](test_support::SlowWork w) {
      MakeSlow(*free, id, h, w);
      v1::EvalResponse resp;
      EXPECT_THAT(Eval(*free, EvalOf(id, h + 2), &resp), IsOk());
      const absl::Time start = absl::Now();
      EXPECT_THAT(Eval(*free, EvalOf(id, h + 2), &resp), IsOk());
      h += 3;
      return absl::ToDoubleSeconds(absl::Now() - start);
    });
  }

  // Waits (up to 10 s) until the tenant has a submission in flight.
  void WaitUntilSubmitted(const std::string& tenant) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (server_->metrics().tenant_submissions_in_flight(tenant).Value() == 0 &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

  TenantsDir tenants_;
  std::unique_ptr<Server> server_;
};

// What every refusal says.
::testing::Matcher<grpc::Status> Exhausted(const std::string& quota, const std::string& limit) {
  return AllOf(HasCode(grpc::StatusCode::RESOURCE_EXHAUSTED),
               ::testing::Property(&grpc::Status::error_message,
                                   AllOf(HasSubstr(absl::StrCat("quota ", quota, " of tenant ")),
                                         HasSubstr(absl::StrCat("limit ", limit)))));
}

TEST_F(QuotaTest, Sessions) {
  auto c = As("sessions");
  const std::string first = OpenAs(*c);
  OpenAs(*c);
  grpc::Status refused = Open(*c, nullptr);
  EXPECT_THAT(refused, Exhausted("sessions", "2"));
  EXPECT_THAT(refused.error_message(), HasSubstr("in use 2"));
  EXPECT_EQ(List(*c).sessions_size(), 2);  // the refused one was not half-opened
  EXPECT_EQ(Refusals("sessions"), 1);
  ASSERT_THAT(Close(*c, first), IsOk());
  EXPECT_THAT(Open(*c, nullptr), IsOk());
  // Another tenant is not limited by it.
  auto free = As("free");
  for (int i = 0; i < 3; ++i) EXPECT_THAT(Open(*free, nullptr), IsOk());
}

TEST_F(QuotaTest, ClientNameBytes) {
  auto c = As("client_name_bytes");
  EXPECT_THAT(Open(*c, nullptr, std::string(17, 'n')), Exhausted("client_name_bytes", "16"));
  EXPECT_EQ(List(*c).sessions_size(), 0);
  EXPECT_THAT(Open(*c, nullptr, std::string(16, 'n')), IsOk());
}

TEST_F(QuotaTest, ObjectsPerSession) {
  auto c = As("objects_per_session");
  const std::string id = OpenAs(*c);
  ASSERT_THAT(CreateTensor(*c, FloatTensor(id, 1, {1, 2})), IsOk());
  ASSERT_THAT(CreateTensor(*c, FloatTensor(id, 2, {1, 2})), IsOk());
  ASSERT_THAT(CreateSequence(*c, id, 3), IsOk());
  EXPECT_THAT(CreateTensor(*c, FloatTensor(id, 4, {1, 2})), Exhausted("objects_per_session", "3"));
  EXPECT_THAT(CreateSequence(*c, id, 4), Exhausted("objects_per_session", "3"));
  EXPECT_THAT(CreateAlgorithm(*c, ScaleAlgorithm(id, 4, 1, 2, 2, 1.0f)),
              Exhausted("objects_per_session", "3"));
  EXPECT_THAT(DestroyTensor(*c, id, 4), HasCode(grpc::StatusCode::NOT_FOUND));  // never made
  ASSERT_THAT(DestroySequence(*c, id, 3), IsOk());
  EXPECT_THAT(CreateAlgorithm(*c, ScaleAlgorithm(id, 4, 1, 2, 2, 1.0f)), IsOk());
  // Commands inside an eval count the same.
  v1::EvalRequest eval;
  eval.set_session_id(id);
  *eval.add_commands()->mutable_create_tensor() = FloatTensor(id, 5, {1});
  v1::EvalResponse resp;
  EXPECT_THAT(Eval(*c, eval, &resp), Exhausted("objects_per_session", "3"));
}

TEST_F(QuotaTest, TensorBytes) {
  auto c = As("tensor_bytes");
  const std::string id = OpenAs(*c);
  EXPECT_THAT(CreateTensor(*c, FloatTensor(id, 1, std::vector<float>(257))),
              Exhausted("tensor_bytes", "1024"));
  EXPECT_THAT(CreateTensor(*c, FloatTensor(id, 1, std::vector<float>(256))), IsOk());
}

TEST_F(QuotaTest, DeviceMemoryBytes) {
  auto c = As("device_memory_bytes");
  const std::string id = OpenAs(*c);
  // A device tensor counts its buffer and its staging copy: 1024 floats take 8192 bytes.
  ASSERT_THAT(CreateTensor(*c, FloatTensor(id, 1, std::vector<float>(1024))), IsOk());
  EXPECT_EQ(TenantMemory("device_memory_bytes", "device"), 8192);
  grpc::Status refused = CreateTensor(*c, FloatTensor(id, 2, {1}));
  EXPECT_THAT(refused, Exhausted("device_memory_bytes", "8192"));
  EXPECT_THAT(refused.error_message(), HasSubstr("in use 8192, this request needs 8"));
  EXPECT_EQ(TenantMemory("device_memory_bytes", "device"), 8192);  // nothing taken by it
  // Another session of the tenant shares the quota.
  const std::string other = OpenAs(*c);
  EXPECT_THAT(CreateTensor(*c, FloatTensor(other, 1, {1})),
              Exhausted("device_memory_bytes", "8192"));
  ASSERT_THAT(DestroyTensor(*c, id, 1), IsOk());
  EXPECT_EQ(TenantMemory("device_memory_bytes", "device"), 0);
  EXPECT_THAT(CreateTensor(*c, FloatTensor(other, 1, std::vector<float>(1024))), IsOk());
  // Closing a session gives its memory back.
  ASSERT_THAT(Close(*c, other), IsOk());
  EXPECT_EQ(TenantMemory("device_memory_bytes", "device"), 0);
  EXPECT_GE(Refusals("device_memory_bytes"), 2);
}

TEST_F(QuotaTest, HostMemoryBytes) {
  auto c = As("host_memory_bytes");
  const std::string id = OpenAs(*c);
  ASSERT_THAT(CreateTensor(*c, FloatTensor(id, 1, std::vector<float>(1024), v1::MEMORY_TYPE_HOST)),
              IsOk());
  // Storage tensors have no host-visible memory.
  v1::CreateTensorRequest storage = FloatTensor(id, 2, {}, v1::MEMORY_TYPE_STORAGE);
  storage.set_count(1024);
  ASSERT_THAT(CreateTensor(*c, storage), IsOk());
  EXPECT_THAT(CreateTensor(*c, FloatTensor(id, 3, {1}, v1::MEMORY_TYPE_HOST)),
              Exhausted("host_memory_bytes", "4096"));
  EXPECT_THAT(CreateTensor(*c, FloatTensor(id, 3, {1})), Exhausted("host_memory_bytes", "4096"));
  ASSERT_THAT(DestroyTensor(*c, id, 1), IsOk());
  EXPECT_THAT(CreateTensor(*c, FloatTensor(id, 3, {1})), IsOk());
}

TEST_F(QuotaTest, SourceBytesAreCheckedBeforeCompiling) {
  auto c = As("source_bytes");
  const std::string id = OpenAs(*c);
  ASSERT_THAT(CreateTensor(*c, FloatTensor(id, 1, {1})), IsOk());
  ASSERT_THAT(CreateTensor(*c, FloatTensor(id, 2, {1})), IsOk());
  const double compiled = server_->metrics().shader_compilations_total("ok").Value() +
                          server_->metrics().shader_compilations_total("error").Value();
  grpc::Status refused = CreateAlgorithm(*c, ScaleAlgorithm(id, 3, 1, 2, 1, 1.0f));
  EXPECT_THAT(refused, Exhausted("source_bytes", "200"));
  EXPECT_THAT(refused.error_message(), HasSubstr("GLSL of "));
  EXPECT_EQ(server_->metrics().shader_compilations_total("ok").Value() +
                server_->metrics().shader_compilations_total("error").Value(),
            compiled);
  const std::string small =
      "#version 450\nlayout(local_size_x = 1) in;\n"
      "layout(binding = 0) buffer B { float b[]; };\nvoid main() { b[0] = 1.0; }\n";
  ASSERT_LE(small.size(), 200u);
  EXPECT_THAT(CreateAlgorithm(*c, GlslAlgorithm(id, 3, {1}, small, 1, "")), IsOk());
}

TEST_F(QuotaTest, DispatchInvocationsCountTheLocalSize) {
  auto c = As("dispatch_invocations");
  const std::string id = OpenAs(*c);
  ASSERT_THAT(CreateTensor(*c, FloatTensor(id, 1, std::vector<float>(1024))), IsOk());
  ASSERT_THAT(CreateTensor(*c, FloatTensor(id, 2, std::vector<float>(1024))), IsOk());
  EXPECT_THAT(CreateAlgorithm(*c, ScaleAlgorithm(id, 3, 1, 2, 65, 1.0f)),
              Exhausted("dispatch_invocations", "64"));
  EXPECT_THAT(CreateAlgorithm(*c, ScaleAlgorithm(id, 3, 1, 2, 64, 1.0f)), IsOk());
  // 5 workgroups of 16: 80.
  const std::string wide =
      absl::StrReplaceAll(kScaleShader, {{"local_size_x = 1", "local_size_x = 16"}});
  grpc::Status refused = CreateAlgorithm(*c, GlslAlgorithm(id, 4, {1, 2}, wide, 5, PushFloat(1)));
  EXPECT_THAT(refused, Exhausted("dispatch_invocations", "64"));
  EXPECT_THAT(refused.error_message(), HasSubstr("5x1x1 workgroups of 16x1x1 invocations (80)"));
  EXPECT_THAT(CreateAlgorithm(*c, GlslAlgorithm(id, 4, {1, 2}, wide, 4, PushFloat(1))), IsOk());
  // A local size from a specialization constant counts with the value given.
  const std::string specialized =
      absl::StrReplaceAll(kScaleShader, {{"local_size_x = 1", "local_size_x_id = 0"}});
  v1::CreateAlgorithmRequest by_spec = GlslAlgorithm(id, 5, {1, 2}, specialized, 4, PushFloat(1));
  const uint32_t thirty_two = 32;
  by_spec.set_spec_constants(std::string(reinterpret_cast<const char*>(&thirty_two), 4));
  EXPECT_THAT(CreateAlgorithm(*c, by_spec), Exhausted("dispatch_invocations", "64"));
  const uint32_t eight = 8;
  by_spec.set_spec_constants(std::string(reinterpret_cast<const char*>(&eight), 4));
  EXPECT_THAT(CreateAlgorithm(*c, by_spec), IsOk());
}

TEST_F(QuotaTest, OpsPerSequence) {
  auto c = As("ops_per_sequence");
  const std::string id = OpenAs(*c);
  ASSERT_THAT(CreateTensor(*c, FloatTensor(id, 1, {1})), IsOk());
  ASSERT_THAT(CreateSequence(*c, id, 2), IsOk());
  const v1::SequenceAction sync = RecordOp(SyncDevice({1}));
  ASSERT_THAT(Record(*c, id, 2, {sync, sync}), IsOk());
  EXPECT_THAT(Record(*c, id, 2, {sync, sync}), Exhausted("ops_per_sequence", "3"));
  ASSERT_THAT(Record(*c, id, 2, {sync}), IsOk());  // the refused record added nothing
  EXPECT_THAT(Record(*c, id, 2, {sync}), Exhausted("ops_per_sequence", "3"));
  // After a clear the sequence starts again from nothing.
  v1::SequenceAction clear;
  clear.set_clear(true);
  EXPECT_THAT(Record(*c, id, 2, {clear, sync, sync, sync}), IsOk());
}

TEST_F(QuotaTest, InflightSubmissions) {
  const test_support::SlowWork work = WorkOf(absl::Milliseconds(500));
  auto c = As("inflight_submissions");
  const std::string id = OpenAs(*c);
  MakeSlow(*c, id, 1, work);
  MakeSlow(*c, id, 4, work);
  grpc::Status first;
  std::thread running([&] {
    v1::EvalResponse resp;
    first = Eval(*c, EvalOf(id, 3), &resp);
  });
  // While the first eval runs, a second one (of another sequence) is refused.
  WaitUntilSubmitted("inflight_submissions");
  v1::EvalResponse refused_resp;
  grpc::Status second = Eval(*c, EvalOf(id, 6), &refused_resp);
  EXPECT_THAT(second, Exhausted("inflight_submissions", "1"));
  running.join();
  ASSERT_THAT(first, IsOk());
  v1::EvalResponse resp;
  EXPECT_THAT(Eval(*c, EvalOf(id, 6), &resp), IsOk());
}

// An eval that gives up waiting (its timeout) does not free its place while the GPU still runs it.
TEST_F(QuotaTest, ATimedOutSubmissionKeepsItsPlaceUntilItCompletes) {
  const test_support::SlowWork work = WorkOf(absl::Milliseconds(500));
  auto c = As("inflight_submissions");
  const std::string id = OpenAs(*c);
  MakeSlow(*c, id, 1, work);
  MakeSlow(*c, id, 4, work);
  v1::EvalRequest impatient = EvalOf(id, 3);
  impatient.set_timeout_ms(1);
  v1::EvalResponse resp;
  ASSERT_THAT(Eval(*c, impatient, &resp), HasCode(grpc::StatusCode::DEADLINE_EXCEEDED));
  EXPECT_THAT(Eval(*c, EvalOf(id, 6), &resp), Exhausted("inflight_submissions", "1"));
  // Once the first submission has completed, the place is free again.
  grpc::Status later;
  const absl::Time until = absl::Now() + absl::Seconds(20);
  do {
    absl::SleepFor(absl::Milliseconds(20));
    later = Eval(*c, EvalOf(id, 6), &resp);
  } while (!later.ok() && absl::Now() < until);
  EXPECT_THAT(later, IsOk());
}

TEST_F(QuotaTest, MemoryStaysChargedWhileASubmissionUsesADestroyedTensor) {
  // Long enough for four calls to land while it runs, under a sanitizer on a busy machine too.
  const test_support::SlowWork work = WorkOf(absl::Seconds(3));
  auto c = As("held_memory");
  const std::string id = OpenAs(*c);
  // One slow pipeline takes the whole quota (its tensor and staging copy).
  MakeSlow(*c, id, 1, work);
  grpc::Status evaluated;
  std::thread running([&] {
    v1::EvalResponse resp;
    evaluated = Eval(*c, EvalOf(id, 3), &resp);
  });
  // Once the submission is in flight, every handle that leads to the tensor is destroyed.
  WaitUntilSubmitted("held_memory");
  ASSERT_THAT(DestroyTensor(*c, id, 1), IsOk());
  ASSERT_THAT(DestroyAlgorithm(*c, id, 2), IsOk());
  ASSERT_THAT(DestroySequence(*c, id, 3), IsOk());
  const bool still_running =
      server_->metrics().tenant_submissions_in_flight("held_memory").Value() > 0;
  grpc::Status refused = CreateTensor(*c, FloatTensor(id, 7, {1}));
  running.join();
  ASSERT_THAT(evaluated, IsOk());
  EXPECT_TRUE(still_running) << "the submission completed before its handles were destroyed";
  EXPECT_THAT(refused, Exhausted("device_memory_bytes", std::to_string(2 * kSlowBytes)));
  // Once the device has let the tensor go, the memory is the tenant's again.
  grpc::Status created;
  const absl::Time until = absl::Now() + absl::Seconds(10);
  do {
    created = CreateTensor(*c, FloatTensor(id, 7, std::vector<float>(kSlowCount)));
  } while (!created.ok() && absl::Now() < until && (absl::SleepFor(absl::Milliseconds(5)), true));
  EXPECT_THAT(created, IsOk());
}

}  // namespace
}  // namespace komputed::server::testing
