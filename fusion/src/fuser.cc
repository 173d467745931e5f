#include "kiln/fusion/fuser.h"

namespace kiln::fusion {

FuserList clone_fusers(const FuserList& fusers) {
  FuserList out;
  out.reserve(fusers.size());
  for (const auto& f : fusers) out.push_back(f->clone());
  return out;
}

}  // namespace kiln::fusion
