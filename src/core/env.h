// env.h: the K3_* environment switches, parsed the same way everywhere.
//
// A switch is on when its value is 1, on, true or yes and off when it is 0, off, false or no (any case).
// Unset or empty keeps the caller's default; any other value keeps the default too, with one warning per
// switch that names it and the value. Each call reads the environment (callers that read a switch once keep
// the result in a static; those that tests flip read it per call).
#pragma once

#include <string>

namespace k3 {

bool env_switch(const char* name, bool fallback);

// The raw value of a multiple-choice setting (K3_MLA_KERNEL=wgmma, K3_KDA_DECODE_TMA=2, ...); "" when unset.
std::string env_value(const char* name);

}  // namespace k3
