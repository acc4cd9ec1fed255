#pragma once
/// The text encoder pre-pass. An offline run knows every prompt before its first call, so umT5 (11.4 GB at the
/// DROID geometry in bf16) need not share the device with the DiT: it is loaded alone, encodes the negative prompt
/// and each distinct prompt of the run once, and is freed before the other networks load. The embeddings (text_len
/// x t5.dim in the backend's compute dtype: 4 MiB each at the DROID geometry in bf16) stay in host memory, and a
/// session uploads a prompt's pair when its prompt changes, where it would otherwise run umT5. The bytes are
/// those the session's own forward would have written (same backend, same calls), so the outputs do not change.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "config/embodiment.h"
#include "config/model_config.h"
#include "core/tensor.h"
#include "policy/tokenizer.h"
#include "weights/weight_source.h"

namespace dzr {

class TextEmbeddings {
public:
    /// Loads umT5 through `loader` onto its backend, encodes the negative prompt and every prompt of `prompts`
    /// (instructions, tokenized in the embodiment's template as a call's prepare() does; duplicates once),
    /// keeps each embedding on the host in the backend's compute dtype, and frees umT5 before it returns.
    /// Needs the backend's workspace (the engine plans it first).
    static TextEmbeddings encode(WeightLoader& loader, const ModelConfig& model, const Embodiment& embodiment,
                                 const Umt5Tokenizer& tokenizer, std::span<const std::string> prompts);

    /// Uploads the embeddings of a call's prompt pair into `positive` and `negative` ([text_len, t5.dim] on
    /// `be`, its compute dtype). Throws dzr::Error quoting the prompt when the pre-pass did not encode it.
    void fetch(Backend& be, const PromptTokens& tokens, const TensorView& positive, const TensorView& negative) const;

    /// Distinct token sequences held (the negative prompt included).
    size_t size() const { return by_tokens_.size(); }
    /// Host bytes of the embeddings.
    size_t host_bytes() const;
    /// Wall time of the pre-pass (umT5's load, the forwards, the downloads) in milliseconds.
    double encode_ms() const { return encode_ms_; }

private:
    using Key = std::pair<std::vector<int64_t>, int64_t>;  // token ids (padded), real length

    void upload(Backend& be, const TokenizedText& t, const std::string& text, const TensorView& out) const;

    std::map<Key, Tensor> by_tokens_;
    double encode_ms_ = 0;
};

}  // namespace dzr
