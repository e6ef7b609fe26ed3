// Tensors, Algorithms and Sequences: the eval round trip and every validation error.
#include "test_util.h"

namespace komputed::server::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr uint32_t kN = 16;

// How the daemon serves a unary Eval.
struct EvalServing {
  std::string name;
  absl::Duration inline_wait;  // --eval_inline_wait
  absl::Duration poll;         // --eval_poll
};

// Every eval test runs three times: with the unary fast path (the serving thread waits for short
// submissions), the same with the serving threads polling for the next call, and with every
// submission handed to the device's completion waiter.
class EvalTest : public ServerTest, public ::testing::WithParamInterface<EvalServing> {
 protected:
  ServerOptions Options() override {
    ServerOptions options = ServerTest::Options();
    options.eval_inline_wait = GetParam().inline_wait;
    options.eval_poll = GetParam().poll;
    return options;
  }
  void SetUp() override {
    ServerTest::SetUp();
    session_ = Open("eval");
    MakePipeline(session_, 1, kN, 2.0f);  // tensors 1, 2; algorithm 3; sequence 4
  }
  // The session still works after an error: its pipeline gives the right numbers.
  void ExpectWorks() { ExpectPipelineWorks(session_, 1, kN, 2.0f); }

  std::string session_;
};

TEST_P(EvalTest, SyncDispatchSyncReturnsTheResult) {
  ExpectWorks();
  // Again, with different input: the recording is reused.
  std::vector<float> input(kN, 3.0f);
  v1::EvalResponse resp;
  ASSERT_THAT(Eval(PipelineEval(session_, 1, input), &resp), IsOk());
  EXPECT_THAT(Floats(resp.downloads(0).data()), ::testing::Each(6.0f));
}

TEST_P(EvalTest, StageTimesComeInOrderOnlyWhenAsked) {
  v1::EvalResponse plain;
  ASSERT_THAT(Eval(PipelineEval(session_, 1, std::vector<float>(kN, 1.0f)), &plain), IsOk());
  EXPECT_FALSE(plain.has_stages());

  v1::EvalRequest req = PipelineEval(session_, 1, std::vector<float>(kN, 5.0f));
  req.set_stage_times(true);
  v1::EvalResponse resp;
  const uint64_t before = MonotonicNs();
  ASSERT_THAT(Eval(req, &resp), IsOk());
  const uint64_t after = MonotonicNs();
  EXPECT_THAT(Floats(resp.downloads(0).data()), ::testing::Each(10.0f));
  ASSERT_TRUE(resp.has_stages());
  const v1::EvalStages& s = resp.stages();
  // One clock (the host's monotonic one) for this test and the daemon it runs in.
  ExpectStagesInOrder(before, s, after);
  // Without an inline wait, the completion waiter saw the submission complete.
  if (GetParam().inline_wait == absl::ZeroDuration()) {
    EXPECT_FALSE(s.waited_inline());
  }
}

TEST_P(EvalTest, DataGivenAtCreationReachesTheShader) {
  std::vector<float> data(kN);
  for (uint32_t i = 0; i < kN; ++i) data[i] = static_cast<float>(i * i);
  ASSERT_THAT(CreateTensor(FloatTensor(session_, 10, data)), IsOk());
  ASSERT_THAT(CreateTensor(FloatTensor(session_, 11, std::vector<float>(kN))), IsOk());
  ASSERT_THAT(CreateAlgorithm(ScaleAlgorithm(session_, 12, 10, 11, kN, -1.0f)), IsOk());
  ASSERT_THAT(CreateSequence(session_, 13), IsOk());
  ASSERT_THAT(
      Record(session_, 13,
             {RecordOp(SyncDevice({10})), RecordOp(Dispatch(12)), RecordOp(SyncLocal({11}))}),
      IsOk());
  v1::EvalRequest req;
  req.set_session_id(session_);
  req.set_sequence(13);
  req.add_downloads(11);
  v1::EvalResponse resp;
  ASSERT_THAT(Eval(req, &resp), IsOk());
  std::vector<float> out = Floats(resp.downloads(0).data());
  for (uint32_t i = 0; i < kN; ++i) EXPECT_FLOAT_EQ(out[i], -data[i]);
}

