#include "core/version.h"

namespace dzr {

const char* version() { return DZR_VERSION; }
const char* git_hash() { return DZR_GIT_HASH; }

}  // namespace dzr
