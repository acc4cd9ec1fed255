#include "policy/tokenizer.h"

#include <sentencepiece_processor.h>

#include "core/error.h"
#include "core/log.h"
#include "policy/prompt.h"
#include "weights/checkpoint.h"

namespace dzr {

struct Umt5Tokenizer::Impl {
    sentencepiece::SentencePieceProcessor sp;
};

Umt5Tokenizer::Umt5Tokenizer(const std::filesystem::path& path)
    : impl_(std::make_unique<Impl>()), path_(resolve_tokenizer_path(path)) {
    const auto status = impl_->sp.Load(path_.string());
    DZR_CHECK(status.ok(), "tokenizer {}: cannot load the sentencepiece model: {}", path_.string(),
              status.ToString());
    const int pad = impl_->sp.pad_id(), eos = impl_->sp.eos_id(), unk = impl_->sp.unk_id();
    DZR_CHECK(
        pad == kPadId && eos == kEosId && unk == kUnkId,
        "tokenizer {}: expected umT5 special ids pad={} eos={} unk={}, the model has pad={} eos={} unk={}",
        path_.string(), kPadId, kEosId, kUnkId, pad, eos, unk);
}

Umt5Tokenizer::~Umt5Tokenizer() = default;
Umt5Tokenizer::Umt5Tokenizer(Umt5Tokenizer&&) noexcept = default;
Umt5Tokenizer& Umt5Tokenizer::operator=(Umt5Tokenizer&&) noexcept = default;

std::vector<int> Umt5Tokenizer::encode_ids(std::string_view text) const {
    std::vector<int> ids;
    const auto status = impl_->sp.Encode(absl::string_view(text.data(), text.size()), &ids);
    DZR_CHECK(status.ok(), "tokenizer {}: cannot encode text: {}", path_.string(), status.ToString());
    return ids;
}

std::vector<std::string> Umt5Tokenizer::encode_pieces(std::string_view text) const {
    std::vector<std::string> pieces;
    const auto status = impl_->sp.Encode(absl::string_view(text.data(), text.size()), &pieces);
    DZR_CHECK(status.ok(), "tokenizer {}: cannot encode text: {}", path_.string(), status.ToString());
    return pieces;
}

TokenizedText Umt5Tokenizer::encode(std::string_view text, int max_length, std::string_view what) const {
    DZR_CHECK(max_length >= 1, "tokenizer: max_length must be >= 1, got {}", max_length);
    const std::vector<int> ids = encode_ids(text);
    TokenizedText out;
    const size_t keep = std::min(ids.size(), size_t(max_length) - 1);
    out.truncated = keep < ids.size();
    if (out.truncated)
        log()->warn("{}: {} tokens exceed the {}-token limit; truncated to {} (+ EOS) as the reference does",
                    what, ids.size() + 1, max_length, keep);
    out.ids.assign(size_t(max_length), kPadId);
    out.attention_mask.assign(size_t(max_length), 0);
    for (size_t i = 0; i < keep; ++i) out.ids[i] = ids[i];
    out.ids[keep] = kEosId;
    out.length = int64_t(keep) + 1;
    for (int64_t i = 0; i < out.length; ++i) out.attention_mask[size_t(i)] = 1;
    return out;
}

std::string Umt5Tokenizer::decode(std::span<const int> ids) const {
    std::string text;
    const auto status = impl_->sp.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    DZR_CHECK(status.ok(), "tokenizer {}: cannot decode ids: {}", path_.string(), status.ToString());
    return text;
}

int Umt5Tokenizer::vocab_size() const {
    return impl_->sp.GetPieceSize();
}

PromptTokens tokenize_droid_prompts(const Umt5Tokenizer& tokenizer, std::string_view instruction,
                                    int max_length) {
    return tokenize_prompts(tokenizer, PromptTemplate::Droid, instruction, max_length);
}

PromptTokens tokenize_prompts(const Umt5Tokenizer& tokenizer, PromptTemplate templ, std::string_view instruction,
                              int max_length) {
    PromptTokens out;
    out.text = clean_prompt_text(templated_prompt(templ, instruction));
    out.positive = tokenizer.encode(out.text, max_length, "prompt");
    out.negative = tokenizer.encode(clean_prompt_text(kDroidNegativePrompt), max_length, "negative prompt");
    return out;
}

}  // namespace dzr
