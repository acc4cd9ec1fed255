#pragma once
/// dzr's version and the commit it was built from ("unknown" outside git), for run manifests and fingerprints.
/// NOTE: defined in version.cpp alone, so a new commit recompiles one file rather than the whole library.

namespace dzr {

const char* version();
const char* git_hash();

}  // namespace dzr
