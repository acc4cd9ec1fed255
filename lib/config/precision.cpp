#include "config/precision.h"

#include "core/error.h"

namespace dzr {

const char* precision_name(Precision p) { return p == Precision::Fp8 ? "fp8" : "bf16"; }

Precision parse_precision(const std::string& text, const std::string& what) {
    if (text == "bf16") return Precision::Bf16;
    if (text == "fp8") return Precision::Fp8;
    DZR_THROW("{}: expected bf16 or fp8, got '{}'", what, text);
}

}  // namespace dzr
