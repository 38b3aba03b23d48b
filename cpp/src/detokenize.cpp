#include "detokenize.hpp"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "seer/seer.hpp"

namespace seer {
namespace {

// code point -> UTF-8 (ByteLevel's alphabet lies below U+0200)
std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) s += char(cp);
  else if (cp < 0x800) s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
  else if (cp < 0x10000) s += char(0xE0 | (cp >> 12)), s += char(0x80 | ((cp >> 6) & 0x3F)), s += char(0x80 | (cp & 0x3F));
  else s += char(0xF0 | (cp >> 18)), s += char(0x80 | ((cp >> 12) & 0x3F)), s += char(0x80 | ((cp >> 6) & 0x3F)), s += char(0x80 | (cp & 0x3F));
  return s;
}

// Decode UTF-8 into code points; false on malformed input.
bool code_points(const std::string& s, std::vector<uint32_t>& out) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || i + len > s.size()) return false;
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += len;
  }
  return true;
}

}  // namespace

Detokenizer::Detokenizer(const std::string& tokenizer_json) {
  nlohmann::json data;
  try {
    data = nlohmann::json::parse(tokenizer_json);
    const auto& vocab = data.at("model").at("vocab");
    auto put = [&](int64_t id, const std::string& token, bool special) {
      if (id >= 0) tokens_[id] = Token{token, special};
    };
    if (vocab.is_object())
      for (const auto& [token, id] : vocab.items()) put(id.get<int64_t>(), token, false);
    else
      return;  // Unigram (a list of pieces) and the like: no text
    for (const auto& added : data.value("added_tokens", nlohmann::json::array()))
      put(added.at("id").get<int64_t>(), added.at("content").get<std::string>(), added.value("special", false));
    const auto& dec = data.value("decoder", nlohmann::json());
    if (dec.is_null()) decoder_ = "none";
    else if (dec.value("type", "") == "ByteLevel") decoder_ = "ByteLevel";
  } catch (const std::exception&) {
    decoder_.clear();
    return;
  }
  if (decoder_ == "ByteLevel") {  // GPT-2's bytes_to_unicode, inverted
    byte_of_.assign(0x200, -1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      byte_of_[printable ? b : 256 + extra++] = b;
    }
  }
}

std::optional<std::string> Detokenizer::decode(const std::vector<int64_t>& ids) const {
  if (decoder_.empty()) return std::nullopt;
  std::string text;
  bool first = true;
  for (int64_t id : ids) {
    const auto found = tokens_.find(id);
    if (found == tokens_.end() || found->second.special) continue;
    const std::string& token = found->second.text;
    if (decoder_ == "none") {
      text += (first ? "" : " ") + token;
    } else {
      std::vector<uint32_t> cps;
      if (!code_points(token, cps)) return std::nullopt;
      for (uint32_t cp : cps) {
        if (cp < byte_of_.size() && byte_of_[cp] >= 0) text += char(byte_of_[cp]);
        else text += utf8(cp);  // an added token's own text
      }
    }
    first = false;
  }
  return text;
}

std::string mask_in_answer(const std::vector<int64_t>& ids, int64_t mask_id) {
  const auto first = std::find(ids.begin(), ids.end(), mask_id);
  if (first == ids.end()) return "";
  return "the model produced the mask token (id " + std::to_string(mask_id) + ") as an answer, at " +
         std::to_string(std::count(ids.begin(), ids.end(), mask_id)) + " of its " + std::to_string(ids.size()) +
         " positions from position " + std::to_string(first - ids.begin()) + "; the export is broken (non-finite " +
         "or corrupt weights): re-export it with validation (seer-export without --no-validate)";
}

std::string cut_at_stop(const std::string& text, const std::vector<std::string>& stop) {
  // the occurrence that ends first, the longest of those ending at the same character (its start the earliest)
  size_t cut = std::string::npos, end = std::string::npos;
  for (const std::string& q : stop) {
    const size_t at = text.find(q);
    if (at == std::string::npos) continue;
    if (at + q.size() < end || (at + q.size() == end && at < cut)) cut = at, end = at + q.size();
  }
  return cut == std::string::npos ? text : text.substr(0, cut);
}

}  // namespace seer
