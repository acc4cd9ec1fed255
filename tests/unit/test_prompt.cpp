// Prompt template, text cleaning and the umT5 tokenizer wrapper (on a tiny model trained for the
// tests, tests/data/tokenizer/).
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "policy/prompt.h"
#include "policy/tokenizer.h"
#include "support/test_support.h"

using namespace dzr;

namespace {

std::filesystem::path test_tokenizer_dir() {
    return test::data_dir() / "tokenizer";
}

}  // namespace

TEST_CASE("droid template wraps the lower-cased instruction with the exact reference text") {
    const std::string expected =
        "A multi-view video shows that a robot pick up the red cup The video is split into three views: The "
        "top view "
        "shows the camera view from the robot's wrist, the bottom-left view shows the camera view from the "
        "left "
        "exterior camera, and the bottom-right view shows the camera view from the right exterior camera. "
        "During "
        "training, one of the two bottom exterior views may be a black screen (dropped view). The robot pick "
        "up the "
        "red cup";
    CHECK(droid_prompt("Pick up the RED cup") == expected);
    // a quoted instruction is unwrapped first, as ast.literal_eval does
    CHECK(droid_prompt("'Pick up the RED cup'") == expected);
    // the empty instruction leaves the two spaces the reference produces
    CHECK(droid_prompt("").rfind("A multi-view video shows that a robot  The video", 0) == 0);
}

TEST_CASE("negative prompt is the reference's fixed text") {
    CHECK(kDroidNegativePrompt ==
          "Vibrant colors, overexposed, static, blurry details, text, subtitles, style, artwork, painting, "
          "image, "
          "still, grayscale, dull, worst quality, low quality, JPEG artifacts, ugly, mutilated, extra "
          "fingers, bad "
          "hands, bad face, deformed, disfigured, mutated limbs, fused fingers, stagnant image, cluttered "
          "background, "
          "three legs, many people in the background, walking backwards.");
    CHECK(clean_prompt_text(kDroidNegativePrompt) == kDroidNegativePrompt);
}

TEST_CASE("cleaning strips, collapses whitespace runs and unescapes html") {
    CHECK(clean_prompt_text("  pick\tup \n the   cup  ") == "pick up the cup");
    CHECK(clean_prompt_text("a\u00a0\u00a0b\u2003c") == "a b c");
    CHECK(clean_prompt_text("salt &amp; pepper") == "salt & pepper");
    // ftfy unescapes to a fixed point when the text has no '<'; html.unescape runs twice after it
    CHECK(clean_prompt_text("&amp;amp;amp;lt;") == "<");
    CHECK(clean_prompt_text("a<b &amp;amp;amp; c") == "a<b &amp; c");
    CHECK(clean_prompt_text("&#39;quoted&#x27; &#65") == "'quoted' A");
    CHECK(clean_prompt_text("") == "");
}

TEST_CASE("cleaning applies the reproduced ftfy fixes") {
    CHECK(clean_prompt_text("the robot\u2019s \u201cgripper\u201d") == "the robot's \"gripper\"");
    CHECK(clean_prompt_text("\ufb01nd the \ufb02ask") == "find the flask");
    CHECK(clean_prompt_text("\uff21\uff22\uff23\u3000\uff11") == "ABC 1");
    CHECK(clean_prompt_text("a\x07"
                            "b\x1b[31mred\x1b[0m") == "abred");
    CHECK(clean_prompt_text("\ufeffcup\r\nbowl") == "cup bowl");
    CHECK(ftfy_subset("x\u0092s") == "x's");  // C1 control read as Windows-1252
}

TEST_CASE("html_unescape follows Python's rules for numeric and named references") {
    CHECK(html_unescape("&lt;tag&gt;") == "<tag>");
    CHECK(html_unescape("&amp") == "&");        // legacy name without ';'
    CHECK(html_unescape("&ampfoo") == "&foo");  // longest legacy prefix
    CHECK(html_unescape("&lt3") == "<3");
    CHECK(html_unescape("&zzz;") == "&zzz;");
    CHECK(html_unescape("&notanentity;") == "\u00acanentity;");  // &not is a legacy name
    CHECK(html_unescape("&hellip") == "&hellip");                // not a legacy name: needs ';'
    CHECK(html_unescape("&hellip;") == "\u2026");
    CHECK(html_unescape("&#128;") == "\u20ac");  // Windows-1252 mapping of 0x80..0x9f
    CHECK(html_unescape("&#0;") == "\ufffd");
    CHECK(html_unescape("&#xD800;") == "\ufffd");
    CHECK(html_unescape("&#x110000;") == "\ufffd");
    CHECK(html_unescape("a&#1;b") == "ab");  // invalid code points are dropped
    CHECK(html_unescape("&#x41&#66;") == "AB");
    CHECK(html_unescape("& &# &#x;") == "& &# &#x;");
}

