// The program of a staged fuser (ReduceBroadcasted, Row): each block's Reduce fuser program as a
// stage, in order.
#pragma once

#include <cstddef>
#include <vector>

#include "kiln/fusion/fused_program.h"
#include "kiln/fusion/fusers.h"

namespace kiln::fusion {

FusedProgram staged_program(ProgramKind kind, const std::vector<ReduceFuser>& blocks, std::size_t len);

}  // namespace kiln::fusion