TEST_P(EvalTest, CommandsRunBeforeTheSubmissionInOneRoundTrip) {
  v1::EvalRequest req;
  req.set_session_id(session_);
  *req.add_commands()->mutable_create_tensor() = FloatTensor("", 20, {1, 2, 3, 4});
  *req.add_commands()->mutable_create_tensor() = FloatTensor("", 21, {0, 0, 0, 0});
  *req.add_commands()->mutable_create_algorithm() = ScaleAlgorithm("", 22, 20, 21, 4, 10.0f);
  v1::CreateSequenceRequest* seq = req.add_commands()->mutable_create_sequence();
  seq->set_handle(23);
  v1::RecordRequest* rec = req.add_commands()->mutable_record();
  rec->set_sequence(23);
  *rec->add_actions() = RecordOp(SyncDevice({20}));
  *rec->add_actions() = RecordOp(Dispatch(22));
  *rec->add_actions() = RecordOp(SyncLocal({21}));
  req.set_sequence(23);
  req.add_downloads(21);
  v1::EvalResponse resp;
  ASSERT_THAT(Eval(req, &resp), IsOk());
  EXPECT_THAT(Floats(resp.downloads(0).data()), ::testing::ElementsAre(10, 20, 30, 40));
}

TEST_P(EvalTest, FailingCommandIsNamedAndEarlierOnesStay) {
  v1::EvalRequest req;
  req.set_session_id(session_);
  *req.add_commands()->mutable_create_tensor() = FloatTensor("", 30, {1});
  *req.add_commands()->mutable_create_tensor() = FloatTensor("", 30, {1});
  *req.add_commands()->mutable_create_tensor() = FloatTensor("", 31, {1});
  req.set_sequence(4);
  v1::EvalResponse resp;
  grpc::Status s = Eval(req, &resp);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::ALREADY_EXISTS));
  EXPECT_THAT(s.error_message(), StartsWith("command 1 (create_tensor 30): "));
  EXPECT_THAT(DestroyTensor(session_, 30), IsOk());                                // applied
  EXPECT_THAT(DestroyTensor(session_, 31), HasCode(grpc::StatusCode::NOT_FOUND));  // never ran
  ExpectWorks();
}

TEST_P(EvalTest, EvalWithoutSequenceReturnsDownloadsAtOnce) {
  v1::EvalRequest req;
  req.set_session_id(session_);
  v1::TensorData* up = req.add_uploads();
  up->set_handle(1);
  up->set_offset(4);
  up->set_data(FloatBytes({42.0f}));
  req.add_downloads(1);
  v1::EvalResponse resp;
  ASSERT_THAT(Eval(req, &resp), IsOk());
  std::vector<float> host = Floats(resp.downloads(0).data());
  ASSERT_EQ(host.size(), kN);
  EXPECT_EQ(host[1], 42.0f);
}

TEST_P(EvalTest, TimestampsComeBackInNanoseconds) {
  ASSERT_THAT(CreateSequence(session_, 40, /*queue=*/0, /*timestamps=*/8), IsOk());
  ASSERT_THAT(Record(session_, 40,
                     {RecordOp(SyncDevice({1})), RecordOp(Dispatch(3)), RecordOp(SyncLocal({2}))}),
              IsOk());
  v1::EvalRequest req;
  req.set_session_id(session_);
  req.set_sequence(40);
  v1::EvalResponse resp;
  ASSERT_THAT(Eval(req, &resp), IsOk());
  ASSERT_EQ(resp.timestamps_ns_size(), 4);  // before the first op, after each of 3
  for (int i = 1; i < resp.timestamps_ns_size(); ++i) {
    EXPECT_GE(resp.timestamps_ns(i), resp.timestamps_ns(i - 1));
  }
  EXPECT_EQ(resp.device_time_ns(), resp.timestamps_ns(3) - resp.timestamps_ns(0));

  grpc::ClientContext ctx;
  v1::GetTimestampsRequest treq;
  treq.set_session_id(session_);
  treq.set_handle(40);
  v1::GetTimestampsResponse tresp;
  ASSERT_THAT(client_->sequences->GetTimestamps(&ctx, treq, &tresp), IsOk());
  EXPECT_EQ(tresp.timestamps_ns_size(), 4);
}

