// fuzz_channel: the records of the daemon's shared-memory socket (komputed/v1/shared_memory_wire.h)
// that a same-host client sends and receives: channel requests (bind, eval, submit), their
// answers, and shared-memory requests.
//
// The whole input is one record, read by every decoder. Checked, besides crashes and sanitizer
// reports: a request that decodes encodes back to the same bytes (and a submit's id and request
// likewise); a shared-memory request without its descriptor is always refused; the input is a
// channel record exactly when it starts with the channel's magic. Then the input's bytes make an
// answer (id, status, response) that must decode back to what was encoded, the status message cut
// at 4096 bytes. The input also stands as the first bytes of a ring (ChannelRing): what a client
// writes there is taken at most a record's size.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "komputed/v1/shared_memory_wire.h"

namespace {

namespace wire = komputed::v1::wire;

void Check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "fuzz check failed: %s\n", what);
    std::abort();
  }
}

void Requests(const std::string& record) {
  wire::ChannelOp op;
  absl::string_view payload;
  if (wire::DecodeChannelRequest(record, &op, &payload).ok()) {
    Check(op == wire::ChannelOp::kBind || op == wire::ChannelOp::kEval ||
              op == wire::ChannelOp::kSubmit || op == wire::ChannelOp::kRing ||
              op == wire::ChannelOp::kDoorbell,
          "a decoded request has a known op");
    Check(wire::EncodeChannelRequest(op, payload) == record, "a request encodes back as it came");
    Check(wire::IsChannelRecord(record), "a decoded request is a channel record");
    if (op == wire::ChannelOp::kSubmit) {
      uint64_t id = 0;
      absl::string_view request;
      const bool ok = wire::DecodeChannelSubmit(payload, &id, &request).ok();
      Check(ok == (payload.size() >= sizeof(id)), "a submit decodes exactly when it holds an id");
      if (ok) {
        Check(wire::EncodeChannelSubmit(id, request) == record, "a submit encodes back");
      }
    }
  }
  Check(wire::IsChannelRecord(record) ==
            (record.size() >= 4 && wire::IsChannelRecord(record.substr(0, 4))),
        "a channel record is told by its first four bytes");
  // No descriptor came with it: refused, whatever the bytes.
  Check(!wire::ParseSharedMemory({record, {}}).ok(), "a shared-memory request without its fd");
  // The answers' decoders take any bytes.
  (void)wire::DecodeChannelReply(record);
  uint64_t id = 0;
  (void)wire::DecodeChannelSubmitReply(record, &id);
}

// The input as a ring's first bytes (its header words, what a client may write there at any
// time): a request is taken only at its size, at most a record's, and its answer comes back whole.
void Ring(const std::string& bytes) {
  static std::string memory(wire::kRingBytes, '\0');
  std::fill(memory.begin(), memory.begin() + wire::kRingHeaderBytes + 64, '\0');
  std::copy_n(bytes.begin(), std::min(bytes.size(), memory.size()), memory.begin());
  wire::ChannelRing ring(memory.data(), nullptr);
  absl::StatusOr<std::string> request = ring.TakeRequest();
  Check(!request.ok() || request->size() <= wire::kMaxChannelRecord, "a request fits a record");
  const std::string answer = bytes.substr(0, wire::kMaxChannelRecord);
  ring.PutAnswer(ring.request_seq(), answer);
  Check(ring.answer_seq() == ring.request_seq(), "an answer is published under its request");
  absl::StatusOr<std::string> taken = ring.TakeAnswer();
  Check(taken.ok() && *taken == answer, "an answer comes back as it was put");
}

void Answers(FuzzedDataProvider& in) {
  const uint64_t id = in.ConsumeIntegral<uint64_t>();
  const auto code = static_cast<absl::StatusCode>(in.ConsumeIntegralInRange<int>(0, 16));
  const std::string message = in.ConsumeRandomLengthString(8192);
  const std::string response = in.ConsumeRemainingBytesAsString();
  const absl::Status status(code, message);
  const std::string cut = message.substr(0, 4096);

  uint64_t decoded_id = 0;
  absl::StatusOr<std::string> submit = wire::DecodeChannelSubmitReply(
      wire::EncodeChannelSubmitReply(id, status, response), &decoded_id);
  Check(decoded_id == id, "a submit answer keeps its id");
  Check(submit.status().code() == code, "a submit answer keeps its code");
  if (status.ok()) {
    Check(submit.ok() && *submit == response, "an OK submit answer keeps its response");
  } else {
    Check(submit.status().message() == cut, "a submit answer keeps its message, cut");
  }
  absl::StatusOr<std::string> eval =
      wire::DecodeChannelReply(wire::EncodeChannelReply(status, response));
  Check(eval.status().code() == code, "an answer keeps its code");
  if (status.ok()) {
    Check(eval.ok() && *eval == response, "an OK answer keeps its payload");
  } else {
    Check(eval.status().message() == cut, "an answer keeps its message, cut");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Requests(std::string(reinterpret_cast<const char*>(data), size));
  Ring(std::string(reinterpret_cast<const char*>(data), size));
  FuzzedDataProvider in(data, size);
  Answers(in);
  return 0;
}