TEST_CASE("lower-casing covers Latin, Greek and Cyrillic like str.lower") {
    CHECK(lower_utf8("PICK Up") == "pick up");
    CHECK(lower_utf8("\u00c0\u00c9\u00ce \u00d1\u00d6 \u00d7") == "\u00e0\u00e9\u00ee \u00f1\u00f6 \u00d7");
    CHECK(lower_utf8("\u0130") == "i\u0307");
    CHECK(lower_utf8("\u0178\u0141\u0100") == "\u00ff\u0142\u0101");
    CHECK(lower_utf8("\u0391\u0392\u0393 \u0386\u038f") == "\u03b1\u03b2\u03b3 \u03ac\u03ce");
    CHECK(lower_utf8("\u0414\u041e\u041c \u0402") == "\u0434\u043e\u043c \u0452");
    CHECK(lower_utf8("\xff") == "\ufffd");  // invalid UTF-8
}

TEST_CASE("python-literal prompts are unwrapped as ast.literal_eval would") {
    CHECK(unwrap_python_literal("'pick up'") == "pick up");
    CHECK(unwrap_python_literal("\"it's\"") == "it's");
    CHECK(unwrap_python_literal("  'a\\'b'") == "a'b");
    CHECK(unwrap_python_literal("['a b', 'c']") == "a b");
    CHECK(unwrap_python_literal("(\"x\",)") == "x");
    CHECK(unwrap_python_literal("[1, 2]") == "1");
    for (const char* unchanged : {"pick up", "'unterminated", "'a' extra", "[abc]", "007", "", "['a', b]"}) {
        CAPTURE(unchanged);
        CHECK(unwrap_python_literal(unchanged) == unchanged);
    }
}

TEST_CASE("tokenizer appends EOS, pads with 0 and masks the padding") {
    const Umt5Tokenizer tok(test_tokenizer_dir());
    CHECK(tok.vocab_size() > 100);
    CHECK(tok.vocab_size() <= 1000);
    const std::string text = "pick up the red cup and place it in the sink";
    const std::vector<int> raw = tok.encode_ids(text);
    REQUIRE(!raw.empty());
    for (int id : raw) {
        CHECK(id != Umt5Tokenizer::kPadId);
        CHECK(id != Umt5Tokenizer::kEosId);
    }
    CHECK(tok.decode(raw) == text);
    const TokenizedText t = tok.encode(text);
    REQUIRE(t.ids.size() == 512);
    REQUIRE(t.attention_mask.size() == 512);
    CHECK(t.length == int64_t(raw.size()) + 1);
    CHECK_FALSE(t.truncated);
    for (size_t i = 0; i < raw.size(); ++i) CHECK(t.ids[i] == raw[i]);
    CHECK(t.ids[raw.size()] == Umt5Tokenizer::kEosId);
    for (size_t i = 0; i < 512; ++i) {
        CHECK(t.attention_mask[i] == (int64_t(i) < t.length ? 1 : 0));
        if (int64_t(i) >= t.length) CHECK(t.ids[i] == Umt5Tokenizer::kPadId);
    }
    // the model file itself works as the path too
    const Umt5Tokenizer by_file(test_tokenizer_dir() / "spiece.model");
    CHECK(by_file.encode_ids(text) == raw);
}

