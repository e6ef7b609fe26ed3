// komputectl: inspect a komputed daemon and try kernels on it.
//
//   komputectl devices                      devices, memory, queue families, limits (of every
//                                           daemon, when the address names several)
//   komputectl health [--service=NAME]      grpc.health.v1 status (exit 0 only when SERVING)
//   komputectl sessions                     open sessions with their memory and age
//   komputectl run --shader=FILE --tensors=SPEC,... [--workgroup=X,Y,Z] [--push=...] [--spec=...]
//   komputectl bench [--seconds=N] [--megabytes=N]
//
// The daemon is --address, else $KOMPUTED_ADDRESS, else 127.0.0.1:50051. Credentials: --token or
// --token_file, --tls_ca, --tls_cert and --tls_key, each flag left empty falling back to its
// environment variable (KOMPUTED_TOKEN, KOMPUTED_TOKEN_FILE, KOMPUTED_TLS_CA, ...) as in kp.
// Errors are one line on stderr and a non-zero exit status.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <kompute/Kompute.hpp>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "komputed/v1/komputed.grpc.pb.h"
#include "remote/credentials.h"
#include "remote/placement.h"
#include "remote/target.h"

ABSL_FLAG(std::string, address, "",
          "komputed's address (host:port, or a target naming several daemons: "
          "dns:///NAME:PORT, ipv4:A:P,B:P); default $KOMPUTED_ADDRESS, else 127.0.0.1:50051");
ABSL_FLAG(std::string, token, "",
          "the bearer token sent on every call; default $KOMPUTED_TOKEN (--token_file, "
          "$KOMPUTED_TOKEN_FILE: a file holding it)");
ABSL_FLAG(std::string, token_file, "",
          "a file holding the token (trailing whitespace trimmed); default $KOMPUTED_TOKEN_FILE");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the CA of the daemon's certificate, which turns TLS on; default "
          "$KOMPUTED_TLS_CA");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM file of a client certificate (mTLS), with --tls_key; default $KOMPUTED_TLS_CERT");
ABSL_FLAG(std::string, tls_key, "",
          "PEM file of the client certificate's private key; default $KOMPUTED_TLS_KEY");
ABSL_FLAG(double, timeout, 30, "seconds to wait for each call");
ABSL_FLAG(bool, include_ids, false,
          "sessions: an admin tenant sees other tenants' session ids too (they are left out "
          "otherwise)");
ABSL_FLAG(std::string, service, "", "health: the service to check (\"\" = the whole server)");
ABSL_FLAG(uint32_t, device, 0, "run, bench: the daemon's device index");
ABSL_FLAG(std::string, shader, "", "run: a GLSL compute shader (.comp, .glsl) or SPIR-V (.spv)");
ABSL_FLAG(std::string, tensors, "",
          "run: the bindings in order, comma-separated, each TYPE:SOURCE[=OUTPUT]; TYPE is "
          "float32|float64|float16|int32|uint32|int16|uint16|int8|uint8; SOURCE a file (raw "
          "little-endian, or numbers in a .txt "
          "file) or zeros:COUNT; OUTPUT a file (.txt: numbers, else raw) written after the run");
ABSL_FLAG(std::string, workgroup, "0,1,1",
          "run: workgroups X,Y,Z (X = 0: the first tensor's element count)");
ABSL_FLAG(std::string, push, "", "run: push constants, comma-separated numbers of --const_type");
ABSL_FLAG(std::string, spec, "", "run: specialization constants, comma-separated --const_type");
ABSL_FLAG(std::string, const_type, "float32", "run: type of --push and --spec values");
ABSL_FLAG(double, seconds, 3, "bench: seconds for each latency measurement");
ABSL_FLAG(uint64_t, megabytes, 256, "bench: MiB moved in each direction for bandwidth");

