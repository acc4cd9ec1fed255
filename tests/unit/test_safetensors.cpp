#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "support/test_support.h"
#include "weights/safetensors.h"

using namespace dzr;
namespace fs = std::filesystem;

namespace {

using test::error_of;
using test::contains;

/// Writes a safetensors file by hand: the 8-byte little-endian length, the header text, the data.
void write_raw(const fs::path& p, const std::string& header, const std::vector<uint8_t>& data,
               uint64_t claimed_len = UINT64_MAX) {
    std::ofstream f(p, std::ios::binary);
    const uint64_t n = claimed_len == UINT64_MAX ? header.size() : claimed_len;
    for (int i = 0; i < 8; ++i) f.put(char(uint8_t(n >> (8 * i))));
    f.write(header.data(), std::streamsize(header.size()));
    f.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
}

std::vector<uint8_t> read_bytes(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// Opens a broken file and checks the message names the file and every `parts`.
void expect_rejected(const fs::path& p, const std::vector<std::string>& parts) {
    const std::string msg = error_of([&] { SafetensorsFile::open(p); });
    INFO("message: " << msg);
    CHECK(!msg.empty());
    CHECK(contains(msg, p.string()));
    for (const auto& s : parts) CHECK(contains(msg, s));
}

}  // namespace

TEST_CASE("safetensors round trip keeps names, dtypes, shapes, bytes and metadata") {
    test::TempDir dir;
    const fs::path p = dir / "t.safetensors";
    std::vector<float> a = test::random_floats(6, 1);
    std::vector<uint16_t> b = {f32_to_bf16(1.5f), f32_to_bf16(-2.0f), f32_to_bf16(0.25f)};
    std::vector<int64_t> c = {int64_t(1) << 60, -7};  // values a float detour would corrupt
    std::vector<uint8_t> d = {0x7e, 0x38, 0x01};      // f8_e4m3 bit patterns
    float scalar = 3.25f;
    write_safetensors(p,
                      {{"z.f32", TensorView(a.data(), DType::F32, Shape{2, 3})},
                       {"a.bf16", TensorView(b.data(), DType::BF16, Shape{3})},
                       {"m.i64", TensorView(c.data(), DType::I64, Shape{2})},
                       {"f8", TensorView(d.data(), DType::F8_E4M3, Shape{1, 3})},
                       {"scalar", TensorView(&scalar, DType::F32, Shape{})},
                       {"empty", TensorView(nullptr, DType::F16, Shape{0, 4})}},
                      {{"format", "pt"}, {"note", "dzr test"}});

    auto f = SafetensorsFile::open(p);
    CHECK(f->entries().size() == 6);
    CHECK(f->metadata().at("format") == "pt");
    CHECK(f->metadata().at("note") == "dzr test");
    CHECK(f->data_offset() % 8 == 0);

    auto za = f->find("z.f32");
    REQUIRE(za.has_value());
    CHECK(za->dtype == DType::F32);
    CHECK(za->shape == Shape{2, 3});
    CHECK(std::memcmp(za->data, a.data(), 24) == 0);
    CHECK(std::memcmp(f->find("a.bf16")->data, b.data(), 6) == 0);
    CHECK(std::memcmp(f->find("m.i64")->data, c.data(), 16) == 0);
    CHECK(f->find("f8")->dtype == DType::F8_E4M3);
    CHECK(std::memcmp(f->find("f8")->data, d.data(), 3) == 0);
    CHECK(f->find("scalar")->shape.rank() == 0);
    float scalar_back = 0.0f;  // NOTE: memcpy, the scalar's offset is not 4-byte aligned in key order
    std::memcpy(&scalar_back, f->find("scalar")->data, 4);
    CHECK(scalar_back == 3.25f);
    CHECK(f->find("empty")->shape == Shape{0, 4});
    CHECK(f->find("empty")->nbytes() == 0);
    CHECK_FALSE(f->find("absent").has_value());

    // data in key order: sorting by offset gives the names sorted
    std::vector<std::string> by_offset;
    for (const auto& e : f->entries())
        if (e.nbytes() > 0) by_offset.push_back(e.name);
    CHECK(std::is_sorted(by_offset.begin(), by_offset.end()));

    // the header is padded with spaces up to the 8-byte boundary
    const auto raw = read_bytes(p);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | raw[size_t(i)];
    CHECK((8 + n) % 8 == 0);
    CHECK(raw[8] == '{');
    const std::string header(raw.begin() + 8, raw.begin() + 8 + long(n));
    const size_t close = header.find_last_of('}');
    CHECK(header.find_first_not_of(' ', close + 1) == std::string::npos);
}

TEST_CASE("safetensors writer gathers strided views and reads back the logical order") {
    test::TempDir dir;
    std::vector<float> v = {0, 1, 2, 3, 4, 5};
    TensorView m(v.data(), DType::F32, Shape{2, 3});
    write_safetensors(dir / "t.safetensors", {{"t", m.transpose(0, 1)}});
    auto f = SafetensorsFile::open(dir / "t.safetensors");
    auto t = f->find("t");
    REQUIRE(t.has_value());
    CHECK(t->shape == Shape{3, 2});
    const float* p = t->ptr<float>();
    const std::vector<float> expected = {0, 3, 1, 4, 2, 5};
    for (size_t i = 0; i < expected.size(); ++i) CHECK(p[i] == expected[i]);
}

TEST_CASE("safetensors tensors keep their file mapping alive after the file object is gone") {
    test::TempDir dir;
    std::vector<float> v = {1, 2, 3};
    write_safetensors(dir / "t.safetensors", {{"t", TensorView(v.data(), DType::F32, Shape{3})}});
    Tensor t;
    {
        auto f = SafetensorsFile::open(dir / "t.safetensors");
        t = f->tensor("t");
    }
    fs::remove(dir / "t.safetensors");
    CHECK(t.ptr<float>()[2] == 3.0f);
    CHECK(t.storage()->device().is_cpu());
}

TEST_CASE("safetensors writer replaces files atomically and leaves nothing behind on failure") {
    test::TempDir dir;
    const fs::path p = dir / "t.safetensors";
    std::vector<float> v = {1, 2, 3};
    write_safetensors(p, {{"t", TensorView(v.data(), DType::F32, Shape{3})}});
    const auto before = read_bytes(p);

    const std::string msg = error_of([&] {
        write_safetensors(p, {{"x", DType::F32, Shape{4}}}, {},
                          [](size_t, std::vector<uint8_t>&) { throw Error("fill failed"); });
    });
    CHECK(msg == "fill failed");
    CHECK(read_bytes(p) == before);
    size_t files = 0;
    for (const auto& e : fs::directory_iterator(dir.path())) files += e.is_regular_file() ? 1 : 0;
    CHECK(files == 1);

    CHECK(contains(error_of([&] {
                       write_safetensors(p, {{"d", DType::F32, Shape{1}}, {"d", DType::F32, Shape{1}}}, {},
                                         [](size_t, std::vector<uint8_t>&) {});
                   }),
                   "tensor d given twice"));
}

TEST_CASE("safetensors rejects files too short for the length prefix") {
    test::TempDir dir;
    const fs::path p = dir / "short.safetensors";
    std::ofstream(p, std::ios::binary).write("abc", 3);
    expect_rejected(p, {"3 bytes", "too short"});
}

TEST_CASE("safetensors rejects a header length larger than the file") {
    test::TempDir dir;
    const fs::path p = dir / "long.safetensors";
    write_raw(p, "{}", {}, 4096);
    expect_rejected(p, {"header length 4096", "past the end"});
}

TEST_CASE("safetensors rejects a header claimed over 100 MB") {
    test::TempDir dir;
    const fs::path p = dir / "huge.safetensors";
    write_raw(p, "{}", {}, 200'000'000);
    expect_rejected(p, {"200000000", "limit"});
}

TEST_CASE("safetensors rejects a header that is not a JSON object") {
    test::TempDir dir;
    write_raw(dir / "text.safetensors", "{not json at all", {});
    expect_rejected(dir / "text.safetensors", {"not valid JSON"});
    write_raw(dir / "array.safetensors", "[1, 2]   ", {});
    expect_rejected(dir / "array.safetensors", {"does not start with '{'"});
    write_raw(dir / "trailing.safetensors", "{} x", {});
    expect_rejected(dir / "trailing.safetensors", {"not valid JSON"});
    write_raw(dir / "meta.safetensors", R"({"__metadata__": {"format": 1}})", {});
    expect_rejected(dir / "meta.safetensors", {"__metadata__", "format"});
}

TEST_CASE("safetensors rejects unknown dtypes by name") {
    test::TempDir dir;
    const fs::path p = dir / "f64.safetensors";
    write_raw(p, R"({"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", std::vector<uint8_t>(8));
    expect_rejected(p, {"tensor w", "F64", "BF16"});
}

TEST_CASE("safetensors rejects a byte span that disagrees with shape and dtype") {
    test::TempDir dir;
    const fs::path p = dir / "size.safetensors";
    write_raw(p, R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})",
              std::vector<uint8_t>(20));
    expect_rejected(p, {"tensor w", "needs 24 bytes", "span 20"});
}

