// fuzz_tensor_chunk: the bulk path of tensor data. Each input makes one tensor (its memory type
// and size from the input) in a new session, then sends up to 16 raw messages through
// v1::wire::ParseTensorChunk (each split into up to 4 slices, as gRPC hands a message over in
// pieces) and TensorWrite (Begin, Write..., Finish), then reads a range back with TensorRead.
//
// Checked, besides crashes and sanitizer reports: ParseTensorChunk accepts what protobuf's own
// parser accepts and gives the same fields and data; Finish succeeds exactly when the chunks
// covered the declared range; the tensor's host data is what a model says (a call's chunks all
// written by a Finish that succeeds, none otherwise); every chunk that TensorRead hands out
// parses back to the tensor's bytes.
//
// The input (FuzzedDataProvider): from its start, the messages (ConsumeRandomLengthString: a
// backslash and another byte end one, two backslashes are one); from its end, the numbers.
#include <fuzzer/FuzzedDataProvider.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz_support.h"
#include "host_data.h"
#include "komputed/v1/komputed.pb.h"
#include "komputed/v1/tensor_chunk_wire.h"
#include "session.h"
#include "tensor_io.h"

namespace komputed::fuzz {
namespace {

constexpr uint64_t kTensor = 1;
constexpr int kMaxChunks = 16;
constexpr size_t kMaxMessage = 8192;

// `raw` as a ByteBuffer of `pieces` slices (the split points from the input).
grpc::ByteBuffer Split(const std::string& raw, FuzzedDataProvider& in) {
  const int pieces = in.ConsumeIntegralInRange<int>(1, 4);
  std::vector<size_t> cuts = {0, raw.size()};
  for (int i = 1; i < pieces; ++i) cuts.push_back(in.ConsumeIntegralInRange<size_t>(0, raw.size()));
  std::sort(cuts.begin(), cuts.end());
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    slices.emplace_back(raw.data() + cuts[i], cuts[i + 1] - cuts[i]);
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Data(const v1::wire::TensorChunkView& view) {
  std::string data(view.data_bytes, '\0');
  v1::wire::CopyData(view, data.data());
  return data;
}

// ParseTensorChunk against protobuf's parser of the same bytes: what protobuf accepts, it must
// accept with the same fields and data. It may accept a little more: it reads varints with
// CodedInputStream, which takes a tag or a length of up to 10 bytes where protobuf's parser stops
// at 5; the values it reads are the ones those bytes encode.
absl::Status Parse(const std::string& raw, grpc::ByteBuffer& buffer,
                   v1::wire::TensorChunkView* view) {
  const absl::Status parsed = v1::wire::ParseTensorChunk(buffer, view);
  v1::TensorChunk reference;
  const bool reference_ok = reference.ParseFromString(raw);
  Check(parsed.ok() || !reference_ok, "ParseTensorChunk rejects a message that protobuf accepts",
        parsed);
  if (!parsed.ok()) {
    Check(absl::IsInvalidArgument(parsed), "ParseTensorChunk's error", parsed);
    return parsed;
  }
  size_t pieces = 0;
  for (absl::string_view piece : view->data) pieces += piece.size();
  Check(pieces == view->data_bytes && pieces <= raw.size(),
        "the data's pieces do not add up to data_bytes");
  if (!reference_ok) return parsed;
  Check(Data(*view) == reference.data(), "ParseTensorChunk's data differs from protobuf's");
  reference.clear_data();
  Check(view->fields.handle() == reference.handle() &&
            view->fields.offset() == reference.offset() &&
            view->fields.total_bytes() == reference.total_bytes() &&
            view->fields.session_id() == reference.session_id() && view->fields.data().empty(),
        "ParseTensorChunk's fields differ from protobuf's");
  return parsed;
}

// What the input asks for besides the messages, read first, from the input's end.
struct Plan {
  core::MemoryType memory = core::MemoryType::kDevice;
  uint64_t bytes = 1;  // the tensor's size
  v1::ReadTensorRequest read;
  uint64_t max_chunk = 1;  // the daemon's cap on a ReadTensor chunk
  int chunks = 0;          // messages sent to WriteTensor
};

Plan ReadPlan(FuzzedDataProvider& in) {
  Plan plan;
  plan.memory = in.PickValueInArray({core::MemoryType::kDevice, core::MemoryType::kHost,
                                     core::MemoryType::kDeviceAndHost, core::MemoryType::kStorage});
  plan.bytes = in.ConsumeIntegralInRange<uint64_t>(1, 4096);
  plan.read.set_handle(kTensor);
  plan.read.set_offset(in.ConsumeIntegralInRange<uint64_t>(0, plan.bytes + 1));
  plan.read.set_length(in.ConsumeIntegralInRange<uint64_t>(0, plan.bytes + 1));
  plan.read.set_chunk_bytes(in.ConsumeIntegralInRange<uint64_t>(0, 1024));
  plan.max_chunk = in.ConsumeIntegralInRange<uint64_t>(1, 2048);
  plan.chunks = in.ConsumeIntegralInRange<int>(0, kMaxChunks);
  return plan;
}

// Reads the plan's range of the tensor back through TensorRead, chunk by chunk, and checks it
// against the model of the tensor's host data.
void ReadBack(const std::shared_ptr<server::Session>& session, const Plan& plan,
              const std::string& model) {
  absl::StatusOr<std::shared_ptr<core::Tensor>> host = session->HostTensor(kTensor);
  Check(host.ok() == core::HasHostData(plan.memory), "HostTensor", host.status());
  if (!host.ok()) return;
  Check(std::memcmp(server::HostData(**host), model.data(), model.size()) == 0,
        "the tensor's host data is not what the accepted chunks wrote");
  absl::StatusOr<std::unique_ptr<server::TensorRead>> read =
      server::TensorRead::Begin(session, plan.read, plan.max_chunk);
  CheckClientError(read.status(), "ReadTensor");
  if (!read.ok()) return;
  uint64_t next = plan.read.offset();
  for (int i = 0; !(*read)->done(); ++i) {
    Check(i < 8192, "ReadTensor does not end");
    absl::StatusOr<grpc::ByteBuffer> next_chunk = (*read)->Next();
    CheckClientError(next_chunk.status(), "ReadTensor's next chunk");
    Check(next_chunk.ok(), "a ReadTensor with nothing in flight stopped", next_chunk.status());
    grpc::ByteBuffer& chunk = *next_chunk;
    std::vector<grpc::Slice> slices;
    Check(chunk.Dump(&slices).ok(), "a ReadTensor chunk's slices");
    std::string raw;
    for (const grpc::Slice& s : slices) {
      raw.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    v1::wire::TensorChunkView view;
    Check(Parse(raw, chunk, &view).ok(), "a ReadTensor chunk does not parse");
    Check(view.fields.handle() == kTensor && view.fields.offset() == next,
          "a ReadTensor chunk's handle or offset");
    Check(view.data_bytes > 0 && view.data_bytes <= plan.max_chunk &&
              next + view.data_bytes <= model.size() &&
              Data(view) == model.substr(next, view.data_bytes),
          "a ReadTensor chunk's data is not the tensor's");
    next += view.data_bytes;
  }
  const uint64_t length =
      plan.read.length() == 0 ? model.size() - plan.read.offset() : plan.read.length();
  Check(next == plan.read.offset() + length, "ReadTensor ended before the range did");
}

void Run(FuzzedDataProvider& in) {
  const Plan plan = ReadPlan(in);
  SessionEnv& env = SessionEnv::Get();
  std::shared_ptr<server::Session> session = env.NewSession();
  server::TensorRequest tensor;
  tensor.handle = kTensor;
  tensor.type = core::ElementType::kBytes;
  tensor.element_size = 1;
  tensor.memory = plan.memory;
  tensor.count = plan.bytes;
  Check(session->CreateTensor(tensor).ok(), "creating the tensor");
  std::string model(plan.bytes, '\0');  // what the tensor's host data must hold

  std::unique_ptr<server::TensorWrite> write;
  std::string staged;  // the model with the call's accepted chunks: written at Finish, all or none
  uint64_t begin = 0, end = 0;
  bool failed = false;  // a WriteTensor call ends at its first error
  for (int i = 0; i < plan.chunks && !failed; ++i) {
    const std::string raw = in.ConsumeRandomLengthString(kMaxMessage);
    grpc::ByteBuffer buffer = Split(raw, in);
    v1::wire::TensorChunkView view;
    if (!Parse(raw, buffer, &view).ok()) continue;  // the service ends the call here
    absl::Status written;
    if (write == nullptr) {
      absl::StatusOr<std::unique_ptr<server::TensorWrite>> begun =
          server::TensorWrite::Begin(session, view);
      written = begun.status();
      if (begun.ok()) {
        write = *std::move(begun);
        staged = model;
        begin = view.fields.offset();
        end = begin + view.fields.total_bytes();
      }
    } else {
      written = write->Write(view);
    }
    CheckClientError(written, "WriteTensor");
    if (!written.ok()) {
      failed = true;
      break;
    }
    const uint64_t offset = view.fields.offset();
    if (view.data_bytes == 0) continue;
    Check(offset >= begin && offset + view.data_bytes <= end,
          "a chunk outside the declared range was written");
    Check(end <= model.size(), "a range past the tensor's end was declared");
    staged.replace(offset, view.data_bytes, Data(view));
  }
  // A call that failed or ended short changes nothing.
  if (write != nullptr && !failed) {
    const absl::Status finished = write->Finish();
    Check(finished.ok() == (write->bytes_written() == end - begin),
          "Finish disagrees with the bytes written", finished);
    if (finished.ok()) model = staged;
  }
  ReadBack(session, plan, model);
  write.reset();  // it holds the tensor: gone before the session closes
  env.CloseAndCheck(std::move(session));
}

}  // namespace
}  // namespace komputed::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  komputed::fuzz::InitProcess();
  komputed::fuzz::SessionEnv::Get();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  komputed::fuzz::Run(in);
  return 0;
}
