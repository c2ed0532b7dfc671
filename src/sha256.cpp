#include "sha256.hpp"

#include <openssl/evp.h>

#include <stdexcept>

namespace orpheus::detail {

std::array<unsigned char, 32> sha256(std::string_view data) {
  static EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  std::array<unsigned char, 32> out{};
  unsigned int len = 0;
  if (md == nullptr || EVP_Digest(data.data(), data.size(), out.data(), &len, md, nullptr) != 1) {
    throw std::runtime_error("SHA-256 unavailable from OpenSSL");
  }
  return out;
}

}  // namespace orpheus::detail
