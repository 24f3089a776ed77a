#pragma once
// (family header: filled in by its op family)
#include "kiln/core/tensor.h"
