#pragma once
// The bulk paths of tensor data: WriteTensor and ReadTensor, chunk by chunk, between gRPC's
// messages and a tensor's host data, each call whole (host_writes.h has the rule).

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "komputed/core/tensor.h"
#include "komputed/v1/komputed.pb.h"
#include "komputed/v1/tensor_chunk_wire.h"
#include "quota.h"
#include "session.h"

namespace komputed::server {

// One WriteTensor call: the first chunk declares the session, tensor and range
// [offset, offset + total_bytes); the chunks, in any order and without overlap, must cover it
// exactly. All or nothing: the chunks are staged as they arrive (the range's size is taken from
// the tenant's host_memory_bytes quota while the call lasts) and Finish writes them into the
// tensor's host data at once, under the session's lock. A call that fails, is cancelled or ends
// short changes nothing. Not thread-safe (one call's chunks arrive one at a time).
class TensorWrite {
 public:
  // A chunk as it arrived: its fields, and its data as pieces of the received message
  // (v1::wire::ParseTensorChunk), so that it is copied once, into the staging buffer.
  using Chunk = v1::wire::TensorChunkView;

  // Checks the first chunk's declaration, takes the staging buffer and stages the chunk's data.
  static absl::StatusOr<std::unique_ptr<TensorWrite>> Begin(std::shared_ptr<Session> session,
                                                            const Chunk& first);
  absl::Status Write(const Chunk& chunk);
  // Writes the staged range into the tensor (Session::WriteHostData), then lets the staging go.
  // INVALID_ARGUMENT unless the chunks covered the declared range exactly; NOT_FOUND when the
  // tensor was destroyed meanwhile. On error nothing is written.
  absl::Status Finish();
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
  // The chunks' data as they arrived, packed into staging blocks (kept for reuse by the next
  // calls: the pages of fresh buffers cost more to fault in than the copies into them).
  struct ReturnBlock {
    void operator()(char* block) const;
  };
  std::vector<std::unique_ptr<char[], ReturnBlock>> blocks_;
  uint64_t block_used_ = 0;          // bytes of blocks_.back() in use
  std::vector<StagedWrite> staged_;  // where each piece goes; its data lies in blocks_
  Charge staging_charge_;            // end_ - begin_ bytes of host memory
};

// One ReadTensor call: a range of a tensor's host data as it was at one moment, handed out in
// chunks. Each chunk is copied from the tensor as its turn comes (HostWrites::Read), which fails
// the call rather than hand out a torn mix of old and new: FAILED_PRECONDITION while a submission
// in flight may change the tensor, ABORTED when the tensor changed since the call began. Not
// thread-safe.
class TensorRead {
 public:
  // The default chunk size: 4 MiB messages, so that a client with gRPC's default 4 MiB receive
  // limit can take them.
  static constexpr uint64_t kDefaultChunkBytes = (4 << 20) - 1024;

  // chunk_bytes is capped to max_chunk_bytes. INVALID_ARGUMENT for a range outside the tensor;
  // FAILED_PRECONDITION while a submission in flight may change the tensor.
  static absl::StatusOr<std::unique_ptr<TensorRead>> Begin(std::shared_ptr<Session> session,
                                                           const v1::ReadTensorRequest& request,
                                                           uint64_t max_chunk_bytes);
  ~TensorRead();
  bool done() const { return next_ >= end_; }
  // The next chunk (call while !done()) as a serialized TensorChunk {handle, offset, data}, its
  // data a copy that the message owns; or why the read cannot go on.
  absl::StatusOr<grpc::ByteBuffer> Next();

 private:
  TensorRead() = default;

  std::shared_ptr<Session> session_;
  std::shared_ptr<core::Tensor> tensor_;
  uint64_t handle_ = 0;
  uint64_t next_ = 0;
  uint64_t end_ = 0;
  uint64_t chunk_bytes_ = 0;
  bool reading_ = false;  // between HostWrites::BeginRead and EndRead
  uint64_t since_ = 0;    // the clock at BeginRead
};

}  // namespace komputed::server
