#pragma once
/// The umT5 tokenizer through libsentencepiece (spiece.model of google/umt5-xxl), with the call the
/// reference makes through HF's T5TokenizerFast: add_special_tokens (EOS id 1 appended),
/// padding='max_length' with pad id 0, truncation=True, max_length 512, and the attention mask.
///
/// Known differences from T5TokenizerFast (docs/SAMPLING.md; check with
/// scripts/parity/gen_tokenizer_golden.py): special-token strings typed in the text ("</s>",
/// "<extra_id_0>") are plain text here; HF's normalizer strips trailing whitespace and replaces
/// runs of 2+ spaces before the model, which the reference's cleaning already guarantees.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/embodiment.h"

namespace dzr {

/// Token ids of one text, padded to a fixed length.
struct TokenizedText {
    std::vector<int64_t> ids;             ///< [max_length]: tokens, EOS, then pad (0)
    std::vector<int64_t> attention_mask;  ///< [max_length]: 1 for tokens and EOS, 0 for pad
    int64_t length = 0;                   ///< tokens including EOS
    bool truncated = false;               ///< the text had more than max_length - 1 tokens
};

class Umt5Tokenizer {
  public:
    static constexpr int kPadId = 0;
    static constexpr int kEosId = 1;
    static constexpr int kUnkId = 2;
    static constexpr int kMaxLength = 512;

    /// `path`: a spiece.model file, or a directory with spiece.model (or tokenizer/spiece.model).
    /// Throws dzr::Error when missing, unreadable, or when its pad/eos/unk ids are not 0/1/2.
    explicit Umt5Tokenizer(const std::filesystem::path& path);
    ~Umt5Tokenizer();
    Umt5Tokenizer(Umt5Tokenizer&&) noexcept;
    Umt5Tokenizer& operator=(Umt5Tokenizer&&) noexcept;
    Umt5Tokenizer(const Umt5Tokenizer&) = delete;
    Umt5Tokenizer& operator=(const Umt5Tokenizer&) = delete;

    /// Piece ids of `text` without special tokens.
    std::vector<int> encode_ids(std::string_view text) const;
    /// Piece strings of `text` (for diagnostics).
    std::vector<std::string> encode_pieces(std::string_view text) const;
    /// ids + EOS, truncated to max_length (keeping EOS, with a warning naming `what`), padded with 0.
    TokenizedText encode(std::string_view text, int max_length = kMaxLength,
                         std::string_view what = "prompt") const;
    std::string decode(std::span<const int> ids) const;
    int vocab_size() const;
    const std::filesystem::path& model_path() const { return path_; }

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    std::filesystem::path path_;
};

/// The two token sequences of a policy call: the templated, cleaned instruction (conditional
/// branch) and the cleaned fixed negative prompt (unconditional branch).
struct PromptTokens {
    std::string text;  ///< the cleaned positive text that was tokenized
    TokenizedText positive;
    TokenizedText negative;
};

PromptTokens tokenize_droid_prompts(const Umt5Tokenizer& tokenizer, std::string_view instruction,
                                    int max_length = Umt5Tokenizer::kMaxLength);

/// The same for an embodiment's template (templated_prompt); the negative prompt is the same for all.
PromptTokens tokenize_prompts(const Umt5Tokenizer& tokenizer, PromptTemplate templ, std::string_view instruction,
                              int max_length = Umt5Tokenizer::kMaxLength);

}  // namespace dzr