TEST_P(EvalTest, DispatchPushConstantsOverrideAndStay) {
  v1::Operation dispatch = Dispatch(3);
  dispatch.mutable_dispatch()->set_has_push_constants(true);
  dispatch.mutable_dispatch()->set_push_constants(PushFloat(5.0f));
  ASSERT_THAT(CreateSequence(session_, 41), IsOk());
  ASSERT_THAT(Record(session_, 41,
                     {RecordOp(SyncDevice({1})), RecordOp(dispatch), RecordOp(SyncLocal({2}))}),
              IsOk());
  v1::EvalRequest req = PipelineEval(session_, 1, std::vector<float>(kN, 1.0f));
  req.set_sequence(41);
  v1::EvalResponse resp;
  ASSERT_THAT(Eval(req, &resp), IsOk());
  EXPECT_THAT(Floats(resp.downloads(0).data()), ::testing::Each(5.0f));
}

TEST_P(EvalTest, RebuiltAlgorithmNeedsRerecord) {
  grpc::ClientContext ctx;
  v1::CreateAlgorithmResponse r;
  ASSERT_THAT(
      client_->algorithms->RebuildAlgorithm(&ctx, ScaleAlgorithm(session_, 3, 1, 2, kN, 7.0f), &r),
      IsOk());
  v1::EvalResponse resp;
  grpc::Status s = Eval(PipelineEval(session_, 1, std::vector<float>(kN, 1.0f)), &resp);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_THAT(s.error_message(), HasSubstr("sequence 4"));

  v1::SequenceAction rerecord;
  rerecord.set_rerecord(true);
  ASSERT_THAT(Record(session_, 4, {rerecord}), IsOk());
  resp.Clear();
  ASSERT_THAT(Eval(PipelineEval(session_, 1, std::vector<float>(kN, 1.0f)), &resp), IsOk());
  EXPECT_THAT(Floats(resp.downloads(0).data()), ::testing::Each(7.0f));
}

TEST_P(EvalTest, SetPushConstantsChangesTheNextEval) {
  grpc::ClientContext ctx;
  v1::SetPushConstantsRequest req;
  req.set_session_id(session_);
  req.set_handle(3);
  req.set_push_constants(PushFloat(4.0f));
  v1::SetPushConstantsResponse r;
  ASSERT_THAT(client_->algorithms->SetPushConstants(&ctx, req, &r), IsOk());
  // The recording holds the old values until it is recorded again.
  v1::SequenceAction rerecord;
  rerecord.set_rerecord(true);
  ASSERT_THAT(Record(session_, 4, {rerecord}), IsOk());
  ExpectPipelineWorks(session_, 1, kN, 4.0f);
}

TEST_P(EvalTest, CopyBetweenTensors) {
  ASSERT_THAT(CreateTensor(FloatTensor(session_, 50, {1, 2, 3})), IsOk());
  ASSERT_THAT(CreateTensor(FloatTensor(session_, 51, {0, 0, 0})), IsOk());
  ASSERT_THAT(CreateSequence(session_, 52), IsOk());
  v1::Operation copy;
  copy.mutable_copy()->add_tensors(50);
  copy.mutable_copy()->add_tensors(51);
  ASSERT_THAT(
      Record(session_, 52, {RecordOp(SyncDevice({50})), RecordOp(copy), RecordOp(SyncLocal({51}))}),
      IsOk());
  v1::EvalRequest req;
  req.set_session_id(session_);
  req.set_sequence(52);
  req.add_downloads(51);
  v1::EvalResponse resp;
  ASSERT_THAT(Eval(req, &resp), IsOk());
  EXPECT_THAT(Floats(resp.downloads(0).data()), ::testing::ElementsAre(1, 2, 3));
}