TEST_CASE("tokenizer truncates to max_length keeping EOS") {
    const Umt5Tokenizer tok(test_tokenizer_dir());
    std::string text;
    for (int i = 0; i < 40; ++i) text += "open the drawer ";
    const std::vector<int> raw = tok.encode_ids(text);
    REQUIRE(raw.size() > 20);
    const TokenizedText t = tok.encode(text, 16);
    CHECK(t.truncated);
    CHECK(t.length == 16);
    CHECK(t.ids.size() == 16);
    for (size_t i = 0; i < 15; ++i) CHECK(t.ids[i] == raw[i]);
    CHECK(t.ids[15] == Umt5Tokenizer::kEosId);
    for (int64_t m : t.attention_mask) CHECK(m == 1);
    // exactly max_length - 1 tokens fit without truncation
    const TokenizedText fit = tok.encode(text, int(raw.size()) + 1);
    CHECK_FALSE(fit.truncated);
    CHECK(fit.length == int64_t(raw.size()) + 1);
}

TEST_CASE("tokenizer errors name the missing or broken model") {
    test::TempDir dir;
    try {
        Umt5Tokenizer tok(dir.path());
        FAIL("expected an error");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find(dir.path().string()) != std::string::npos);
        CHECK(std::string(e.what()).find("spiece.model") != std::string::npos);
    }
    { std::ofstream(dir / "spiece.model") << "not a sentencepiece model"; }
    CHECK_THROWS_AS(Umt5Tokenizer(dir.path()), Error);
    CHECK_THROWS_AS(Umt5Tokenizer(dir / "missing.model"), Error);
}

TEST_CASE("droid prompts tokenize the cleaned template and the negative prompt") {
    const Umt5Tokenizer tok(test_tokenizer_dir());
    const PromptTokens p = tokenize_droid_prompts(tok, "  Pick up the RED cup  ");
    CHECK(p.text == clean_prompt_text(droid_prompt("  Pick up the RED cup  ")));
    CHECK(p.text.find("robot pick up the red cup The video") != std::string::npos);
    CHECK(p.positive.ids[size_t(p.positive.length - 1)] == Umt5Tokenizer::kEosId);
    std::vector<int> body(p.positive.ids.begin(), p.positive.ids.begin() + p.positive.length - 1);
    CHECK(tok.decode(body) == p.text);
    const PromptTokens q = tokenize_droid_prompts(tok, "open the drawer");
    CHECK(q.negative.ids == p.negative.ids);
    CHECK(q.positive.ids != p.positive.ids);
    CHECK(p.positive.length < 512);
}

namespace {

// Compares our encode() with HF's ids stored by scripts/parity/gen_tokenizer_golden.py.
void compare_with_hf(const Umt5Tokenizer& tok, const std::filesystem::path& golden) {
    std::ifstream in(golden);
    const nlohmann::json j = nlohmann::json::parse(in);
    int probes_differing = 0;
    for (const auto& c : j.at("cases")) {
        const std::string text = c.at("text").get<std::string>();
        CAPTURE(text);
        const auto ids = c.at("ids").get<std::vector<int64_t>>();
        std::vector<int64_t> want(512, Umt5Tokenizer::kPadId), mask(512, 0);
        std::copy(ids.begin(), ids.end(), want.begin());
        std::fill(mask.begin(), mask.begin() + long(ids.size()), 1);
        const TokenizedText t = tok.encode(text, 512);
        if (c.value("probe", false)) {
            // inputs where HF and raw sentencepiece may legitimately differ: report, do not fail
            if (t.ids != want) {
                ++probes_differing;
                MESSAGE("probe differs from HF: \"" << text << "\"");
            }
            continue;
        }
        CHECK(t.ids == want);
        CHECK(t.attention_mask == mask);
    }
    MESSAGE(golden.filename().string() << ": " << probes_differing << " probe case(s) differ from HF");
}

}  // namespace

TEST_CASE("tokenizer matches HF's T5 tokenizer built from the same test model") {
    compare_with_hf(Umt5Tokenizer(test_tokenizer_dir()), test_tokenizer_dir() / "hf_tiny_golden.json");
}

TEST_CASE("umT5 ids match HF's tokenizer where a golden file and the real model exist") {
    const std::filesystem::path golden = test_tokenizer_dir() / "umt5_golden.json";
    const char* model = std::getenv("DZR_UMT5_TOKENIZER");
    if (!std::filesystem::exists(golden) || model == nullptr) {
        MESSAGE(
            "skipped: needs tests/data/tokenizer/umt5_golden.json (scripts/parity/gen_tokenizer_golden.py) "
            "and DZR_UMT5_TOKENIZER pointing at the real umt5-xxl spiece.model");
        return;
    }
    compare_with_hf(Umt5Tokenizer(model), golden);
}