namespace {

namespace v1 = komputed::v1;
using kp::internal::remote::ClientCredentials;
using kp::internal::remote::CredentialSettings;
using kp::internal::remote::Endpoint;

[[noreturn]] void Fail(const std::string& message, int status = 1) {
  std::fprintf(stderr, "komputectl: error: %s\n", message.c_str());
  std::exit(status);
}

std::string Address() {
  std::string a = absl::GetFlag(FLAGS_address);
  if (!a.empty()) return a;
  const char* env = std::getenv("KOMPUTED_ADDRESS");
  return env != nullptr && env[0] != '\0' ? env : "127.0.0.1:50051";
}

// The credential flags, named as typed; empty ones fall back to the environment.
CredentialSettings Settings() {
  CredentialSettings s;
  s.token = {absl::GetFlag(FLAGS_token), "--token"};
  s.token_file = {absl::GetFlag(FLAGS_token_file), "--token_file"};
  s.tls_ca = {absl::GetFlag(FLAGS_tls_ca), "--tls_ca"};
  s.tls_cert = {absl::GetFlag(FLAGS_tls_cert), "--tls_cert"};
  s.tls_key = {absl::GetFlag(FLAGS_tls_key), "--tls_key"};
  s.command_line = true;
  return s;
}

// Loaded once, before any command runs (main), so that a bad setting is reported under the
// name the user gave it.
const ClientCredentials& Credentials() {
  static const std::shared_ptr<const ClientCredentials> credentials = [] {
    absl::StatusOr<std::shared_ptr<const ClientCredentials>> c =
        ClientCredentials::Load(Settings());
    if (!c.ok()) Fail(std::string(c.status().message()));
    return *std::move(c);
  }();
  return *credentials;
}

std::shared_ptr<grpc::Channel> Channel() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  return Credentials().CreateChannel(Address(), args);
}

// The daemon for kp::Manager, with the same credentials as the channels above: the token is
// resolved here (kp::Remote takes the token's text, not a file).
kp::Remote RemoteOf() {
  kp::Remote remote{Address(), absl::GetFlag(FLAGS_device), {}};
  absl::StatusOr<std::string> token = kp::internal::remote::ResolveToken(Settings());
  if (!token.ok()) Fail(std::string(token.status().message()));
  remote.token = *std::move(token);
  remote.tlsCa = absl::GetFlag(FLAGS_tls_ca);
  remote.tlsCert = absl::GetFlag(FLAGS_tls_cert);
  remote.tlsKey = absl::GetFlag(FLAGS_tls_key);
  return remote;
}

void SetDeadline(grpc::ClientContext& c) {
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(
                                                        absl::GetFlag(FLAGS_timeout) * 1000)));
}

// "listing sessions at ADDRESS: MESSAGE (code N); HINT"
std::string CallError(const grpc::Status& s, const std::string& what, const std::string& where) {
  const std::string hint = Credentials().Hint(s.error_code(), s.error_message());
  return absl::StrCat(what, " at ", where, ": ", s.error_message(), " (code ",
                      static_cast<int>(s.error_code()), ")", hint.empty() ? "" : "; ", hint);
}

void Check(const grpc::Status& s, const std::string& what) {
  if (!s.ok()) Fail(CallError(s, what, Address()));
}

// The daemons that the address names; a malformed address ends the program (status 2).
std::vector<Endpoint> Daemons() {
  absl::StatusOr<std::vector<Endpoint>> endpoints = kp::internal::remote::ResolveTarget(Address());
  if (!endpoints.ok()) Fail(std::string(endpoints.status().message()), 2);
  return *std::move(endpoints);
}

// A channel to one daemon of several, its certificate checked against the name that resolved
// to it.
std::shared_ptr<grpc::Channel> ChannelTo(const Endpoint& daemon) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  return Credentials().CreateChannel(daemon.target, args, daemon.tls_name);
}

// Calls every daemon at once, each call within --timeout: `call`'s results in the order of
// `daemons`.
template <typename Result>
std::vector<Result> AskEach(const std::vector<Endpoint>& daemons,
                            const std::function<Result(const Endpoint&)>& call) {
  std::vector<Result> results(daemons.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < daemons.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = call(daemons[i]); });
  }
  for (auto& t : threads) t.join();
  return results;
}