// ---------------------------------------------------------------------------------------------
// Validation: the specific code, a message naming the value, and the session still works.

TEST_P(EvalTest, UnknownHandlesAreNotFound) {
  grpc::Status s = DestroyTensor(session_, 999);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::NOT_FOUND));
  EXPECT_EQ(s.error_message(), "tensor 999 not found in this session");

  v1::EvalRequest req;
  req.set_session_id(session_);
  req.set_sequence(999);
  v1::EvalResponse resp;
  s = Eval(req, &resp);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(s.error_message(), HasSubstr("sequence 999"));

  s = Record(session_, 4, {RecordOp(Dispatch(998))});
  EXPECT_THAT(s, HasCode(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(s.error_message(), HasSubstr("algorithm 998"));

  s = CreateAlgorithm(ScaleAlgorithm(session_, 60, 1, 997, kN, 1.0f));
  EXPECT_THAT(s, HasCode(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(s.error_message(), HasSubstr("tensor 997"));

  req.set_sequence(0);
  req.add_downloads(996);
  s = Eval(req, &resp);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(s.error_message(), HasSubstr("tensor 996"));
  ExpectWorks();
}

TEST_P(EvalTest, DuplicateHandlesAlreadyExist) {
  EXPECT_THAT(CreateTensor(FloatTensor(session_, 1, {1})),
              HasCode(grpc::StatusCode::ALREADY_EXISTS));
  EXPECT_THAT(CreateAlgorithm(ScaleAlgorithm(session_, 3, 1, 2, kN, 1.0f)),
              HasCode(grpc::StatusCode::ALREADY_EXISTS));
  EXPECT_THAT(CreateSequence(session_, 4), HasCode(grpc::StatusCode::ALREADY_EXISTS));
  ExpectWorks();
}

TEST_P(EvalTest, BadImagesAreInvalidArguments) {
  auto image = [&](uint64_t handle, uint32_t width, uint32_t height, uint32_t channels) {
    v1::CreateTensorRequest r = FloatTensor(session_, handle, {});
    r.set_count(0);
    r.mutable_image()->set_width(width);
    r.mutable_image()->set_height(height);
    r.mutable_image()->set_channels(channels);
    return r;
  };
  struct Case {
    v1::CreateTensorRequest request;
    const char* error;
  };
  std::vector<Case> cases = {
      {image(80, 4, 4, 0), "1 to 4 channels, not 0"},
      {image(81, 4, 4, 5), "not 5"},
      {image(82, 0, 4, 1), "both must be above 0"},
      {image(83, 4, 4, 1), "memory type host"},
      {image(84, 4, 4, 1), "float64"},
      {image(85, 4, 4, 2), "count 7 is not the image's 4x4x2 = 32 elements"},
      {image(86, 2, 2, 1), "data of 12 bytes given"},
  };
  cases[3].request.set_memory_type(v1::MEMORY_TYPE_HOST);
  cases[4].request.set_element_type(v1::ELEMENT_TYPE_FLOAT64);
  cases[5].request.set_count(7);
  cases[6].request.set_data(FloatBytes({1, 2, 3}));
  for (const Case& c : cases) {
    SCOPED_TRACE(c.error);
    grpc::Status s = CreateTensor(c.request);
    EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
    EXPECT_THAT(s.error_message(), HasSubstr(c.error));
  }
  // A good one, with its texels and with its count given.
  v1::CreateTensorRequest good = image(87, 2, 2, 1);
  good.set_data(FloatBytes({1, 2, 3, 4}));
  EXPECT_THAT(CreateTensor(good), IsOk());
  v1::CreateTensorRequest counted = image(88, 2, 2, 4);
  counted.set_count(16);
  counted.set_memory_type(v1::MEMORY_TYPE_STORAGE);
  EXPECT_THAT(CreateTensor(counted), IsOk());
  ExpectWorks();
}

TEST_P(EvalTest, BadTensorsAreInvalidArguments) {
  v1::CreateTensorRequest zero = FloatTensor(session_, 70, {});
  grpc::Status s = CreateTensor(zero);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("zero-sized tensor (0 elements)"));

  v1::CreateTensorRequest wrong_size = FloatTensor(session_, 71, {1, 2, 3});
  wrong_size.set_count(4);
  s = CreateTensor(wrong_size);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("data of 12 bytes given"));

  v1::CreateTensorRequest handle0 = FloatTensor(session_, 0, {1});
  EXPECT_THAT(CreateTensor(handle0), HasCode(grpc::StatusCode::INVALID_ARGUMENT));

  v1::CreateTensorRequest bad_type = FloatTensor(session_, 72, {1});
  bad_type.set_element_type(static_cast<v1::ElementType>(17));
  s = CreateTensor(bad_type);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("element type 17"));

  v1::CreateTensorRequest bad_memory = FloatTensor(session_, 73, {1});
  bad_memory.set_memory_type(static_cast<v1::MemoryType>(9));
  EXPECT_THAT(CreateTensor(bad_memory), HasCode(grpc::StatusCode::INVALID_ARGUMENT));

  v1::CreateTensorRequest bad_element_size = FloatTensor(session_, 74, {1});
  bad_element_size.set_element_size(8);
  EXPECT_THAT(CreateTensor(bad_element_size), HasCode(grpc::StatusCode::INVALID_ARGUMENT));

  // The small element types have their own sizes: 2 bytes for float16.
  v1::CreateTensorRequest half;
  half.set_session_id(session_);
  half.set_handle(76);
  half.set_element_type(v1::ELEMENT_TYPE_FLOAT16);
  half.set_count(3);
  half.set_element_size(4);
  s = CreateTensor(half);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("float16 (2 bytes"));
  half.set_element_size(0);
  half.set_data(std::string(5, '\0'));
  s = CreateTensor(half);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("data of 5 bytes given"));
  half.set_data(std::string(6, '\0'));
  EXPECT_THAT(CreateTensor(half), IsOk());

  v1::CreateTensorRequest raw;
  raw.set_session_id(session_);
  raw.set_handle(75);
  raw.set_element_type(v1::ELEMENT_TYPE_BYTES);
  raw.set_count(3);
  EXPECT_THAT(CreateTensor(raw), HasCode(grpc::StatusCode::INVALID_ARGUMENT));  // no size
  raw.set_element_size(6);
  EXPECT_THAT(CreateTensor(raw), IsOk());

  // None of the failed handles exist.
  for (uint64_t h : {70, 71, 72, 73, 74}) {
    EXPECT_THAT(DestroyTensor(session_, h), HasCode(grpc::StatusCode::NOT_FOUND));
  }
  ExpectWorks();
}

