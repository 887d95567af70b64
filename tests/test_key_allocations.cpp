// Proves that deriving a key allocates nothing on the heap, neither in C++ (operator new) nor
// inside OpenSSL (its malloc hooks), once the thread's hashing context exists.

#include <idemgate/key.hpp>

#include <gtest/gtest.h>
#include <openssl/crypto.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>

namespace {
std::atomic<long> cxx_allocations{0};
std::atomic<long> openssl_allocations{0};

void* counting_malloc(size_t n, const char*, int) {
  openssl_allocations.fetch_add(1);
  return std::malloc(n);
}
void* counting_realloc(void* p, size_t n, const char*, int) {
  openssl_allocations.fetch_add(1);
  return std::realloc(p, n);
}
void counting_free(void* p, const char*, int) {
  std::free(p);
}
}  // namespace

void* operator new(std::size_t n) {
  cxx_allocations.fetch_add(1);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}

TEST(DeriveKey, AllocatesNothingOnTheHotPath) {
  const std::string notification = "CIS-2025-06-09-1001";
  const std::string container = "MSKU7000037";
  // The first call creates this thread's reusable context.
  (void)idemgate::derive_key("ect.claim_slot", notification, container);
  const long cxx_before = cxx_allocations.load();
  const long ssl_before = openssl_allocations.load();
  idemgate::Key last;
  for (int i = 0; i < 10000; ++i)
    last = idemgate::derive_key("ect.claim_slot", notification, container);
  EXPECT_EQ(cxx_allocations.load() - cxx_before, 0);
  EXPECT_EQ(openssl_allocations.load() - ssl_before, 0);
  EXPECT_EQ(last.hex(), "fcdf3be2f923908b2dc04f19ada8a7cf01909fd202b58ca9676f08591cf59d11");
}

TEST(DeriveKey, AllocationCounterSeesOpenSslAllocations) {
  // Guards the test above: if the hooks were not installed, zero would prove nothing.
  const long before = openssl_allocations.load();
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_MD_CTX_free(ctx);
  EXPECT_GT(openssl_allocations.load(), before);
}

int main(int argc, char** argv) {
  // Must run before OpenSSL allocates anything.
  if (CRYPTO_set_mem_functions(counting_malloc, counting_realloc, counting_free) != 1) {
    std::fprintf(stderr, "could not install OpenSSL allocation hooks\n");
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
