#pragma once
/// The columns of one parquet file, read through Apache Arrow C++ (libparquet): what a LeRobot dataset's data
/// and metadata files hold. Every error names the file and the column.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace arrow {
class ChunkedArray;
}

namespace dzr::dataset {

class ParquetTable {
public:
    /// Reads those of `columns` that `file` has (all of them when `columns` is empty). Throws dzr::Error naming the
    /// file when it is missing, not parquet, or damaged.
    ParquetTable(const std::filesystem::path& file, const std::vector<std::string>& columns);
    ~ParquetTable();

    const std::filesystem::path& file() const { return file_; }
    int64_t rows() const { return rows_; }
    bool has(const std::string& column) const { return columns_.count(column) != 0; }
    /// Every column name of the file (read or not).
    const std::vector<std::string>& schema_names() const { return schema_names_; }

    /// A numeric scalar column (any integer or floating type, or bool) as doubles.
    std::vector<double> numbers(const std::string& column) const;
    /// An integer scalar column; a floating value that is not an integer is an error.
    std::vector<int64_t> integers(const std::string& column) const;
    /// A string column.
    std::vector<std::string> strings(const std::string& column) const;
    /// A list (or fixed-size list) column of numbers: rows x `width` row-major, every row of that width.
    std::vector<double> vectors(const std::string& column, int64_t width) const;
    /// A list of strings column (LeRobot v3.0's episode `tasks`).
    std::vector<std::vector<std::string>> string_lists(const std::string& column) const;

private:
    const arrow::ChunkedArray& column(const std::string& name) const;

    std::filesystem::path file_;
    int64_t rows_ = 0;
    std::vector<std::string> schema_names_;
    std::map<std::string, std::shared_ptr<arrow::ChunkedArray>> columns_;
};

/// "Arrow 26.0.1" for `dzr info`.
std::string arrow_version();

}  // namespace dzr::dataset
