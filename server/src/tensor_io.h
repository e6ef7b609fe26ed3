#pragma once
// The bulk paths of tensor data: WriteTensor and ReadTensor, chunk by chunk, straight between
// gRPC's messages and a tensor's host data.

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <map>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "komputed/core/tensor.h"
#include "komputed/v1/komputed.pb.h"
#include "komputed/v1/tensor_chunk_wire.h"
#include "session.h"

namespace komputed::server {

// One WriteTensor call: the first chunk declares the session, tensor and range
// [offset, offset + total_bytes); the chunks, in any order and without overlap, must cover it
// exactly. Each chunk is written into the tensor's host data as it arrives. Not thread-safe (one
// call's chunks arrive one at a time).
class TensorWrite {
 public:
  // A chunk as it arrived: its fields, and its data as pieces of the received message
  // (v1::wire::ParseTensorChunk), so that it is copied once, into the tensor.
  using Chunk = v1::wire::TensorChunkView;

  // Checks the first chunk's declaration and writes its data.
  static absl::StatusOr<std::unique_ptr<TensorWrite>> Begin(std::shared_ptr<Session> session,
                                                            const Chunk& first);
  absl::Status Write(const Chunk& chunk);
  // INVALID_ARGUMENT unless the chunks covered the declared range exactly.
  absl::Status Finish() const;
  uint64_t bytes_written() const { return written_; }

 private:
  TensorWrite() = default;

  std::shared_ptr<Session> session_;
  std::shared_ptr<core::Tensor> tensor_;
  uint64_t handle_ = 0;
  uint64_t begin_ = 0;
  uint64_t end_ = 0;
  uint64_t written_ = 0;
  std::map<uint64_t, uint64_t> ranges_;  // written [start, end), adjacent ones merged
};

// One ReadTensor call: a range of a tensor's host data, handed out in chunks. Not thread-safe.
class TensorRead {
 public:
  // The default chunk size: 4 MiB messages, so that a client with gRPC's default 4 MiB receive
  // limit can take them.
  static constexpr uint64_t kDefaultChunkBytes = (4 << 20) - 1024;

  // chunk_bytes is capped to max_chunk_bytes. INVALID_ARGUMENT for a range outside the tensor.
  static absl::StatusOr<std::unique_ptr<TensorRead>> Begin(std::shared_ptr<Session> session,
                                                           const v1::ReadTensorRequest& request,
                                                           uint64_t max_chunk_bytes);
  bool done() const { return next_ >= end_; }
  // The next chunk (call while !done()) as a serialized TensorChunk {handle, offset, data}, its
  // data not copied: the message refers to the tensor's host data, and holds the tensor until
  // gRPC has sent it.
  grpc::ByteBuffer Next();

 private:
  TensorRead() = default;

  std::shared_ptr<Session> session_;
  std::shared_ptr<core::Tensor> tensor_;
  uint64_t handle_ = 0;
  uint64_t next_ = 0;
  uint64_t end_ = 0;
  uint64_t chunk_bytes_ = 0;
};

}  // namespace komputed::server
