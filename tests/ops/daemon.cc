#include "daemon.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace komputed::ops_testing {
namespace {

// Reads one line from `fd` until `until`; empty on timeout or end of file.
std::string ReadLine(int fd, absl::Time until) {
  std::string line;
  while (absl::Now() < until) {
    pollfd p{fd, POLLIN, 0};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(until - absl::Now()));
    if (poll(&p, 1, std::max(ms, 1)) <= 0) continue;
    char c;
    if (read(fd, &c, 1) != 1) break;
    if (c == '\n') return line;
    line.push_back(c);
  }
  return line;
}

std::chrono::system_clock::time_point In(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

}  // namespace

Daemon::Daemon(const std::vector<std::string>& flags) {
  char log_template[] = "/tmp/komputed-ops-log-XXXXXX";
  const int log_fd = mkstemp(log_template);
  if (log_fd < 0) {
    ADD_FAILURE() << "mkstemp: " << std::strerror(errno);
    return;
  }
  log_path_ = log_template;
  int out[2];
  if (pipe(out) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return;
  }
  pid_ = fork();
  if (pid_ == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    close(out[0]);
    close(out[1]);
    close(log_fd);
    std::vector<std::string> args = {KOMPUTED_BINARY, "--listen=127.0.0.1:0",
                                     "--metrics_listen=127.0.0.1:0"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(KOMPUTED_BINARY, argv.data());
    std::perror("execv komputed");
    _exit(127);
  }
  close(out[1]);
  close(log_fd);
  // stdout carries exactly these two lines, in this order.
  const absl::Time until = absl::Now() + absl::Seconds(60);
  const std::string first = ReadLine(out[0], until);
  const std::string second = ReadLine(out[0], until);
  close(out[0]);
  const std::string listening = "komputed listening on ";
  const std::string metrics = "komputed metrics on ";
  if (absl::StartsWith(first, listening)) address_ = first.substr(listening.size());
  if (absl::StartsWith(second, metrics)) metrics_address_ = second.substr(metrics.size());
  if (!started()) {
    ADD_FAILURE() << "komputed did not print its addresses; stdout: '" << first << "', '" << second
                  << "'; stderr:\n"
                  << Log();
  }
}

Daemon::~Daemon() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (!log_path_.empty()) unlink(log_path_.c_str());
}

