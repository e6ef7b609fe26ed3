#pragma once
// Names the calling thread, as `top -H`, `ps -L`, gdb and perf show it.

#include <pthread.h>

#include <string>

namespace komputed::core {

// Sets the calling thread's name to `name`, cut to the 15 characters that Linux keeps. Every
// thread that komputed starts names itself first, "kd-" and what it does.
inline void NameThisThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace komputed::core
