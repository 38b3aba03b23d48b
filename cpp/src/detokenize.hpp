// Answer ids -> text, from the export's tokenizer.json (what `tokenizers` does for decode(skip_special_tokens)).
//
// In:  tokenizer.json: its vocabulary (WordLevel, BPE, WordPiece: token -> id), added tokens, decoder.
// Out: the text of an answer, special added tokens dropped; none when the decoder is one this file does not read; and
//      why an answer that holds the mask id is none (mask_in_answer: that request fails, as in Python).
// Read: no decoder (tokens joined by spaces, the fixture's word-level tokenizer) and ByteLevel (GPT-2 style byte
// mapping, the usual BPE decoder). Encoding prompt text stays with the caller (seer-prompt-ids): the chat
// template is Jinja and user text must never become control tokens, which the Python runtime already ensures.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace seer {

class Detokenizer {
 public:
  explicit Detokenizer(const std::string& tokenizer_json);  // tokenizer.json's text; unreadable: no text
  std::optional<std::string> decode(const std::vector<int64_t>& ids) const;

 private:
  struct Token {
    std::string text;
    bool special = false;  // a special added token (dropped)
  };
  // id -> token, a map: its size is the file's entries, never the largest id a file names
  std::unordered_map<int64_t, Token> tokens_;
  std::string decoder_;              // "none" | "ByteLevel" | "" (unsupported)
  std::vector<int> byte_of_;         // ByteLevel: code point -> byte
};

// Why answer `ids` is no answer: it holds `mask_id`, which a model never predicts unless its export is broken (a NaN
// weight exported with --no-validate); empty when it holds none. Word for word Python's
// seer_trt.runtime.detokenize.mask_in_answer.
std::string mask_in_answer(const std::vector<int64_t>& ids, int64_t mask_id);

}  // namespace seer
