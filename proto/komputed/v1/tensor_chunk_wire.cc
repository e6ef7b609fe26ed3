#include "komputed/v1/tensor_chunk_wire.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace komputed::v1::wire {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;

absl::Status ParseTensorChunk(grpc::ByteBuffer& raw, TensorChunkView* chunk) {
  const absl::Status malformed =
      absl::InvalidArgumentError("a message is not a komputed.v1.TensorChunk");
  chunk->fields.Clear();
  chunk->data.clear();
  chunk->data_bytes = 0;
  grpc::ProtoBufferReader reader(&raw);
  if (!reader.status().ok()) return malformed;
  std::string other_fields;  // every field but `data`, for protobuf to parse
  {
    google::protobuf::io::StringOutputStream other_stream(&other_fields);
    CodedOutputStream other(&other_stream);
    CodedInputStream in(&reader);
    while (const uint32_t tag = in.ReadTag()) {
      if (WireFormatLite::GetTagFieldNumber(tag) != TensorChunk::kDataFieldNumber ||
          WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
        if (!WireFormatLite::SkipField(&in, tag, &other)) return malformed;
        continue;
      }
      uint64_t length = 0;
      if (!in.ReadVarint64(&length)) return malformed;
      chunk->data.clear();  // a field given twice: the last one counts
      chunk->data_bytes = length;
      while (length > 0) {
        const void* piece = nullptr;
        int size = 0;
        if (!in.GetDirectBufferPointer(&piece, &size) || size <= 0) return malformed;
        const int take = static_cast<int>(std::min<uint64_t>(length, static_cast<uint64_t>(size)));
        chunk->data.emplace_back(static_cast<const char*>(piece), static_cast<size_t>(take));
        if (!in.Skip(take)) return malformed;
        length -= static_cast<uint64_t>(take);
      }
    }
    if (!in.ConsumedEntireMessage()) return malformed;
  }
  if (!chunk->fields.ParseFromString(other_fields)) return malformed;
  return absl::OkStatus();
}

void CopyData(const TensorChunkView& chunk, char* to) {
  for (absl::string_view piece : chunk.data) {
    std::memcpy(to, piece.data(), piece.size());
    to += piece.size();
  }
}

grpc::ByteBuffer SerializeTensorChunk(const TensorChunk& fields, const char* data, size_t size,
                                      void (*release)(void*), void* hold) {
  std::string prefix = fields.SerializeAsString();
  uint8_t field[16];  // a tag (at most 5 bytes) and a 64-bit length (at most 10)
  uint8_t* end = CodedOutputStream::WriteVarint32ToArray(
      WireFormatLite::MakeTag(TensorChunk::kDataFieldNumber,
                              WireFormatLite::WIRETYPE_LENGTH_DELIMITED),
      field);
  end = CodedOutputStream::WriteVarint64ToArray(size, end);
  prefix.append(reinterpret_cast<const char*>(field), static_cast<size_t>(end - field));
  grpc::Slice slices[2] = {grpc::Slice(prefix),
                           grpc::Slice(const_cast<char*>(data), size, release, hold)};
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace komputed::v1::wire