std::string Bytes(uint64_t b) {
  if (b >= (uint64_t{1} << 30)) return absl::StrFormat("%.1f GiB", b / double(1 << 30));
  if (b >= (uint64_t{1} << 20)) return absl::StrFormat("%.1f MiB", b / double(1 << 20));
  if (b >= 1024) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrCat(b, " B");
}

// Prints rows as columns padded to the widest cell.
void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows) {
    width.resize(std::max(width.size(), r.size()));
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    std::cout << line << "\n";
  }
}

const char* TypeName(uint32_t t) {
  switch (t) {
    case 1:
      return "integrated";
    case 2:
      return "discrete";
    case 3:
      return "virtual";
    case 4:
      return "cpu";
    default:
      return "other";
  }
}

std::vector<std::string> DeviceRow(const v1::DeviceInfo& d) {
  std::vector<std::string> families;
  for (const auto& f : d.queue_families()) {
    std::string caps =
        absl::StrCat(f.graphics() ? "g" : "", f.compute() ? "c" : "", f.transfer() ? "t" : "");
    families.push_back(
        absl::StrCat(f.index(), ":", caps.empty() ? "-" : caps, "x", f.queue_count()));
  }
  const auto& l = d.limits();
  std::string wg =
      l.max_compute_work_group_count_size() == 3
          ? absl::StrCat(l.max_compute_work_group_count(0), "x", l.max_compute_work_group_count(1),
                         "x", l.max_compute_work_group_count(2))
          : "?";
  return {absl::StrCat(d.index()),
          d.name(),
          absl::StrCat(TypeName(d.device_type()), d.lost() ? " (lost)" : ""),
          Bytes(d.memory_bytes()),
          Bytes(d.memory_in_use_bytes()),
          absl::StrCat(d.sessions()),
          absl::StrJoin(families, " "),
          wg,
          absl::StrCat(l.max_push_constants_size(), " B"),
          Bytes(l.max_storage_buffer_range())};
}

std::vector<std::string> DeviceColumns() {
  return {"INDEX",    "NAME",           "TYPE",           "MEMORY", "IN USE",
          "SESSIONS", "QUEUE FAMILIES", "MAX WORKGROUPS", "PUSH",   "STORAGE RANGE"};
}

// One daemon: its devices. Several (a target such as dns:///komputed-headless.NS.svc:50051 or
// ipv4:A:P,B:P): every device of every daemon, asked all at once, with a DAEMON column; a daemon
// that does not answer is reported on stderr and makes the exit status 1.
int Devices() {
  const std::vector<Endpoint> endpoints = Daemons();
  std::vector<std::vector<std::string>> rows;
  if (endpoints.size() == 1) {
    auto stub = v1::Devices::NewStub(Channel());
    grpc::ClientContext c;
    SetDeadline(c);
    v1::ListDevicesResponse r;
    Check(stub->ListDevices(&c, v1::ListDevicesRequest(), &r), "listing devices");
    rows.push_back(DeviceColumns());
    for (const auto& d : r.devices()) rows.push_back(DeviceRow(d));
    PrintTable(rows);
    return 0;
  }
  const std::vector<kp::internal::remote::DaemonReport> reports =
      kp::internal::remote::QueryDaemons(endpoints, Credentials(),
                                         absl::Seconds(absl::GetFlag(FLAGS_timeout)));
  rows.push_back(DeviceColumns());
  rows.front().insert(rows.front().begin(), "DAEMON");
  int status = 0;
  for (const auto& report : reports) {
    if (!report.status.ok()) {
      std::fprintf(stderr, "komputectl: error: listing devices at %s: %s\n",
                   report.endpoint.name.c_str(), std::string(report.status.message()).c_str());
      status = 1;
      continue;
    }
    for (const auto& d : report.devices) {
      rows.push_back(DeviceRow(d));
      rows.back().insert(rows.back().begin(), report.endpoint.name);
    }
  }
  PrintTable(rows);
  return status;
}

