#include "dataset/parquet_table.h"

#include <arrow/api.h>
#include <arrow/config.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "io/atomic_file.h"

namespace dzr::dataset {

namespace fs = std::filesystem;

namespace {

template <typename T>
T checked(arrow::Result<T> r, const fs::path& file, const char* what) {
    DZR_CHECK(r.ok(), "{}: cannot {}: {}", file.string(), what, r.status().ToString());
    return std::move(r).ValueOrDie();
}

void checked(const arrow::Status& s, const fs::path& file, const char* what) {
    DZR_CHECK(s.ok(), "{}: cannot {}: {}", file.string(), what, s.ToString());
}

/// Element `i` of a numeric array as a double; false when the type is not numeric.
bool number_at(const arrow::Array& a, int64_t i, double& out) {
    switch (a.type_id()) {
        case arrow::Type::DOUBLE: out = static_cast<const arrow::DoubleArray&>(a).Value(i); return true;
        case arrow::Type::FLOAT: out = static_cast<const arrow::FloatArray&>(a).Value(i); return true;
        case arrow::Type::INT64: out = double(static_cast<const arrow::Int64Array&>(a).Value(i)); return true;
        case arrow::Type::INT32: out = static_cast<const arrow::Int32Array&>(a).Value(i); return true;
        case arrow::Type::INT16: out = static_cast<const arrow::Int16Array&>(a).Value(i); return true;
        case arrow::Type::INT8: out = static_cast<const arrow::Int8Array&>(a).Value(i); return true;
        case arrow::Type::UINT8: out = static_cast<const arrow::UInt8Array&>(a).Value(i); return true;
        case arrow::Type::BOOL: out = static_cast<const arrow::BooleanArray&>(a).Value(i) ? 1.0 : 0.0; return true;
        default: return false;
    }
}

/// The values array and the [begin, end) of row `i` of a list-like array; false for other types.
bool list_row(const arrow::Array& a, int64_t i, std::shared_ptr<arrow::Array>& values, int64_t& begin, int64_t& end) {
    switch (a.type_id()) {
        case arrow::Type::LIST: {
            const auto& l = static_cast<const arrow::ListArray&>(a);
            values = l.values(), begin = l.value_offset(i), end = begin + l.value_length(i);
            return true;
        }
        case arrow::Type::LARGE_LIST: {
            const auto& l = static_cast<const arrow::LargeListArray&>(a);
            values = l.values(), begin = l.value_offset(i), end = begin + l.value_length(i);
            return true;
        }
        case arrow::Type::FIXED_SIZE_LIST: {
            const auto& l = static_cast<const arrow::FixedSizeListArray&>(a);
            values = l.values(), begin = l.value_offset(i), end = begin + l.value_length(i);
            return true;
        }
        default: return false;
    }
}

bool string_at(const arrow::Array& a, int64_t i, std::string& out) {
    if (a.type_id() == arrow::Type::STRING) {
        out = static_cast<const arrow::StringArray&>(a).GetString(i);
        return true;
    }
    if (a.type_id() == arrow::Type::LARGE_STRING) {
        out = static_cast<const arrow::LargeStringArray&>(a).GetString(i);
        return true;
    }
    return false;
}

/// Calls f(chunk, row_in_chunk, row) for every row, refusing nulls.
template <typename F>
void for_rows(const arrow::ChunkedArray& c, const fs::path& file, const std::string& name, F&& f) {
    int64_t row = 0;
    for (const auto& chunk : c.chunks()) {
        for (int64_t i = 0; i < chunk->length(); ++i, ++row) {
            DZR_CHECK(!chunk->IsNull(i), "{}: column {} is null at row {}", file.string(), name, row);
            f(*chunk, i, row);
        }
    }
}

}  // namespace

ParquetTable::ParquetTable(const fs::path& file, const std::vector<std::string>& columns) : file_(file) {
    DZR_CHECK(io::input_file_present(file), "{}: no such file", file.string());
    try {
        auto in = checked(arrow::io::ReadableFile::Open(file.string()), file, "open it");
        auto reader = checked(parquet::arrow::OpenFile(in, arrow::default_memory_pool()), file, "read it as parquet");
        std::shared_ptr<arrow::Schema> schema;
        checked(reader->GetSchema(&schema), file, "read its schema");
        for (const auto& f : schema->fields()) schema_names_.push_back(f->name());
        rows_ = reader->parquet_reader()->metadata()->num_rows();
        for (int i = 0; i < schema->num_fields(); ++i) {
            const std::string& name = schema->field(i)->name();
            if (!columns.empty() && std::find(columns.begin(), columns.end(), name) == columns.end()) continue;
            std::shared_ptr<arrow::ChunkedArray> data;
            checked(reader->ReadColumn(i, &data), file, "read a column");
            DZR_CHECK(data->length() == rows_, "{}: column {} has {} rows, the file {}", file.string(), name,
                      data->length(), rows_);
            columns_[name] = std::move(data);
        }
    } catch (const parquet::ParquetException& e) {
        DZR_THROW("{}: not a readable parquet file: {}", file.string(), e.what());
    }
}

ParquetTable::~ParquetTable() = default;

const arrow::ChunkedArray& ParquetTable::column(const std::string& name) const {
    const auto it = columns_.find(name);
    DZR_CHECK(it != columns_.end(), "{}: no column {}", file_.string(), name);
    return *it->second;
}

std::vector<double> ParquetTable::numbers(const std::string& name) const {
    std::vector<double> out(static_cast<size_t>(rows_));
    for_rows(column(name), file_, name, [&](const arrow::Array& a, int64_t i, int64_t row) {
        DZR_CHECK(number_at(a, i, out[size_t(row)]), "{}: column {} is {}, not numbers", file_.string(), name,
                  a.type()->ToString());
    });
    return out;
}

std::vector<int64_t> ParquetTable::integers(const std::string& name) const {
    std::vector<int64_t> out(static_cast<size_t>(rows_));
    for_rows(column(name), file_, name, [&](const arrow::Array& a, int64_t i, int64_t row) {
        if (a.type_id() == arrow::Type::INT64) {
            out[size_t(row)] = static_cast<const arrow::Int64Array&>(a).Value(i);
            return;
        }
        double v = 0;
        DZR_CHECK(number_at(a, i, v) && v == std::floor(v) && std::abs(v) < 9e15, "{}: column {} row {}: not an integer",
                  file_.string(), name, row);
        out[size_t(row)] = int64_t(v);
    });
    return out;
}

std::vector<std::string> ParquetTable::strings(const std::string& name) const {
    std::vector<std::string> out(static_cast<size_t>(rows_));
    for_rows(column(name), file_, name, [&](const arrow::Array& a, int64_t i, int64_t row) {
        DZR_CHECK(string_at(a, i, out[size_t(row)]), "{}: column {} is {}, not strings", file_.string(), name,
                  a.type()->ToString());
    });
    return out;
}

std::vector<double> ParquetTable::vectors(const std::string& name, int64_t width) const {
    std::vector<double> out(static_cast<size_t>(rows_ * width));
    for_rows(column(name), file_, name, [&](const arrow::Array& a, int64_t i, int64_t row) {
        std::shared_ptr<arrow::Array> values;
        int64_t begin = 0, end = 0;
        DZR_CHECK(list_row(a, i, values, begin, end), "{}: column {} is {}, not a list of numbers", file_.string(),
                  name, a.type()->ToString());
        DZR_CHECK(end - begin == width, "{}: column {} row {} has {} values, expected {}", file_.string(), name, row,
                  end - begin, width);
        for (int64_t k = begin; k < end; ++k) {
            DZR_CHECK(!values->IsNull(k), "{}: column {} row {} holds a null", file_.string(), name, row);
            DZR_CHECK(number_at(*values, k, out[size_t(row * width + k - begin)]), "{}: column {} holds {}, not numbers",
                      file_.string(), name, values->type()->ToString());
        }
    });
    return out;
}

std::vector<std::vector<std::string>> ParquetTable::string_lists(const std::string& name) const {
    std::vector<std::vector<std::string>> out(static_cast<size_t>(rows_));
    for_rows(column(name), file_, name, [&](const arrow::Array& a, int64_t i, int64_t row) {
        std::shared_ptr<arrow::Array> values;
        int64_t begin = 0, end = 0;
        DZR_CHECK(list_row(a, i, values, begin, end), "{}: column {} is {}, not a list of strings", file_.string(),
                  name, a.type()->ToString());
        for (int64_t k = begin; k < end; ++k) {
            std::string s;
            DZR_CHECK(!values->IsNull(k) && string_at(*values, k, s), "{}: column {} row {}: not a list of strings",
                      file_.string(), name, row);
            out[size_t(row)].push_back(std::move(s));
        }
    });
    return out;
}

std::string arrow_version() { return fmt::format("Arrow {}", ARROW_VERSION_STRING); }

}  // namespace dzr::dataset
