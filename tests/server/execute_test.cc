// Execute: asynchronous evals on one stream, events in completion order.
#include <chrono>
#include <map>
#include <thread>

#include "test_util.h"

namespace komputed::server::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kN = 4096;

class ExecuteTest : public ServerTest {
 protected:
  void SetUp() override {
    ServerTest::SetUp();
    session_ = Open("execute");
    for (int p = 0; p < 4; ++p) MakePipeline(session_, Base(p), kN, Scale(p));
  }
  static uint64_t Base(int p) { return 10 * (p + 1); }
  static float Scale(int p) { return static_cast<float>(p + 2); }
  static std::vector<float> Input(uint64_t id) {
    std::vector<float> v(kN);
    for (uint32_t i = 0; i < kN; ++i) v[i] = static_cast<float>((id * 31 + i) % 1000);
    return v;
  }
  // Checks an event of an eval of pipeline p with Input(id).
  static void ExpectResult(const v1::ExecuteEvent& event, int p) {
    ASSERT_EQ(event.code(), 0) << event.message();
    ASSERT_EQ(event.result().downloads_size(), 1);
    std::vector<float> out = Floats(event.result().downloads(0).data());
    std::vector<float> in = Input(event.request_id());
    ASSERT_EQ(out.size(), kN);
    for (uint32_t i = 0; i < kN; ++i) ASSERT_FLOAT_EQ(out[i], in[i] * Scale(p)) << "element " << i;
  }
  v1::ExecuteRequest Request(uint64_t id, int p) {
    v1::ExecuteRequest req;
    *req.mutable_eval() = PipelineEval(session_, Base(p), Input(id));
    req.mutable_eval()->set_request_id(id);
    return req;
  }
  // One request that evaluates the four pipelines (ids 100 to 103) on a new stream: each event
  // has its pipeline's result.
  void ExpectFourPipelinesInOneRequest();
  // Writes `request` on a new stream, half-closes it and returns every event, by request id.
  std::map<uint64_t, v1::ExecuteEvent> RunOneRequest(const v1::ExecuteRequest& request);

  std::string session_;
};

