#include "tensor_io.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "host_data.h"
#include "komputed/core/status.h"

namespace komputed::server {

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
  v1::wire::CopyData(chunk, HostData(*tensor_) + offset);
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

absl::Status TensorWrite::Finish() const {
  if (written_ != end_ - begin_) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteTensor to tensor ", handle_, ": the chunks cover ", written_, " of the ",
                     end_ - begin_, " bytes that the first message declared (total_bytes)"));
  }
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
  return read;
}

grpc::ByteBuffer TensorRead::Next() {
  session_->Touch();
  const uint64_t n = std::min(chunk_bytes_, end_ - next_);
  v1::TensorChunk fields;
  fields.set_handle(handle_);
  fields.set_offset(next_);
  grpc::ByteBuffer chunk = v1::wire::SerializeTensorChunk(
      fields, HostData(*tensor_) + next_, n,
      [](void* held) { delete static_cast<std::shared_ptr<core::Tensor>*>(held); },
      new std::shared_ptr<core::Tensor>(tensor_));
  next_ += n;
  session_->CountDownload(n);
  return chunk;
}

}  // namespace komputed::server
