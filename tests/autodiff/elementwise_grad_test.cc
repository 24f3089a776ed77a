// Finite-difference cases for the elementwise vjps.
#include "gradcheck.h"

namespace kiln::testing {
namespace {

using In = const std::vector<Tensor>&;

KILN_GRAD_CASES({
    {"add/broadcast", {"add"}, {rnd({2, 3}, 1), rnd({3}, 2)}, [](In x) { return ops::add(x[0], x[1]); }},
    {"sub/broadcast", {"sub"}, {rnd({2, 1}, 3), rnd({1, 4}, 4)}, [](In x) { return ops::sub(x[0], x[1]); }},
    {"mul/broadcast", {"mul"}, {rnd({2, 3, 4}, 5), rnd({3, 1}, 6)}, [](In x) { return ops::mul(x[0], x[1]); }},
    {"div", {"div"}, {rnd({2, 3}, 7), rnd_away({2, 3}, 8, 0.5, 2)}, [](In x) { return ops::div(x[0], x[1]); }},
    {"neg", {"neg"}, {rnd({5}, 9)}, [](In x) { return ops::neg(x[0]); }},
    {"exp", {"exp"}, {rnd({5}, 10)}, [](In x) { return ops::exp(x[0]); }},
    {"log", {"log"}, {rnd({5}, 11, 0.5, 2)}, [](In x) { return ops::log(x[0]); }},
    {"tanh", {"tanh"}, {rnd({5}, 12)}, [](In x) { return ops::tanh(x[0]); }},
    {"relu", {"relu"}, {rnd_away({7}, 13)}, [](In x) { return ops::relu(x[0]); }},
    {"square", {"square"}, {rnd({4}, 14)}, [](In x) { return ops::square(x[0]); }},
});

}  // namespace
}  // namespace kiln::testing
