// The work pool lives in the core (orpheus/work_pool.hpp): it needs no Asio
// or Beast, and other front ends use it too. This name stays for code
// written against the Beast adapter.
#pragma once

#include "orpheus/work_pool.hpp"

namespace orpheus::beast {

using work_pool = orpheus::work_pool;

}  // namespace orpheus::beast
