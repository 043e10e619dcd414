// Opening a shared library at run time (dlopen) and taking its functions (dlsym): how the
// CUDA backend loads cuBLAS and the NCCL transport loads NCCL, so that neither is a link
// dependency of processes that never use it.
//
// Header-only, so that both the nvcc-compiled backend and the C++ transport use it without
// another library between them.
#ifndef BATON_COMMON_CORE_DYNAMIC_LIBRARY_H_
#define BATON_COMMON_CORE_DYNAMIC_LIBRARY_H_

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace baton {

// The libraries to try, in order: the one $`env_var` names alone when it is set and not
// empty, else `soname` from the loader's search path, then `hint` (the copy the build
// found; null or equal to `soname` adds nothing).
inline std::vector<std::string> LibraryCandidates(const char* env_var, std::string soname,
                                                  const char* hint) {
  if (const char* env = std::getenv(env_var); env != nullptr && *env != '\0') return {env};
  std::vector<std::string> out = {std::move(soname)};
  if (hint != nullptr && out[0] != hint) out.emplace_back(hint);
  return out;
}

// dlopen(path) with RTLD_NOW | RTLD_LOCAL. Null on failure, and `*error` says why (the
// loader's message, else the path). The caller owns the handle: dlclose it to give it up.
inline void* OpenLibrary(const std::string& path, std::string* error) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* e = dlerror();
    *error = e != nullptr ? e : path + ": dlopen failed";
  }
  return lib;
}

// Sets *fn to `lib`'s symbol `name`; when there is none, *fn is null and `name` is added to
// `missing`, so that one error can list every absent function.
template <typename F>
void FindSymbol(void* lib, const char* name, F* fn, std::vector<std::string>* missing) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  if (*fn == nullptr) missing->push_back(name);
}

}  // namespace baton

#endif  // BATON_COMMON_CORE_DYNAMIC_LIBRARY_H_