TEST_F(ExecuteTest, EachRequestGetsOneEventWithItsData) {
  grpc::ClientContext ctx;
  auto stream = client_->sequences->Execute(&ctx);
  for (int p = 0; p < 4; ++p) ASSERT_TRUE(stream->Write(Request(100 + p, p)));
  v1::ExecuteRequest bad;
  bad.mutable_eval()->set_session_id(session_);
  bad.mutable_eval()->set_sequence(999);
  bad.mutable_eval()->set_request_id(7);
  ASSERT_TRUE(stream->Write(bad));
  stream->WritesDone();

  std::map<uint64_t, v1::ExecuteEvent> events;
  v1::ExecuteEvent event;
  while (stream->Read(&event)) {
    EXPECT_TRUE(events.emplace(event.request_id(), event).second)
        << "twice: " << event.request_id();
  }
  EXPECT_THAT(stream->Finish(), IsOk());
  ASSERT_EQ(events.size(), 5u);
  for (int p = 0; p < 4; ++p) ExpectResult(events.at(100 + p), p);
  EXPECT_EQ(events.at(7).code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(events.at(7).message(), HasSubstr("sequence 999"));
}

// An eval that asks for its stages' moments gets them in its event, in order, on the clock that
// the test shares with the daemon: from the moment its request was read to the event's answer.
TEST_F(ExecuteTest, StageTimesComeInTheEventWhenAsked) {
  grpc::ClientContext ctx;
  auto stream = client_->sequences->Execute(&ctx);
  v1::ExecuteRequest asked = Request(1, 0);
  asked.mutable_eval()->set_stage_times(true);
  const uint64_t before = MonotonicNs();
  ASSERT_TRUE(stream->Write(asked));
  v1::ExecuteEvent event;
  ASSERT_TRUE(stream->Read(&event));
  const uint64_t after = MonotonicNs();
  ExpectResult(event, 0);
  ASSERT_TRUE(event.result().has_stages());
  const v1::EvalStages& s = event.result().stages();
  ExpectStagesInOrder(before, s, after);
  // Not asked: none.
  ASSERT_TRUE(stream->Write(Request(2, 1)));
  ASSERT_TRUE(stream->Read(&event));
  ExpectResult(event, 1);
  EXPECT_FALSE(event.result().has_stages());
  stream->WritesDone();
  EXPECT_FALSE(stream->Read(&event));
  EXPECT_THAT(stream->Finish(), IsOk());
}

// Reads every event of the stream until it ends, its more_events included; counts the messages.
std::map<uint64_t, v1::ExecuteEvent> ReadAll(
    grpc::ClientReaderWriter<v1::ExecuteRequest, v1::ExecuteEvent>& stream, int* messages,
    int* batched) {
  std::map<uint64_t, v1::ExecuteEvent> events;
  v1::ExecuteEvent event;
  while (stream.Read(&event)) {
    ++*messages;
    *batched += event.more_events_size();
    for (const v1::ExecuteEvent& more : event.more_events()) {
      EXPECT_EQ(more.more_events_size(), 0) << "a batched event carries more of its own";
      EXPECT_TRUE(events.emplace(more.request_id(), more).second) << "twice: " << more.request_id();
    }
    event.clear_more_events();
    EXPECT_TRUE(events.emplace(event.request_id(), event).second)
        << "twice: " << event.request_id();
  }
  return events;
}

std::map<uint64_t, v1::ExecuteEvent> ExecuteTest::RunOneRequest(const v1::ExecuteRequest& request) {
  grpc::ClientContext ctx;
  auto stream = client_->sequences->Execute(&ctx);
  EXPECT_TRUE(stream->Write(request));
  stream->WritesDone();
  int messages = 0, more = 0;
  std::map<uint64_t, v1::ExecuteEvent> events = ReadAll(*stream, &messages, &more);
  EXPECT_THAT(stream->Finish(), IsOk());
  return events;
}

void ExecuteTest::ExpectFourPipelinesInOneRequest() {
  v1::ExecuteRequest request = Request(100, 0);
  for (int p = 1; p < 4; ++p) *request.add_more_evals() = Request(100 + p, p).eval();
  std::map<uint64_t, v1::ExecuteEvent> events = RunOneRequest(request);
  ASSERT_EQ(events.size(), 4u);
  for (int p = 0; p < 4; ++p) ExpectResult(events.at(100 + p), p);
}

TEST_F(ExecuteTest, ARequestCarriesSeveralEvalsAndEventsComeTogetherWhenAsked) {
  v1::OpenSessionRequest open;
  v1::OpenSessionResponse opened;
  grpc::ClientContext open_context;
  ASSERT_TRUE(client_->sessions->OpenSession(&open_context, open, &opened).ok());
  EXPECT_TRUE(opened.execute_batches()) << "the daemon says it takes batches";

  for (const bool batched : {true, false}) {
    SCOPED_TRACE(batched ? "events batched" : "one event per message");
    grpc::ClientContext ctx;
    auto stream = client_->sequences->Execute(&ctx);
    // One request: the four pipelines and an eval of a sequence that does not exist.
    v1::ExecuteRequest request = Request(100, 0);
    for (int p = 1; p < 4; ++p) *request.add_more_evals() = Request(100 + p, p).eval();
    v1::EvalRequest* bad = request.add_more_evals();
    bad->set_session_id(session_);
    bad->set_sequence(999);
    bad->set_request_id(7);
    request.set_batched_events(batched);
    ASSERT_TRUE(stream->Write(request));
    stream->WritesDone();
    int messages = 0, more = 0;
    std::map<uint64_t, v1::ExecuteEvent> events = ReadAll(*stream, &messages, &more);
    EXPECT_THAT(stream->Finish(), IsOk());
    ASSERT_EQ(events.size(), 5u);
    for (int p = 0; p < 4; ++p) ExpectResult(events.at(100 + p), p);
    EXPECT_EQ(events.at(7).code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
    EXPECT_EQ(messages + more, 5);
    if (!batched) {
      EXPECT_EQ(more, 0) << "events came together to a client that did not ask";
    }
  }
}

// Evals ready at once go to the device in one vkQueueSubmit (komputed_submitted_together_total
// counts them), each with its own result; an eval that uploads into a tensor that an earlier one
// submits, or evaluates the same sequence again, waits for the submission before it.
TEST_F(ExecuteTest, EvalsReadyAtOnceAreSubmittedTogetherUnlessOneChangesWhatAnotherUses) {
  prometheus::Counter& together = server_->metrics().submitted_together_total();
  const double before = together.Value();
  ExpectFourPipelinesInOneRequest();
  EXPECT_EQ(together.Value() - before, 4) << "the four evals went to the device together";

  // Pipeline 1's eval also uploads into pipeline 0's input, which the eval before it submits;
  // pipeline 0 then comes again. None of them shares a submission with the one before it.
  const double between = together.Value();
  {
    v1::ExecuteRequest request = Request(200, 0);
    v1::EvalRequest touching = Request(201, 1).eval();
    v1::TensorData* upload = touching.add_uploads();
    upload->set_handle(Base(0));
    upload->set_data(FloatBytes(Input(202)));
    *request.add_more_evals() = touching;
    *request.add_more_evals() = Request(202, 0).eval();
    std::map<uint64_t, v1::ExecuteEvent> events = RunOneRequest(request);
    ASSERT_EQ(events.size(), 3u);
    ExpectResult(events.at(201), 1);
    EXPECT_EQ(events.at(200).code(), 0) << events.at(200).message();
    if (events.at(202).code() == 0) {
      // Pipeline 0's first eval had completed when the eval after 201 was prepared (a fast
      // device): 202 went with 201, and ran.
      ExpectResult(events.at(202), 0);
      EXPECT_EQ(together.Value() - between, 2);
    } else {
      // The same sequence again while its first eval runs: refused as it always was.
      EXPECT_EQ(events.at(202).code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION))
          << events.at(202).message();
      EXPECT_EQ(together.Value(), between) << "an eval joined one whose tensors it changes";
    }
  }
}

// An eval of a sequence with nothing recorded downloads a tensor that the next eval uploads into:
// the download has the data from before that upload, as if each eval had come alone.
TEST_F(ExecuteTest, ADownloadIsReadBeforeALaterEvalsUploadIntoItsTensor) {
  constexpr uint64_t kEmpty = 900;  // a sequence that never records anything
  ASSERT_THAT(CreateSequence(session_, kEmpty), IsOk());
  v1::ExecuteRequest request;
  v1::EvalRequest& first = *request.mutable_eval();
  first.set_session_id(session_);
  first.set_request_id(1);
  first.set_sequence(kEmpty);
  first.add_downloads(Base(0));
  v1::EvalRequest second = Request(2, 1).eval();
  v1::TensorData* upload = second.add_uploads();
  upload->set_handle(Base(0));
  upload->set_data(FloatBytes(Input(3)));
  *request.add_more_evals() = second;
  std::map<uint64_t, v1::ExecuteEvent> events = RunOneRequest(request);
  ASSERT_EQ(events.size(), 2u);
  ExpectResult(events.at(2), 1);
  const v1::ExecuteEvent& downloaded = events.at(1);
  ASSERT_EQ(downloaded.code(), 0) << downloaded.message();
  ASSERT_EQ(downloaded.result().downloads_size(), 1);
  const std::vector<float> seen = Floats(downloaded.result().downloads(0).data());
  ASSERT_EQ(seen.size(), kN);
  for (uint32_t i = 0; i < kN; ++i) ASSERT_EQ(seen[i], 0.0f) << "element " << i;
}

class ExecuteAloneTest : public ExecuteTest {
 protected:
  ServerOptions Options() override {
    ServerOptions options = TestServerOptions();
    options.submit_together = false;
    return options;
  }
};

TEST_F(ExecuteAloneTest, WithoutSubmittingTogetherEachEvalIsSubmittedAlone) {
  ExpectFourPipelinesInOneRequest();
  EXPECT_EQ(server_->metrics().submitted_together_total().Value(), 0);
}

TEST_F(ExecuteTest, ARequestOfTooManyEvalsFailsEachOfThemAndRunsNone) {
  grpc::ClientContext ctx;
  auto stream = client_->sequences->Execute(&ctx);
  v1::ExecuteRequest request = Request(1, 0);
  for (uint64_t id = 2; id <= 65; ++id) *request.add_more_evals() = Request(id, 1).eval();
  request.set_batched_events(true);
  ASSERT_TRUE(stream->Write(request));
  // The stream still serves after the refusal.
  ASSERT_TRUE(stream->Write(Request(66, 2)));
  stream->WritesDone();
  int messages = 0, more = 0;
  std::map<uint64_t, v1::ExecuteEvent> events = ReadAll(*stream, &messages, &more);
  EXPECT_THAT(stream->Finish(), IsOk());
  ASSERT_EQ(events.size(), 66u);
  for (uint64_t id = 1; id <= 65; ++id) {
    EXPECT_EQ(events.at(id).code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
    EXPECT_THAT(events.at(id).message(), HasSubstr("65 evals; at most 64"));
  }
  ExpectResult(events.at(66), 2);
  std::printf("66 events in %d messages\n", messages);
}

// A daemon whose messages are small: events written together stay within its send limit (a
// write past it would fail and end the stream).
class ExecuteSmallMessagesTest : public ExecuteTest {
 protected:
  ServerOptions Options() override {
    ServerOptions o = ExecuteTest::Options();
    o.max_message_bytes = 48 << 10;  // three 16 KiB events would not fit in one
    return o;
  }
};

TEST_F(ExecuteSmallMessagesTest, EventsWrittenTogetherStayWithinTheMessageLimit) {
  grpc::ClientContext ctx;
  auto stream = client_->sequences->Execute(&ctx);
  constexpr int kRounds = 30;
  int more = 0;
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t base = 1000 + 10 * round;
    for (int p = 0; p < 4; ++p) {  // a request each: two would not fit in one message either
      v1::ExecuteRequest request = Request(base + p, p);
      request.set_batched_events(true);
      ASSERT_TRUE(stream->Write(request)) << "round " << round;
    }
    std::map<uint64_t, v1::ExecuteEvent> events;
    v1::ExecuteEvent event;
    while (events.size() < 4) {
      ASSERT_TRUE(stream->Read(&event)) << "the stream ended in round " << round;
      more += event.more_events_size();
      for (const v1::ExecuteEvent& m : event.more_events()) events.emplace(m.request_id(), m);
      event.clear_more_events();
      events.emplace(event.request_id(), event);
    }
    for (int p = 0; p < 4; ++p) ExpectResult(events.at(base + p), p);
  }
  stream->WritesDone();
  EXPECT_THAT(stream->Finish(), IsOk());
  EXPECT_EQ(more, 0) << "16 KiB events went together under a 24 KiB batch";
}

TEST_F(ExecuteTest, ManyEvalsInFlightStayCorrect) {
  grpc::ClientContext ctx;
  auto stream = client_->sequences->Execute(&ctx);
  // Keep one eval in flight per pipeline; reuse a pipeline once its event is back.
  constexpr int kTotal = 200;
  int sent = 0;
  int received = 0;
  std::map<uint64_t, int> pipeline_of;
  for (int p = 0; p < 4; ++p, ++sent) {
    pipeline_of[sent] = p;
    ASSERT_TRUE(stream->Write(Request(sent, p)));
  }
  v1::ExecuteEvent event;
  while (received < kTotal && stream->Read(&event)) {
    ++received;
    const int p = pipeline_of.at(event.request_id());
    ExpectResult(event, p);
    if (sent < kTotal) {
      pipeline_of[sent] = p;
      ASSERT_TRUE(stream->Write(Request(sent, p)));
      ++sent;
    }
  }
  stream->WritesDone();
  EXPECT_FALSE(stream->Read(&event));
  EXPECT_THAT(stream->Finish(), IsOk());
  EXPECT_EQ(received, kTotal);
}

// Requests written back to back (each read while the ones before it may still be running) run
// in the order they were read, and a half close right after the last still brings every event.
// Eval k writes k + 1 into element k of one tensor and reads the whole tensor back: run in order,
// it sees elements 0..k written and none after.
TEST_F(ExecuteTest, RequestsRunInTheOrderReadAndAllAnswerAfterAHalfClose) {
  constexpr int kCount = 64;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = client_->sequences->Execute(&ctx);
  for (int k = 0; k < kCount; ++k) {
    v1::ExecuteRequest req;
    v1::EvalRequest& eval = *req.mutable_eval();
    eval.set_session_id(session_);
    eval.set_request_id(static_cast<uint64_t>(k) + 1);
    v1::TensorData* upload = eval.add_uploads();
    upload->set_handle(Base(0));
    upload->set_offset(static_cast<uint64_t>(k) * sizeof(float));
    const float value = static_cast<float>(k + 1);
    upload->set_data(&value, sizeof(value));
    eval.add_downloads(Base(0));
    ASSERT_TRUE(stream->Write(req));
  }
  stream->WritesDone();
  int received = 0;
  v1::ExecuteEvent event;
  while (stream->Read(&event)) {
    ++received;
    ASSERT_EQ(event.code(), 0) << event.message();
    ASSERT_EQ(event.result().downloads_size(), 1);
    const std::vector<float> seen = Floats(event.result().downloads(0).data());
    ASSERT_EQ(seen.size(), kN);
    const int k = static_cast<int>(event.request_id()) - 1;
    for (int i = 0; i < kCount; ++i) {
      ASSERT_EQ(seen[i], i <= k ? static_cast<float>(i + 1) : 0.0f)
          << "eval " << k << ", element " << i;
    }
  }
  EXPECT_THAT(stream->Finish(), IsOk());
  EXPECT_EQ(received, kCount);
}

TEST_F(ExecuteTest, RequestsNamingAnotherSessionGetAnErrorEvent) {
  const std::string other = Open("other");
  grpc::ClientContext ctx;
  auto stream = client_->sequences->Execute(&ctx);
  v1::ExecuteRequest unknown;
  unknown.mutable_eval()->set_session_id("nope");
  unknown.mutable_eval()->set_request_id(1);
  ASSERT_TRUE(stream->Write(unknown));
  v1::ExecuteEvent event;
  ASSERT_TRUE(stream->Read(&event));
  EXPECT_EQ(event.request_id(), 1u);
  EXPECT_EQ(event.code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));

  ASSERT_TRUE(stream->Write(Request(2, 0)));  // binds the stream to session_
  ASSERT_TRUE(stream->Read(&event));
  ExpectResult(event, 0);

  v1::ExecuteRequest wrong = Request(3, 1);
  wrong.mutable_eval()->set_session_id(other);
  ASSERT_TRUE(stream->Write(wrong));
  ASSERT_TRUE(stream->Read(&event));
  EXPECT_EQ(event.request_id(), 3u);
  EXPECT_EQ(event.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));

  v1::ExecuteRequest implicit = Request(4, 1);
  implicit.mutable_eval()->clear_session_id();  // empty: the stream's session
  ASSERT_TRUE(stream->Write(implicit));
  ASSERT_TRUE(stream->Read(&event));
  ExpectResult(event, 1);
  stream->WritesDone();
  EXPECT_THAT(stream->Finish(), IsOk());
}

