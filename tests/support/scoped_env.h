#pragma once
// An environment variable set for the life of an object. Header-only.

#include <cstdlib>
#include <optional>
#include <string>

namespace komputed::test_support {

// Sets `name` to `value` (or unsets it, for std::nullopt); the destructor puts back what was
// there before, or unsets it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* previous = std::getenv(name); previous != nullptr) previous_ = previous;
    if (value.has_value()) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (previous_.has_value()) {
      setenv(name_, previous_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> previous_;
};

}  // namespace komputed::test_support
