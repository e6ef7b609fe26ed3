// WriteTensor and ReadTensor: chunked host data transfer.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "absl/time/clock.h"
#include "support/slow_kernel.h"
#include "test_util.h"

namespace komputed::server::testing {
namespace {

using ::testing::HasSubstr;

class TensorIoTest : public ServerTest {
 protected:
  void SetUp() override {
    ServerTest::SetUp();
    session_ = Open("io");
  }

  struct Chunk {
    uint64_t offset;
    std::string data;
  };

  // Sends the chunks (the first declares the session, tensor and total) and returns the status.
  grpc::Status Write(uint64_t handle, uint64_t total, const std::vector<Chunk>& chunks,
                     uint64_t* written = nullptr, Client* client = nullptr) {
    grpc::ClientContext ctx;
    v1::WriteTensorResponse resp;
    auto writer = (client ? client : client_.get())->tensors->WriteTensor(&ctx, &resp);
    for (size_t i = 0; i < chunks.size(); ++i) {
      v1::TensorChunk c;
      if (i == 0) {
        c.set_session_id(session_);
        c.set_handle(handle);
        c.set_total_bytes(total);
      }
      c.set_offset(chunks[i].offset);
      c.set_data(chunks[i].data);
      if (!writer->Write(c)) break;  // the daemon has finished the call (an error)
    }
    writer->WritesDone();
    grpc::Status s = writer->Finish();
    if (written != nullptr) *written = resp.bytes_written();
    return s;
  }

  grpc::Status Read(uint64_t handle, uint64_t offset, uint64_t length, uint64_t chunk_bytes,
                    std::string* out, size_t* chunks = nullptr, Client* client = nullptr) {
    grpc::ClientContext ctx;
    v1::ReadTensorRequest req;
    req.set_session_id(session_);
    req.set_handle(handle);
    req.set_offset(offset);
    req.set_length(length);
    req.set_chunk_bytes(chunk_bytes);
    auto reader = (client ? client : client_.get())->tensors->ReadTensor(&ctx, req);
    v1::TensorChunk c;
    size_t n = 0;
    out->clear();
    while (reader->Read(&c)) {
      EXPECT_EQ(c.offset(), offset + out->size());
      EXPECT_EQ(c.handle(), handle);
      if (chunk_bytes != 0) {
        EXPECT_LE(c.data().size(), chunk_bytes);
      }
      out->append(c.data());
      ++n;
    }
    if (chunks != nullptr) *chunks = n;
    return reader->Finish();
  }

  std::string session_;
};

TEST_F(TensorIoTest, SixtyFourMebibytesRoundTripInChunks) {
  constexpr uint64_t kBytes = 64ull << 20;
  v1::CreateTensorRequest req;
  req.set_session_id(session_);
  req.set_handle(1);
  req.set_element_type(v1::ELEMENT_TYPE_UINT32);
  req.set_count(kBytes / 4);
  req.set_memory_type(v1::MEMORY_TYPE_DEVICE);
  ASSERT_THAT(CreateTensor(req), IsOk());

  std::string data(kBytes, '\0');
  std::mt19937_64 rng(7);
  for (size_t i = 0; i < kBytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(&data[i], &v, 8);
  }
  // 4 MiB chunks, written in a shuffled order (the first one still declares the call).
  constexpr uint64_t kChunk = 4 << 20;
  std::vector<Chunk> chunks;
  for (uint64_t off = 0; off < kBytes; off += kChunk)
    chunks.push_back({off, data.substr(off, kChunk)});
  std::shuffle(chunks.begin() + 1, chunks.end(), rng);
  uint64_t written = 0;
  ASSERT_THAT(Write(1, kBytes, chunks, &written), IsOk());
  EXPECT_EQ(written, kBytes);

  // Through the device and back, then read in 3 MiB chunks.
  ASSERT_THAT(CreateSequence(session_, 2), IsOk());
  ASSERT_THAT(Record(session_, 2, {RecordOp(SyncDevice({1})), RecordOp(SyncLocal({1}))}), IsOk());
  v1::EvalRequest eval;
  eval.set_session_id(session_);
  eval.set_sequence(2);
  v1::EvalResponse resp;
  ASSERT_THAT(Eval(eval, &resp), IsOk());

  std::string back;
  size_t n = 0;
  ASSERT_THAT(Read(1, 0, 0, 3 << 20, &back, &n), IsOk());
  EXPECT_EQ(n, (kBytes + (3 << 20) - 1) / (3 << 20));
  ASSERT_EQ(back.size(), kBytes);
  EXPECT_TRUE(back == data);

  // A range, with the daemon's default chunk size, by a client with gRPC's default limits.
  Client plain(server_->address(), /*large_messages=*/false);
  ASSERT_THAT(Read(1, 1000, 10 << 20, 0, &back, &n, &plain), IsOk());
  EXPECT_EQ(n, 3u);
  EXPECT_TRUE(back == data.substr(1000, 10 << 20));
}

TEST_F(TensorIoTest, PartialRangeWriteLeavesTheRest) {
  ASSERT_THAT(CreateTensor(FloatTensor(session_, 1, {1, 2, 3, 4, 5, 6}, v1::MEMORY_TYPE_HOST)),
              IsOk());
  // Bytes [8, 20) (floats 2..4): the first chunk starts the range, the others come in any order.
  ASSERT_THAT(Write(1, 12, {{8, FloatBytes({30})}, {16, FloatBytes({50})}, {12, FloatBytes({40})}}),
              IsOk());
  std::string back;
  ASSERT_THAT(Read(1, 0, 0, 0, &back), IsOk());
  EXPECT_THAT(Floats(back), ::testing::ElementsAre(1, 2, 30, 40, 50, 6));
}

TEST_F(TensorIoTest, ChunksThatDoNotAddUpAreRejected) {
  ASSERT_THAT(CreateTensor(FloatTensor(session_, 1, std::vector<float>(256))), IsOk());
  std::string kb(512, 'x');

  grpc::Status s = Write(1, 1024, {{0, kb}});  // short
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("cover 512 of the 1024 bytes"));

