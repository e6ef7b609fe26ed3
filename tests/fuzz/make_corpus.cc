// fuzz_make_corpus DIR: writes the seed corpora of the fuzz targets into DIR/<target>/: the
// repository's shaders (core/shaders/multiply.comp and the test suites' shaders) compiled to
// SPIR-V, and real requests serialized, in each target's input format. Run it again after a
// change of an input format:
//   build-fuzz/fuzz/fuzz_make_corpus tests/fuzz/corpus
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/test_device.h"
#include "glslc_script.h"
#include "komputed/core/shader.h"
#include "komputed/v1/komputed.pb.h"
#include "komputed/v1/shared_memory_wire.h"
#include "session_script.pb.h"
#include "support/bytes.h"
#include "support/requests.h"

namespace komputed::fuzz {
namespace {

namespace ts = test_support;

// Specialization constants and a local size taken from one (as the kp tests use them).
constexpr char kSpecShader[] = R"(#version 450
layout(local_size_x_id = 1) in;
layout(constant_id = 0) const float kScale = 2.0;
layout(set = 0, binding = 0) buffer Out { float out_v[]; };
void main() { out_v[gl_GlobalInvocationID.x] *= kScale; }
)";

// From the kp tests: two dimensions, push constants of two ints.
constexpr char k2DShader[] = R"(#version 450
layout(local_size_x = 1, local_size_y = 1) in;
layout(set = 0, binding = 0) buffer Out { uint out_v[]; };
void main() {
  uint x = gl_GlobalInvocationID.x, y = gl_GlobalInvocationID.y;
  out_v[y * 4 + x] = x + 100 * y;
}
)";
constexpr char kPushShader[] = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer Out { int out_v[]; };
layout(push_constant) uniform Push { int a; int b; } push;
void main() { out_v[0] = push.a; out_v[1] = push.b; }
)";

struct Shader {
  const char* name;
  const char* glsl;  // null: the built-in multiply
  int tensors;
  int push_bytes;
};
const Shader kShaders[] = {
    {"multiply", nullptr, 3, 0},     {"scale", ts::kScaleShader, 2, 4},
    {"add", core::kAddShader, 2, 0}, {"affine", core::kAffineShader, 2, 8},
    {"spec", kSpecShader, 1, 0},     {"two_d", k2DShader, 1, 0},
    {"push", kPushShader, 1, 8},     {"busy", core::kBusyShader, 1, 4},
};

