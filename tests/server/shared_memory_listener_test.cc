// Tests of the same-host channel's listener with handlers of the test's own, which hold each
// submitted eval until the test answers it: the bound on submits in flight on one channel.

#include "shared_memory_listener.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "komputed/v1/shared_memory_wire.h"
#include "support/poll.h"
#include "support/raw_channel.h"

namespace komputed::server {
namespace {

namespace wire = v1::wire;

using Done = std::function<void(absl::StatusOr<std::string>)>;
using test_support::RawChannel;

class HeldEvals {
 public:
  SharedMemoryListener::Handlers Handlers(std::string ticket) {
    SharedMemoryListener::Handlers h;
    h.take = [](wire::SharedMemoryAttach) { return absl::UnimplementedError("no regions here"); };
    h.bind = [ticket](absl::string_view t) {
      return t == ticket ? absl::OkStatus() : absl::NotFoundError("no such session");
    };
    h.eval = [this](const std::string&, std::string request, bool may_wait_inline, Done done) {
      absl::MutexLock lock(&mu_);
      EXPECT_FALSE(may_wait_inline) << "a submit's answer comes from the completion waiter";
      held_.emplace_back(std::move(request), std::move(done));
    };
    return h;
  }
  // Waits until `n` evals are held; false when they do not come.
  bool AwaitHeld(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return held_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }
  size_t held() {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }
  // Answers the held eval `i` with its own request as the response.
  void Answer(size_t i) {
    std::pair<std::string, Done> eval;
    {
      absl::MutexLock lock(&mu_);
      eval = std::move(held_[i]);
      held_[i].second = nullptr;
    }
    eval.second(eval.first);
  }
  // Answers every eval still held (with an error), as a daemon does when a channel ends.
  void AnswerAll() {
    std::vector<Done> all;
    {
      absl::MutexLock lock(&mu_);
      for (auto& [request, done] : held_) {
        if (done) all.push_back(std::move(done));
        done = nullptr;
      }
    }
    for (Done& done : all) done(absl::CancelledError("the test ends"));
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<std::string, Done>> held_ ABSL_GUARDED_BY(mu_);
};

TEST(SharedMemoryListenerTest, AtMostSixtyFourSubmitsAreInFlightOnAChannel) {
  const std::string ticket(wire::kSharedMemoryTicketSize, 't');
  HeldEvals evals;
  absl::StatusOr<std::unique_ptr<SharedMemoryListener>> listener =
      SharedMemoryListener::Start(evals.Handlers(ticket), 1);
  ASSERT_TRUE(listener.ok()) << listener.status();
  RawChannel c((*listener)->name());
  ASSERT_TRUE(c.connected());
  absl::StatusOr<std::string> bound =
      c.Ask(wire::EncodeChannelRequest(wire::ChannelOp::kBind, ticket));
  ASSERT_TRUE(bound.ok()) << bound.status();

  // The limit, all held: no answer yet; then two more, each refused at once with its id.
  constexpr uint64_t kLimit = wire::kMaxChannelSubmits;
  for (uint64_t id = 1; id <= kLimit + 2; ++id) {
    ASSERT_TRUE(c.Send(wire::EncodeChannelSubmit(id, "request " + std::to_string(id))));
  }
  uint64_t id = 0;
  for (uint64_t want : {kLimit + 1, kLimit + 2}) {
    absl::StatusOr<std::string> answer = c.SubmitAnswer(&id);
    EXPECT_EQ(id, want);
    EXPECT_EQ(answer.status().code(), absl::StatusCode::kResourceExhausted) << answer.status();
    EXPECT_NE(answer.status().message().find("64 submits at once"), std::string::npos)
        << answer.status();
  }
  ASSERT_TRUE(evals.AwaitHeld(kLimit));
  EXPECT_EQ(evals.held(), kLimit) << "the refused submits reached the daemon";
  EXPECT_EQ(c.Record(absl::Milliseconds(100)).status().code(), absl::StatusCode::kDeadlineExceeded)
      << "an answer came for a submit still held";

  // One answered gives its place to the next submit: that one is taken, the one after refused.
  evals.Answer(4);
  absl::StatusOr<std::string> answer = c.SubmitAnswer(&id);
  EXPECT_EQ(id, 5u);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(*answer, "request 5");
  ASSERT_TRUE(c.Send(wire::EncodeChannelSubmit(100, "request 100")));
  ASSERT_TRUE(evals.AwaitHeld(kLimit + 1));
  ASSERT_TRUE(c.Send(wire::EncodeChannelSubmit(101, "request 101")));
  answer = c.SubmitAnswer(&id);
  EXPECT_EQ(id, 101u);
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kResourceExhausted) << answer.status();