int Daemon::WaitExit(absl::Duration timeout) {
  if (pid_ <= 0) return -1;
  const absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

int Daemon::Stop(int signal, absl::Duration timeout) {
  if (pid_ <= 0) return -1;
  kill(pid_, signal);
  return WaitExit(timeout);
}

std::string Daemon::Log() const {
  std::ifstream in(log_path_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool Daemon::WaitForLog(const std::string& text, absl::Duration timeout) const {
  const absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    if (absl::StrContains(Log(), text)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return absl::StrContains(Log(), text);
}

int RunProgram(const std::vector<std::string>& argv, std::string* out, std::string* err,
               absl::Duration timeout) {
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
    std::vector<std::string> args = argv;
    std::vector<char*> raw;
    for (auto& a : args) raw.push_back(a.data());
    raw.push_back(nullptr);
    execv(raw[0], raw.data());
    std::perror("execv");
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  out->clear();
  err->clear();
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {out, err};
  int open_fds = 2;
  const absl::Time until = absl::Now() + timeout;
  while (open_fds > 0 && absl::Now() < until) {
    if (poll(fds, 2, 100) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buf[4096];
      const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& p : fds) {
    if (p.fd >= 0) close(p.fd);
  }
  int status = 0;
  while (absl::Now() < until) {
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// ---------------------------------------------------------------------------------------------
// Scraping

std::string Scrape(const std::string& metrics_address) {
  const size_t colon = metrics_address.rfind(':');
  if (colon == std::string::npos) return "";
  const std::string host = metrics_address.substr(0, colon);
  const std::string port = metrics_address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) return "";
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return "";
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const std::string request =
      absl::StrCat("GET /metrics HTTP/1.0\r\nHost: ", metrics_address, "\r\n\r\n");
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string response;
  char buf[8192];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (!absl::StartsWith(response, "HTTP/1.") ||
      !absl::StrContains(response.substr(0, body), " 200 ") || body == std::string::npos) {
    return "";
  }
  return response.substr(body + 4);
}

Samples::Samples(const std::string& text) {
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "# TYPE ")) {
      std::vector<std::string> parts = absl::StrSplit(line.substr(7), ' ');
      if (parts.size() == 2) types_[parts[0]] = parts[1];
      continue;
    }
    if (absl::StartsWith(line, "#")) continue;
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    double value = 0;
    const std::string number(line.substr(space + 1));
    if (!absl::SimpleAtod(number, &value)) continue;
    // name{label="value",...}: keyed with the labels in name order, whatever order they came in.
    const absl::string_view series = line.substr(0, space);
    const size_t brace = series.find('{');
    if (brace == absl::string_view::npos) {
      values_[std::string(series)] = value;
      continue;
    }
    std::map<std::string, std::string> labels;
    size_t i = brace + 1;
    while (i < series.size() && series[i] != '}') {
      const size_t eq = series.find("=\"", i);
      if (eq == absl::string_view::npos) break;
      std::string label(series.substr(i, eq - i));
      std::string text;
      size_t j = eq + 2;
      for (; j < series.size() && series[j] != '"'; ++j) {
        if (series[j] == '\\' && j + 1 < series.size()) ++j;
        text.push_back(series[j]);
      }
      labels[label] = text;
      i = j + 1;
      if (i < series.size() && series[i] == ',') ++i;
    }
    values_[Key(std::string(series.substr(0, brace)), labels)] = value;
  }
}

std::string Samples::Key(const std::string& name,
                         const std::map<std::string, std::string>& labels) {
  if (labels.empty()) return name;
  std::string key = name + "{";
  bool first = true;
  for (const auto& [label, value] : labels) {
    absl::StrAppend(&key, first ? "" : ",", label, "=\"", value, "\"");
    first = false;
  }
  return key + "}";
}

double Samples::Get(const std::string& name,
                    const std::map<std::string, std::string>& labels) const {
  auto it = values_.find(Key(name, labels));
  return it == values_.end() ? 0 : it->second;
}

bool Samples::Has(const std::string& name, const std::map<std::string, std::string>& labels) const {
  return values_.contains(Key(name, labels));
}

// ---------------------------------------------------------------------------------------------
// Client

Client::Client(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  devices = v1::Devices::NewStub(channel);
  sessions = v1::Sessions::NewStub(channel);
  tensors = v1::Tensors::NewStub(channel);
  algorithms = v1::Algorithms::NewStub(channel);
  sequences = v1::Sequences::NewStub(channel);
  health = grpc::health::v1::Health::NewStub(channel);
}

grpc::Status Client::Open(std::string* session_id, const std::string& name) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  v1::OpenSessionRequest req;
  req.set_client_name(name);
  v1::OpenSessionResponse resp;
  grpc::Status s = sessions->OpenSession(&ctx, req, &resp);
  *session_id = resp.session_id();
  return s;
}

grpc::Status Client::Close(const std::string& session_id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  v1::CloseSessionRequest req;
  req.set_session_id(session_id);
  v1::CloseSessionResponse resp;
  return sessions->CloseSession(&ctx, req, &resp);
}

grpc::Status Client::CreateTensor(const v1::CreateTensorRequest& request) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  v1::CreateTensorResponse resp;
  return tensors->CreateTensor(&ctx, request, &resp);
}

grpc::Status Client::CreateAlgorithm(const v1::CreateAlgorithmRequest& request) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  v1::CreateAlgorithmResponse resp;
  return algorithms->CreateAlgorithm(&ctx, request, &resp);
}

grpc::Status Client::CreateSequence(const std::string& session, uint64_t handle,
                                    uint32_t timestamps) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  v1::CreateSequenceRequest req;
  req.set_session_id(session);
  req.set_handle(handle);
  req.set_total_timestamps(timestamps);
  v1::CreateSequenceResponse resp;
  return sequences->CreateSequence(&ctx, req, &resp);
}

grpc::Status Client::Record(const std::string& session, uint64_t sequence,
                            const std::vector<v1::Operation>& ops) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  v1::RecordRequest req;
  req.set_session_id(session);
  req.set_sequence(sequence);
  for (const auto& op : ops) *req.add_actions()->mutable_record() = op;
  v1::RecordResponse resp;
  return sequences->Record(&ctx, req, &resp);
}

grpc::Status Client::Eval(const v1::EvalRequest& request, v1::EvalResponse* response) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(60)));
  return sequences->Eval(&ctx, request, response);
}

grpc::health::v1::HealthCheckResponse::ServingStatus Client::Health(const std::string& service,
                                                                    grpc::Status* status) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = health->Check(&ctx, req, &resp);
  if (status != nullptr) *status = s;
  return resp.status();
}

// ---------------------------------------------------------------------------------------------
// Builders

std::string FloatBytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

std::string UintBytes(const std::vector<uint32_t>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(uint32_t));
}

std::vector<uint32_t> Uints(const std::string& bytes) {
  std::vector<uint32_t> values(bytes.size() / sizeof(uint32_t));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(uint32_t));
  return values;
}

