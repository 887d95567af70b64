#pragma once

// A self-signed certificate for 127.0.0.1, made in memory with OpenSSL, for HTTPS over loopback
// (an httplib::SSLServer takes the key and certificate; a client trusts the PEM file).

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <stdexcept>
#include <string>

namespace idemgate::test {

/// A P-256 key and a certificate for 127.0.0.1 signed by it, valid for a day.
struct SelfSigned {
  SelfSigned() : key(EVP_EC_gen("P-256")), cert(X509_new()) {
    if (!key || !cert) throw std::runtime_error("OpenSSL could not make a key or certificate");
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert), -60);
    X509_gmtime_adj(X509_getm_notAfter(cert), 24 * 3600);
    X509_set_pubkey(cert, key);
    X509_NAME* name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>("127.0.0.1"), -1, -1, 0);
    X509_set_issuer_name(cert, name);
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
    X509_EXTENSION* san = X509V3_EXT_conf_nid(nullptr, &ctx, NID_subject_alt_name, "IP:127.0.0.1");
    if (san == nullptr || X509_add_ext(cert, san, -1) != 1 ||
        X509_sign(cert, key, EVP_sha256()) == 0)
      throw std::runtime_error("OpenSSL could not sign the certificate");
    X509_EXTENSION_free(san);
  }
  ~SelfSigned() {
    X509_free(cert);
    EVP_PKEY_free(key);
  }
  SelfSigned(const SelfSigned&) = delete;
  SelfSigned& operator=(const SelfSigned&) = delete;

  /// Writes the certificate as PEM to `path`, for the client to trust.
  void write_pem(const std::string& path) const {
    FILE* file = std::fopen(path.c_str(), "w");
    if (file == nullptr || PEM_write_X509(file, cert) != 1)
      throw std::runtime_error("cannot write " + path);
    std::fclose(file);
  }

  /// The private key.
  EVP_PKEY* key;
  /// The certificate, for 127.0.0.1 (subject and subjectAltName).
  X509* cert;
};

}  // namespace idemgate::test
