#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace komputed::server {

// One kind of a session's objects (tensors, algorithms, sequences) by their client-chosen 64-bit
// handles, and the one wording of what can be wrong with a handle: 0 is never a handle
// (INVALID_ARGUMENT), a new handle must be free (ALREADY_EXISTS), a used one must exist
// (NOT_FOUND "tensor 7 not found in this session"). `kind` names the objects in those messages
// and must outlive the table (a string literal). Not thread-safe: its owner's lock guards it.
template <typename T>
class HandleTable {
 public:
  explicit HandleTable(absl::string_view kind) : kind_(kind) {}

  absl::string_view kind() const { return kind_; }
  size_t size() const { return entries_.size(); }

  // OK when `handle` may name a new object.
  absl::Status CheckNew(uint64_t handle) const {
    if (handle == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(kind_, " handle 0 is not valid (0 is never a handle)"));
    }
    if (entries_.contains(handle)) {
      return absl::AlreadyExistsError(
          absl::StrCat(kind_, " ", handle, " already exists in this session"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<T> Find(uint64_t handle) const {
    auto it = entries_.find(handle);
    if (it == entries_.end()) return NotFound(handle);
    return it->second;
  }

  // Calls fn(handle, value) for every entry.
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (const auto& [handle, value] : entries_) fn(handle, value);
  }

  // After CheckNew(handle) was OK.
  void Insert(uint64_t handle, T value) { entries_.insert_or_assign(handle, std::move(value)); }

  // Removes the object and returns it (NOT_FOUND when there is none).
  absl::StatusOr<T> Take(uint64_t handle) {
    auto it = entries_.find(handle);
    if (it == entries_.end()) return NotFound(handle);
    T value = std::move(it->second);
    entries_.erase(it);
    return value;
  }

  // Empties the table; returns what it held.
  absl::flat_hash_map<uint64_t, T> TakeAll() { return std::exchange(entries_, {}); }

 private:
  absl::Status NotFound(uint64_t handle) const {
    return absl::NotFoundError(absl::StrCat(kind_, " ", handle, " not found in this session"));
  }

  absl::string_view kind_;
  absl::flat_hash_map<uint64_t, T> entries_;
};

}  // namespace komputed::server
