// derive_key on a two-field input, beside OpenSSL's fastest way through EVP to hash the same
// encoded bytes (the length-prefixed encoding key.hpp describes): SHA-256 fetched once, one
// EVP_MD_CTX reused for every digest (EVP_DigestInit_ex / Update / Final_ex), so the baseline
// pays neither a fetch nor a context allocation per call. That derive_key allocates nothing is
// proved by tests/test_key_allocations.cpp, not here.

#include "bench_support.hpp"

#include <idemgate/key.hpp>

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace {

constexpr std::string_view scope = "ect.claim_slot";
constexpr std::string_view notification = "CIS-2025-06-09-1001";
constexpr std::string_view container = "MSKU7000037";

// The bytes derive_key hashes: each part preceded by its length as 8 big-endian bytes.
std::string encoded(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view part : parts) {
    std::uint64_t n = part.size();
    std::array<char, 8> length{};
    for (int i = 7; i >= 0; --i, n >>= 8)
      length[static_cast<std::size_t>(i)] = static_cast<char>(n & 0xff);
    out.append(length.data(), length.size());
    out.append(part);
  }
  return out;
}

void derive_key_two_fields(benchmark::State& state) {
  for (auto _ : state) {
    idemgate::Key key = idemgate::derive_key(scope, notification, container);
    benchmark::DoNotOptimize(key);
  }
}

// SHA-256 fetched once and a digest context kept for the whole run.
class ReusedContext {
 public:
  ReusedContext() : md_(EVP_MD_fetch(nullptr, "SHA256", nullptr)), ctx_(EVP_MD_CTX_new()) {}
  ReusedContext(const ReusedContext&) = delete;
  ReusedContext& operator=(const ReusedContext&) = delete;
  ~ReusedContext() {
    EVP_MD_CTX_free(ctx_);
    EVP_MD_free(md_);
  }

  [[nodiscard]] bool usable() const { return md_ != nullptr && ctx_ != nullptr; }

  // One digest on the reused context; false when OpenSSL refused a step.
  bool digest(std::string_view bytes, unsigned char* out, unsigned int* size) {
    return EVP_DigestInit_ex(ctx_, md_, nullptr) == 1 &&
           EVP_DigestUpdate(ctx_, bytes.data(), bytes.size()) == 1 &&
           EVP_DigestFinal_ex(ctx_, out, size) == 1;
  }

 private:
  EVP_MD* md_;
  EVP_MD_CTX* ctx_;
};

void evp_reused_context_same_bytes(benchmark::State& state) {
  const std::string bytes = encoded({scope, notification, container});
  ReusedContext sha256;
  // The baseline must hash exactly what derive_key hashes.
  std::array<unsigned char, EVP_MAX_MD_SIZE> check{};
  unsigned int check_size = 0;
  const idemgate::Key expected = idemgate::derive_key(scope, notification, container);
  if (!sha256.usable() || !sha256.digest(bytes, check.data(), &check_size) ||
      check_size != idemgate::Key::size ||
      !std::equal(expected.bytes().begin(), expected.bytes().end(), check.begin())) {
    state.SkipWithError(
        "OpenSSL refused the digest, or the encoding here no longer matches "
        "derive_key's");
    return;
  }
  for (auto _ : state) {
    std::array<unsigned char, EVP_MAX_MD_SIZE> digest;
    unsigned int size = 0;
    const bool done = sha256.digest(bytes, digest.data(), &size);
    benchmark::DoNotOptimize(done);
    benchmark::DoNotOptimize(digest);
    benchmark::DoNotOptimize(size);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("key/derive_key", derive_key_two_fields);
  benchmark::RegisterBenchmark("key/evp_reused_ctx", evp_reused_context_same_bytes);
  return idemgate::bench::run_benchmarks(argc, argv);
}