  // Another channel of the same session has places of its own.
  RawChannel other((*listener)->name());
  ASSERT_TRUE(other.Ask(wire::EncodeChannelRequest(wire::ChannelOp::kBind, ticket)).ok());
  ASSERT_TRUE(other.Send(wire::EncodeChannelSubmit(1, "other")));
  EXPECT_TRUE(evals.AwaitHeld(kLimit + 2));
  evals.AnswerAll();
}

// What descriptor `fd` of this process names (/proc/self/fd), e.g. "pipe:[1234]".
std::string Target(int fd) {
  char buf[256];
  const ssize_t n = readlink(absl::StrCat("/proc/self/fd/", fd).c_str(), buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// How many descriptors of this process name `target`.
int Holders(const std::string& target) {
  int n = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    int fd = 0;
    if (!absl::SimpleAtoi(e->d_name, &fd) || fd == dirfd(dir)) continue;
    if (Target(fd) == target) ++n;
  }
  closedir(dir);
  return n;
}

// Whether no descriptor of this process names `target` within 10 s (a passed file that is not a
// memfd is closed on a thread of its own).
bool Released(const std::string& target) {
  return test_support::PollUntil(
      absl::Seconds(10), [&] { return Holders(target) == 0; }, absl::Milliseconds(5));
}

TEST(SharedMemoryListenerTest, EveryPassedDescriptorIsClosedWhateverTheAnswer) {
  const std::string ticket(wire::kSharedMemoryTicketSize, 't');
  HeldEvals evals;
  absl::StatusOr<std::unique_ptr<SharedMemoryListener>> listener =
      SharedMemoryListener::Start(evals.Handlers(ticket), 1);
  ASSERT_TRUE(listener.ok()) << listener.status();
  const std::string name = (*listener)->name();

  // Each way of passing a descriptor that the daemon refuses, with a memfd (closed at once) and
  // with a pipe (closed on a thread): the daemon's copy of it (this process's, the listener being
  // in it) goes once the answer has come. The test's own copy is closed first.
  struct Case {
    const char* what;
    std::function<absl::Status(int fd)> pass;
  };
  const std::vector<Case> cases = {
      {"a region that the handler refuses",
       [&](int fd) {
         return wire::PassSharedMemory(name, ticket, 1, fd, 4096, absl::Seconds(10));
       }},
      {"a shared-memory request of the wrong size",
       [&](int fd) { return RawChannel(name).Ask(std::string(8, 'x'), fd).status(); }},
      {"a bind record with a descriptor",
       [&](int fd) {
         return RawChannel(name)
             .Ask(wire::EncodeChannelRequest(wire::ChannelOp::kBind, ticket), fd)
             .status();
       }},
      {"a ring on an unbound channel",
       [&](int fd) {
         return RawChannel(name)
             .Ask(wire::EncodeChannelRequest(wire::ChannelOp::kRing, ""), fd)
             .status();
       }},
      {"a ring that is not a memfd of the ring's size",
       [&](int fd) {
         RawChannel c(name);
         absl::Status bound =
             c.Ask(wire::EncodeChannelRequest(wire::ChannelOp::kBind, ticket)).status();
         if (!bound.ok()) return bound;
         return c.Ask(wire::EncodeChannelRequest(wire::ChannelOp::kRing, ""), fd).status();
       }},
  };
  for (const Case& c : cases) {
    for (const bool memfd : {true, false}) {
      SCOPED_TRACE(absl::StrCat(c.what, memfd ? ", a memfd" : ", a pipe"));
      int fd = -1;
      int other = -1;
      if (memfd) {
        fd = memfd_create(absl::StrCat("passed-", c.what).c_str(), MFD_CLOEXEC);
        ASSERT_GE(fd, 0);
        ASSERT_EQ(ftruncate(fd, 4096), 0);
      } else {
        int p[2];
        ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
        fd = p[0];
        other = p[1];
      }
      const std::string target = Target(fd);
      ASSERT_FALSE(target.empty());
      const absl::Status answer = c.pass(fd);
      EXPECT_FALSE(answer.ok());
      close(fd);
      if (other >= 0) close(other);
      EXPECT_TRUE(Released(target)) << "the daemon still holds " << target << " (" << answer << ")";
    }
  }
}

// After serving a record a reactor polls for the next one, but only while `may_poll` lets it (a
// CPU device's work in flight needs the cores): told no, it sleeps, and still serves what comes.
TEST(SharedMemoryListenerTest, AReactorPollsOnlyWhileItMay) {
  const std::string ticket(wire::kSharedMemoryTicketSize, 't');
  HeldEvals evals;
  SharedMemoryListener::Handlers handlers = evals.Handlers(ticket);
  std::atomic<bool> allowed{true};
  std::atomic<int64_t> asked{0};
  handlers.may_poll = [&] {
    asked.fetch_add(1);
    return allowed.load();
  };
  // A poll far longer than the test: only `may_poll` ends it.
  absl::StatusOr<std::unique_ptr<SharedMemoryListener>> listener =
      SharedMemoryListener::Start(std::move(handlers), 1, absl::Seconds(60));
  ASSERT_TRUE(listener.ok()) << listener.status();
  RawChannel c((*listener)->name());
  ASSERT_TRUE(c.connected());
  auto bind = [&] { return c.Ask(wire::EncodeChannelRequest(wire::ChannelOp::kBind, ticket)); };
  absl::StatusOr<std::string> bound = bind();
  ASSERT_TRUE(bound.ok()) << bound.status();

  // Polling: asked again and again.
  const int64_t before = asked.load();
  EXPECT_TRUE(test_support::PollUntil(absl::Seconds(10), [&] {
    return asked.load() > before + 100;
  })) << "the reactor did not poll after serving a record";

  // Told no: it stops asking (at most a look or two in between), and sleeps.
  allowed.store(false);
  absl::SleepFor(absl::Milliseconds(50));
  const int64_t stopped = asked.load();
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_LE(asked.load(), stopped + 2) << "the reactor went on polling when told not to";

  // Asleep, it still answers the next record at once (a second bind: refused, but answered).
  bound = bind();
  EXPECT_EQ(bound.status().code(), absl::StatusCode::kFailedPrecondition) << bound.status();
  evals.AnswerAll();
}

}  // namespace
}  // namespace komputed::server
