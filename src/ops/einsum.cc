// einsum: lowered to sum, transpose, reshape and one batched matmul.
#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <vector>

#include "kiln/ops/linalg.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/shape.h"

namespace kiln::ops {
namespace {

[[noreturn]] void bad(const std::string& eq, const std::string& why) {
  throw InvalidArgumentError("einsum '" + eq + "': " + why);
}

bool has(const std::string& s, char c) { return s.find(c) != std::string::npos; }

// Sums out letters of `t` (subscripts `sub`) that `keep` does not contain.
Tensor sum_out(Tensor t, std::string& sub, const std::string& keep) {
  std::vector<int64_t> axes;
  std::string rest;
  for (size_t i = 0; i < sub.size(); ++i) {
    if (has(keep, sub[i]))
      rest += sub[i];
    else
      axes.push_back(static_cast<int64_t>(i));
  }
  if (!axes.empty()) t = sum(t, axes, false);
  sub = rest;
  return t;
}

// Transposes `t` from subscripts `from` to the order `to` (a permutation of `from`).
Tensor permute(const Tensor& t, const std::string& from, const std::string& to) {
  if (from == to) return t;
  std::vector<int64_t> perm;
  for (char c : to) perm.push_back(static_cast<int64_t>(from.find(c)));
  return transpose(t, perm);
}

}  // namespace

Tensor einsum(const std::string& equation, const std::vector<Tensor>& operands) {
  std::string eq;
  for (char c : equation)
    if (c != ' ') eq += c;
  auto arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> subs;
  for (size_t start = 0;;) {
    auto comma = lhs.find(',', start);
    subs.push_back(lhs.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (subs.size() != operands.size())
    bad(equation, std::to_string(subs.size()) + " operand subscripts but " + std::to_string(operands.size()) +
                      " operands");
  if (subs.empty() || subs.size() > 2) bad(equation, "kiln's einsum takes one or two operands");
  std::map<char, int64_t> size;
  std::map<char, int> count;
  for (size_t k = 0; k < subs.size(); ++k) {
    const std::string& s = subs[k];
    if (static_cast<int>(s.size()) != operands[k].rank())
      bad(equation, "operand " + std::to_string(k) + " has rank " + std::to_string(operands[k].rank()) + " but '" + s +
                        "' names " + std::to_string(s.size()) + " dims");
    for (size_t i = 0; i < s.size(); ++i) {
      char c = s[i];
      if (!std::isalpha(static_cast<unsigned char>(c))) bad(equation, std::string("bad subscript '") + c + "'");
      if (s.find(c) != i) bad(equation, std::string("repeated subscript '") + c + "' in one operand (diagonals are not supported)");
      int64_t d = operands[k].dim(static_cast<int>(i));
      auto it = size.find(c);
      if (it != size.end() && it->second != d)
        bad(equation, std::string("subscript '") + c + "' has size " + std::to_string(it->second) + " and " +
                          std::to_string(d));
      size[c] = d;
      count[c]++;
    }
  }
  std::string out;
  if (arrow != std::string::npos) {
    out = eq.substr(arrow + 2);
    for (size_t i = 0; i < out.size(); ++i) {
      if (!size.count(out[i])) bad(equation, std::string("output subscript '") + out[i] + "' is not in any operand");
      if (out.find(out[i]) != i) bad(equation, std::string("repeated output subscript '") + out[i] + "'");
    }
  } else {
    for (auto& [c, n] : count)
      if (n == 1) out += c;
  }

  if (operands.size() == 1) {
    std::string s = subs[0];
    Tensor t = sum_out(operands[0], s, out);
    return permute(t, s, out);
  }

  std::string sa = subs[0], sb = subs[1];
  // Letters only one operand has and the output lacks are summed out first.
  Tensor a = sum_out(operands[0], sa, out + sb);
  Tensor b = sum_out(operands[1], sb, out + sa);
  std::string batch, a_only, b_only, contract;
  for (char c : sa) {
    if (has(sb, c))
      (has(out, c) ? batch : contract) += c;
    else
      a_only += c;
  }
  for (char c : sb)
    if (!has(sa, c)) b_only += c;
  auto prod = [&](const std::string& s) {
    int64_t p = 1;
    for (char c : s) p *= size[c];
    return p;
  };
  a = permute(a, sa, batch + a_only + contract);
  b = permute(b, sb, batch + contract + b_only);
  Tensor c = matmul(reshape(a, {prod(batch), prod(a_only), prod(contract)}),
                    reshape(b, {prod(batch), prod(contract), prod(b_only)}));
  std::vector<int64_t> dims;
  std::string got = batch + a_only + b_only;
  for (char ch : got) dims.push_back(size[ch]);
  c = reshape(c, dims);
  return permute(c, got, out);
}

}  // namespace kiln::ops
