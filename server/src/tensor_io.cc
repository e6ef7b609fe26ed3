#include "tensor_io.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <new>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "host_data.h"
#include "komputed/core/status.h"
#include "status.h"

namespace komputed::server {

namespace {

// Staging blocks: the size of a client's chunk, and at most 128 MiB of them kept for reuse.
constexpr size_t kStagingBlock = 4 << 20;
constexpr size_t kKeptBlocks = 32;

struct BlockPool {
  absl::Mutex mu;
  std::vector<char*> free ABSL_GUARDED_BY(mu);
};
BlockPool& Blocks() {
  static BlockPool* const pool = new BlockPool();  // never destroyed: in use until exit
  return *pool;
}

// A block of kStagingBlock bytes, or nullptr when there is no memory.
char* TakeBlock() {
  BlockPool& pool = Blocks();
  {
    absl::MutexLock lock(&pool.mu);
    if (!pool.free.empty()) {
      char* block = pool.free.back();
      pool.free.pop_back();
      return block;
    }
  }
  return new (std::nothrow) char[kStagingBlock];
}

}  // namespace

void TensorWrite::ReturnBlock::operator()(char* block) const {
  BlockPool& pool = Blocks();
  {
    absl::MutexLock lock(&pool.mu);
    if (pool.free.size() < kKeptBlocks) {
      pool.free.push_back(block);
      return;
    }
  }
  delete[] block;
}

absl::StatusOr<std::unique_ptr<TensorWrite>> TensorWrite::Begin(std::shared_ptr<Session> session,
                                                                const Chunk& chunk) {
  const v1::TensorChunk& first = chunk.fields;
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Tensor> tensor, session->HostTensor(first.handle()));
  const std::string what = absl::StrCat("WriteTensor to tensor ", first.handle(), ": ");
  if (first.total_bytes() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     "the first message declares total_bytes 0; it must give the number of "
                     "bytes the call writes"));
  }
  if (!Inside(first.offset(), first.total_bytes(), tensor->byte_size())) {
    return absl::InvalidArgumentError(absl::StrCat(what, first.total_bytes(), " bytes at offset ",
                                                   first.offset(), " do not fit in its ",
                                                   tensor->byte_size(), " bytes"));
  }
  auto write = std::unique_ptr<TensorWrite>(new TensorWrite());
  absl::StatusOr<Charge> charge = session->ChargeHostMemory(first.total_bytes());
  if (!charge.ok()) {
    return Annotate(charge.status(),
                    absl::StrCat(what, "staging its ", first.total_bytes(), " bytes: "));
  }
  write->staging_charge_ = *std::move(charge);
  write->session_ = std::move(session);
  write->tensor_ = std::move(tensor);
  write->handle_ = first.handle();
  write->begin_ = first.offset();
  write->end_ = first.offset() + first.total_bytes();
  KD_RETURN_IF_ERROR(write->Write(chunk));
  return write;
}

absl::Status TensorWrite::Write(const Chunk& chunk) {
  session_->Touch();
  const uint64_t offset = chunk.fields.offset();
  const uint64_t length = chunk.data_bytes;
  if (length == 0) return absl::OkStatus();
  const std::string what = absl::StrCat("WriteTensor to tensor ", handle_, ": ");
  if (offset < begin_ || !Inside(offset - begin_, length, end_ - begin_)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "the chunk of ", length, " bytes at offset ", offset, " falls outside [",
                     begin_, ", ", end_, "), the range that the first message declared"));
  }
  const uint64_t end = offset + length;
  auto next = ranges_.lower_bound(offset);
  if (next != ranges_.end() && next->first < end) {
    return absl::InvalidArgumentError(absl::StrCat(what, "the chunk [", offset, ", ", end,
                                                   ") overlaps bytes already written at [",
                                                   next->first, ", ", next->second, ")"));
  }
  if (next != ranges_.begin()) {
    auto prev = std::prev(next);
    if (prev->second > offset) {
      return absl::InvalidArgumentError(absl::StrCat(what, "the chunk [", offset, ", ", end,
                                                     ") overlaps bytes already written at [",
                                                     prev->first, ", ", prev->second, ")"));
    }
  }
  uint64_t at = offset;
  for (absl::string_view piece : chunk.data) {
    while (!piece.empty()) {
      if (blocks_.empty() || block_used_ == kStagingBlock) {
        char* block = TakeBlock();
        if (block == nullptr) {
          return absl::ResourceExhaustedError(
              absl::StrCat(what, "no memory to stage the chunk of ", length, " bytes"));
        }
        blocks_.emplace_back(block);
        block_used_ = 0;
      }
      const size_t n = std::min<size_t>(piece.size(), kStagingBlock - block_used_);
      char* const to = blocks_.back().get() + block_used_;
      std::memcpy(to, piece.data(), n);
      StagedWrite* last = staged_.empty() ? nullptr : &staged_.back();
      if (last != nullptr && last->data.data() + last->data.size() == to &&
          last->offset + last->data.size() == at) {
        last->data = absl::string_view(last->data.data(), last->data.size() + n);
      } else {
        staged_.push_back({at, absl::string_view(to, n)});
      }
      block_used_ += n;
      at += n;
      piece.remove_prefix(n);
    }
  }
  written_ += length;
  session_->CountUpload(length);
  // Keep the written ranges merged, so that the map stays small.
  uint64_t start = offset;
  uint64_t stop = end;
  if (next != ranges_.end() && next->first == end) {
    stop = next->second;
    next = ranges_.erase(next);
  }
  if (next != ranges_.begin()) {
    auto prev = std::prev(next);
    if (prev->second == offset) {
      start = prev->first;
      ranges_.erase(prev);
    }
  }
  ranges_[start] = stop;
  return absl::OkStatus();
}

