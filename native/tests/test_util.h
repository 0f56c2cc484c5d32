// Minimal test harness for the native tests (no framework): CHECK records failures and the
// executable exits non-zero if any failed, printing "<suite>: N passed, M failed".
#pragma once
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

namespace sluice_test {

struct Registry {
  std::vector<std::pair<std::string, std::function<void()>>> tests;
  int failures_in_current = 0;
  static Registry& get() {
    static Registry r;
    return r;
  }
};

struct Register {
  Register(const char* name, std::function<void()> fn) { Registry::get().tests.emplace_back(name, std::move(fn)); }
};

/** A per-process scratch path under /tmp for files a test writes (e.g. a generated model). */
inline std::string temp_dir(const std::string& name) {
  return "/tmp/sluice-native-test-" + std::to_string(::getpid()) + "/" + name;
}

inline int run_all(const char* suite) {
  int passed = 0, failed = 0;
  for (auto& [name, fn] : Registry::get().tests) {
    Registry::get().failures_in_current = 0;
    try {
      fn();
    } catch (const std::exception& e) {
      std::printf("  %s: unexpected exception: %s\n", name.c_str(), e.what());
      Registry::get().failures_in_current++;
    }
    if (Registry::get().failures_in_current == 0) {
      passed++;
      std::printf("ok   %s\n", name.c_str());
    } else {
      failed++;
      std::printf("FAIL %s\n", name.c_str());
    }
  }
  std::printf("%s: %d passed, %d failed\n", suite, passed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace sluice_test

#define TEST_CASE(name)                                                   \
  static void name();                                                     \
  static sluice_test::Register register_##name(#name, name);              \
  static void name()

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::printf("  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);        \
      sluice_test::Registry::get().failures_in_current++;                           \
    }                                                                               \
  } while (0)

#define CHECK_THROWS_CODE(expr, code_value)                                              \
  do {                                                                                   \
    bool thrown_ = false;                                                                \
    try {                                                                                \
      expr;                                                                              \
    } catch (const sluice::Error& e_) {                                                  \
      thrown_ = e_.code() == (code_value);                                               \
      if (!thrown_) std::printf("  %s:%d: wrong error code: %s\n", __FILE__, __LINE__, e_.what()); \
    }                                                                                    \
    if (!thrown_) {                                                                      \
      std::printf("  %s:%d: expected %s to throw %s\n", __FILE__, __LINE__, #expr, #code_value); \
      sluice_test::Registry::get().failures_in_current++;                                \
    }                                                                                    \
  } while (0)
