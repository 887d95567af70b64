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

namespace idemgate::detail {

/// Incremental SHA-256 that allocates nothing per digest.
class Sha256 {
 public:
  /// A digest: 32 raw bytes.
  using digest_type = std::array<unsigned char, 32>;

#if IDEMGATE_SHA256_STACK
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  Sha256() noexcept {
    reset();
  }

  /// Starts a new digest.
  void reset() noexcept {
    SHA256_Init(&ctx_);
  }

  /// Feeds bytes into the digest.
  void update(const void* data, std::size_t size) noexcept {
    if (size != 0) SHA256_Update(&ctx_, data, size);
  }

  /// Finishes the digest and starts the next one.
  digest_type finish() noexcept {
    digest_type out{};
    SHA256_Final(out.data(), &ctx_);
    reset();
    return out;
  }
#pragma GCC diagnostic pop

 private:
  SHA256_CTX ctx_{};

 public:
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

  /// Starts a new digest.
  void reset() {
    if (EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1)
      throw std::runtime_error("idemgate: OpenSSL could not initialise SHA-256");
  }

  /// Feeds bytes into the digest.
  void update(const void* data, std::size_t size) {
    if (size != 0 && EVP_DigestUpdate(ctx_, data, size) != 1)
      throw std::runtime_error("idemgate: OpenSSL SHA-256 update failed");
  }

  /// Finishes the digest and starts the next one.
  digest_type finish() {
    digest_type out{};
    unsigned int length = 0;
    if (EVP_DigestFinal_ex(ctx_, out.data(), &length) != 1 || length != out.size())
      throw std::runtime_error("idemgate: OpenSSL SHA-256 final failed");
    reset();
    return out;
  }

 private:
  EVP_MD_CTX* ctx_;

 public:
#endif

  /// Feeds a string's bytes into the digest.
  void update(std::string_view bytes) {
    update(bytes.data(), bytes.size());
  }
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