std::vector<uint32_t> Spirv(const Shader& shader) {
  if (shader.glsl == nullptr) {
    absl::Span<const uint32_t> words = *core::MultiplyShader(core::ElementType::kFloat32);
    return {words.begin(), words.end()};
  }
  absl::StatusOr<std::vector<uint32_t>> spirv = core::CompileGlsl(shader.glsl, shader.name);
  if (!spirv.ok()) {
    std::fprintf(stderr, "%s: %s\n", shader.name, spirv.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(spirv);
}

std::string Bytes(const std::vector<uint32_t>& words) {
  return std::string(reinterpret_cast<const char*>(words.data()), words.size() * 4);
}

void Write(const std::filesystem::path& dir, const std::string& name, const std::string& bytes) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

// ----- fuzz_session: serialized SessionScripts.

v1::Command Call(const v1::CreateTensorRequest& r) {
  v1::Command c;
  *c.mutable_create_tensor() = r;
  return c;
}
v1::Command Call(const v1::CreateAlgorithmRequest& r) {
  v1::Command c;
  *c.mutable_create_algorithm() = r;
  return c;
}
v1::Command Sequence(uint64_t handle, uint32_t timestamps) {
  v1::Command c;
  c.mutable_create_sequence()->set_handle(handle);
  c.mutable_create_sequence()->set_total_timestamps(timestamps);
  return c;
}
v1::Command Record(uint64_t sequence, const std::vector<v1::Operation>& ops) {
  v1::Command c;
  c.mutable_record()->set_sequence(sequence);
  for (const v1::Operation& op : ops) *c.mutable_record()->add_actions()->mutable_record() = op;
  return c;
}
v1::Operation Dispatch(uint64_t algorithm) {
  v1::Operation op;
  op.mutable_dispatch()->set_algorithm(algorithm);
  return op;
}

v1::CreateAlgorithmRequest SpirvAlgorithm(uint64_t handle, std::vector<uint64_t> tensors,
                                          const Shader& shader, uint32_t x, std::string push) {
  v1::CreateAlgorithmRequest r;
  r.set_handle(handle);
  for (uint64_t t : tensors) r.add_tensors(t);
  r.set_spirv(Bytes(Spirv(shader)));
  r.mutable_workgroup()->set_x(x);
  r.mutable_workgroup()->set_y(1);
  r.mutable_workgroup()->set_z(1);
  r.set_push_constants(std::move(push));
  return r;
}

void SessionCorpus(const std::filesystem::path& dir) {
  const std::vector<float> four = {1, 2, 3, 4};
  const std::string scale = ts::FloatBytes({2.0f});
  // Kompute's array multiplication, call by call, then one eval.
  {
    SessionScript s;
    *s.add_steps()->mutable_call() = Call(ts::FloatTensor("", 1, four));
    *s.add_steps()->mutable_call() = Call(ts::FloatTensor("", 2, four));
    *s.add_steps()->mutable_call() = Call(ts::FloatTensor("", 3, {0, 0, 0, 0}));
    *s.add_steps()->mutable_call() = Call(SpirvAlgorithm(1, {1, 2, 3}, kShaders[0], 4, ""));
    *s.add_steps()->mutable_call() = Sequence(1, 0);
    *s.add_steps()->mutable_call() =
        Record(1, {ts::SyncDevice({1, 2}), Dispatch(1), ts::SyncLocal({3})});
    v1::EvalRequest* eval = s.add_steps()->mutable_eval();
    eval->set_sequence(1);
    eval->add_downloads(3);
    s.add_steps()->set_describe(true);
    Write(dir, "multiply_calls", s.SerializeAsString());
  }
  // The same pipelined into one eval, with an upload and timestamps.
  {
    SessionScript s;
    v1::EvalRequest* eval = s.add_steps()->mutable_eval();
    *eval->add_commands() = Call(ts::FloatTensor("", 1, four));
    *eval->add_commands() = Call(ts::FloatTensor("", 2, four, v1::MEMORY_TYPE_HOST));
    *eval->add_commands() = Call(SpirvAlgorithm(5, {1, 2}, kShaders[1], 4, scale));
    *eval->add_commands() = Sequence(7, 4);
    *eval->add_commands() = Record(7, {ts::SyncDevice({1}), Dispatch(5), ts::SyncLocal({2})});
    eval->set_sequence(7);
    v1::TensorData* up = eval->add_uploads();
    up->set_handle(1);
    up->set_offset(4);
    up->set_data(ts::FloatBytes({9}));
    eval->add_downloads(2);
    eval->set_timeout_ms(50);
    s.add_steps()->mutable_timestamps()->set_handle(7);
    // Again, inline, with other push constants.
    v1::EvalRequest* again = s.add_steps()->mutable_eval();
    v1::Command push;
    push.mutable_set_push_constants()->set_handle(5);
    push.mutable_set_push_constants()->set_push_constants(ts::FloatBytes({3}));
    *again->add_commands() = push;
    v1::Command rerecord;
    rerecord.mutable_record()->set_sequence(7);
    rerecord.mutable_record()->add_actions()->set_clear(true);
    rerecord.mutable_record()->add_actions()->mutable_record()->mutable_dispatch()->set_algorithm(
        5);
    *again->add_commands() = rerecord;
    again->set_sequence(7);
    again->set_request_id(1);
    again->add_downloads(2);
    Write(dir, "scale_eval", s.SerializeAsString());
  }
  // A rebuild, copies, barriers and destruction.
  {
    SessionScript s;
    *s.add_steps()->mutable_call() = Call(ts::FloatTensor("", 1, four));
    *s.add_steps()->mutable_call() =
        Call(ts::FloatTensor("", 2, four, v1::MEMORY_TYPE_DEVICE_AND_HOST));
    *s.add_steps()->mutable_call() = Call(ts::FloatTensor("", 3, four, v1::MEMORY_TYPE_STORAGE));
    *s.add_steps()->mutable_call() = Call(SpirvAlgorithm(2, {1, 2}, kShaders[2], 4, ""));
    v1::Command rebuild;
    *rebuild.mutable_rebuild_algorithm() =
        SpirvAlgorithm(2, {2, 1}, kShaders[3], 2, ts::FloatBytes({2, 1}));
    *s.add_steps()->mutable_call() = rebuild;
    *s.add_steps()->mutable_call() = Sequence(3, 0);
    v1::Operation copy;
    for (uint64_t t : {1, 2, 3}) copy.mutable_copy()->add_tensors(t);
    v1::Operation barrier;
    barrier.mutable_barrier()->add_tensors(2);
    barrier.mutable_barrier()->set_src_access(0x40);  // shader write
    barrier.mutable_barrier()->set_dst_access(0x20);  // shader read
    barrier.mutable_barrier()->set_src_stage(0x800);  // compute shader
    barrier.mutable_barrier()->set_dst_stage(0x800);
    barrier.mutable_barrier()->set_primary(true);
    *s.add_steps()->mutable_call() = Record(3, {ts::SyncDevice({1}), copy, barrier, Dispatch(2)});
    v1::Command rerecord;
    rerecord.mutable_record()->set_sequence(3);
    rerecord.mutable_record()->add_actions()->set_rerecord(true);
    *s.add_steps()->mutable_call() = rerecord;
    s.add_steps()->mutable_eval()->set_sequence(3);
    v1::Command destroy;
    destroy.mutable_destroy_tensor()->set_handle(1);
    *s.add_steps()->mutable_call() = destroy;
    destroy.mutable_destroy_algorithm()->set_handle(2);
    *s.add_steps()->mutable_call() = destroy;
    destroy.mutable_destroy_sequence()->set_handle(3);
    *s.add_steps()->mutable_call() = destroy;
    Write(dir, "rebuild_copy_destroy", s.SerializeAsString());
  }
  // GLSL compiled by the daemon, spec constants, raw bytes and int tensors.
  {
    SessionScript s;
    v1::EvalRequest* eval = s.add_steps()->mutable_eval();
    *eval->add_commands() = Call(ts::FloatTensor("", 1, four));
    v1::CreateTensorRequest bytes;
    bytes.set_handle(2);
    bytes.set_element_type(v1::ELEMENT_TYPE_BYTES);
    bytes.set_element_size(3);
    bytes.set_count(5);
    bytes.set_memory_type(v1::MEMORY_TYPE_HOST);
    *eval->add_commands() = Call(bytes);
    *eval->add_commands() = Call(ts::GlslAlgorithm("", 3, {1}, kSpecShader, 4, ""));
    v1::CreateAlgorithmRequest spec = SpirvAlgorithm(4, {1}, kShaders[4], 4, "");
    spec.set_spec_constants(ts::FloatBytes({3}) + ts::UintBytes({1}));
    *eval->add_commands() = Call(spec);
    *eval->add_commands() = Sequence(1, 2);
    *eval->add_commands() = Record(1, {Dispatch(3), Dispatch(4), ts::SyncLocal({1})});
    eval->set_sequence(1);
    eval->add_downloads(1);
    eval->add_downloads(2);
    Write(dir, "glsl_spec", s.SerializeAsString());
  }
}

// ----- fuzz_tensor_chunk: FuzzedDataProvider's format, written the way the target reads it:
// strings from the front, numbers from the back (most significant byte last in the file).
class ProviderInput {
 public:
  void String(const std::string& s) {
    for (char c : s) {
      front_ += c;
      if (c == '\\') front_ += '\\';
    }
    front_ += "\\ ";  // a backslash and another byte end the string
  }
  void Integer(uint64_t min, uint64_t max, uint64_t value) {
    const uint64_t range = max - min;
    std::vector<uint8_t> bytes;
    uint64_t v = value - min;
    for (int offset = 0; offset < 64 && (range >> offset) > 0; offset += 8) {
      bytes.push_back(static_cast<uint8_t>(v & 0xff));
      v >>= 8;
    }
    // The first byte consumed (the last in the file) is the most significant.
    for (auto it = bytes.rbegin(); it != bytes.rend(); ++it) back_.push_back(*it);
  }
  std::string Bytes() const { return front_ + std::string(back_.rbegin(), back_.rend()); }

 private:
  std::string front_;
  std::vector<char> back_;  // in the order consumed
};

std::string Chunk(uint64_t handle, uint64_t total, uint64_t offset, const std::string& data) {
  v1::TensorChunk c;
  c.set_session_id("s");
  c.set_handle(handle);
  c.set_total_bytes(total);
  c.set_offset(offset);
  c.set_data(data);
  return c.SerializeAsString();
}

void TensorChunkCorpus(const std::filesystem::path& dir) {
  struct Seed {
    const char* name;
    int memory;  // the target's PickValueInArray index
    uint64_t bytes, read_offset, read_length, chunk_bytes, max_chunk;
    std::vector<std::string> messages;
    int pieces;
  };
  const std::string a(64, 'a'), b(32, 'b');
  const std::vector<Seed> seeds = {
      {"whole", 0, 64, 0, 0, 0, 16, {Chunk(1, 64, 0, a)}, 1},
      {"two_chunks", 1, 96, 8, 40, 7, 2048, {Chunk(1, 96, 0, a), Chunk(0, 0, 64, b)}, 2},
      {"out_of_order",
       2,
       128,
       0,
       0,
       1024,
       33,
       {Chunk(1, 96, 96, b), Chunk(0, 0, 32, a), Chunk(0, 0, 0, b)},
       3},
      {"overlap", 0, 100, 0, 0, 0, 64, {Chunk(1, 80, 10, a), Chunk(0, 0, 40, b)}, 4},
      {"storage", 3, 16, 0, 0, 0, 1, {Chunk(1, 16, 0, std::string(16, 'x'))}, 1},
      {"short", 0, 4096, 4000, 96, 50, 2048, {Chunk(1, 200, 4000, b)}, 2},
  };
  for (const Seed& seed : seeds) {
    ProviderInput in;
    in.Integer(0, 3, seed.memory);
    in.Integer(1, 4096, seed.bytes);
    in.Integer(0, seed.bytes + 1, seed.read_offset);
    in.Integer(0, seed.bytes + 1, seed.read_length);
    in.Integer(0, 1024, seed.chunk_bytes);
    in.Integer(1, 2048, seed.max_chunk);
    in.Integer(0, 16, seed.messages.size());
    for (const std::string& m : seed.messages) {
      in.String(m);
      in.Integer(1, 4, seed.pieces);
      for (int p = 1; p < seed.pieces; ++p) in.Integer(0, m.size(), m.size() * p / seed.pieces);
    }
    Write(dir, seed.name, in.Bytes());
  }
}

// ----- fuzz_spirv: 4 bytes of settings, then the module.
void SpirvCorpus(const std::filesystem::path& dir) {
  for (const Shader& shader : kShaders) {
    const std::string settings = {static_cast<char>(shader.tensors),
                                  static_cast<char>(shader.push_bytes),
                                  shader.glsl == kSpecShader ? '\x02' : '\0', '\x04'};
    Write(dir, shader.name, settings + Bytes(Spirv(shader)));
    // The same with the watchdog's cancel checks added.
    std::string watched = settings;
    watched[0] = static_cast<char>(watched[0] | 16);
    Write(dir, std::string(shader.name) + "_watchdog", watched + Bytes(Spirv(shader)));
  }
  // Each of the built-in multiply's element types, rebuilt.
  const core::ElementType types[] = {core::ElementType::kInt32, core::ElementType::kUInt32,
                                     core::ElementType::kFloat64};
  const char* names[] = {"multiply_int", "multiply_uint", "multiply_double"};
  for (int i = 0; i < 3; ++i) {
    absl::Span<const uint32_t> words = *core::MultiplyShader(types[i]);
    Write(dir, names[i], std::string("\x0b\0\0\x01", 4) + Bytes({words.begin(), words.end()}));
  }
}

// ----- fuzz_glsl: the sources.
void GlslCorpus(const std::filesystem::path& dir) {
  for (const Shader& shader : kShaders) {
    if (shader.glsl != nullptr) Write(dir, shader.name, shader.glsl);
  }
  Write(dir, "syntax_error", "#version 450\nlayout(local_size_x = 1) in;\nvoid main() { x = ; }\n");
}

// ----- fuzz_glsl_pipe: a settings byte, then the script (glslc_script.h) and more source.
void GlslPipeCorpus(const std::filesystem::path& dir) {
  using K = ScriptStep::Kind;
  struct Seed {
    const char* name;
    uint8_t settings;
    std::vector<std::pair<K, uint8_t>> steps;
  };
  const std::vector<Seed> seeds = {
      {"compiles", 0, {{K::kRead, 255}, {K::kOut, 4}, {K::kExit, 0}}},
      {"compile_error", 1, {{K::kRead, 1}, {K::kErr, 40}, {K::kExit, 1}}},
      {"too_much_spirv", 0, {{K::kOut, 200}, {K::kExit, 0}}},
      {"partial_word", 0, {{K::kOut, 1}, {K::kErr, 1}, {K::kCloseOut, 0}, {K::kExit, 0}}},
      {"reads_nothing", 14, {{K::kCloseIn, 0}, {K::kOut, 2}, {K::kExit, 0}}},
      {"crashes", 1, {{K::kRead, 4}, {K::kSignal, 0}}},
      {"crashes_unbounded", 0, {{K::kSignal, 1}}},
      {"killed", 0, {{K::kOut, 1}, {K::kSignal, 2}}},
      {"slow", 0, {{K::kSleep, 255}, {K::kSleep, 255}, {K::kOut, 1}}},
      {"busy", 4, {{K::kSpin, 40}, {K::kErr, 255}, {K::kExit, 2}}},
      {"not_started", 0, {{K::kExit, 3}}},
      // Found by fuzzing: a child that closed both outputs was waited for past the wall time.
      {"closes_output_then_sleeps", 0, {{K::kCloseOut, 0}, {K::kCloseErr, 0}, {K::kSleep, 255}}},
  };
  for (const Seed& seed : seeds) {
    std::string bytes(1, static_cast<char>(seed.settings));
    bytes += static_cast<char>(seed.steps.size());
    for (const auto& [kind, amount] : seed.steps) {
      bytes += static_cast<char>(kind);
      bytes += static_cast<char>(amount);
    }
    bytes += "#version 450\nvoid main() {}\n";
    Write(dir, seed.name, bytes);
  }
}

// ----- fuzz_channel: whole records of the shared-memory socket, as a client sends them and as
// the daemon answers.
void ChannelCorpus(const std::filesystem::path& dir) {
  namespace wire = v1::wire;
  const std::string ticket(wire::kSharedMemoryTicketSize, 'a');
  Write(dir, "bind", wire::EncodeChannelRequest(wire::ChannelOp::kBind, ticket));
  v1::EvalRequest eval;
  eval.set_sequence(4);
  eval.set_stage_times(true);
  v1::TensorData* upload = eval.add_uploads();
  upload->set_handle(1);
  upload->set_data(std::string(16, '\x01'));
  Write(dir, "eval", wire::EncodeChannelRequest(wire::ChannelOp::kEval, eval.SerializeAsString()));
  Write(dir, "submit", wire::EncodeChannelSubmit(7, eval.SerializeAsString()));
  v1::EvalResponse response;
  response.add_timestamps_ns(1);
  response.add_timestamps_ns(2);
  Write(dir, "answer", wire::EncodeChannelReply(absl::OkStatus(), response.SerializeAsString()));
  Write(dir, "submit_answer",
        wire::EncodeChannelSubmitReply(7, absl::OkStatus(), response.SerializeAsString()));
  Write(dir, "refusal",
        wire::EncodeChannelSubmitReply(8, absl::InvalidArgumentError("not an EvalRequest"), ""));
}

}  // namespace
}  // namespace komputed::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  komputed::fuzz::SessionCorpus(dir / "session");
  komputed::fuzz::TensorChunkCorpus(dir / "tensor_chunk");
  komputed::fuzz::SpirvCorpus(dir / "spirv");
  komputed::fuzz::GlslCorpus(dir / "glsl");
  komputed::fuzz::GlslPipeCorpus(dir / "glsl_pipe");
  komputed::fuzz::ChannelCorpus(dir / "channel");
  return 0;
}