  s = Write(1, 1024, {{0, kb}, {512, kb}, {1024, "y"}});  // beyond the declared range
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("outside [0, 1024)"));

  s = Write(1, 1024, {{0, kb}, {256, kb}});  // overlap
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("overlaps"));

  s = Write(1, 2048, {{0, kb}});  // declared range beyond the tensor's 1024 bytes
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("do not fit in its 1024 bytes"));

  s = Write(1, 0, {{0, kb}});  // nothing declared
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));

  s = Write(1, 1024, {});  // no chunk at all
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));

  EXPECT_THAT(Write(2, 4, {{0, "abcd"}}), HasCode(grpc::StatusCode::NOT_FOUND));

  // The session still works.
  uint64_t written = 0;
  const std::string q(256, 'q');
  EXPECT_THAT(Write(1, 1024, {{0, q}, {768, q}, {256, q}, {512, q}}, &written), IsOk());
  EXPECT_EQ(written, 1024u);
}

TEST_F(TensorIoTest, StorageTensorsHaveNoHostData) {
  ASSERT_THAT(CreateTensor(FloatTensor(session_, 1, {1, 2}, v1::MEMORY_TYPE_STORAGE)), IsOk());
  grpc::Status s = Write(1, 8, {{0, FloatBytes({1, 2})}});
  EXPECT_THAT(s, HasCode(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_THAT(s.error_message(), HasSubstr("tensor 1 is a storage tensor"));
  std::string back;
  EXPECT_THAT(Read(1, 0, 0, 0, &back), HasCode(grpc::StatusCode::FAILED_PRECONDITION));
}

TEST_F(TensorIoTest, ReadOutOfRangeIsRejected) {
  ASSERT_THAT(CreateTensor(FloatTensor(session_, 1, {1, 2}, v1::MEMORY_TYPE_HOST)), IsOk());
  std::string back;
  EXPECT_THAT(Read(1, 9, 0, 0, &back), HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(Read(1, 4, 5, 0, &back), HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(Read(7, 0, 0, 0, &back), HasCode(grpc::StatusCode::NOT_FOUND));
  ASSERT_THAT(Read(1, 4, 4, 0, &back), IsOk());
  EXPECT_THAT(Floats(back), ::testing::ElementsAre(2));
}

// A tensor of several chunks whose every byte is known: bytes(seed)[i] = (i * 7 + seed) % 251.
std::string Pattern(uint64_t bytes, int seed) {
  std::string data(bytes, '\0');
  for (uint64_t i = 0; i < bytes; ++i) data[i] = static_cast<char>((i * 7 + seed) % 251);
  return data;
}

constexpr uint64_t kBig = 16 << 20;   // four chunks
constexpr uint64_t kChunk = 4 << 20;  // the client's chunk size

class AllOrNothingTest : public TensorIoTest {
 protected:
  void SetUp() override {
    TensorIoTest::SetUp();
    v1::CreateTensorRequest req;
    req.set_session_id(session_);
    req.set_handle(1);
    req.set_element_type(v1::ELEMENT_TYPE_UINT32);
    req.set_count(kBig / 4);
    req.set_memory_type(v1::MEMORY_TYPE_DEVICE);
    req.set_data(Pattern(kBig, 1));
    ASSERT_THAT(CreateTensor(req), IsOk());
  }
  std::vector<Chunk> Chunks(const std::string& data, uint64_t total) {
    std::vector<Chunk> chunks;
    for (uint64_t off = 0; off < total; off += kChunk)
      chunks.push_back({off, data.substr(off, kChunk)});
    return chunks;
  }
  void ExpectUnchanged() {
    std::string back;
    ASSERT_THAT(Read(1, 0, 0, 0, &back), IsOk());
    ASSERT_EQ(back.size(), kBig);
    EXPECT_TRUE(back == Pattern(kBig, 1)) << "the tensor changed";
  }
  double Uploaded() { return server_->metrics().bytes_transferred_total("upload").Value(); }
};

TEST_F(AllOrNothingTest, ACancelledWriteChangesNothing) {
  const std::string fresh = Pattern(kBig, 2);
  const double before = Uploaded();
  grpc::ClientContext ctx;
  v1::WriteTensorResponse resp;
  auto writer = client_->tensors->WriteTensor(&ctx, &resp);
  std::vector<Chunk> chunks = Chunks(fresh, kBig);
  for (size_t i = 0; i < 3; ++i) {
    v1::TensorChunk c;
    if (i == 0) {
      c.set_session_id(session_);
      c.set_handle(1);
      c.set_total_bytes(kBig);
    }
    c.set_offset(chunks[i].offset);
    c.set_data(chunks[i].data);
    ASSERT_TRUE(writer->Write(c));
  }
  // The daemon has taken three of the four chunks when the client goes.
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (Uploaded() - before < 3 * kChunk && absl::Now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_GE(Uploaded() - before, 3.0 * kChunk);
  ctx.TryCancel();
  EXPECT_THAT(writer->Finish(), HasCode(grpc::StatusCode::CANCELLED));
  ExpectUnchanged();
  // The daemon counts the call as cancelled, not as a request of the wrong size (the client did
  // nothing wrong: it went away).
  Metrics& m = server_->metrics();
  const absl::Time counted = absl::Now() + absl::Seconds(30);
  while (m.rpcs_total("komputed.v1.Tensors/WriteTensor", "CANCELLED").Value() < 1 &&
         absl::Now() < counted) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(m.rpcs_total("komputed.v1.Tensors/WriteTensor", "CANCELLED").Value(), 1);
  EXPECT_EQ(m.rpcs_total("komputed.v1.Tensors/WriteTensor", "INVALID_ARGUMENT").Value(), 0);
}

TEST_F(AllOrNothingTest, AShortWriteChangesNothing) {
  const std::string fresh = Pattern(kBig, 3);
  std::vector<Chunk> chunks = Chunks(fresh, kBig);
  chunks.pop_back();  // 12 of the 16 MiB declared
  grpc::Status s = Write(1, kBig, chunks);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(s.error_message(), HasSubstr("nothing was written"));
  ExpectUnchanged();
}

TEST_F(AllOrNothingTest, AWriteThatFailsMidwayChangesNothing) {
  const std::string fresh = Pattern(kBig, 4);
  std::vector<Chunk> chunks = Chunks(fresh, kBig);
  chunks.insert(chunks.begin() + 2, Chunk{kChunk / 2, std::string(16, 'x')});  // an overlap
  EXPECT_THAT(Write(1, kBig, chunks), HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  ExpectUnchanged();
}

TEST_F(AllOrNothingTest, ACompleteWriteOfSeveralChunksLandsWhole) {
  const std::string fresh = Pattern(kBig, 5);
  uint64_t written = 0;
  ASSERT_THAT(Write(1, kBig, Chunks(fresh, kBig), &written), IsOk());
  EXPECT_EQ(written, kBig);
  std::string back;
  ASSERT_THAT(Read(1, 0, 0, 0, &back), IsOk());
  EXPECT_TRUE(back == fresh);
  // A range: only it changes.
  const std::string part = Pattern(2 * kChunk, 6);
  ASSERT_THAT(
      Write(1, 2 * kChunk, {{kChunk, part.substr(0, kChunk)}, {2 * kChunk, part.substr(kChunk)}}),
      IsOk());
  ASSERT_THAT(Read(1, 0, 0, 0, &back), IsOk());
  EXPECT_TRUE(back == fresh.substr(0, kChunk) + part + fresh.substr(3 * kChunk));
}

TEST_F(AllOrNothingTest, AWriteDuringAReadFailsTheReadRatherThanTearIt) {
  // The read takes 64 KiB chunks and stops after the first; the daemon cannot run far ahead of
  // a client that does not read (flow control), so most of the tensor is still to be copied when
  // the write lands.
  grpc::ClientContext ctx;
  v1::ReadTensorRequest req;
  req.set_session_id(session_);
  req.set_handle(1);
  req.set_chunk_bytes(64 << 10);
  auto reader = client_->tensors->ReadTensor(&ctx, req);
  v1::TensorChunk c;
  ASSERT_TRUE(reader->Read(&c));
  std::string got = c.data();

  const std::string fresh = Pattern(kBig, 7);
  ASSERT_THAT(Write(1, kBig, Chunks(fresh, kBig)), IsOk());
  while (reader->Read(&c)) got += c.data();
  grpc::Status s = reader->Finish();
  EXPECT_THAT(s, HasCode(grpc::StatusCode::ABORTED));
  EXPECT_THAT(s.error_message(), HasSubstr("changed during the read"));
  // What came before the failure is the old data only.
  EXPECT_LT(got.size(), kBig);
  EXPECT_TRUE(got == Pattern(kBig, 1).substr(0, got.size()));
  // Read again: the new data.
  std::string back;
  ASSERT_THAT(Read(1, 0, 0, 0, &back), IsOk());
  EXPECT_TRUE(back == fresh);
}

TEST_F(AllOrNothingTest, ADestroyedTensorIsNotWrittenAtTheEnd) {
  const double before = Uploaded();
  grpc::ClientContext ctx;
  v1::WriteTensorResponse resp;
  auto writer = client_->tensors->WriteTensor(&ctx, &resp);
  v1::TensorChunk c;
  c.set_session_id(session_);
  c.set_handle(1);
  c.set_total_bytes(8);
  c.set_data("abcd");
  ASSERT_TRUE(writer->Write(c));
  c.Clear();
  c.set_offset(4);
  c.set_data("efgh");
  // Destroyed (and created again) once the daemon has the first chunk, before the last: the
  // write lands in neither.
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (Uploaded() - before < 4 && absl::Now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_THAT(DestroyTensor(session_, 1), IsOk());
  ASSERT_THAT(CreateTensor(FloatTensor(session_, 1, {1, 2})), IsOk());
  ASSERT_TRUE(writer->Write(c));
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  EXPECT_THAT(s, HasCode(grpc::StatusCode::NOT_FOUND));
  std::string back;
  ASSERT_THAT(Read(1, 0, 0, 0, &back), IsOk());
  EXPECT_THAT(Floats(back), ::testing::ElementsAre(1, 2));
}

// The staging buffer counts against the tenant's host memory while the call lasts.
class StagingQuotaTest : public TensorIoTest {
 protected:
  ServerOptions Options() override {
    ServerOptions options = TensorIoTest::Options();
    options.default_quota.host_memory_bytes = 3 << 20;  // a 2 MiB tensor and 1 MiB of staging
    return options;
  }
};

TEST_F(StagingQuotaTest, StagingIsCountedAgainstHostMemory) {
  constexpr uint64_t kBytes = 2 << 20;
  ASSERT_THAT(CreateTensor(FloatTensor(session_, 1, std::vector<float>(kBytes / 4))), IsOk());
  const std::string data = Pattern(kBytes, 8);
  grpc::Status s = Write(1, kBytes, {{0, data}});
  EXPECT_THAT(s, HasCode(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_THAT(s.error_message(), HasSubstr("staging its 2097152 bytes"));
  // Half at a time fits; once a call ends its staging is given back.
  ASSERT_THAT(Write(1, kBytes / 2, {{0, data.substr(0, kBytes / 2)}}), IsOk());
  ASSERT_THAT(Write(1, kBytes / 2, {{kBytes / 2, data.substr(kBytes / 2)}}), IsOk());
  std::string back;
  ASSERT_THAT(Read(1, 0, 0, 0, &back), IsOk());
  EXPECT_TRUE(back == data);
}

// While a submission that changes a tensor's host data is in flight, the tensor is not read.
class ReadDuringSubmissionTest : public TensorIoTest {};

TEST_F(ReadDuringSubmissionTest, ATensorThatASubmissionInFlightChangesIsNotRead) {
  constexpr uint32_t kCount = 32768;  // invocations (lavapipe: at most 65535 workgroups)
  grpc::ClientContext devices_ctx;
  v1::ListDevicesResponse devices;
  ASSERT_THAT(client_->devices->ListDevices(&devices_ctx, v1::ListDevicesRequest(), &devices),
              IsOk());
  const bool cpu = devices.devices(0).device_type() == 4;     // VK_PHYSICAL_DEVICE_TYPE_CPU
  const SlowWork work = SlowWork::Of(cpu ? 1000 : 1e7, cpu);  // about half a second on lavapipe
  v1::CreateTensorRequest t;
  t.set_session_id(session_);
  t.set_handle(1);
  t.set_element_type(v1::ELEMENT_TYPE_UINT32);
  t.set_count(kCount);
  ASSERT_THAT(CreateTensor(t), IsOk());
  ASSERT_THAT(CreateTensor(FloatTensor(session_, 4, {1, 2, 3})), IsOk());  // not in the sequence
  v1::CreateAlgorithmRequest a;
  a.set_session_id(session_);
  a.set_handle(2);
  a.add_tensors(1);
  a.set_glsl(kSlowShader);
  a.mutable_workgroup()->set_x(kCount);
  a.mutable_workgroup()->set_y(1);
  a.mutable_workgroup()->set_z(1);
  a.set_push_constants(work.PushConstants());
  ASSERT_THAT(CreateAlgorithm(a), IsOk());
  ASSERT_THAT(CreateSequence(session_, 3), IsOk());
  ASSERT_THAT(Record(session_, 3,
                     {RecordOp(SyncDevice({1})), RecordOp(Dispatch(2)), RecordOp(SyncLocal({1}))}),
              IsOk());

  grpc::ClientContext ctx;
  auto stream = client_->sequences->Execute(&ctx);
  v1::ExecuteRequest req;
  req.mutable_eval()->set_session_id(session_);
  req.mutable_eval()->set_sequence(3);
  req.mutable_eval()->set_request_id(1);
  ASSERT_TRUE(stream->Write(req));
  // Submitted: the tensor is marked from before the submission until the device has finished.
  Metrics& m = server_->metrics();
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (m.queue_depth("0", "0").Value() == 0 && absl::Now() < until) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::string back;
  grpc::Status during = Read(1, 0, 0, 0, &back);
  const bool still_in_flight = m.queue_depth("0", "0").Value() > 0;  // the whole read long
  std::string other;
  EXPECT_THAT(Read(4, 0, 0, 0, &other), IsOk());  // a tensor that the submission leaves alone
  EXPECT_THAT(Floats(other), ::testing::ElementsAre(1, 2, 3));
  v1::ExecuteEvent event;
  ASSERT_TRUE(stream->Read(&event));
  ASSERT_EQ(event.code(), 0) << event.message();
  if (during.ok() && !still_in_flight) {
    GTEST_SKIP() << "the submission completed during the read (a fast device)";
  }
  EXPECT_THAT(during, HasCode(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_THAT(during.error_message(), HasSubstr("a submission in flight may change"));

  // Once the eval has completed, the result reads.
  ASSERT_THAT(Read(1, 0, 0, 0, &back), IsOk());
  ASSERT_EQ(back.size(), kCount * 4u);
  uint32_t first = 0;
  std::memcpy(&first, back.data(), 4);
  EXPECT_EQ(first, Lcg(0, work));
  stream->WritesDone();
  EXPECT_THAT(stream->Finish(), IsOk());
}

}  // namespace
}  // namespace komputed::server::testing