TEST_P(EvalTest, InvalidSpirvIsRejected) {
  v1::CreateAlgorithmRequest req = ScaleAlgorithm(session_, 80, 1, 2, kN, 1.0f);
  req.set_spirv(std::string(10, '\x01'));
  grpc::Status s = CreateAlgorithm(req);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("10 bytes"));

  req.set_spirv(std::string(64, '\x07'));
  s = CreateAlgorithm(req);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("algorithm 80"));

  req.set_glsl("#version 450\nvoid main() { this is not glsl; }\n");
  s = CreateAlgorithm(req);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("GLSL"));

  req.clear_shader();
  EXPECT_THAT(CreateAlgorithm(req), HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  ExpectWorks();
}

TEST_P(EvalTest, PushConstantsOfTheWrongSizeAreRejected) {
  grpc::ClientContext ctx;
  v1::SetPushConstantsRequest req;
  req.set_session_id(session_);
  req.set_handle(3);
  req.set_push_constants(std::string(8, '\0'));
  v1::SetPushConstantsResponse r;
  grpc::Status s = client_->algorithms->SetPushConstants(&ctx, req, &r);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(s.error_message(),
            "algorithm 3: push constants of 8 bytes given; the algorithm was built with 4 bytes");

  v1::Operation dispatch = Dispatch(3);
  dispatch.mutable_dispatch()->set_has_push_constants(true);
  dispatch.mutable_dispatch()->set_push_constants(std::string(12, '\0'));
  s = Record(session_, 4, {RecordOp(dispatch)});
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("12 bytes given"));

  v1::CreateAlgorithmRequest odd = ScaleAlgorithm(session_, 81, 1, 2, kN, 1.0f);
  odd.set_push_constants(std::string(6, '\0'));
  EXPECT_THAT(CreateAlgorithm(odd), HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  ExpectWorks();
}

