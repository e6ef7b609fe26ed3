#pragma once
// TensorChunk messages as gRPC byte buffers, for the bulk transfers (WriteTensor, ReadTensor):
// the tensor data is lent to gRPC on the way out and read in place on the way in, instead of
// being copied into and out of a protobuf `bytes` field. The bytes on the wire are the ordinary
// serialized TensorChunk, so either side may use the generated message instead.

#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "komputed/v1/komputed.pb.h"

namespace komputed::v1::wire {

// A received TensorChunk: every field but `data` in `fields`, and `data` as the pieces of the
// received buffer that hold it, in order (data_bytes in all).
struct TensorChunkView {
  TensorChunk fields;
  std::vector<absl::string_view> data;
  uint64_t data_bytes = 0;
};

// Parses `raw`; `chunk->data` then points into `raw`'s slices, which must outlive its use.
// INVALID_ARGUMENT when `raw` is not a serialized TensorChunk.
absl::Status ParseTensorChunk(grpc::ByteBuffer& raw, TensorChunkView* chunk);

// Copies the chunk's data into `to` (data_bytes of room).
void CopyData(const TensorChunkView& chunk, char* to);

// `fields` (whose `data` must be empty) followed by field `data` holding data[0, size). The data
// is not copied: gRPC refers to it until it calls release(hold), once.
grpc::ByteBuffer SerializeTensorChunk(const TensorChunk& fields, const char* data, size_t size,
                                      void (*release)(void*), void* hold);

}  // namespace komputed::v1::wire
