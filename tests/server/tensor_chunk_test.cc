// v1::wire::ParseTensorChunk: a WriteTensor message as it arrives (a serialized TensorChunk in one
// or more slices) into its fields and the pieces of the message that hold its data.
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <string>
#include <vector>

#include "komputed/v1/tensor_chunk_wire.h"
#include "test_util.h"

namespace komputed::server::testing {
namespace {

// `bytes` as a ByteBuffer cut into slices of at most `slice_bytes`.
grpc::ByteBuffer Sliced(const std::string& bytes, size_t slice_bytes) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += slice_bytes) {
    slices.emplace_back(bytes.substr(at, slice_bytes));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Joined(const v1::wire::TensorChunkView& chunk) {
  std::string data;
  for (absl::string_view piece : chunk.data) data.append(piece.data(), piece.size());
  return data;
}

std::string Serialized(const v1::TensorChunk& chunk) {
  std::string bytes;
  EXPECT_TRUE(chunk.SerializeToString(&bytes));
  return bytes;
}

TEST(TensorChunkParse, FieldsAndDataAcrossSlices) {
  v1::TensorChunk sent;
  sent.set_session_id("a-session");
  sent.set_handle(7);
  sent.set_total_bytes(1000);
  sent.set_offset(24);
  std::string data(1000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31 + 7);
  sent.set_data(data);
  for (size_t slice_bytes : {size_t{1}, size_t{3}, size_t{64}, size_t{4096}}) {
    grpc::ByteBuffer raw = Sliced(Serialized(sent), slice_bytes);
    v1::wire::TensorChunkView chunk;
    ASSERT_TRUE(v1::wire::ParseTensorChunk(raw, &chunk).ok()) << slice_bytes;
    EXPECT_EQ(chunk.fields.session_id(), "a-session");
    EXPECT_EQ(chunk.fields.handle(), 7u);
    EXPECT_EQ(chunk.fields.total_bytes(), 1000u);
    EXPECT_EQ(chunk.fields.offset(), 24u);
    EXPECT_TRUE(chunk.fields.data().empty()) << "data is not copied into the message";
    EXPECT_EQ(chunk.data_bytes, data.size());
    EXPECT_EQ(Joined(chunk), data) << "slices of " << slice_bytes;
  }
}

// Protobuf allows fields in any order and a field twice (the last one counts); unknown fields
// are kept apart from the data.
TEST(TensorChunkParse, AnyFieldOrderRepeatedDataAndUnknownFields) {
  v1::TensorChunk first_data;
  first_data.set_data("old");
  v1::TensorChunk rest;
  rest.set_offset(5);
  rest.set_handle(2);
  v1::TensorChunk last_data;
  last_data.set_data("new data");
  std::string unknown;  // field 99, varint 1
  unknown.push_back(static_cast<char>(((99 << 3) & 0x7f) | 0x80));
  unknown.push_back(static_cast<char>(99 >> 4));
  unknown.push_back(1);
  const std::string bytes =
      Serialized(first_data) + unknown + Serialized(rest) + Serialized(last_data);
  grpc::ByteBuffer raw = Sliced(bytes, 5);
  v1::wire::TensorChunkView chunk;
  ASSERT_TRUE(v1::wire::ParseTensorChunk(raw, &chunk).ok());
  EXPECT_EQ(chunk.fields.offset(), 5u);
  EXPECT_EQ(chunk.fields.handle(), 2u);
  EXPECT_EQ(Joined(chunk), "new data");
  EXPECT_EQ(chunk.data_bytes, 8u);
}

TEST(TensorChunkParse, EmptyMessageHasNoData) {
  grpc::ByteBuffer raw = Sliced("", 1);
  v1::wire::TensorChunkView chunk;
  ASSERT_TRUE(v1::wire::ParseTensorChunk(raw, &chunk).ok());
  EXPECT_EQ(chunk.data_bytes, 0u);
  EXPECT_TRUE(chunk.data.empty());
}

TEST(TensorChunkParse, MalformedMessagesAreInvalidArguments) {
  v1::TensorChunk sent;
  sent.set_handle(3);
  sent.set_data(std::string(100, 'x'));
  const std::string bytes = Serialized(sent);
  for (const std::string& bad :
       {bytes.substr(0, bytes.size() - 1),  // data cut short
        bytes.substr(0, 3),                 // inside the data's length prefix
        std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11),  // an overlong varint
        std::string("\x0a\x05"
                    "ab",
                    4)}) {  // session_id longer than the message
    grpc::ByteBuffer raw = Sliced(bad, 2);
    v1::wire::TensorChunkView chunk;
    absl::Status status = v1::wire::ParseTensorChunk(raw, &chunk);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("komputed.v1.TensorChunk"));
  }
}

}  // namespace
}  // namespace komputed::server::testing