TEST_CASE("safetensors rejects malformed shapes and offsets") {
    test::TempDir dir;
    write_raw(dir / "neg.safetensors", R"({"w": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}})",
              {});
    expect_rejected(dir / "neg.safetensors", {"tensor w", "non-negative integer"});
    write_raw(dir / "frac.safetensors", R"({"w": {"dtype": "U8", "shape": [1.5], "data_offsets": [0, 0]}})",
              {});
    expect_rejected(dir / "frac.safetensors", {"tensor w"});
    write_raw(dir / "rev.safetensors", R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [4, 0]}})",
              std::vector<uint8_t>(4));
    expect_rejected(dir / "rev.safetensors", {"tensor w", "[4, 0]"});
    write_raw(dir / "three.safetensors", R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}})",
              std::vector<uint8_t>(1));
    expect_rejected(dir / "three.safetensors", {"tensor w", "data_offsets"});
    write_raw(dir / "nofield.safetensors", R"({"w": {"dtype": "U8", "shape": [1]}})",
              std::vector<uint8_t>(1));
    expect_rejected(dir / "nofield.safetensors", {"tensor w", "data_offsets"});
    write_raw(dir / "extra.safetensors",
              R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": 1}})",
              std::vector<uint8_t>(1));
    expect_rejected(dir / "extra.safetensors", {"tensor w", "'x'"});
    write_raw(dir / "overflow.safetensors",
              R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", {});
    expect_rejected(dir / "overflow.safetensors", {"tensor w"});
    write_raw(dir / "rank.safetensors",
              R"({"w": {"dtype": "U8", "shape": [1, 1, 1, 1, 1, 1, 1], "data_offsets": [0, 1]}})",
              std::vector<uint8_t>(1));
    expect_rejected(dir / "rank.safetensors", {"tensor w", "rank 7"});
}

