// How a Pre-RPC result is stored and read back (src/pre_state.cpp): JSON
// text, or "cbor:" + base64 for values JSON cannot carry (bytes that are not
// UTF-8).
//
// Input: a stored text, as a row's pre_state column holds it; or, after a
// first byte 0x01, the CBOR of a value to store.
//
// Properties (neither function may throw):
//  - what decode_pre_state() reads, encode_pre_state() stores again so that
//    it reads back the same value (values JSON cannot represent exactly
//    aside: NaN and infinities, CBOR byte strings), and storing that again
//    gives the same text;
//  - any value a handler could return (anything CBOR can carry but byte
//    strings) is stored faithfully: it reads back equal, strings that are
//    not UTF-8 included.
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "fuzz_support.hpp"
#include "pre_state.hpp"

namespace {

using orpheus::fuzz::shown;

// Whether `root` holds only what JSON and CBOR both carry exactly.
bool representable(const nlohmann::json& root) {
  std::vector<const nlohmann::json*> todo{&root};
  while (!todo.empty()) {
    const auto* j = todo.back();
    todo.pop_back();
    if (j->is_binary()) return false;
    if (j->is_number_float() && !std::isfinite(j->get<double>())) return false;
    if (j->is_structured()) {
      for (const auto& child : *j) todo.push_back(&child);
    }
  }
  return true;
}

void check_stored(const nlohmann::json& value, std::string_view from) {
  const std::string stored = orpheus::detail::encode_pre_state(value);
  const auto back = orpheus::detail::decode_pre_state(stored);
  FUZZ_CHECK(back.has_value(),
             "stored " + shown(stored) + " does not read back; from " + shown(from));
  FUZZ_CHECK(*back == value,
             "stored " + shown(stored) + " reads back as another value; from " + shown(from));
  FUZZ_CHECK(orpheus::detail::encode_pre_state(*back) == stored, "not stable: " + shown(stored));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in = orpheus::fuzz::text_of(data, size);
  if (!in.empty() && in[0] == '\x01') {
    nlohmann::json value;
    try {  // nlohmann throws on absurd sizes even with allow_exceptions = false
      value = nlohmann::json::from_cbor(in.substr(1), /*strict=*/true,
                                        /*allow_exceptions=*/false);
    } catch (const nlohmann::json::exception&) {
      return 0;
    }
    if (!value.is_discarded() && representable(value)) check_stored(value, in);
    return 0;
  }
  const auto value = orpheus::detail::decode_pre_state(in);
  if (value && representable(*value)) check_stored(*value, in);
  return 0;
}