absl::Status TensorWrite::Finish() {
  if (written_ != end_ - begin_) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteTensor to tensor ", handle_, ": the chunks cover ", written_, " of the ",
                     end_ - begin_,
                     " bytes that the first message declared (total_bytes); nothing was written"));
  }
  absl::Status status = session_->WriteHostData(handle_, *tensor_, staged_);
  staged_.clear();
  blocks_.clear();
  staging_charge_.Release();
  return Annotate(status, absl::StrCat("WriteTensor to tensor ", handle_, ": "));
}

absl::Status Session::WriteHostData(uint64_t handle, const core::Tensor& tensor,
                                    const std::vector<StagedWrite>& pieces) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckUsableLocked());
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Tensor> now, HostTensorLocked(handle));
  if (now.get() != &tensor) {
    return absl::NotFoundError(
        absl::StrCat("tensor ", handle,
                     " was destroyed (and created again) during the call; nothing was "
                     "written"));
  }
  host_writes_->Write(tensor, pieces);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TensorRead>> TensorRead::Begin(std::shared_ptr<Session> session,
                                                              const v1::ReadTensorRequest& request,
                                                              uint64_t max_chunk_bytes) {
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Tensor> tensor, session->HostTensor(request.handle()));
  const uint64_t size = tensor->byte_size();
  if (request.offset() > size) {
    return absl::InvalidArgumentError(absl::StrCat("ReadTensor of tensor ", request.handle(),
                                                   ": offset ", request.offset(), " is beyond its ",
                                                   size, " bytes"));
  }
  const uint64_t length = request.length() == 0 ? size - request.offset() : request.length();
  if (!Inside(request.offset(), length, size)) {
    return absl::InvalidArgumentError(absl::StrCat("ReadTensor of tensor ", request.handle(), ": ",
                                                   length, " bytes at offset ", request.offset(),
                                                   " do not fit in its ", size, " bytes"));
  }
  auto read = std::unique_ptr<TensorRead>(new TensorRead());
  read->session_ = std::move(session);
  read->tensor_ = std::move(tensor);
  read->handle_ = request.handle();
  read->next_ = request.offset();
  read->end_ = request.offset() + length;
  const uint64_t chunk = request.chunk_bytes() == 0 ? kDefaultChunkBytes : request.chunk_bytes();
  read->chunk_bytes_ = std::max<uint64_t>(1, std::min(chunk, max_chunk_bytes));
  read->since_ = read->session_->host_writes().BeginRead();
  read->reading_ = true;
  // Nothing is copied yet: whether the tensor can be read now.
  absl::Status now = read->session_->host_writes().Read(*read->tensor_, read->since_, read->next_,
                                                        /*size=*/0, nullptr);
  if (!now.ok()) {
    return Annotate(now, absl::StrCat("ReadTensor of tensor ", read->handle_, ": "));
  }
  return read;
}

TensorRead::~TensorRead() {
  if (reading_) session_->host_writes().EndRead();
}

absl::StatusOr<grpc::ByteBuffer> TensorRead::Next() {
  session_->Touch();
  const uint64_t n = std::min(chunk_bytes_, end_ - next_);
  std::unique_ptr<char[]> data(new char[n]);
  absl::Status copied = session_->host_writes().Read(*tensor_, since_, next_, n, data.get());
  if (!copied.ok()) {
    return Annotate(copied, absl::StrCat("ReadTensor of tensor ", handle_, ": "));
  }
  v1::TensorChunk fields;
  fields.set_handle(handle_);
  fields.set_offset(next_);
  char* const lent = data.release();  // gRPC gives it back through the release function
  grpc::ByteBuffer chunk = v1::wire::SerializeTensorChunk(
      fields, lent, n, [](void* held) { delete[] static_cast<char*>(held); }, lent);
  next_ += n;
  session_->CountDownload(n);
  return chunk;
}

}  // namespace komputed::server
