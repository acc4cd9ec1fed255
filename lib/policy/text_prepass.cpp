#include "policy/text_prepass.h"

#include "config/kv_config.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "model/umt5.h"

namespace dzr {

TextEmbeddings TextEmbeddings::encode(WeightLoader& loader, const ModelConfig& model, const Embodiment& embodiment,
                                      const Umt5Tokenizer& tokenizer, std::span<const std::string> prompts) {
    DZR_CHECK(embodiment.prompt.has_value(), "text pre-pass: embodiment {} has no prompt template", embodiment.tag);
    Timer timer;
    TextEmbeddings cache;
    Backend& be = loader.backend();
    const DType dt = be.compute_dtype();
    const Shape shape{model.t5.text_len, model.t5.dim};
    {
        const Umt5Encoder encoder(loader, model.t5);
        loader.finish();  // NOTE: a deferring loader reads umT5's bytes now, before it runs (weights/bulk_load.h)
        const Tensor out = be.alloc(shape, dt);
        const auto encode_one = [&](const TokenizedText& t) {
            Key key{t.ids, t.length};
            if (cache.by_tokens_.count(key)) return;
            std::vector<int32_t> ids32(t.ids.begin(), t.ids.end());
            encoder.forward(be, ids32, int(t.length), out, {});
            Tensor host = Tensor::host(shape, dt);
            be.download(out, host);
            cache.by_tokens_.emplace(std::move(key), std::move(host));
        };
        for (const std::string& prompt : prompts) {
            DZR_CHECK(!prompt.empty(), "text pre-pass: empty prompt");
            const PromptTokens tokens = tokenize_prompts(tokenizer, *embodiment.prompt, prompt, model.t5.text_len);
            encode_one(tokens.positive);
            encode_one(tokens.negative);
        }
    }  // NOTE: umT5 and its output buffer are freed here, before the caller loads the other networks
    cache.encode_ms_ = timer.ms();
    log()->info("text pre-pass: {} prompt{} and the negative prompt encoded in {:.1f} s ({} held on the host); "
                "umT5 freed",
                cache.size() > 0 ? cache.size() - 1 : 0, cache.size() == 2 ? "" : "s", cache.encode_ms_ / 1e3,
                format_bytes(cache.host_bytes()));
    return cache;
}

size_t TextEmbeddings::host_bytes() const {
    size_t bytes = 0;
    for (const auto& [key, t] : by_tokens_) bytes += t.nbytes();
    return bytes;
}

void TextEmbeddings::upload(Backend& be, const TokenizedText& t, const std::string& text, const TensorView& out) const {
    const auto it = by_tokens_.find(Key{t.ids, t.length});
    DZR_CHECK(it != by_tokens_.end(),
              "text pre-pass: the prompt \"{}\" was not among the run's prompts encoded before the load (the "
              "session has no text encoder)",
              text);
    be.upload(it->second, out);
}

void TextEmbeddings::fetch(Backend& be, const PromptTokens& tokens, const TensorView& positive,
                           const TensorView& negative) const {
    upload(be, tokens.positive, tokens.text, positive);
    upload(be, tokens.negative, "the negative prompt", negative);
}

}  // namespace dzr
