// SPDX-License-Identifier: MIT
// HMAC-SHA256 over OpenSSL and constant-time comparison; includes nothing of idemgate.
#pragma once

#include <openssl/crypto.h>
#include <openssl/evp.h>
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
#include <openssl/core_names.h>
#include <openssl/params.h>
#else
#include <openssl/hmac.h>
#endif

#include <array>
#include <climits>
#include <cstddef>
#include <initializer_list>
#include <new>
#include <stdexcept>
#include <string_view>

namespace idemgate::detail {

#if OPENSSL_VERSION_NUMBER >= 0x30000000L
/// The HMAC algorithm, fetched once per process so each MAC skips the provider lookup.
inline EVP_MAC* hmac_algorithm() {
  static EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (mac == nullptr)
    throw std::runtime_error(
        "idemgate: OpenSSL has no HMAC implementation; check that the default provider loads");
  return mac;
}
#endif

/// Incremental HMAC-SHA256 over one reusable OpenSSL context.
///
/// `start` sets the key, `update` feeds the message in pieces (so a body is never copied to be
/// concatenated with its prefix), `finish` returns the 32-byte MAC.
class HmacSha256 {
 public:
  /// A MAC: 32 raw bytes.
  using mac_type = std::array<unsigned char, 32>;

  HmacSha256() {
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
    ctx_ = EVP_MAC_CTX_new(hmac_algorithm());
#else
    ctx_ = HMAC_CTX_new();
#endif
    if (ctx_ == nullptr) throw std::bad_alloc();
  }
  ~HmacSha256() {
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
    EVP_MAC_CTX_free(ctx_);
#else
    HMAC_CTX_free(ctx_);
#endif
  }
  HmacSha256(const HmacSha256&) = delete;
  HmacSha256& operator=(const HmacSha256&) = delete;

  /// Starts a new MAC under `key`, which must not be empty.
  void start(std::string_view key) {
    if (key.empty())
      throw std::logic_error("idemgate: HMAC key is empty; callers must reject empty secrets");
    const auto* bytes = reinterpret_cast<const unsigned char*>(key.data());
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
    char digest[] = "SHA256";
    const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                                 OSSL_PARAM_construct_end()};
    if (EVP_MAC_init(ctx_, bytes, key.size(), params) != 1)
#else
    if (key.size() > static_cast<std::size_t>(INT_MAX) ||
        HMAC_Init_ex(ctx_, bytes, static_cast<int>(key.size()), EVP_sha256(), nullptr) != 1)
#endif
      throw std::runtime_error("idemgate: OpenSSL could not initialise HMAC-SHA256");
  }

  /// Feeds bytes into the MAC.
  void update(std::string_view bytes) {
    if (bytes.empty()) return;
    const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
    if (EVP_MAC_update(ctx_, data, bytes.size()) != 1)
#else
    if (HMAC_Update(ctx_, data, bytes.size()) != 1)
#endif
      throw std::runtime_error("idemgate: OpenSSL HMAC-SHA256 update failed");
  }

  /// Finishes the MAC; call `start` again before the next one.
  mac_type finish() {
    mac_type out{};
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
    std::size_t length = 0;
    if (EVP_MAC_final(ctx_, out.data(), &length, out.size()) != 1 || length != out.size())
#else
    unsigned int length = 0;
    if (HMAC_Final(ctx_, out.data(), &length) != 1 || length != out.size())
#endif
      throw std::runtime_error("idemgate: OpenSSL HMAC-SHA256 final failed");
    return out;
  }

 private:
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
  EVP_MAC_CTX* ctx_ = nullptr;
#else
  HMAC_CTX* ctx_ = nullptr;
#endif
};

/// This thread's reusable HMAC-SHA256 context.
inline HmacSha256& thread_hmac_sha256() {
  thread_local HmacSha256 hmac;
  return hmac;
}

/// HMAC-SHA256 under `key` (non-empty) of the concatenation of `parts`, without concatenating.
[[nodiscard]] inline HmacSha256::mac_type hmac_sha256(
    std::string_view key, std::initializer_list<std::string_view> parts) {
  HmacSha256& hmac = thread_hmac_sha256();
  hmac.start(key);
  for (std::string_view part : parts) hmac.update(part);
  return hmac.finish();
}

/// Constant-time equality of two MACs: the time taken does not depend on where they differ.
[[nodiscard]] inline bool mac_equal(const HmacSha256::mac_type& a,
                                    const HmacSha256::mac_type& b) noexcept {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace idemgate::detail