// A client that goes away with evals in flight: the daemon keeps serving, and the stream's
// session is released (it is reaped once idle, which needs the stream's cleanup to have run).
class ExecuteCancelTest : public ExecuteTest {
 protected:
  ServerOptions Options() override {
    ServerOptions options = ExecuteTest::Options();
    options.session_idle_timeout = absl::Milliseconds(300);
    return options;
  }
};

TEST_F(ExecuteCancelTest, ClientThatDisappearsMidStreamDoesNotHurtTheDaemon) {
  // Checked after each round in a fresh session: the stream's own sequences may still be running
  // the cancelled evals (a new eval of them is FAILED_PRECONDITION until they complete). Each
  // round's session is closed at once, so no idle timeout can reap it while it is checked.
  for (int round = 0; round < 5; ++round) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    auto stream = client_->sequences->Execute(ctx.get());
    for (int p = 0; p < 4; ++p) ASSERT_TRUE(stream->Write(Request(round * 10 + p, p)));
    if (round % 2 == 1) {
      v1::ExecuteEvent event;
      ASSERT_TRUE(stream->Read(&event));  // some completed, some maybe not
    }
    ctx->TryCancel();
    EXPECT_THAT(stream->Finish(), HasCode(grpc::StatusCode::CANCELLED));
    const std::string other = Open("other");
    MakePipeline(other, 1, kN, 3.0f);
    ExpectPipelineWorks(other, 1, kN, 3.0f);
    grpc::ClientContext close_ctx;
    v1::CloseSessionRequest close;
    close.set_session_id(other);
    v1::CloseSessionResponse closed;
    EXPECT_THAT(client_->sessions->CloseSession(&close_ctx, close, &closed), IsOk());
  }
  // The sessions have no open stream left: they are reaped.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  bool gone = false;
  while (!gone && absl::Now() < until) {
    grpc::ClientContext ctx;
    v1::ListSessionsResponse list;
    ASSERT_THAT(client_->sessions->ListSessions(&ctx, v1::ListSessionsRequest(), &list), IsOk());
    gone = list.sessions_size() == 0;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(gone);
  grpc::ClientContext ctx;
  v1::PingResponse pong;
  EXPECT_THAT(client_->sessions->Ping(&ctx, v1::PingRequest(), &pong), IsOk());
}

TEST_F(ExecuteTest, ShutdownWithAStreamOpenCompletes) {
  grpc::ClientContext ctx;
  auto stream = client_->sequences->Execute(&ctx);
  for (int p = 0; p < 4; ++p) ASSERT_TRUE(stream->Write(Request(p, p)));
  server_->Shutdown(absl::Milliseconds(100));  // cancels the stream after 100 ms
  v1::ExecuteEvent event;
  while (stream->Read(&event)) {
  }
  EXPECT_FALSE(stream->Finish().ok());
}

}  // namespace
}  // namespace komputed::server::testing
