// WriteTensor and ReadTensor: chunked host data transfer.
#include <algorithm>
#include <numeric>
#include <random>

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

}  // namespace
}  // namespace komputed::server::testing