// One daemon: its status, exit status 0 when SERVING. Several: a table of each daemon's status,
// asked all at once; 0 when every one is SERVING.
int Health() {
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(absl::GetFlag(FLAGS_service));
  const std::vector<Endpoint> daemons = Daemons();
  if (daemons.size() == 1) {
    auto stub = grpc::health::v1::Health::NewStub(Channel());
    grpc::ClientContext c;
    SetDeadline(c);
    grpc::health::v1::HealthCheckResponse resp;
    Check(stub->Check(&c, req, &resp), "health check");
    std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status()) << "\n";
    return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
  }
  struct Answer {
    grpc::Status status;
    grpc::health::v1::HealthCheckResponse response;
  };
  const std::vector<Answer> answers = AskEach<Answer>(daemons, [&](const Endpoint& daemon) {
    Answer a;
    grpc::ClientContext c;
    SetDeadline(c);
    a.status = grpc::health::v1::Health::NewStub(ChannelTo(daemon))->Check(&c, req, &a.response);
    return a;
  });
  std::vector<std::vector<std::string>> rows = {{"DAEMON", "STATUS"}};
  int status = 0;
  for (size_t i = 0; i < daemons.size(); ++i) {
    const Answer& a = answers[i];
    if (!a.status.ok()) {
      std::fprintf(stderr, "komputectl: error: %s\n",
                   CallError(a.status, "health check", daemons[i].name).c_str());
      rows.push_back({daemons[i].name, "UNREACHABLE"});
      status = 1;
      continue;
    }
    rows.push_back({daemons[i].name, grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                                         a.response.status())});
    if (a.response.status() != grpc::health::v1::HealthCheckResponse::SERVING) status = 1;
  }
  PrintTable(rows);
  return status;
}

// The sessions of the daemon, or of every daemon that the address names (a DAEMON column first;
// a daemon that does not answer is named on stderr, and the exit status is 1).
int Sessions() {
  v1::ListSessionsRequest request;
  request.set_include_ids(absl::GetFlag(FLAGS_include_ids));
  const std::vector<Endpoint> daemons = Daemons();
  struct Answer {
    grpc::Status status;
    v1::ListSessionsResponse response;
  };
  auto ask = [&](const std::shared_ptr<grpc::Channel>& channel) {
    Answer a;
    grpc::ClientContext c;
    SetDeadline(c);
    a.status = v1::Sessions::NewStub(channel)->ListSessions(&c, request, &a.response);
    return a;
  };
  const bool several = daemons.size() > 1;
  std::vector<Answer> answers;
  if (several) {
    answers = AskEach<Answer>(daemons, [&](const Endpoint& d) { return ask(ChannelTo(d)); });
  } else {
    answers.push_back(ask(Channel()));
    Check(answers.front().status, "listing sessions");
  }
  std::vector<std::vector<std::string>> rows = {{"SESSION", "TENANT", "CLIENT", "PEER", "DEVICE",
                                                 "MEMORY", "TENSORS", "ALGORITHMS", "SEQUENCES",
                                                 "AGE", "IDLE"}};
  if (several) rows.front().insert(rows.front().begin(), "DAEMON");
  int status = 0;
  size_t listed = 0;
  for (size_t i = 0; i < answers.size(); ++i) {
    if (!answers[i].status.ok()) {
      std::fprintf(stderr, "komputectl: error: %s\n",
                   CallError(answers[i].status, "listing sessions", daemons[i].name).c_str());
      status = 1;
      continue;
    }
    for (const auto& s : answers[i].response.sessions()) {
      rows.push_back({s.session_id().empty() ? "-" : s.session_id(), s.tenant(), s.client_name(),
                      s.peer(), absl::StrCat(s.device_index()), Bytes(s.memory_bytes()),
                      absl::StrCat(s.tensors()), absl::StrCat(s.algorithms()),
                      absl::StrCat(s.sequences()),
                      absl::FormatDuration(absl::Milliseconds(s.age_ms())),
                      absl::FormatDuration(absl::Milliseconds(s.idle_ms()))});
      if (several) rows.back().insert(rows.back().begin(), daemons[i].name);
      ++listed;
    }
  }
  PrintTable(rows);
  if (listed == 0) std::cout << "(no sessions)\n";
  return status;
}