TEST_P(EvalTest, WorkgroupBeyondTheDeviceLimitIsRejected) {
  grpc::ClientContext ctx;
  v1::ListDevicesResponse devices;
  ASSERT_THAT(client_->devices->ListDevices(&ctx, v1::ListDevicesRequest(), &devices), IsOk());
  const uint32_t max_x = devices.devices(0).limits().max_compute_work_group_count(0);

  v1::CreateAlgorithmRequest req = ScaleAlgorithm(session_, 82, 1, 2, kN, 1.0f);
  req.mutable_workgroup()->set_x(max_x + 1);
  grpc::Status s = CreateAlgorithm(req);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("x=", max_x + 1)));

  req.mutable_workgroup()->set_x(kN);
  req.mutable_workgroup()->set_z(0);
  s = CreateAlgorithm(req);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("z=0"));
  ExpectWorks();
}

// Shaders are checked against their algorithm and the device in the daemon too.
TEST_P(EvalTest, ShadersThatDoNotFitAreRejected) {
  const std::string buffer_reference = R"(#version 450
#extension GL_EXT_buffer_reference : require
layout(local_size_x = 1) in;
layout(buffer_reference, std430) buffer Floats { float v[]; };
layout(set = 0, binding = 0) buffer Pointers { Floats target; };
void main() { target.v[0] = 1.0; }
)";
  grpc::Status s = CreateAlgorithm(GlslAlgorithm(session_, 84, {1}, buffer_reference, 1, ""));
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("PhysicalStorageBufferAddresses"));

  const std::string third_binding = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 2) buffer Out { float out_v[]; };
void main() { out_v[0] = 1.0; }
)";
  s = CreateAlgorithm(GlslAlgorithm(session_, 85, {1, 2}, third_binding, 1, ""));
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("binding 2) has no tensor"));

  const std::string huge_shared = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer Out { float out_v[]; };
shared float big[16777216];
void main() { big[0] = 1.0; barrier(); out_v[0] = big[0]; }
)";
  s = CreateAlgorithm(GlslAlgorithm(session_, 86, {1}, huge_shared, 1, ""));
  EXPECT_THAT(s, HasCode(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_THAT(s.error_message(), HasSubstr("maxComputeSharedMemorySize"));
  ExpectWorks();
}

TEST_P(EvalTest, BarrierWithMismatchedMasksIsRejected) {
  v1::Operation barrier;
  v1::Barrier* b = barrier.mutable_barrier();
  b->add_tensors(2);
  b->set_src_access(VK_ACCESS_SHADER_WRITE_BIT);
  b->set_dst_access(VK_ACCESS_HOST_READ_BIT);
  b->set_src_stage(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT);
  b->set_dst_stage(VK_PIPELINE_STAGE_TRANSFER_BIT);
  b->set_primary(true);
  grpc::Status s = Record(session_, 4, {RecordOp(barrier)});
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr("dstAccessMask 0x2000 (HOST_READ)"), HasSubstr("TRANSFER")));
  b->set_dst_access(VK_ACCESS_TRANSFER_READ_BIT);
  EXPECT_THAT(Record(session_, 4, {RecordOp(barrier)}), IsOk());
  ExpectWorks();
}