v1::CreateTensorRequest FloatTensor(const std::string& session, uint64_t handle,
                                    const std::vector<float>& data, v1::MemoryType memory) {
  v1::CreateTensorRequest r;
  r.set_session_id(session);
  r.set_handle(handle);
  r.set_element_type(v1::ELEMENT_TYPE_FLOAT32);
  r.set_count(data.size());
  r.set_memory_type(memory);
  r.set_data(FloatBytes(data));
  return r;
}

v1::CreateAlgorithmRequest GlslAlgorithm(const std::string& session, uint64_t handle,
                                         std::vector<uint64_t> tensors, const std::string& glsl,
                                         uint32_t workgroups, const std::string& push) {
  v1::CreateAlgorithmRequest r;
  r.set_session_id(session);
  r.set_handle(handle);
  for (uint64_t t : tensors) r.add_tensors(t);
  r.set_glsl(glsl);
  r.mutable_workgroup()->set_x(workgroups);
  r.mutable_workgroup()->set_y(1);
  r.mutable_workgroup()->set_z(1);
  r.set_push_constants(push);
  return r;
}

v1::Operation SyncDevice(std::vector<uint64_t> tensors) {
  v1::Operation op;
  for (uint64_t t : tensors) op.mutable_sync_device()->add_tensors(t);
  return op;
}

v1::Operation SyncLocal(std::vector<uint64_t> tensors) {
  v1::Operation op;
  for (uint64_t t : tensors) op.mutable_sync_local()->add_tensors(t);
  return op;
}

v1::Operation Dispatch(uint64_t algorithm) {
  v1::Operation op;
  op.mutable_dispatch()->set_algorithm(algorithm);
  return op;
}

void MakeScalePipeline(Client& client, const std::string& session, uint64_t h, uint32_t n,
                       float scale, uint32_t timestamps) {
  const std::vector<float> zeros(n, 0.0f);
  ASSERT_THAT(client.CreateTensor(FloatTensor(session, h, zeros)), IsOk());
  ASSERT_THAT(client.CreateTensor(FloatTensor(session, h + 1, zeros)), IsOk());
  ASSERT_THAT(client.CreateAlgorithm(
                  GlslAlgorithm(session, h + 2, {h, h + 1}, kScaleShader, n, FloatBytes({scale}))),
              IsOk());
  ASSERT_THAT(client.CreateSequence(session, h + 3, timestamps), IsOk());
  ASSERT_THAT(client.Record(session, h + 3, {SyncDevice({h}), Dispatch(h + 2), SyncLocal({h + 1})}),
              IsOk());
}

v1::EvalRequest ScaleEval(const std::string& session, uint64_t h, const std::vector<float>& input) {
  v1::EvalRequest req;
  req.set_session_id(session);
  req.set_sequence(h + 3);
  v1::TensorData* up = req.add_uploads();
  up->set_handle(h);
  up->set_data(FloatBytes(input));
  req.add_downloads(h + 1);
  return req;
}

void MakeSlowPipeline(Client& client, const std::string& session, uint64_t h, uint32_t n,
                      const test_support::SlowWork& work) {
  v1::CreateTensorRequest t;
  t.set_session_id(session);
  t.set_handle(h);
  t.set_element_type(v1::ELEMENT_TYPE_UINT32);
  t.set_count(n);
  ASSERT_THAT(client.CreateTensor(t), IsOk());
  ASSERT_THAT(client.CreateAlgorithm(GlslAlgorithm(session, h + 1, {h}, test_support::kSlowShader,
                                                   n, work.PushConstants())),
              IsOk());
  ASSERT_THAT(client.CreateSequence(session, h + 2), IsOk());
  ASSERT_THAT(client.Record(session, h + 2, {SyncDevice({h}), Dispatch(h + 1), SyncLocal({h})}),
              IsOk());
}

v1::EvalRequest SlowEval(const std::string& session, uint64_t h,
                         const std::vector<uint32_t>& input) {
  v1::EvalRequest req;
  req.set_session_id(session);
  req.set_sequence(h + 2);
  v1::TensorData* up = req.add_uploads();
  up->set_handle(h);
  up->set_data(UintBytes(input));
  req.add_downloads(h);
  return req;
}

bool DeviceIsCpu(Client& client) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ListDevicesResponse response;
  const grpc::Status status =
      client.devices->ListDevices(&context, v1::ListDevicesRequest(), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return status.ok() && response.devices_size() > 0 &&
         response.devices(0).device_type() == 4;  // VK_PHYSICAL_DEVICE_TYPE_CPU
}

}  // namespace komputed::ops_testing
