#pragma once
// The eager op library, by family. Every op is a free function in kiln::ops that
// validates its arguments (throwing typed kiln::Error), promotes dtypes, and
// dispatches through the op registry to the device's kernel.
#include "kiln/ops/collective.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/random.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/shape.h"