TEST_P(EvalTest, SequenceQueueOutOfRangeIsRejected) {
  grpc::Status s = CreateSequence(session_, 90, /*queue=*/1);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("queue 1 out of range"));
  ExpectWorks();
}

TEST_P(EvalTest, BadUploadsAndDownloadsChangeNothing) {
  // Out of range: nothing is written, not even the good upload before it.
  v1::EvalRequest req = PipelineEval(session_, 1, std::vector<float>(kN, 100.0f));
  v1::TensorData* bad = req.add_uploads();
  bad->set_handle(1);
  bad->set_offset(kN * 4 - 2);
  bad->set_data("abcd");
  v1::EvalResponse resp;
  grpc::Status s = Eval(req, &resp);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("tensor 1"));

  v1::EvalRequest peek;
  peek.set_session_id(session_);
  peek.add_downloads(1);
  ASSERT_THAT(Eval(peek, &resp), IsOk());
  EXPECT_THAT(Floats(resp.downloads(0).data()), ::testing::Not(::testing::Contains(100.0f)));

  // A storage tensor has no host data.
  ASSERT_THAT(CreateTensor(FloatTensor(session_, 91, {1, 2}, v1::MEMORY_TYPE_STORAGE)), IsOk());
  v1::EvalRequest storage;
  storage.set_session_id(session_);
  storage.add_downloads(91);
  s = Eval(storage, &resp);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_THAT(s.error_message(), HasSubstr("tensor 91"));
  ExpectWorks();
}

TEST_P(EvalTest, EmptyActionsAndOperationsAreRejected) {
  EXPECT_THAT(Record(session_, 4, {v1::SequenceAction()}),
              HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(Record(session_, 4, {RecordOp(v1::Operation())}),
              HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  v1::Operation copy;
  copy.mutable_copy()->add_tensors(1);
  EXPECT_THAT(Record(session_, 4, {RecordOp(copy)}), HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  v1::EvalRequest req;
  req.set_session_id(session_);
  req.add_commands();
  v1::EvalResponse resp;
  EXPECT_THAT(Eval(req, &resp), HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  ExpectWorks();
}

TEST_P(EvalTest, DownloadsLargerThanAMessageAreRejectedBeforeSubmitting) {
  v1::CreateTensorRequest big;
  big.set_session_id(session_);
  big.set_handle(95);
  big.set_element_type(v1::ELEMENT_TYPE_FLOAT32);
  big.set_count(16u << 20);  // 64 MiB: the daemon's whole message limit
  big.set_memory_type(v1::MEMORY_TYPE_HOST);
  ASSERT_THAT(CreateTensor(big), IsOk());
  v1::EvalRequest req;
  req.set_session_id(session_);
  req.add_downloads(95);
  v1::EvalResponse resp;
  grpc::Status s = Eval(req, &resp);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_THAT(s.error_message(), HasSubstr("ReadTensor"));
  ExpectWorks();
}

INSTANTIATE_TEST_SUITE_P(
    InlineWaitPollingAndHandOff, EvalTest,
    ::testing::Values(EvalServing{"InlineWait", absl::Milliseconds(2), absl::ZeroDuration()},
                      EvalServing{"InlineWaitPolling", absl::Milliseconds(2),
                                  absl::Microseconds(250)},
                      EvalServing{"HandOff", absl::ZeroDuration(), absl::ZeroDuration()}),
    [](const ::testing::TestParamInfo<EvalServing>& info) { return info.param.name; });

}  // namespace
}  // namespace komputed::server::testing