// ---- run

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail(absl::StrCat("cannot read ", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// An element type of --tensors and --const_type: its name, size and kp type; `encode` appends
// one value's bytes, false when the value is not one of the type (out of its range, or a
// fraction for an integer type); `decode` writes one element as text.
struct ElementType {
  const char* name;
  uint32_t size;
  kp::Memory::DataTypes data_type;
  bool (*encode)(double value, std::string& out);
  void (*decode)(const uint8_t* element, std::ostream& out);
};

template <typename T>
void AppendBytes(T value, std::string& out) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

template <typename T>
T FromBytes(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

template <typename Int>
bool EncodeInteger(double d, std::string& out) {
  if (!(d >= static_cast<double>(std::numeric_limits<Int>::min()) &&
        d <= static_cast<double>(std::numeric_limits<Int>::max()) && d == std::floor(d))) {
    return false;
  }
  AppendBytes(static_cast<Int>(d), out);
  return true;
}

template <typename Int>
void DecodeInteger(const uint8_t* p, std::ostream& out) {
  out << static_cast<int64_t>(FromBytes<Int>(p));
}

// Floating-point values are rounded to the nearest of the type; past its largest finite value
// they are refused rather than made infinite.
template <typename Float>
bool EncodeFloat(double d, std::string& out) {
  double largest = 65504.0;  // binary16's
  if constexpr (!std::is_same_v<Float, kp::float16>) largest = std::numeric_limits<Float>::max();
  if (std::isfinite(d) && std::fabs(d) > largest) return false;
  if constexpr (std::is_same_v<Float, kp::float16>) {
    AppendBytes(kp::float16(static_cast<float>(d)), out);
  } else {
    AppendBytes(static_cast<Float>(d), out);
  }
  return true;
}

template <typename Float>
void DecodeFloat(const uint8_t* p, std::ostream& out) {
  if constexpr (std::is_same_v<Float, kp::float16>) {
    out << static_cast<float>(FromBytes<kp::float16>(p));
  } else {
    out << FromBytes<Float>(p);
  }
}

constexpr ElementType kElementTypes[] = {
    {"float32", 4, kp::Memory::DataTypes::eFloat, EncodeFloat<float>, DecodeFloat<float>},
    {"float64", 8, kp::Memory::DataTypes::eDouble, EncodeFloat<double>, DecodeFloat<double>},
    {"float16", 2, kp::Memory::DataTypes::eHalf, EncodeFloat<kp::float16>,
     DecodeFloat<kp::float16>},
    {"int32", 4, kp::Memory::DataTypes::eInt, EncodeInteger<int32_t>, DecodeInteger<int32_t>},
    {"uint32", 4, kp::Memory::DataTypes::eUnsignedInt, EncodeInteger<uint32_t>,
     DecodeInteger<uint32_t>},
    {"int16", 2, kp::Memory::DataTypes::eShort, EncodeInteger<int16_t>, DecodeInteger<int16_t>},
    {"uint16", 2, kp::Memory::DataTypes::eUnsignedShort, EncodeInteger<uint16_t>,
     DecodeInteger<uint16_t>},
    {"int8", 1, kp::Memory::DataTypes::eChar, EncodeInteger<int8_t>, DecodeInteger<int8_t>},
    {"uint8", 1, kp::Memory::DataTypes::eUnsignedChar, EncodeInteger<uint8_t>,
     DecodeInteger<uint8_t>},
};

// The type named `name`; an unknown name ends the program (status 2), listing the known ones.
const ElementType& TypeNamed(const std::string& name, const std::string& where) {
  std::vector<std::string> names;
  for (const ElementType& t : kElementTypes) {
    if (name == t.name) return t;
    names.push_back(t.name);
  }
  Fail(absl::StrCat(where, ": unknown type \"", name, "\" (", absl::StrJoin(names, ", "), ")"), 2);
}

struct Binding {
  const ElementType* type = nullptr;
  std::shared_ptr<kp::Tensor> tensor;
  std::string output;
};

// Numbers as bytes of `type`; a number that is not one of the type ends the program (status 2).
std::string Encode(const ElementType& type, const std::vector<std::string>& numbers,
                   const std::string& where) {
  std::string out;
  for (const auto& n : numbers) {
    if (n.empty()) continue;
    double d;
    if (!absl::SimpleAtod(n, &d)) Fail(absl::StrCat(where, ": \"", n, "\" is not a number"), 2);
    if (!type.encode(d, out)) {
      Fail(absl::StrCat(where, ": ", n, " is not a ", type.name, " value"), 2);
    }
  }
  return out;
}

void WriteOutput(const Binding& b) {
  const auto* p = static_cast<const uint8_t*>(b.tensor->rawData());
  const size_t n = b.tensor->size();
  std::ofstream out(b.output, std::ios::binary);
  if (!out) Fail(absl::StrCat("cannot write ", b.output));
  if (!EndsWith(b.output, ".txt")) {
    out.write(reinterpret_cast<const char*>(p),
              static_cast<std::streamsize>(b.tensor->memorySize()));
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    b.type->decode(p + i * b.type->size, out);
    out << "\n";
  }
}

int Run() {
  const std::string shader = absl::GetFlag(FLAGS_shader);
  if (shader.empty()) Fail("run needs --shader=FILE", 2);
  if (absl::GetFlag(FLAGS_tensors).empty()) Fail("run needs --tensors=TYPE:SOURCE[=OUTPUT],...", 2);
  std::string code = ReadFile(shader);
  std::vector<uint32_t> spirv;
  if (EndsWith(shader, ".spv")) {
    if (code.size() % 4 != 0) Fail(absl::StrCat(shader, ": SPIR-V size is not a multiple of 4"));
    spirv.resize(code.size() / 4);
    std::memcpy(spirv.data(), code.data(), code.size());
  }
  std::vector<std::string> wg = absl::StrSplit(absl::GetFlag(FLAGS_workgroup), ',');
  kp::Workgroup workgroup{0, 1, 1};
  for (size_t i = 0; i < std::min<size_t>(3, wg.size()); ++i) {
    if (!absl::SimpleAtoi(wg[i], &workgroup[i])) {
      Fail(absl::StrCat("--workgroup: \"", wg[i], "\" is not a count"), 2);
    }
  }
  const ElementType& ctype = TypeNamed(absl::GetFlag(FLAGS_const_type), "--const_type");
  std::string push = Encode(ctype, absl::StrSplit(absl::GetFlag(FLAGS_push), ','), "--push");
  std::string spec = Encode(ctype, absl::StrSplit(absl::GetFlag(FLAGS_spec), ','), "--spec");

  try {
    kp::Manager mgr(RemoteOf());
    if (spirv.empty()) spirv = kp::compileSource(code);
    std::vector<Binding> bindings;
    for (absl::string_view item_view : absl::StrSplit(absl::GetFlag(FLAGS_tensors), ',')) {
      const std::string item(item_view);
      Binding b;
      std::vector<std::string> io = absl::StrSplit(item, absl::MaxSplits('=', 1));
      std::vector<std::string> parts = absl::StrSplit(io[0], absl::MaxSplits(':', 1));
      if (parts.size() != 2) Fail(absl::StrCat("--tensors: \"", item, "\" is not TYPE:SOURCE"), 2);
      b.type = &TypeNamed(parts[0], "--tensors");
      const uint32_t size = b.type->size;
      std::string data;
      if (parts[1].rfind("zeros:", 0) == 0) {
        uint64_t n;
        if (!absl::SimpleAtoi(parts[1].substr(6), &n) || n == 0) {
          Fail(absl::StrCat("--tensors: \"", parts[1], "\" needs a count above 0"), 2);
        }
        data.assign(n * size, '\0');
      } else {
        data = ReadFile(parts[1]);
        if (EndsWith(parts[1], ".txt")) {
          data =
              Encode(*b.type, absl::StrSplit(data, absl::ByAnyChar(" \t\r\n,"), absl::SkipEmpty()),
                     parts[1]);
        }
        if (data.empty() || data.size() % size != 0) {
          Fail(absl::StrCat(parts[1], ": ", data.size(), " bytes is not a whole number of ",
                            b.type->name, " values"));
        }
      }
      if (io.size() == 2) b.output = io[1];
      b.tensor = mgr.tensor(data.data(), data.size() / size, size, b.type->data_type);
      bindings.push_back(std::move(b));
    }
    std::vector<std::shared_ptr<kp::Tensor>> params;
    for (const auto& b : bindings) params.push_back(b.tensor);
    auto spec_bytes = std::vector<uint8_t>(spec.begin(), spec.end());
    auto push_bytes = std::vector<uint8_t>(push.begin(), push.end());
    auto algo = mgr.algorithm(params, spirv, workgroup, std::vector<float>{}, std::vector<float>{});
    algo->rebuildRaw(params, spirv, workgroup, spec_bytes, ctype.size, push_bytes);
    auto seq = mgr.sequence(0, 3);
    const auto start = std::chrono::steady_clock::now();
    seq->record<kp::OpTensorSyncDevice>(params)
        ->record<kp::OpAlgoDispatch>(algo)
        ->record<kp::OpTensorSyncLocal>(params)
        ->eval();
    const auto wall = std::chrono::steady_clock::now() - start;
    auto ts = seq->getTimestamps();
    std::cerr << "ran on " << mgr.getDeviceProperties().deviceName << " in "
              << std::chrono::duration<double, std::milli>(wall).count() << " ms";
    if (ts.size() >= 3) std::cerr << " (kernel " << (ts[2] - ts[1]) / 1000.0 << " us on the GPU)";
    std::cerr << "\n";
    for (const auto& b : bindings) {
      if (!b.output.empty()) WriteOutput(b);
    }
  } catch (const kp::Error& e) {
    Fail(e.what());
  }
  return 0;
}

// ---- bench

void Progress(const char* what, double fraction) {
  if (!isatty(STDERR_FILENO)) return;
  const int width = 30;
  int filled = static_cast<int>(fraction * width);
  std::fprintf(stderr, "\r%-22s [%s%s] %3d%%", what, std::string(filled, '#').c_str(),
               std::string(width - filled, ' ').c_str(), static_cast<int>(fraction * 100));
  if (fraction >= 1) std::fprintf(stderr, "\r%*s\r", 60, "");
}

// `v` is never empty: every measurement loop runs at least once.
double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

int Bench() {
  const double seconds = absl::GetFlag(FLAGS_seconds);
  auto sessions = v1::Sessions::NewStub(Channel());
  std::vector<double> rtt;
  auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  do {  // at least one call, whatever --seconds says
    grpc::ClientContext c;
    SetDeadline(c);
    v1::PingResponse r;
    auto t0 = std::chrono::steady_clock::now();
    Check(sessions->Ping(&c, v1::PingRequest(), &r), "ping");
    rtt.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    Progress("ping", seconds > 0 ? std::min(1.0, elapsed() / seconds) : 1.0);
  } while (elapsed() < seconds);
  Progress("ping", 1);
  std::printf("ping round trip      p50 %8.1f us   p99 %8.1f us   (%zu calls)\n",
              Percentile(rtt, 0.5), Percentile(rtt, 0.99), rtt.size());
  try {
    kp::Manager mgr(RemoteOf());
    auto t = mgr.tensor(std::vector<float>(1024, 1.0f));
    auto seq = mgr.sequence();
    seq->record<kp::OpTensorSyncDevice>({t})->record<kp::OpTensorSyncLocal>({t});
    std::vector<double> evals;
    start = std::chrono::steady_clock::now();
    do {
      auto t0 = std::chrono::steady_clock::now();
      seq->eval();
      evals.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      Progress("eval (4 KiB)", seconds > 0 ? std::min(1.0, elapsed() / seconds) : 1.0);
    } while (elapsed() < seconds);
    Progress("eval (4 KiB)", 1);
    std::printf("eval 4 KiB up+down   p50 %8.1f us   p99 %8.1f us   (%zu evals)\n",
                Percentile(evals, 0.5), Percentile(evals, 0.99), evals.size());

    const uint64_t mib = absl::GetFlag(FLAGS_megabytes);
    if (mib > 0) {
      const uint64_t count = mib << 18;  // floats
      auto big = mgr.tensorT<float>(count);
      float* p = big->data();
      for (uint64_t i = 0; i < count; ++i) p[i] = static_cast<float>(i & 0xffff);
      auto up = mgr.sequence(), down = mgr.sequence();
      up->record<kp::OpTensorSyncDevice>({big});
      down->record<kp::OpTensorSyncLocal>({big});
      const int rounds = 4;
      double up_s = 0, down_s = 0;
      for (int r = 0; r < rounds; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        up->eval();
        auto t1 = std::chrono::steady_clock::now();
        down->eval();
        auto t2 = std::chrono::steady_clock::now();
        up_s += std::chrono::duration<double>(t1 - t0).count();
        down_s += std::chrono::duration<double>(t2 - t1).count();
        Progress("bandwidth", double(r + 1) / rounds);
      }
      const double bytes = double(mib << 20) * rounds;
      std::printf("upload   %5llu MiB   %8.2f GB/s\n", static_cast<unsigned long long>(mib),
                  bytes / up_s / 1e9);
      std::printf("download %5llu MiB   %8.2f GB/s\n", static_cast<unsigned long long>(mib),
                  bytes / down_s / 1e9);
    }
  } catch (const kp::Error& e) {
    Fail(e.what());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // --help lists the flags of this file (absl looks for komputectl.cc by default).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "komputectl/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.normalize_filename = [](absl::string_view file) {
    const size_t at = file.rfind("client/");
    return std::string(at == absl::string_view::npos ? file : file.substr(at));
  };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "komputectl COMMAND [flags]\n\n"
      "commands:\n"
      "  devices    the daemon's devices: memory, queue families, limits (every daemon's, with\n"
      "             a DAEMON column, when the address names several)\n"
      "  health     grpc.health.v1 status of the daemon (--service for one service); a table\n"
      "             of every daemon's when the address names several\n"
      "  sessions   open sessions with their memory and age (every daemon's, with a DAEMON\n"
      "             column, when the address names several)\n"
      "  run        compile a GLSL (or load a SPIR-V) file, bind tensors from files, dispatch,\n"
      "             write outputs: komputectl run --shader=k.comp \\\n"
      "               --tensors=float32:a.txt,float32:b.txt,float32:zeros:3=out.txt\n"
      "  bench      round-trip latency and bandwidth against the daemon\n\n"
      "The daemon is --address, else $KOMPUTED_ADDRESS, else 127.0.0.1:50051. Credentials:\n"
      "--token or --token_file, --tls_ca, --tls_cert and --tls_key, else $KOMPUTED_TOKEN,\n"
      "$KOMPUTED_TOKEN_FILE, $KOMPUTED_TLS_CA, $KOMPUTED_TLS_CERT and $KOMPUTED_TLS_KEY.");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    Fail(args.size() < 2 ? "no command given (devices, health, sessions, run, bench; --help)"
                         : "one command at a time",
         2);
  }
  const std::string command = args[1];
  Credentials();  // a bad setting fails here, before any command starts
  if (command == "devices") return Devices();
  if (command == "health") return Health();
  if (command == "sessions") return Sessions();
  if (command == "run") return Run();
  if (command == "bench") return Bench();
  Fail(absl::StrCat("unknown command \"", command, "\" (devices, health, sessions, run, bench)"),
       2);
}