TEST_CASE("safetensors rejects overlapping spans") {
    test::TempDir dir;
    const fs::path p = dir / "overlap.safetensors";
    write_raw(p,
              R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                  "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}})",
              std::vector<uint8_t>(6));
    expect_rejected(p, {"tensors a and b overlap"});
}

TEST_CASE("safetensors rejects holes and uncovered bytes in the data buffer") {
    test::TempDir dir;
    write_raw(dir / "hole.safetensors",
              R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                  "b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}})",
              std::vector<uint8_t>(6));
    expect_rejected(dir / "hole.safetensors", {"2 unused bytes", "before tensor b"});
    write_raw(dir / "lead.safetensors", R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}})",
              std::vector<uint8_t>(3));
    expect_rejected(dir / "lead.safetensors", {"before tensor a"});
    write_raw(dir / "tail.safetensors", R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})",
              std::vector<uint8_t>(5));
    expect_rejected(dir / "tail.safetensors", {"3 bytes after the last tensor", "(a)"});
}

TEST_CASE("safetensors rejects spans past the end of the data buffer and truncated files") {
    test::TempDir dir;
    write_raw(dir / "oob.safetensors", R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
              std::vector<uint8_t>(8));
    expect_rejected(dir / "oob.safetensors", {"tensor a", "past the end of the data buffer"});

    // a valid file cut short in its data section
    std::vector<float> v(64, 1.0f);
    const fs::path p = dir / "cut.safetensors";
    write_safetensors(p, {{"big", TensorView(v.data(), DType::F32, Shape{64})}});
    fs::resize_file(p, fs::file_size(p) - 10);
    expect_rejected(p, {"tensor big", "past the end"});
}

TEST_CASE("safetensors rejects duplicate keys that JSON parsers silently merge") {
    test::TempDir dir;
    const fs::path p = dir / "dup.safetensors";
    write_raw(p,
              R"({"w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                  "w": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}})",
              std::vector<uint8_t>(4));
    expect_rejected(p, {"tensor w", "more than once"});
}

TEST_CASE("safetensors reports a missing file by name") {
    test::TempDir dir;
    const std::string msg = error_of([&] { SafetensorsFile::open(dir / "absent.safetensors"); });
    CHECK(contains(msg, "absent.safetensors"));
}

TEST_CASE("safetensors accepts an empty tensor list and zero-byte tensors between others") {
    test::TempDir dir;
    write_raw(dir / "none.safetensors", "{}      ", {});
    CHECK(SafetensorsFile::open(dir / "none.safetensors")->entries().empty());
    write_raw(dir / "zero.safetensors",
              R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                  "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [2, 2]},
                  "b": {"dtype": "U8", "shape": [1], "data_offsets": [2, 3]}})",
              {1, 2, 3});
    auto f = SafetensorsFile::open(dir / "zero.safetensors");
    CHECK(f->entries().size() == 3);
    CHECK(*f->find("b")->ptr<uint8_t>() == 3);
}
