// SPDX-License-Identifier: MIT
// Incremental SHA-256 over OpenSSL; includes nothing of idemgate.
#pragma once

#include <openssl/evp.h>
#include <openssl/opensslv.h>
#include <openssl/sha.h>

#include <array>
#include <cstddef>
#include <stdexcept>
#include <string_view>

// OpenSSL 3.0's EVP_DigestInit frees and reallocates the provider's context on every digest,
// one heap allocation per key. Its SHA256_* functions hash the same bytes into a context on the
// stack, allocating nothing; they are deprecated but present in every 3.x build. A build
// without deprecated functions falls back to EVP.
#if defined(OPENSSL_NO_DEPRECATED_3_0) || defined(IDEMGATE_SHA256_EVP)
#define IDEMGATE_SHA256_STACK 0
#else
#define IDEMGATE_SHA256_STACK 1
#endif

// Calls one of OpenSSL's deprecated SHA256_* functions without the deprecation warning.
#define IDEMGATE_SHA256_LEGACY(call)                                                             \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wdeprecated-declarations\"") \
      call;                                                                                      \
  _Pragma("GCC diagnostic pop")

namespace idemgate::detail {

/// Incremental SHA-256 that allocates nothing per digest.
class Sha256 {
 public:
  /// A digest: 32 raw bytes.
  using digest_type = std::array<unsigned char, 32>;

#if IDEMGATE_SHA256_STACK
  Sha256() noexcept {
    reset();
  }
#else
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    if (ctx_ == nullptr) throw std::bad_alloc();
    reset();
  }
  ~Sha256() {
    EVP_MD_CTX_free(ctx_);
  }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
#endif

  /// Starts a new digest.
  void reset() {
#if IDEMGATE_SHA256_STACK
    IDEMGATE_SHA256_LEGACY(SHA256_Init(&ctx_));
#else
    if (EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1)
      throw std::runtime_error("idemgate: OpenSSL could not initialise SHA-256");
#endif
  }

  /// Feeds bytes into the digest.
  void update(const void* data, std::size_t size) {
    if (size == 0) return;
#if IDEMGATE_SHA256_STACK
    IDEMGATE_SHA256_LEGACY(SHA256_Update(&ctx_, data, size));
#else
    if (EVP_DigestUpdate(ctx_, data, size) != 1)
      throw std::runtime_error("idemgate: OpenSSL SHA-256 update failed");
#endif
  }

  /// Feeds a string's bytes into the digest.
  void update(std::string_view bytes) {
    update(bytes.data(), bytes.size());
  }

  /// Finishes the digest and starts the next one.
  digest_type finish() {
    digest_type out{};
#if IDEMGATE_SHA256_STACK
    IDEMGATE_SHA256_LEGACY(SHA256_Final(out.data(), &ctx_));
#else
    unsigned int length = 0;
    if (EVP_DigestFinal_ex(ctx_, out.data(), &length) != 1 || length != out.size())
      throw std::runtime_error("idemgate: OpenSSL SHA-256 final failed");
#endif
    reset();
    return out;
  }

 private:
#if IDEMGATE_SHA256_STACK
  SHA256_CTX ctx_{};
#else
  EVP_MD_CTX* ctx_;
#endif
};

/// This thread's reusable SHA-256 context.
inline Sha256& thread_sha256() {
  thread_local Sha256 hasher;
  return hasher;
}

/// SHA-256 of one byte string.
inline Sha256::digest_type sha256(std::string_view bytes) {
  Sha256& hasher = thread_sha256();
  hasher.update(bytes);
  return hasher.finish();
}

}  // namespace idemgate::detail
