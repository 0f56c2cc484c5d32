// SHA-256 (util/sha256.h) against FIPS 180-4's published examples, and the SHA-extension path
// against the portable one over every length up to three blocks and split updates.
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"
#include "util/sha256.h"

namespace {

std::string hex(const std::array<uint8_t, 32>& d) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

std::string digest(const std::string& msg) {
  sluice::Sha256 h;
  h.update(msg.data(), msg.size());
  return hex(h.finish());
}

// Runs `fn` with the hardware path (where the CPU has one) and with the portable path.
template <typename Fn>
void both_paths(Fn fn) {
  sluice::Sha256::force_portable(false);
  fn();
  sluice::Sha256::force_portable(true);
  fn();
  sluice::Sha256::force_portable(false);
}

}  // namespace

TEST_CASE(published_examples) {
  std::printf("  SHA extensions: %s\n", sluice::Sha256::hardware() ? "yes" : "no");
  both_paths([] {
    CHECK(digest("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(digest("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    CHECK(digest("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    CHECK(digest(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  });
}

TEST_CASE(hardware_path_matches_portable_at_every_length_and_split) {
  std::mt19937 rng(7);
  std::vector<uint8_t> data(64 * 3 + 1);
  for (auto& b : data) b = uint8_t(rng());
  for (size_t n = 0; n <= data.size(); n++) {
    std::array<uint8_t, 32> ref{}, got{}, split{};
    sluice::Sha256::force_portable(true);
    {
      sluice::Sha256 h;
      h.update(data.data(), n);
      ref = h.finish();
    }
    sluice::Sha256::force_portable(false);
    {
      sluice::Sha256 h;
      h.update(data.data(), n);
      got = h.finish();
    }
    {
      // Uneven pieces exercise the partial-block buffer.
      sluice::Sha256 h;
      size_t at = 0;
      for (size_t piece = 1; at < n; piece = piece * 3 % 67 + 1) {
        const size_t take = std::min(piece, n - at);
        h.update(data.data() + at, take);
        at += take;
      }
      split = h.finish();
    }
    CHECK(got == ref);
    CHECK(split == ref);
  }
}

int main() { return sluice_test::run_all("sha256"); }
