// komputed: the GPU compute daemon. Parses flags, starts the server, serves until SIGINT or
// SIGTERM. Everything else lives in the komputed_server library.
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "host:port to serve gRPC on; port 0 picks a free port (printed at start)");
ABSL_FLAG(std::vector<std::string>, devices, {},
          "comma-separated Vulkan device indices to serve (e.g. 0,2); empty: every device");
ABSL_FLAG(absl::Duration, session_idle_timeout, absl::Seconds(60),
          "close a session after this long with no call and no open Execute stream");
ABSL_FLAG(absl::Duration, eval_timeout, absl::Seconds(600),
          "bound on an eval's wait for the device when the request gives no timeout_ms");
ABSL_FLAG(int, max_message_bytes, 64 << 20, "largest gRPC message received or sent, in bytes");
ABSL_FLAG(std::string, log_level, "info",
          "log level: trace, debug, info, warning, error, critical or off");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("komputed: serves Vulkan compute devices over gRPC");
  absl::ParseCommandLine(argc, argv);

  const std::string level_name = absl::GetFlag(FLAGS_log_level);
  const spdlog::level::level_enum level = spdlog::level::from_str(level_name);
  if (level == spdlog::level::off && level_name != "off") {
    std::fprintf(stderr, "komputed: unknown --log_level=%s\n", level_name.c_str());
    return 2;
  }
  // Logs go to stderr: stdout carries only the "listening on" line that scripts read.
  spdlog::set_default_logger(spdlog::stderr_color_mt("komputed"));
  spdlog::set_level(level);

  komputed::server::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  for (const std::string& d : absl::GetFlag(FLAGS_devices)) {
    uint32_t index = 0;
    if (!absl::SimpleAtoi(d, &index)) {
      std::fprintf(stderr, "komputed: --devices: '%s' is not a device index\n", d.c_str());
      return 2;
    }
    options.devices.push_back(index);
  }
  options.session_idle_timeout = absl::GetFlag(FLAGS_session_idle_timeout);
  options.eval_timeout = absl::GetFlag(FLAGS_eval_timeout);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);

  // Every thread started from here on inherits the blocked signals; main takes them with sigwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto server = komputed::server::Server::Start(options);
  if (!server.ok()) {
    spdlog::critical("komputed cannot start: {}", server.status().ToString());
    return 1;
  }
  std::printf("komputed listening on %s\n", (*server)->address().c_str());
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  spdlog::info("komputed: {} received", signal_number == SIGINT ? "SIGINT" : "SIGTERM");
  (*server)->Shutdown(absl::Seconds(2));
  return 0;
}
