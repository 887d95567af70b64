// derive_key on a two-field input, beside a bare OpenSSL EVP_Digest SHA-256 of the same encoded
// bytes (the length-prefixed encoding key.hpp describes). That derive_key allocates nothing is
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

void evp_digest_same_bytes(benchmark::State& state) {
  const std::string bytes = encoded({scope, notification, container});
  // The baseline must hash exactly what derive_key hashes.
  std::array<unsigned char, EVP_MAX_MD_SIZE> check{};
  unsigned int check_size = 0;
  EVP_Digest(bytes.data(), bytes.size(), check.data(), &check_size, EVP_sha256(), nullptr);
  const idemgate::Key expected = idemgate::derive_key(scope, notification, container);
  if (check_size != idemgate::Key::size ||
      !std::equal(expected.bytes().begin(), expected.bytes().end(), check.begin())) {
    state.SkipWithError("the encoding here no longer matches derive_key's");
    return;
  }
  for (auto _ : state) {
    std::array<unsigned char, EVP_MAX_MD_SIZE> digest;
    unsigned int size = 0;
    EVP_Digest(bytes.data(), bytes.size(), digest.data(), &size, EVP_sha256(), nullptr);
    benchmark::DoNotOptimize(digest);
    benchmark::DoNotOptimize(size);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("key/derive_key", derive_key_two_fields);
  benchmark::RegisterBenchmark("key/evp_digest", evp_digest_same_bytes);
  return idemgate::bench::run_benchmarks(argc, argv);
}
