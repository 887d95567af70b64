// SPDX-License-Identifier: MIT
// Ed25519 signature verification over OpenSSL; includes nothing of idemgate.
#pragma once

#include <openssl/err.h>
#include <openssl/evp.h>

#include <array>
#include <cstddef>
#include <memory>
#include <new>
#include <stdexcept>
#include <string_view>

namespace idemgate::detail {

/// An Ed25519 public key (RFC 8032), held as an OpenSSL key that verifies signatures.
///
/// Copies share the key; verifying is safe from several threads at once (each call uses its own
/// OpenSSL context).
class Ed25519PublicKey {
 public:
  /// Size of a raw public key, in bytes.
  static constexpr std::size_t key_size = 32;
  /// Size of a signature, in bytes.
  static constexpr std::size_t signature_size = 64;
  /// A raw public key.
  using key_type = std::array<unsigned char, key_size>;
  /// A raw signature.
  using signature_type = std::array<unsigned char, signature_size>;

  /// Loads a raw 32-byte public key; throws `std::runtime_error` when OpenSSL cannot.
  explicit Ed25519PublicKey(const key_type& raw)
      : key_(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, raw.data(), raw.size()),
             EVP_PKEY_free) {
    if (!key_) {
      ERR_clear_error();
      throw std::runtime_error(
          "idemgate: OpenSSL could not load an Ed25519 public key; check that it is OpenSSL "
          "1.1.1 or later and that its default provider loads");
    }
  }

  /// Whether `signature` is a valid Ed25519 signature of `message` under this key.
  [[nodiscard]] bool verify(const signature_type& signature, std::string_view message) const {
    const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context(EVP_MD_CTX_new(),
                                                                          EVP_MD_CTX_free);
    if (!context) throw std::bad_alloc();
    // Ed25519 hashes internally: no digest is named, and only the one-shot call is allowed.
    const bool valid =
        EVP_DigestVerifyInit(context.get(), nullptr, nullptr, nullptr, key_.get()) == 1 &&
        EVP_DigestVerify(context.get(), signature.data(), signature.size(),
                         reinterpret_cast<const unsigned char*>(message.data()),
                         message.size()) == 1;
    // A refused signature leaves an entry in this thread's OpenSSL error queue; it is not an
    // error of the caller's next OpenSSL call.
    if (!valid) ERR_clear_error();
    return valid;
  }

 private:
  std::shared_ptr<EVP_PKEY> key_;
};

}  // namespace idemgate::detail
