#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "core/arena.h"
#include "core/convert.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"
#include "core/json_text.h"
#include "core/sha256.h"
#include "core/tensor.h"

using namespace dzr;

TEST_CASE("dtype names, sizes and safetensors codes round-trip") {
    CHECK(dtype_size(DType::BF16) == 2);
    CHECK(dtype_size(DType::I64) == 8);
    CHECK(dtype_from_safetensors_code("BF16") == DType::BF16);
    CHECK(dtype_from_safetensors_code("F8_E4M3") == DType::F8_E4M3);
    CHECK_FALSE(dtype_from_safetensors_code("F64").has_value());
    CHECK(dtype_from_name("f16") == DType::F16);
    CHECK(dtype_safetensors_code(DType::U8) == "U8");
}

TEST_CASE("bf16 conversion rounds to nearest even and keeps specials") {
    CHECK(bf16_to_f32(f32_to_bf16(1.0f)) == 1.0f);
    CHECK(bf16_to_f32(f32_to_bf16(-2.5f)) == -2.5f);
    // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even mantissa (1.0)
    CHECK(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256.0f)) == 1.0f);
    // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even)
    CHECK(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256.0f)) == 1.0f + 1.0f / 64.0f);
    CHECK(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
    CHECK(std::isinf(bf16_to_f32(f32_to_bf16(INFINITY))));
}

TEST_CASE("f16 conversion matches IEEE half for normals, subnormals and overflow") {
    for (float v : {0.0f, 1.0f, -1.5f, 65504.0f, 6.1035156e-05f, 0.333251953125f})
        CHECK(f16_to_f32(f32_to_f16(v)) == v);
    CHECK(f16_to_f32(f32_to_f16(5.9604645e-08f)) == 5.9604645e-08f);  // smallest subnormal
    CHECK(f16_to_f32(0x0001) == doctest::Approx(5.9604645e-08));
    CHECK(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
    CHECK(f32_to_f16(1.0f) == 0x3c00);
    CHECK(f32_to_f16(-2.0f) == 0xc000);
}

TEST_CASE("f8 e4m3 decodes the format's extremes") {
    CHECK(f8e4m3_to_f32(0x00) == 0.0f);
    CHECK(f8e4m3_to_f32(0x38) == 1.0f);     // exp 7, man 0
    CHECK(f8e4m3_to_f32(0x7e) == 448.0f);   // max normal
    CHECK(f8e4m3_to_f32(0x01) == std::ldexp(1.0f, -9));
    CHECK(std::isnan(f8e4m3_to_f32(0x7f)));
    CHECK(f8e4m3_to_f32(0xb8) == -1.0f);
}

TEST_CASE("tensor views slice, transpose and reshape without copying") {
    Tensor t = Tensor::host(Shape{2, 3, 4}, DType::F32);
    float* p = t.ptr<float>();
    for (int i = 0; i < 24; ++i) p[i] = float(i);
    TensorView v = t.view();
    CHECK(v.is_contiguous());
    TensorView s = v.slice(1, 1, 2);  // [2, 2, 4]
    CHECK(s.shape == Shape{2, 2, 4});
    CHECK_FALSE(s.is_contiguous());
    CHECK(s.ptr<float>()[0] == 4.0f);
    TensorView tr = v.transpose(0, 2);  // [4, 3, 2]
    auto vals = to_f32_vector(tr);
    CHECK(vals[0] == 0.0f);
    CHECK(vals[1] == 12.0f);  // (0,0,1) of the transpose is (1,0,0) of the original
    CHECK(v.reshape(Shape{6, 4}).rows() == 6);
    CHECK_THROWS_AS(v.reshape(Shape{5, 5}), Error);
}

TEST_CASE("convert_copy_host converts dtypes through strided sources") {
    Tensor src = Tensor::host_f32(Shape{2, 2}, {1.0f, 2.0f, 3.0f, 4.0f});
    Tensor dst = Tensor::host(Shape{2, 2}, DType::BF16);
    convert_copy_host(src.view().transpose(0, 1), dst);
    auto back = to_f32_vector(dst);
    CHECK(back == std::vector<float>{1.0f, 3.0f, 2.0f, 4.0f});
}

TEST_CASE("parse_device accepts cpu, cuda and cuda:N only") {
    CHECK(parse_device("cpu").is_cpu());
    CHECK(parse_device("cuda:2").index == 2);
    CHECK_THROWS_AS(parse_device("gpu"), Error);
    CHECK_THROWS_AS(parse_device("cuda:x"), Error);
}

TEST_CASE("arena allocates aligned, releases to a mark and reports exhaustion") {
    std::vector<char> buf(4096);
    Arena a(buf.data(), buf.size(), Device::cpu());
    void* p0 = a.alloc(10);
    size_t m = a.mark();
    void* p1 = a.alloc(300);
    CHECK(static_cast<char*>(p1) - static_cast<char*>(p0) == 256);
    CHECK(a.used() == 256 + 512);
    a.release(m);
    CHECK(a.used() == 256);
    CHECK(a.high_water() == 768);
    CHECK_THROWS_AS(a.alloc(8192), Error);

    Arena measure;  // no buffer: counts only
    measure.alloc(1000);
    {
        ArenaScope scope(measure);
        measure.alloc(5000);
    }
    CHECK(measure.used() == 1024);
    CHECK(measure.high_water() == 1024 + 5120);
}

TEST_CASE("sha256 gives the standard's digests, the portable implementation too, in one or many updates") {
    const std::pair<std::string, std::string> vectors[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {std::string(1000000, 'a'), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
    };
    for (const auto& [text, digest] : vectors) {
        CAPTURE(text.size());
        CHECK(dzr::sha256_hex(text) == digest);
        CHECK(dzr::sha256_portable_hex(text.data(), text.size()) == digest);
        dzr::Sha256 h;  // odd-sized pieces cross the 64-byte blocks
        for (size_t i = 0; i < text.size(); i += 37) h.update(std::string_view(text).substr(i, 37));
        CHECK(h.hex_digest() == digest);
    }
    // every length around the padding boundaries agrees between the two implementations
    std::string s;
    for (int n = 0; n < 200; ++n) {
        CAPTURE(n);
        CHECK(dzr::sha256_portable_hex(s.data(), s.size()) == dzr::sha256_hex(s));
        s.push_back(char(n * 7 + 1));
    }
}

TEST_CASE("a JSON key given twice in one object is found with both lines") {
    CHECK_FALSE(find_duplicate_json_key(R"({"a": 1, "b": {"a": 2}, "c": [{"a": 1}, {"a": 2}]})").has_value());
    const auto d = find_duplicate_json_key("{\n  \"x\": {\"k\": 1,\n  \"k\": 2}\n}");
    REQUIRE(d.has_value());
    CHECK(d->key == "k");
    CHECK(d->first_line == 2);
    CHECK(d->second_line == 3);
    // strings holding braces, commas and escaped quotes are not structure; escapes are decoded before comparing
    CHECK_FALSE(find_duplicate_json_key(R"({"a": "{\"a\": 1, ", "b": "]"})").has_value());
    CHECK(find_duplicate_json_key(R"({"ab": 1, "a\u0062": 2})").value().key == "ab");
    try {
        parse_json_strict<nlohmann::ordered_json>("{\"seed\": 1,\n\"seed\": 2}", "c.json");
        FAIL("a repeated key was accepted");
    } catch (const Error& e) {
        CHECK(std::string(e.what()) == "c.json: line 2: key \"seed\" given twice in one object (first on line 1)");
    }
    CHECK(parse_json_strict<nlohmann::json>("{\"seed\": 1}", "c.json")["seed"] == 1);
}
